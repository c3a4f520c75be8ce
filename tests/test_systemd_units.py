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


def _install(units: Path, *args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "install-systemd", "--unit-dir", str(units), "--no-user", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr


def _read_with_the_unit(units: Path, dropin: str) -> None:
    """The drop-in is read with the daemon's unit, every key in it known and every value parsed."""
    if shutil.which("systemd-analyze"):
        check = subprocess.run(
            ["systemd-analyze", "verify", str(units / "edge-agent.service")],
            capture_output=True,
            text=True,
            env={"SYSTEMD_UNIT_PATH": f"{units}:", "PATH": "/usr/bin:/bin"},
        )
        assert dropin not in check.stderr, check.stderr


def test_install_systemd_jetson_adds_the_gpu_drop_in(tmp_path):
    _install(tmp_path, "--jetson")
    dropin = (tmp_path / "edge-agent.service.d" / "jetson.conf").read_text()
    assert "DevicePolicy=auto" in dropin and "SupplementaryGroups=video render" in dropin
    assert not (tmp_path / "edge-trainer.service.d").exists()
    _read_with_the_unit(tmp_path, "jetson.conf")


def test_install_systemd_opens_the_folders_the_configuration_names_outside_the_state_directory(tmp_path):
    """ProtectSystem=strict leaves every folder read-only to the daemon but its own: a [backup] dir on a stick and an
    [inbox] path elsewhere are opened by a drop-in written from the configuration, and it goes when they do."""
    conf = tmp_path / "edge-agent.toml"
    conf.write_text('[backup]\ndir = "/media/farm backup"\n[inbox]\npath = "/srv/photos"\n')
    units = tmp_path / "units"
    _install(units, "--config", str(conf))
    dropin, web = units / "edge-agent.service.d" / "paths.conf", units / "edge-web.service.d" / "paths.conf"
    assert 'ReadWritePaths="-/media/farm backup" "-/srv/photos"' in dropin.read_text()
    assert 'ReadWritePaths="-/srv/photos"' in web.read_text()  # the page's uploads go into the inbox
    trainer = units / "edge-trainer.service.d" / "paths.conf"
    assert 'ReadWritePaths="-/media/farm backup"\n' in trainer.read_text()  # a trainer alone backs itself up
    _read_with_the_unit(units, "paths.conf")  # the quoted path with its space parsed too
    conf.write_text("")
    _install(units, "--config", str(conf))
    assert not dropin.exists() and not web.exists() and not trainer.exists() and (units / "edge-agent.service").is_file()
