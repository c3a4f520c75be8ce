"""A real MQTT broker for tests: Debian's mosquitto on a free loopback port (``make install-dev`` installs it as root),
and a subscriber that keeps what it hears."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"

needs_mosquitto = pytest.mark.skipif(
    not Path(MOSQUITTO).exists(), reason="Debian's mosquitto is not installed (make install-dev installs it as root)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """mosquitto on 127.0.0.1:``port``; :meth:`stop` and :meth:`start` again on the same port (the broker going away)."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.conf = root / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        self.log = root / "mosquitto.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not start: {self.log.read_text()[-500:]}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


class Listener:
    """A paho subscriber to ``topics``: ``messages`` holds (topic, payload, retain) as they arrive."""

    def __init__(self, port: int, topics: list[str]) -> None:
        import paho.mqtt.client as mqtt

        self.messages: list[tuple[str, bytes, bool]] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"test-listener-{port}-{time.monotonic_ns()}")
        self.client.on_connect = lambda c, u, f, rc, p: [c.subscribe(t, qos=1) for t in topics]
        self.client.on_message = self._got
        self.client.reconnect_delay_set(1, 2)
        self.client.connect("127.0.0.1", port, 30)
        self.client.loop_start()

    def _got(self, client, userdata, msg) -> None:
        with self._lock:
            self.messages.append((msg.topic, msg.payload, bool(msg.retain)))

    def on(self, topic: str) -> list[bytes]:
        with self._lock:
            return [p for t, p, _ in self.messages if t == topic]

    def wait(self, cond, timeout: float = 15.0) -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise AssertionError(f"timed out; heard {[(t, p[:80]) for t, p, _ in self.messages]}")
            time.sleep(0.05)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
