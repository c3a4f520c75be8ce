"""Backups on their own: the daemon writes one into ``[backup] dir`` (a USB stick, a NAS share) every ``every_h``
hours, and whenever the page's "Back up now" asks (:func:`request_backup`), so a dead SD card costs a farm a day of its
season, not the season; ``status``, the Health page, ``/metrics`` and the health alerts say when the last one was
taken, when the stick last read back whole, and why one failed.

Each is written by :func:`edge_agent.backup_folder.take` (what it refuses, what it keeps, what it shares and reads
back: see there) in a thread of the daemon at the lowest CPU priority (the photos go on being classified); a failure
is said and tried again hourly.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edge_agent.backup import REQUEST, BackupError, BackupStopped, DatabaseDamaged, card_suspect, changed_unseen, last_backup
from edge_agent.backup_folder import take
from edge_agent.config import AppConfig, BackupSection
from edge_agent.log import get_logger
from edge_agent.spans import ago, within
from edge_agent.worker import Worker
from engines.durable import atomic_write

__all__ = ["BackupSchedule", "POLL_S", "backup_lines", "request_backup", "requested"]

#: How long after a failure the next try waits (or ``every_h``, if shorter).
RETRY_S = 3600.0
#: How long after the daemon starts a device that never had a backup takes its first (start-up is left alone).
FIRST_DELAY_S = 600.0
#: How often the daemon's schedule looks whether a backup is due (or asked for).
POLL_S = 60.0


def request_backup(state_root: Path) -> float:
    """Ask the daemon's schedule for a backup now (the page's "Back up now"): it writes one at its next look, within
    :data:`POLL_S`; returns when it was asked. Raises OSError where the state directory cannot be written."""
    now = time.time()
    atomic_write(Path(state_root) / REQUEST, json.dumps({"time": now}).encode())
    return now


def requested(state_root: Path) -> float | None:
    """When a backup now was asked for and not yet taken (None: it was not)."""
    try:
        data = json.loads((Path(state_root) / REQUEST).read_text())
    except (OSError, ValueError):
        return None
    return float(data["time"]) if isinstance(data, dict) and isinstance(data.get("time"), (int, float)) else None


class BackupSchedule(Worker):
    """The daemon's thread that takes a backup whenever one is due (see the module)."""

    thread_name = "backup"
    background = True  # the photos go first

    def __init__(
        self,
        cfg: AppConfig,
        state_root: Path,
        clock=time.time,
        poll_s: float = POLL_S,
        first_delay_s: float | None = None,
        defer: Callable[[], str | None] = lambda: None,
        on_damaged: Callable[[str, BaseException], None] = lambda name, exc: None,
    ) -> None:
        """``defer()``: why another service takes this state directory's backups (None: this one does);
        ``on_damaged(name, exc)``: told where a backup found a damaged page in a database (:class:`DatabaseDamaged`),
        so the service that writes it puts it right."""
        super().__init__()
        self.defer, self.on_damaged = defer, on_damaged
        self.cfg, self.section, self.state_root = cfg, cfg.backup, Path(state_root)
        self.clock, self.poll_s = clock, poll_s
        self.started = clock()
        self.first_delay_s = FIRST_DELAY_S if first_delay_s is None else first_delay_s
        self.log = get_logger("backup")
        self.running = False
        self.failed: dict | None = None  # {"time", "error", "since"}: the last try failed
        self.taken = 0
        self._lock = threading.Lock()

    def _failure(self, last: dict | None) -> dict | None:
        """The last try's failure, unless a backup was written since (by hand): then it is over."""
        if self.failed and last is not None and last["time"] > self.failed["time"]:
            self.log.info("backup_recovered", failing_since=self.failed["since"], by=last["path"])
            self.failed = None
        return self.failed

    def due(self, now: float) -> bool:
        """Whether a backup should be written now."""
        return not self.defer() and (requested(self.state_root) is not None or now >= self.next_due(now))

    def next_due(self, now: float) -> float:
        """When the next backup is due (a time; ``now`` or before: at the next look): an hour after a failure (or
        ``every_h``, if shorter), ``every_h`` after the last backup (``now`` where the clock was set back since), and
        for a device with none yet :data:`FIRST_DELAY_S` after the start."""
        last = last_backup(self.state_root)
        failed = self._failure(last)
        if failed:
            return failed["time"] + min(RETRY_S, self.section.every_h * 3600)
        if last is None:
            return self.started + self.first_delay_s
        return last["time"] + self.section.every_h * 3600 if last["time"] <= now + 300 else now

    def run_once(self) -> dict | None:
        """Take a backup now; returns what :func:`take` did, or None where it failed (recorded in :attr:`failed`)."""
        with self._lock:
            self.running = True
            asked = requested(self.state_root)
            try:
                done = take(self.cfg, self.state_root, should_stop=self._stop.is_set, now=self.clock())
            except BackupStopped:
                return None
            except Exception as exc:  # noqa: BLE001 - BackupError says what to do; anything else is said too, never kills the thread
                now = self.clock()
                since = self.failed["since"] if self.failed else now
                self.failed = {"time": now, "error": str(exc) if isinstance(exc, BackupError) else repr(exc)[:300], "since": since}
                self.log.error("backup_failed", error=str(exc), failing_since=since)
                if isinstance(exc, DatabaseDamaged):
                    self.on_damaged(exc.name, exc.cause)
                return None
            finally:
                self.running = False
                if asked is not None and requested(self.state_root) == asked:  # answered (a newer request stays)
                    (self.state_root / REQUEST).unlink(missing_ok=True)
            if self.failed:
                self.log.info("backup_recovered", failing_since=self.failed["since"])
            self.failed = None
            self.taken += 1
            self.log.info(
                "backup_written",
                path=done["path"],
                bytes=done["bytes"],
                written=done["written"],
                deleted=done["deleted"],
                shared_deleted=done["shared_deleted"],
            )
            if done["shared_kept"]:
                self.log.warning("backup_shared_files_kept", why=done["shared_kept"])
            if done["changed_unseen"]:
                self.log.warning(
                    "backup_found_files_changed_unseen", files=done["changed_unseen"], problem=changed_unseen(done["changed_unseen"])
                )
            return done

    def status(self) -> dict:
        """What ``status`` and the pages show of the schedule (the last backup itself is in the state's record)."""
        now = self.clock()
        nxt = self.next_due(now)  # (first: a failure a backup by hand has ended is cleared)
        return {
            "dir": self.section.dir,
            "every_h": self.section.every_h,
            "keep": self.section.keep,
            "running": self.running,
            "failed": self.failed,
            "next": nxt,
            "deferred": self.defer(),
            "taken": self.taken,
            "requested": requested(self.state_root),
            "card_suspect": card_suspect(last_backup(self.state_root), time.time()),
        }

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.due(self.clock()):
                self.run_once()


def backup_lines(
    section: BackupSection, last: dict | None, schedule: dict | None, now: float, asked: float | None = None
) -> list[tuple[str, bool]]:
    """What ``status`` and the Health page say of backups, as lines ``(text, warn)``: the last one, the schedule
    (``schedule``: :meth:`BackupSchedule.status` where the daemon runs one; ``asked``: when one was asked for now, if
    the schedule has not said so yet), and what to do where there is none."""
    out: list[tuple[str, bool]] = []
    suspect = card_suspect(last, now)
    if suspect:
        files = suspect["files"]
        out.append(
            (
                f"CARD FAILING: {len(files)} file{'' if len(files) == 1 else 's'} changed on it without being written (e.g. "
                f"{files[0] if files else '?'}), found by a backup {ago(now - suspect['time'])}: put a new card in soon "
                "(edge-agent backup, then edge-agent restore onto the new card)",
                True,
            )
        )
    stale_s = 2 * section.every_h * 3600 if section.dir else 7 * 86400
    if last is None:
        out.append(("no backup taken yet", True))
    else:
        size = f"{last.get('bytes', 0) / 2**20:.0f} MiB"
        if last.get("restored"):
            out.append(
                (f"restored here {ago(now - last['restored'])} from a backup taken {ago(now - last['time'])} ({last['path']})", False)
            )
        else:
            written = last.get("written")
            if isinstance(written, int) and written < last.get("bytes", 0):
                size += f" ({written / 2**20:.0f} MiB written, the rest shared with the backups before it)"
            out.append((f"last backup {ago(now - last['time'])}, {size}: {last['path']}", now - last["time"] > stale_s))
    if not section.dir:
        if last is None or now - last["time"] > stale_s:
            out.append(
                (
                    "a dead SD card loses the season's history and labels: set [backup] dir to a USB stick's folder for a "
                    f"backup every {section.every_h:g} h, or run edge-agent backup --out FILE now and then",
                    True,
                )
            )
        else:
            out.append((f"[backup] dir unset: none is taken on its own every {section.every_h:g} h", False))
        return out
    if schedule is None:
        out.append(
            (
                f"every {section.every_h:g} h into {section.dir} by the daemon: it is not running, or was started before "
                "[backup] dir was set (restart it)",
                True,
            )
        )
        if asked:
            out.append((f"asked for {ago(now - asked)}: written when the daemon runs again", True))
        return out
    asked = schedule.get("requested") or asked
    if schedule.get("deferred"):
        out.append((str(schedule["deferred"]), False))
        return out
    if schedule.get("running"):
        out.append((f"writing one into {section.dir} now", False))
    elif asked:
        out.append((f"asked for {ago(now - asked)}: the daemon writes it within a minute", False))
    else:
        nxt = schedule.get("next") or now
        out.append((f"every {section.every_h:g} h into {section.dir}, the {section.keep} newest kept; next {within(nxt - now)}", False))
    if section.shared_files and section.check_every_days and last and isinstance(last.get("checked"), (int, float)):
        out.append(
            (
                f"every photo and engine on the stick read back whole {ago(now - last['checked'])} (every {section.check_every_days:g} days)",
                False,
            )
        )
    if not section.passphrase_file:
        out.append(("not sealed: the stick holds this device's keys as they are ([backup] passphrase_file seals them)", False))
    failed = schedule.get("failed")
    if failed:
        out.append((f"FAILED {ago(now - failed['time'])}: {failed['error']}; tried again hourly", True))
    return out
