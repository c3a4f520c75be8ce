"""Running the real daemon as a subprocess in tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from edge_agent.config import default_store_path
from edge_agent.config_toml import sections_toml
from engines.store import EngineStore

REPO = Path(__file__).resolve().parents[1]
#: The shipped store's version, and the one a first retrain publishes after it.
SHIPPED = EngineStore(default_store_path()).current()
SHIPPED_NEXT = f"v{int(SHIPPED[1:]) + 1:04d}"

FAST = {
    "daemon": {"status_interval_s": 0.5, "drain_timeout_s": 20.0},
    "inbox": {"settle_s": 0.3, "rescan_interval_s": 1.0, "incomplete_grace_s": 2.0},
    "log": {"format": "json"},
    # Every class trusted from the start: these tests are about the road pseudo-labels travel, not whether a class has
    # earned them (that is tests/test_trust.py, and the default, trust_checks = 10, in test_the_default_daemon_...).
    "labels": {"trust_checks": 0},
    # Likewise the field check ([trainer] field_check_every): its gate is tests/test_field_check.py's.
    "trainer": {"field_check_every": 0},
    # And the photos nobody labelled: their road is tests/test_unlabelled.py's (the README farm test runs the defaults).
    "handoff": {"unlabelled_per_day": 0},
}


def merge(base: dict, extra: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for k, v in extra.items():
        out.setdefault(k, {}).update(v)
    return out


#: Every daemon and trainer process a test started: :func:`kill_leftovers` ends those a failed test left running.
_STARTED: list[subprocess.Popen] = []


def kill_leftovers() -> None:
    """SIGKILL every process started here that still runs (a test that failed before stopping it): left running, it
    watches a folder that a later run of the suite makes again under the same name."""
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


class DaemonProc:
    """``edge-agent run`` in a subprocess; its JSON log lines go to ``log``."""

    def __init__(self, state: Path, config: dict | None = None, env: dict | None = None) -> None:
        self.state = state
        self.state.mkdir(parents=True, exist_ok=True)
        self.config_path = state.parent / f"{state.name}.toml"
        self.config_path.write_text(sections_toml(merge(FAST, config or {})))
        self.log_path = state.parent / f"{state.name}.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    @property
    def inbox(self) -> Path:
        return self.state / "inbox"

    def start(self) -> "DaemonProc":
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edge_agent", "run", "--config", str(self.config_path), "--state-dir", str(self.state)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=self.env,
        )
        _STARTED.append(self.proc)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"daemon exited {self.proc.returncode}: {self.log_path.read_text()[-3000:]}"
            with open(self.log_path) as f:
                f.seek(start)
                if '"event": "ready"' in f.read():
                    return
            time.sleep(0.05)
        raise TimeoutError("daemon never became ready")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def terminate(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self._log.close()
        return rc

    def events(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by SIGKILL
        return out


def db_rows(state: Path, sql: str, name: str = "results.sqlite") -> list[tuple]:
    from edge_agent.results import query_readonly

    return query_readonly(state / name, sql, timeout=10)


def wait_until(cond, timeout: float, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


class NotifySocket:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []

    def collect(self, seconds: float) -> list[tuple[float, str]]:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            for line in data.decode().splitlines():
                self.messages.append((time.monotonic(), line))
        return self.messages

    def close(self) -> None:
        self.sock.close()


class TrainerProc:
    def __init__(self, state: Path, config: dict) -> None:
        self.state = state
        self.config_path = state.parent / "trainer.toml"
        self.config_path.write_text(sections_toml(merge(FAST, config)))
        self.log_path = state.parent / "trainer.log"
        self.proc = None

    def start(self) -> "TrainerProc":
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainer",
                "--log-format",
                "json",
                "serve",
                "--config",
                str(self.config_path),
                "--state-dir",
                str(self.state),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        _STARTED.append(self.proc)
        return self

    def logged(self, event: str) -> bool:
        return f'"event": "{event}"' in self.log_path.read_text() if self.log_path.exists() else False

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        self._log.close()
        return rc


def stand_in_store(root: Path, signing_key) -> Path:
    """A store at ``root`` whose one version, named as the shipped one, is an untrained LeafNet (128 px) of the shipped
    model's classes: for the tests of the trainer's process (a kill, a stop, its memory), where what is tested is the
    process, not the model (a retrain of it takes a few seconds here, one of the shipped model about a minute)."""
    import torch

    from trainer.models import build_model
    from trainer.publish import publish_model

    torch.manual_seed(0)
    shipped = EngineStore(default_store_path()).open()
    publish_model(
        build_model(len(shipped.classes)).eval(),
        list(shipped.classes),
        root,
        training={"kind": "test-fixture"},
        signing_key=signing_key,
        version=SHIPPED,
    )
    return root


#: The first shipped version (LeafNet5 at 128 px, trained on the lab photos, signed with the release key), and the one
#: a first retrain of it publishes.
FIRST_RELEASE, FIRST_RELEASE_NEXT = "v1000", "v1001"


def first_release_store(root: Path) -> Path:
    """A store at ``root`` holding only :data:`FIRST_RELEASE`, as shipped: for the tests of the road photos and
    pseudo-labels travel, which need a trained model's confident answers but not the shipped model's accuracy (v1000
    runs a photo in about a third of v4000's time here, and retrains in a fraction of it)."""
    shutil.copytree(Path(default_store_path()) / FIRST_RELEASE, root / FIRST_RELEASE)
    (root / "current").write_text(FIRST_RELEASE)
    return root


def split_photos(plantvillage: Path, labelled_per_class: int = 10):
    """A small labelled folder for the trainer, and the other photos for the field."""
    labelled, field = {}, []
    for cls in sorted(p for p in plantvillage.iterdir() if p.is_dir()):
        photos = sorted(cls.glob("*.jpg"))
        labelled[cls.name] = photos[:labelled_per_class]
        field.extend(photos[labelled_per_class:])
    return labelled, field


def make_labelled(tmp_path: Path, labelled: dict) -> Path:
    """A ``[trainer] labelled_data`` folder under ``tmp_path`` of the ``labelled`` photos (class -> photos)."""
    root = tmp_path / "labelled"
    for cls, photos in labelled.items():
        (root / cls).mkdir(parents=True)
        for p in photos:
            shutil.copy(p, root / cls / p.name)
    return root
