"""The sd_notify(3) protocol: READY=1, WATCHDOG=1, STATUS=..., STOPPING=1, EXTEND_TIMEOUT_USEC=... over $NOTIFY_SOCKET.

No dependency: one datagram per message to the socket systemd names (an
abstract-namespace name when it starts with '@'). Outside systemd every call
does nothing. A receiver that stops reading (systemd never does; a wrapper or
a harness may) costs a message at most :data:`SEND_TIMEOUT_S`, never the daemon.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

__all__ = ["Notifier", "SEND_TIMEOUT_S"]

#: The longest a message waits on a notify socket whose receiver does not read; then it is dropped (send: False).
SEND_TIMEOUT_S = 1.0


class Notifier:
    """Sends service notifications to systemd; a no-op when $NOTIFY_SOCKET is unset."""

    def __init__(self, env: dict[str, str] | None = None, timeout_s: float = SEND_TIMEOUT_S) -> None:
        env = os.environ if env is None else env
        self._timeout_s = timeout_s
        addr = env.get("NOTIFY_SOCKET", "")
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        self._addr = addr or None
        self._sock: socket.socket | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        watchdog_for_us = not pid or pid == str(os.getpid())
        #: The watchdog timeout systemd expects pings within (seconds), or None.
        self.watchdog_timeout: float | None = int(usec) / 1e6 if usec.isdigit() and watchdog_for_us else None

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def send(self, *fields: str) -> bool:
        """Send ``KEY=value`` fields in one datagram; False when not under systemd, on error, or when the receiver
        has not taken it within the timeout (its queue full: nobody reads)."""
        if self._addr is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.settimeout(self._timeout_s)
            self._sock.sendto("\n".join(fields).encode(), self._addr)
            return True
        except OSError:
            return False

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def extend_start(self, seconds: float, status: str | None = None) -> bool:
        """Ask for ``seconds`` more start-up time from now (systemd 236+ ignores it within TimeoutStartSec)."""
        return self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}", *([f"STATUS={status}"] if status else []))

    @contextlib.contextmanager
    def starting(self, status: str, every_s: float = 10.0, at_most_s: float = 1800.0) -> Iterator[None]:
        """While the block runs, extend the start-up time every ``every_s`` seconds by three times that, for at most
        ``at_most_s`` in all: a first start on a Jetson builds the TensorRT plan, which can outlast TimeoutStartSec
        (and a unit killed mid-build would build again at every restart)."""
        if not self.enabled:
            yield
            return
        done = threading.Event()

        def keep() -> None:
            end = time.monotonic() + at_most_s
            while (left := end - time.monotonic()) > 0:
                self.extend_start(min(3 * every_s, left), status)
                if done.wait(every_s):
                    return

        thread = threading.Thread(target=keep, name="start-time", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(5)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
