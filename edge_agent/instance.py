"""One daemon, and one trainer, a state directory: a second ``edge-agent run`` on the same folder (the service and one
started by hand, ``make run`` in two terminals) stops at once naming the process that holds it, instead of both
claiming the same photos, ledger and label queue (and one's start replacing a damaged ledger the other still writes);
a second ``edge-trainer serve`` likewise (it took the hand-off's socket from the first, and its labels file)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from engines.errors import EdgeAgentError

__all__ = ["LOCK", "StateInUse", "hold_state", "holding_state"]

#: In the state directory: locked (``flock``) by the daemon that runs on it, for as long as it runs; holds its pid.
LOCK = "daemon.lock"
#: Each service's lock file (in its own folder) and how to stop the one that holds it.
_SERVICES = {
    "daemon": (LOCK, "edge-agent daemon", "systemctl stop edge-agent"),
    "trainer": ("trainer.lock", "edge-trainer", "systemctl stop edge-trainer"),
}


class StateInUse(EdgeAgentError):
    """Another daemon runs on this state directory."""


def hold_state(state_root: Path, service: str = "daemon") -> IO | None:
    """Lock ``state_root`` for this ``service`` (the returned file, kept open, holds it until it is closed or the
    process ends); raises :class:`StateInUse` where another process holds it. A folder whose disk cannot take the lock
    file (mounted read-only, as a failing card remounts itself) is not locked: nothing can write there to be shared."""
    name, what, stop = _SERVICES[service]
    path = Path(state_root) / name
    try:
        f = open(path, "a+")
    except OSError:
        return None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read(32).strip() or "?"
        f.close()
        raise StateInUse(
            f"{state_root}: another {what} runs on it (pid {pid}): stop that one first ({stop}, or Ctrl-C where it was "
            "started by hand), or give this one another --state-dir"
        ) from None
    with contextlib.suppress(OSError):  # (a full disk: the lock holds without the pid)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
    return f


@contextlib.contextmanager
def holding_state(state_root: Path, service: str = "daemon") -> Iterator[None]:
    """:func:`hold_state` for the block (a command that runs on a service's files: ``edge-trainer retrain``, ``salvage``)."""
    held = hold_state(state_root, service)
    try:
        yield
    finally:
        if held is not None:
            held.close()
