"""One daemon a state directory: a second ``edge-agent run`` on the same folder (the service and one started by hand,
``make run`` in two terminals) stops at once naming the process that holds it, instead of both claiming the same
photos, ledger and label queue (and one's start replacing a damaged ledger the other still writes)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO

from engines.errors import EdgeAgentError

__all__ = ["LOCK", "StateInUse", "hold_state"]

#: In the state directory: locked (``flock``) by the daemon that runs on it, for as long as it runs; holds its pid.
LOCK = "daemon.lock"


class StateInUse(EdgeAgentError):
    """Another daemon runs on this state directory."""


def hold_state(state_root: Path) -> IO | None:
    """Lock ``state_root`` for this daemon (the returned file, kept open, holds it until the process ends); raises
    :class:`StateInUse` where another process holds it. A state directory whose disk cannot take the lock file (mounted
    read-only, as a failing card remounts itself) is not locked: nothing can write there for two daemons to share."""
    path = Path(state_root) / LOCK
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
            f"{state_root}: another edge-agent daemon runs on it (pid {pid}): stop that one first (systemctl stop "
            "edge-agent, or Ctrl-C where it was started by hand), or give this one another --state-dir"
        ) from None
    with contextlib.suppress(OSError):  # (a full disk: the lock holds without the pid)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
    return f
