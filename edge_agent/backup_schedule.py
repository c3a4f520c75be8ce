"""Backups on their own: the daemon writes one into ``[backup] dir`` (a USB stick, a NAS share) every ``every_h``
hours and keeps the ``keep`` newest of this device's there, so a dead SD card costs a farm a day of its season, not
the season; ``status``, the Health page, ``/metrics`` and the health alerts say when the last one was taken, and why
one failed.

A backup is written by :func:`edge_agent.backup.backup` in a thread of the daemon at the lowest CPU priority (the
photos go on being classified), sealed where ``[backup] passphrase_file`` names a passphrase. It is never written
where it cannot be whole; each of these is a failure, said and tried again hourly: a folder that is not there (a
stick not plugged in: it is never created, which would fill the SD card under the mount point), a folder on the
state directory's own disk (a mount point with no stick in it), a folder this process may not write (read-only,
another user's, or one the systemd unit does not open: ``edge-agent install-systemd`` opens ``[backup] dir``), or
too little room after deleting this device's oldest backups there (its newest is always kept). Files there that are
not this device's backups (``edge-agent-<device>-<YYYYmmdd-HHMMSS>.tar.gz[.sealed]``) are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edge_agent._backup_files import SharedFiles, referenced, shared_root
from edge_agent._backup_seal import SUFFIX, Unsealer, read_passphrase
from edge_agent.backup import REQUEST, BackupError, BackupStopped, backup, last_backup, write_record
from edge_agent.config import AppConfig, BackupSection
from edge_agent.log import get_logger
from edge_agent.restore import read_manifest
from edge_agent.worker import Worker
from engines.durable import atomic_write

__all__ = ["BackupSchedule", "POLL_S", "backup_lines", "device_name", "own_backups", "request_backup", "requested", "take"]

#: How long after a failure the next try waits (or ``every_h``, if shorter).
RETRY_S = 3600.0
#: How long after the daemon starts a device that never had a backup takes its first (start-up is left alone).
FIRST_DELAY_S = 600.0
#: How often the daemon's schedule looks whether a backup is due (or asked for).
POLL_S = 60.0
#: The lock file in the state directory held while a backup of it is written into a folder (``*.lock``: never backed up).
LOCK = "backup.lock"
#: Room left beside a backup's planned bytes for tar's headers and the manifest.
_SLACK = 1 << 20
_NAME = re.compile(r"edge-agent-(?P<device>[A-Za-z0-9_.-]+)-(?P<when>\d{8}-\d{6})\.tar\.gz(?:\.sealed)?")


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


def device_name() -> str:
    """This device's name in its backups' file names: the host name, with anything but letters, digits, ``_.-`` as ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname()) or "device"


def own_backups(folder: Path, device: str) -> list[Path]:
    """This device's backups in ``folder``, oldest first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    ours = [n for n in names if (m := _NAME.fullmatch(n)) and m["device"] == device]
    return [folder / n for n in sorted(ours, key=lambda n: _NAME.fullmatch(n)["when"])]


def _same_disk(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


def _unwritable(folder: Path) -> str | None:
    """Why this process may not write into ``folder`` (None where it may)."""
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return (
            "is read-only here: mounted read-only, or, under systemd, not a folder the service may write (run "
            "sudo edge-agent install-systemd again after setting [backup] dir, then restart edge-agent)"
        )
    return (
        f"may not be written by the user {getpass.getuser()}: mount the stick for it (uid=edge-agent in /etc/fstab, "
        "docs/operations.md) or give it the folder"
    )


def take(cfg: AppConfig, state_root: Path, should_stop=lambda: False, device: str | None = None, now: float | None = None) -> dict:
    """Write one backup into ``[backup] dir`` (its photos and engines shared with this device's other backups there,
    unless ``shared_files`` is off) and delete this device's older ones beyond ``keep`` and the shared files no backup
    left names; returns ``{"path", "bytes", "written", "deleted", "shared_deleted", "shared_freed", "shared_kept"}``
    (``bytes``: what it restores; ``shared_kept``: why no shared file could be deleted); raises :class:`BackupError`
    naming the folder and what to do, having deleted nothing but to make room (this device's oldest backups there,
    never its newest)."""
    section = cfg.backup
    folder = Path(section.dir).expanduser()
    device = device or device_name()
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist: is the USB stick or share plugged in and mounted?"
        raise BackupError(f"{folder} {what} ([backup] dir)")
    if _same_disk(folder, state_root):
        raise BackupError(
            f"{folder} is on the state directory's own disk, where a backup dies with the card: is the USB stick or share "
            "mounted there? ([backup] dir)"
        )
    why = _unwritable(folder)
    if why:
        raise BackupError(f"{folder} {why}")
    passphrase = read_passphrase(section.passphrase_file) if section.passphrase_file else None
    with _one_at_a_time(state_root, should_stop):
        return _take(cfg, state_root, folder, device, passphrase, should_stop, now)


@contextlib.contextmanager
def _one_at_a_time(state_root: Path, should_stop):
    """Held while a backup of ``state_root`` is written into a folder: the daemon's and one asked for by hand wait
    for each other (either's clean-up would delete the shared files the other has written and not yet named)."""
    fd = os.open(state_root / LOCK, os.O_RDONLY | os.O_CREAT, 0o644)  # (read-only: one a root's backup made serves too)
    with os.fdopen(fd) as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if should_stop():
                    raise BackupStopped(f"{state_root}: stopped while another backup of it was being written") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _take(cfg: AppConfig, state_root: Path, folder: Path, device: str, passphrase: bytes | None, should_stop, now) -> dict:
    """:func:`take` once its checks have passed and it holds the lock."""
    section = cfg.backup
    unsealer = Unsealer(passphrase) if passphrase else None
    shared = shared_root(folder, device) if section.shared_files else None
    deleted: list[str] = []
    freed, kept = [0, 0], [None]  # shared files and bytes deleted; why none could be (a backup there unreadable)
    ours = own_backups(folder, device)

    def collect(planned: set[str]) -> None:
        """Delete the shared files no backup left names (nor this one will); none while one of them cannot be read."""
        if shared is None:
            return
        try:
            names = referenced(ours, lambda p: read_manifest(p, unsealer))
        except BackupError as exc:  # its shared files are kept until it is deleted itself
            kept[0] = str(exc)
            return
        kept[0] = None
        files, size = SharedFiles(shared).collect(names | planned)
        freed[0], freed[1] = freed[0] + files, freed[1] + size

    def room(need: int, planned: set[str]) -> None:
        """Make room for ``need`` more bytes: this device's oldest backups deleted first, never its newest."""
        need += _SLACK
        usage = shutil.disk_usage(folder)
        while usage.free < need and len(ours) > 1:
            oldest = ours.pop(0)
            oldest.unlink(missing_ok=True)
            deleted.append(oldest.name)
            collect(planned)
            usage = shutil.disk_usage(folder)
        if usage.free < need:
            raise BackupError(
                f"{folder} has {usage.free >> 20} MiB free, a backup needs about {need >> 20} MiB more: free space there, or "
                "point [backup] dir at a larger disk"
            )

    for stale in folder.glob(f".tmp-*-edge-agent-{device}-*.tar.gz*"):  # half-written by a daemon killed mid-backup
        stale.unlink(missing_ok=True)
    suffix = ".tar.gz" + (SUFFIX if passphrase else "")
    out = folder / f"edge-agent-{device}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}{suffix}"
    manifest = backup(cfg, state_root, out, section.photos, should_stop, passphrase, shared=shared, room=room)
    ours = own_backups(folder, device)
    for old in [p for p in ours[: -section.keep] if p != out]:  # (the clock set back: it sorts first)
        old.unlink(missing_ok=True)
        deleted.append(old.name)
    ours = own_backups(folder, device)
    collect(set())
    checked = None
    if shared is not None and section.check_every_days:
        checked = _check_shared(state_root, out, manifest, SharedFiles(shared, unsealer=unsealer), section, should_stop, now)
    return {
        "path": str(out),
        "bytes": manifest["bytes"],
        "written": manifest["written"],
        "deleted": deleted,
        "shared_deleted": freed[0],
        "shared_freed": freed[1],
        "shared_kept": kept[0],
        "checked": checked,
    }


def _check_shared(state_root: Path, out: Path, manifest: dict, files: SharedFiles, section: BackupSection, should_stop, now) -> int | None:
    """Every ``check_every_days``, read back from the stick every shared file the backup ``out`` just written names
    (a stick can damage what it held well when written); the record keeps when they last all read back whole. Returns
    how many were read (None: not due, or stopped); raises :class:`BackupError` where some are damaged: those are
    deleted, and ``out`` with them (it names them), so the next backup, an hour later, writes them again."""
    now = time.time() if now is None else now
    record = last_backup(state_root) or {}
    last = record.get("checked") if isinstance(record.get("checked"), (int, float)) else None
    if last is not None and last <= now and now - last < section.check_every_days * 86400:
        return None
    named = {m["shared"]: m["sha256"] for m in manifest["files"].values() if isinstance(m, dict) and "shared" in m}
    bad = files.damaged(named, should_stop)
    if bad is None:
        return None
    if bad:
        for name in bad:
            (files.root / name).unlink(missing_ok=True)
        out.unlink(missing_ok=True)
        raise BackupError(
            f"{len(bad)} of the {len(named)} photos and engines this device's backups keep in {files.root} read back damaged "
            f"from the stick (e.g. {bad[0]}): deleted, with the backup just written; the next backup writes them again. A "
            "stick that damages files again is failing, or holds less than it claims: replace it"
        )
    write_record(state_root, record | {"checked": now})
    return len(named)


class BackupSchedule(Worker):
    """The daemon's thread that takes a backup whenever one is due (see the module)."""

    thread_name = "backup"

    def __init__(
        self,
        cfg: AppConfig,
        state_root: Path,
        clock=time.time,
        poll_s: float = POLL_S,
        first_delay_s: float | None = None,
        defer: Callable[[], str | None] = lambda: None,
    ) -> None:
        """``defer()``: why another service takes this state directory's backups (None: this one does)."""
        super().__init__()
        self.defer = defer
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
        }

    def _run(self) -> None:
        try:  # the photos go first: this thread (only) at the lowest CPU priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        while not self._stop.wait(self.poll_s):
            if self.due(self.clock()):
                self.run_once()


def _span(seconds: float) -> str:
    if seconds < 5400:
        return f"{max(1, round(seconds / 60))} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def _ago(seconds: float) -> str:
    return "just now" if seconds < 60 else f"{_span(seconds)} ago"


def _within(seconds: float) -> str:
    return "at the next look" if seconds < 60 else f"in {_span(seconds)}"


def backup_lines(
    section: BackupSection, last: dict | None, schedule: dict | None, now: float, asked: float | None = None
) -> list[tuple[str, bool]]:
    """What ``status`` and the Health page say of backups, as lines ``(text, warn)``: the last one, the schedule
    (``schedule``: :meth:`BackupSchedule.status` where the daemon runs one; ``asked``: when one was asked for now, if
    the schedule has not said so yet), and what to do where there is none."""
    out: list[tuple[str, bool]] = []
    stale_s = 2 * section.every_h * 3600 if section.dir else 7 * 86400
    if last is None:
        out.append(("no backup taken yet", True))
    else:
        size = f"{last.get('bytes', 0) / 2**20:.0f} MiB"
        if last.get("restored"):
            out.append(
                (f"restored here {_ago(now - last['restored'])} from a backup taken {_ago(now - last['time'])} ({last['path']})", False)
            )
        else:
            written = last.get("written")
            if isinstance(written, int) and written < last.get("bytes", 0):
                size += f" ({written / 2**20:.0f} MiB written, the rest shared with the backups before it)"
            out.append((f"last backup {_ago(now - last['time'])}, {size}: {last['path']}", now - last["time"] > stale_s))
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
            out.append((f"asked for {_ago(now - asked)}: written when the daemon runs again", True))
        return out
    asked = schedule.get("requested") or asked
    if schedule.get("deferred"):
        out.append((str(schedule["deferred"]), False))
        return out
    if schedule.get("running"):
        out.append((f"writing one into {section.dir} now", False))
    elif asked:
        out.append((f"asked for {_ago(now - asked)}: the daemon writes it within a minute", False))
    else:
        nxt = schedule.get("next") or now
        out.append((f"every {section.every_h:g} h into {section.dir}, the {section.keep} newest kept; next {_within(nxt - now)}", False))
    if section.shared_files and section.check_every_days and last and isinstance(last.get("checked"), (int, float)):
        out.append(
            (
                f"every photo and engine on the stick read back whole {_ago(now - last['checked'])} (every {section.check_every_days:g} days)",
                False,
            )
        )
    if not section.passphrase_file:
        out.append(("not sealed: the stick holds this device's keys as they are ([backup] passphrase_file seals them)", False))
    failed = schedule.get("failed")
    if failed:
        out.append((f"FAILED {_ago(now - failed['time'])}: {failed['error']}; tried again hourly", True))
    return out
