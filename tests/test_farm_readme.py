"""The README's farm section, run as written: one trainer and two devices on 127.0.0.1 (each its own folder standing
for its machine: its configuration file, its state directory), the section's configuration and commands taken from
the README itself; then a new version's staged rollout, a device with the wrong trusted key whose refusal reaches
the trainer's Fleet page within one heartbeat, and a device rollback that stays."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.fleet import publish_nudged

from .daemon_helpers import REPO, SHIPPED, wait_until

torch = pytest.importorskip("torch", reason="publishing a second version needs the trainer")

BIN = Path(sys.executable).parent


def _block(name: str) -> str:
    """The fenced block after ``<!-- farm: NAME -->`` in the README."""
    text = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- farm: {re.escape(name)} -->\n```\w*\n(.*?)```", text, re.S)
    assert m, f"README.md has no '<!-- farm: {name} -->' block"
    return m.group(1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Machine:
    """A folder standing for one machine: ``etc/edge-agent.toml`` for /etc/edge-agent/edge-agent.toml and
    ``state`` for /var/lib/edge-agent; commands run with $EDGE_AGENT_CONFIG naming the former (what the services'
    file is, where it exists) from the folder itself (so a fallback to ./edge-state would show)."""

    def __init__(self, root: Path, ports: dict[str, int]) -> None:
        self.root, self.ports = root, ports
        (root / "etc").mkdir(parents=True)
        self.config, self.state = root / "etc" / "edge-agent.toml", root / "state"
        self.procs: list[subprocess.Popen] = []

    def here(self, text: str) -> str:
        text = text.replace("/etc/edge-agent/edge-agent.toml", str(self.config)).replace("/var/lib/edge-agent", str(self.state))
        text = text.replace("trainer.local", "127.0.0.1").replace("0.0.0.0", "127.0.0.1")
        for default, port in self.ports.items():
            text = text.replace(f":{default}", f":{port}")
        return text.replace(".venv/bin/", f"{BIN}/")

    @property
    def env(self) -> dict:
        return {**os.environ, "EDGE_AGENT_CONFIG": str(self.config), "PYTHONPATH": str(REPO)}

    def run(self, line: str, check: bool = True) -> subprocess.CompletedProcess:
        line = self.here(line.split("  #")[0].strip()).replace("sudo -u edge-agent ", "").replace("sudo ", "")
        out = subprocess.run(line, shell=True, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=120)
        if check:
            assert out.returncode == 0, f"{line}: {out.stderr}"
        return out

    def systemctl(self, line: str) -> None:
        """``systemctl enable --now UNITS``: the units' commands, started here (the web page is read in-process)."""
        for unit in re.findall(r"([\w-]+)\.service", line):
            argv = {"edge-trainer": ["edge-trainer", "serve"], "edge-agent": ["edge-agent", "run"]}.get(unit)
            if argv:
                log = open(self.root / f"{unit}.log", "w")
                self.procs.append(subprocess.Popen([str(BIN / argv[0]), *argv[1:]], cwd=self.root, env=self.env, stdout=log, stderr=log))

    def commands(self, block: str) -> None:
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if "systemctl" in line:
                self.systemctl(line)
            else:
                self.run(line)

    def log(self, unit: str) -> str:
        p = self.root / f"{unit}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_the_readme_farm_section_works_as_written(tmp_path):
    from starlette.testclient import TestClient

    from edge_agent.config import load_config
    from edge_agent.state import StateLayout
    from edge_agent.web.app import WebContext, create_app

    ports = {5555: _port(), 5556: _port(), 5557: _port()}
    trainer = Machine(tmp_path / "trainer", ports)
    devices = {name: Machine(tmp_path / name, ports) for name in ("greenhouse", "shed", "barn")}
    heartbeat = 1.0
    # 1. the trainer, as the README says (a canary period of seconds, not half an hour, and a heartbeat of 1 s)
    config = _block("trainer config").replace("period_s = 1800", "period_s = 2\nmin_photos = 0")
    trainer.config.write_text(trainer.here(config).replace("[handoff]\n", f"[handoff]\nheartbeat_s = {heartbeat}\n"))
    assert "edge-trainer device add greenhouse" in _block("trainer commands")
    try:
        trainer.commands(_block("trainer commands"))
        again = trainer.run(".venv/bin/edge-trainer keys")
        assert "kept the trainer's certificate" in again.stdout  # a second run changes nothing
        trainer.run(".venv/bin/edge-trainer device add barn")  # a third device, which will trust the wrong key
        # 2. each device: its folder copied from the trainer, its configuration from the README
        for name, dev in devices.items():
            shutil.copytree(trainer.state / "keys" / "devices" / name, dev.state / "keys")
            text = _block("device config").replace("greenhouse", name)
            if name == "barn":  # a device told to trust another key than the trainer's
                text = text.replace('trusted_keys = ["/var/lib/edge-agent/keys/signing.pub"]', f'trusted_keys = ["{"ab" * 32}"]')
            dev.config.write_text(dev.here(text).replace("[handoff]\n", f"[handoff]\nheartbeat_s = {heartbeat}\n"))
        for name in ("greenhouse", "shed"):
            devices[name].commands(_block("device commands").split("\n", 1)[0])  # systemctl: the daemon
        wait_until(
            lambda: (
                {"greenhouse", "shed"}
                <= set(re.findall(r"^(\w+)\s", trainer.run(".venv/bin/edge-trainer fleet", check=False).stdout, re.M))
            ),
            90,
            "both devices in the fleet",
        )
        status_command = _block("device commands").splitlines()[1]
        wait_until(  # the device's own status is written on its next heartbeat, which may come after the fleet's
            lambda: f"connected: idle, serving {SHIPPED}" in devices["greenhouse"].run(status_command).stdout,
            30,
            "the device's status to show the trainer",
        )
        gh = devices["greenhouse"]  # the device's own page knows the trainer it hands off to
        gh_page = TestClient(
            create_app(WebContext(load_config(gh.config), StateLayout(gh.state), gh.state / "inbox", "127.0.0.1")),
            base_url="http://localhost",
            client=("127.0.0.1", 5),
        )
        tile = gh_page.get("/health").text
        assert f"connected to tcp://127.0.0.1:{ports[5555]}" in tile and f"serving {SHIPPED}" in tile, tile
        # a new version: the canary (greenhouse: the first by name, 10 % of two is one) first, then the shed
        v2 = publish_nudged(trainer.state / "engines", trainer.state / "trainer" / "signing.key")
        wait_until(lambda: '"engine_swapped"' in devices["greenhouse"].log("edge-agent"), 150, "the canary serves the new version")
        assert '"engine_swapped"' not in devices["shed"].log("edge-agent")  # not before the canary has served it
        wait_until(lambda: '"engine_swapped"' in devices["shed"].log("edge-agent"), 60, "the rest once the canary served it")

        def fleet() -> str:
            return trainer.run(".venv/bin/edge-trainer fleet").stdout

        wait_until(lambda: re.search(rf"^shed .* {v2} ", fleet(), re.M), 10, "the trainer's status has caught up")
        assert re.search(rf"^greenhouse .* {v2} ", fleet(), re.M) and f"rollout of {v2}: done" in fleet(), fleet()
        # a device with the wrong trusted key: its refusal is on the trainer's Fleet page within one heartbeat
        devices["barn"].commands(_block("device commands").split("\n", 1)[0])
        wait_until(lambda: '"engine_refused"' in devices["barn"].log("edge-agent"), 90, "barn refuses the trainer's version")
        refused_at = time.monotonic()
        cfg = load_config(trainer.config)
        page = TestClient(
            create_app(WebContext(cfg, StateLayout(trainer.state), trainer.state / "inbox", "127.0.0.1")),
            base_url="http://localhost",
            client=("127.0.0.1", 5),
        )

        def barn_row() -> str:
            html = page.get("/fleet").text
            m = re.search(r'<tr data-device="barn">(.*?)</tr>', html, re.S)
            return m.group(1) if m else ""

        wait_until(lambda: "refused" in barn_row() and v2 in barn_row(), 10, "barn's refusal on the Fleet page")
        # the status file is written every heartbeat or two: within one heartbeat of the hello, plus that write
        assert time.monotonic() - refused_at < 3 * heartbeat + 2
        assert "not signed by a trusted key" in barn_row() or "trusted" in barn_row(), barn_row()
        # a device rollback stays: pinned on the device and on the trainer's page, and the offers keep being refused
        shed = devices["shed"]
        shed.run(".venv/bin/edge-agent engine rollback")
        wait_until(lambda: f"pinned to {SHIPPED}" in page.get("/fleet").text, 15, "the pin on the Fleet page")
        time.sleep(3 * heartbeat)
        assert f"PINNED to {SHIPPED}" in shed.run(".venv/bin/edge-agent status").stdout
        assert re.search(rf"^shed .* {SHIPPED} +{SHIPPED} ", trainer.run(".venv/bin/edge-trainer fleet").stdout, re.M)
    finally:
        for m in (trainer, *devices.values()):
            m.stop()
