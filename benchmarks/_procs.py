"""Waiting on the real daemon and trainer that a full-mode benchmark started, noticing at once if one of them died."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["wait_for"]


def wait_for(cond: Callable[[], object], what: str, procs: dict[str, subprocess.Popen], timeout_s: float, logs: Path | None = None) -> None:
    """Poll ``cond`` every 0.5 s until it is true; RuntimeError if a process in ``procs`` exits first (naming its log
    under ``logs``), TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        for name, proc in procs.items():
            if proc.poll() is not None:
                where = f"; see {logs / name}.log" if logs is not None else ""
                raise RuntimeError(f"the {name} exited ({proc.returncode}) while waiting for {what}{where}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout_s:.0f} s")
        time.sleep(0.5)
