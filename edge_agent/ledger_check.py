"""The ledger read whole in the background: a minute after a start that did not read it, once a day, and at once where a
look (the page, a command) met a damaged page, so a page a card rotted is found within a day and not only when a
commit, the hand-off or a backup happens to read it; the daemon then stops for its next start to keep every row that
can still be read (:mod:`engines.salvage`). The trainer reads its labels (``samples.sqlite``) the same way."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from edge_agent.log import get_logger
from edge_agent.spans import ago, within
from edge_agent.storage_errors import storage_problem
from edge_agent.worker import Worker
from engines.durable import check_whole, connect_readonly

__all__ = ["REQUEST", "LedgerCheck", "ask_to_read", "check_line", "request_check"]

#: Beside the ledger (or the trainer's labels): asks its service to read it whole now (a look, or the daemon's backup,
#: met a damaged page).
REQUEST = "ledger-check-requested"
#: A day between reads; a minute after a start that did not read it whole.
EVERY_S = 86400.0
FIRST_S = 60.0


def check_line(status: dict | None, now: float) -> str | None:
    """What ``status`` and the Health page say of the ledger's reads (:meth:`LedgerCheck.status`), or None."""
    if not status:
        return None
    last = status.get("last")
    if last and last.get("damaged"):
        return f"a damaged page found {ago(now - last['time'])}: the daemon's next start keeps every row that can still be read"
    again = within(status["next"] - now)
    if last:
        return f"read whole for damage {ago(now - last['time'])} ({last['seconds']:.1f} s), none found; again {again}"
    return f"to be read whole for damage {again}"


def request_check(state_root: Path) -> None:
    """Ask for the ledger of ``state_root`` to be read whole (a look met a damaged page): now by a running daemon, else
    at the daemon's next start (its record of a clean close forgotten); where the state directory cannot be written,
    the daily read finds it."""
    from edge_agent._ledger_file import forget_closed
    from edge_agent.state import StateLayout

    forget_closed(StateLayout(Path(state_root)).db)
    ask_to_read(Path(state_root))


def ask_to_read(folder: Path) -> None:
    """Leave :data:`REQUEST` in ``folder``: the service whose databases lie there reads them whole within seconds."""
    with contextlib.suppress(OSError):
        (folder / REQUEST).touch()


class LedgerCheck(Worker):
    """The thread that reads a service's database whole (SQLite's quick_check: about 150 ms for a season's 300,000
    results here) at the lowest CPU priority, through a connection of its own, and tells ``on_damaged(exc)``."""

    thread_name = "ledger-check"
    background = True  # the photos first

    def __init__(
        self,
        files: Path | Sequence[Path],
        on_damaged: Callable[[BaseException, Path], None],
        first_s: float = FIRST_S,
        every_s: float = EVERY_S,
        poll_s: float = 5.0,
    ) -> None:
        """``files``: the database (or databases, in one folder) read whole; ``on_damaged(exc, file)`` is told of one
        found damaged."""
        super().__init__()
        self.files = [Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files]
        self.on_damaged = on_damaged
        self.request = self.files[0].parent / REQUEST
        self.every_s, self.poll_s = every_s, poll_s
        self.next = time.monotonic() + first_s
        self.last: dict | None = None  # {"time", "seconds", "damaged"}: the last read
        self.log = get_logger("ledger_check")

    def run_once(self) -> bool:
        """Read the files whole now; returns whether they are whole (an error that is no damage, a locked file: as
        whole, read again at the next turn; a file not there yet: nothing to read)."""
        self.request.unlink(missing_ok=True)
        self.next = time.monotonic() + self.every_s
        started = time.monotonic()
        for path in self.files:
            try:
                if path.is_file():
                    with contextlib.closing(connect_readonly(path)) as con:
                        check_whole(con)
            except sqlite3.DatabaseError as exc:
                if storage_problem(exc, path.parent) != "damaged":
                    self.log.warning("ledger_check_failed", file=str(path), error=repr(exc), again_in_s=self.every_s)
                    continue
                self.last = {"time": time.time(), "seconds": time.monotonic() - started, "damaged": f"{path.name}: {exc}"}
                self.log.error("ledger_damaged", file=str(path), error=str(exc), met_by="the background read")
                self.on_damaged(exc, path)
                return False
        self.last = {"time": time.time(), "seconds": time.monotonic() - started, "damaged": None}
        self.log.info("ledger_checked", seconds=round(self.last["seconds"], 3))
        return True

    def status(self) -> dict:
        """The last read (or None) and when the next is due (a time), for :func:`check_line`."""
        return {"last": self.last, "next": time.time() + max(0.0, self.next - time.monotonic())}

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if time.monotonic() >= self.next or self.request.exists():
                self.run_once()
