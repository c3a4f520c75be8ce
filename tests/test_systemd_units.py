"""The systemd units: valid, hardened, and identical to what install-systemd writes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.units import render

REPO = Path(__file__).parents[1]
needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def test_repo_units_are_the_rendered_ones():
    for name, text in render().items():
        assert (REPO / "systemd" / name).read_text() == text, f"regenerate systemd/{name} from edge_agent/units.py"


@pytest.fixture
def units_here(tmp_path) -> dict[str, Path]:
    """The units rendered for this environment (so ExecStart points at real executables)."""
    out = {}
    for name, text in render(bin_dir=str(Path(sys.executable).parent)).items():
        out[name] = tmp_path / name
        out[name].write_text(text)
    return out


@needs_systemd
def test_units_verify_without_warnings(units_here):
    proc = subprocess.run(["systemd-analyze", "verify", *map(str, units_here.values())], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    relevant = [line for line in proc.stderr.splitlines() if "edge-" in line]
    assert relevant == [], relevant


@needs_systemd
@pytest.mark.parametrize("name", ["edge-agent.service", "edge-trainer.service", "edge-web.service"])
def test_security_exposure_at_most_2(units_here, name):
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", str(units_here[name])], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout + proc.stderr)
    assert m, proc.stdout[-2000:] + proc.stderr
    assert float(m.group(1)) <= 2.0


def test_unit_contents():
    agent = render()["edge-agent.service"]
    trainer = render()["edge-trainer.service"]
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "StartLimitBurst=", "StateDirectory=edge-agent", "User=edge-agent"):
        assert line in agent
    for line in ("Nice=19", "IOSchedulingClass=idle", "MemoryMax=", "Restart=on-failure"):
        assert line in trainer
    web = render()["edge-web.service"]
    for line in (
        "ExecStart=/opt/edge-agent/.venv/bin/edge-agent web",
        "MemoryMax=",
        "Restart=on-failure",
        "StateDirectory=edge-agent",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
    ):
        assert line in web
    assert "Requires=" not in web and "BindsTo=" not in web  # the page's failures never stop the daemon


def test_install_systemd_writes_units_for_this_environment(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "install-systemd", "--unit-dir", str(tmp_path), "--no-user"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "edge-agent.service").read_text()
    assert f"ExecStart={Path(sys.executable).parent}/edge-agent run" in text
    assert (tmp_path / "edge-trainer.service").is_file()
    assert f"ExecStart={Path(sys.executable).parent}/edge-agent web" in (tmp_path / "edge-web.service").read_text()


def test_install_systemd_jetson_adds_the_gpu_drop_in(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "install-systemd", "--unit-dir", str(tmp_path), "--no-user", "--jetson"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    dropin = (tmp_path / "edge-agent.service.d" / "jetson.conf").read_text()
    assert "DevicePolicy=auto" in dropin and "SupplementaryGroups=video render" in dropin
    assert not (tmp_path / "edge-trainer.service.d").exists()
    if shutil.which("systemd-analyze"):  # the drop-in is read with the unit, and every key in it is known
        check = subprocess.run(
            ["systemd-analyze", "verify", str(tmp_path / "edge-agent.service")],
            capture_output=True,
            text=True,
            env={"SYSTEMD_UNIT_PATH": f"{tmp_path}:", "PATH": "/usr/bin:/bin"},
        )
        assert "jetson.conf" not in check.stderr, check.stderr
