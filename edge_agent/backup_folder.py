"""A backup into a folder (a USB stick, a NAS share), as the daemon's schedule and ``edge-agent backup`` write them:
this device's ``keep`` newest kept there, their photos and engines shared (:mod:`edge_agent._backup_files`) and read
back from the stick, and nothing else in the folder touched.

A backup is never written where it cannot be whole; each of these is a :class:`~edge_agent.backup.BackupError` that
says what to do: a folder that is not there (a stick not plugged in: it is never created, which would fill the SD card
under the mount point), a folder on the state directory's own disk (a mount point with no stick in it), a folder this
process may not write (read-only, another user's, or one the systemd unit does not open: ``edge-agent
install-systemd`` opens ``[backup] dir``), or too little room after deleting this device's oldest backups there (its
newest is always kept). Files there that are not this device's backups
(``edge-agent-<device>-<YYYYmmdd-HHMMSS>.tar.gz[.sealed]``) or its shared files are never touched. Every
``check_every_days`` the shared files the newest backup names are read back whole; a damaged one is deleted, with
that day's backup, and written again by the next.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import getpass
import os
import re
import shutil
import socket
import time
from pathlib import Path

from edge_agent._backup_files import SharedFiles, referenced, shared_root
from edge_agent._backup_seal import SUFFIX, Unsealer, read_passphrase
from edge_agent.backup import BackupError, BackupStopped, backup, last_backup, write_record
from edge_agent.config import AppConfig, BackupSection
from edge_agent.restore import read_manifest

__all__ = ["LOCK", "device_name", "own_backups", "take"]

#: The lock file in the state directory held while a backup of it is written into a folder (``*.lock``: never backed up).
LOCK = "backup.lock"
#: Room left beside a backup's planned bytes for tar's headers and the manifest.
_SLACK = 1 << 20
_NAME = re.compile(r"edge-agent-(?P<device>[A-Za-z0-9_.-]+)-(?P<when>\d{8}-\d{6})\.tar\.gz(?:\.sealed)?")


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
    with _one_at_a_time(state_root, should_stop, folder / f".edge-agent-{device}.{LOCK}"):
        return _take(cfg, state_root, folder, device, passphrase, should_stop, now)


@contextlib.contextmanager
def _one_at_a_time(state_root: Path, should_stop, beside: Path):
    """Held while a backup of ``state_root`` is written into a folder: the daemon's and one asked for by hand wait
    for each other (either's clean-up would delete the shared files the other has written and not yet named). Its
    file is in the state directory; where that disk is mounted read-only and holds none (a failing card), ``beside``
    in the backups' folder, where every backup of it then looks."""
    try:
        fd = os.open(state_root / LOCK, os.O_RDONLY | os.O_CREAT, 0o644)  # (read-only: one a root's backup made serves too)
    except OSError as exc:
        if exc.errno != errno.EROFS:
            raise
        fd = os.open(beside, os.O_RDONLY | os.O_CREAT, 0o600)
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
        "changed_unseen": manifest.get("changed_unseen", []),
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
