"""Clock jumps: a wall clock set forward while the daemon runs (a time sync after days without a network, a date set
by hand, a board without a clock battery that restored its last saved time at boot) does not make what was recorded
before the jump look older than it is, so retention never removes it early.

:class:`ClockWatch` compares the wall clock with the time since boot at each look (Linux's ``CLOCK_BOOTTIME``,
which counts a laptop's sleep as the wall clock does; the monotonic clock, which does not, elsewhere). A forward step of more than
:data:`JUMP_S` is a jump: kept in ``<state>/clock.json`` as when it happened on the clock before it and by how much,
so :meth:`ClockWatch.shift` can say how much of a record's apparent age the jumps after it made, across restarts.
A step back is logged only: what is recorded after it looks younger than it is and is kept longer, never lost. A
jump while the daemon is stopped cannot be told from time passing and is not seen here; a clock left behind by one is
told by the phones' photos (:func:`edge_agent.capture_time.clock_behind`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from edge_agent.log import get_logger
from engines.durable import atomic_write

__all__ = ["ClockJump", "ClockWatch", "JUMP_S"]

#: A step of the wall clock against the monotonic one larger than this (seconds) is a jump, not drift.
JUMP_S = 3600.0
#: The most jumps remembered (the oldest forgotten first: what was recorded before it then looks its old age again).
MOST_JUMPS = 100


def since_boot() -> float:
    """Seconds since boot, sleep included where the system counts it (Linux), else the monotonic clock."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


class ClockJump(NamedTuple):
    """The wall clock stepped forward ``by`` seconds when it read ``before`` (on the clock before the jump)."""

    before: float
    by: float


class ClockWatch:
    """The wall clock's forward jumps, seen by comparing it with the monotonic clock; kept in ``path``."""

    def __init__(self, path: Path, wall: Callable[[], float] = time.time, mono: Callable[[], float] = since_boot) -> None:
        self.path, self.wall, self.mono = Path(path), wall, mono
        self.log = get_logger("clock")
        self.jumps = self._read()
        self._offset: float | None = None

    def _read(self) -> list[ClockJump]:
        try:
            raw = json.loads(self.path.read_text())
            jumps = [ClockJump(float(j["before"]), float(j["by"])) for j in raw["jumps"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a torn or edited file: say so, start again
            self.log.warning("clock_file_unreadable", path=str(self.path), error=repr(exc)[:200], fix="it is rewritten at the next jump")
            return []
        return sorted(j for j in jumps if math.isfinite(j.before) and math.isfinite(j.by) and j.by > 0)[-MOST_JUMPS:]

    def look(self) -> ClockJump | None:
        """Compare the clocks; a forward jump since the last look is recorded, logged and returned."""
        offset = self.wall() - self.mono()
        last, self._offset = self._offset, offset
        if last is None:
            return None
        step = offset - last
        if step < -JUMP_S:
            self.log.warning("clock_stepped_back", seconds=round(-step), note="what is recorded now looks younger: kept longer")
            return None
        if step <= JUMP_S:
            return None
        jump = ClockJump(self.wall() - step, step)
        self.jumps = [*self.jumps, jump][-MOST_JUMPS:]
        self.log.warning(
            "clock_jumped",
            days=round(step / 86400, 2),
            note="what was recorded before keeps its age: retention counts it from its own clock",
        )
        try:
            atomic_write(self.path, json.dumps({"jumps": [j._asdict() for j in self.jumps]}).encode())
        except OSError as exc:  # a full disk: remembered until the daemon stops
            self.log.warning("clock_file_unwritable", path=str(self.path), error=repr(exc)[:200])
        return jump

    def note(self) -> str | None:
        """The latest jump in a sentence, for ``status`` and the Health page (None: none seen)."""
        if not self.jumps:
            return None
        last = self.jumps[-1]
        when = datetime.fromtimestamp(last.before).strftime("%Y-%m-%d %H:%M")
        more = f" ({len(self.jumps)} jumps in all)" if len(self.jumps) > 1 else ""
        return (
            f"the clock was set forward {last.by / 86400:.1f} days at {when} (as it read then){more}: "
            "photos and results from before keep their age"
        )

    def shift(self, stamped: float) -> float:
        """Seconds the jumps after a record stamped at ``stamped`` added to its apparent age."""
        return sum(j.by for j in self.jumps if stamped < j.before)

    def older_than(self, cutoff: float) -> list[tuple[float, float]]:
        """The stamps that are older than ``cutoff`` once each is counted from its own clock: ``[lo, hi)`` ranges."""
        edges = [-math.inf, *sorted(j.before for j in self.jumps), math.inf]
        out = []
        for lo, hi in zip(edges, edges[1:]):
            top = min(hi, cutoff - self.shift(lo))
            if top > lo:
                out.append((lo, top))
        return out
