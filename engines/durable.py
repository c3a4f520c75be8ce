"""Crash-safe file writing shared by the store, the plan cache and the daemon's queues, bounded reading of files a user
names, the services' SQLite connections (safe from another user's look and readable on a read-only disk), and whether
a disk is read-only or failing."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path, PurePath

__all__ = [
    "NO_ROOM",
    "check_whole",
    "fsync_dir",
    "fsync_file",
    "atomic_write",
    "read_at_most",
    "sync_filesystem",
    "set_aside",
    "moved_here",
    "file_now",
    "relocate_rows",
    "replace_row_file",
    "connect_readonly",
    "connect_writable",
    "read_only_disk",
    "failing_disk",
]

#: The errnos of a write the disk had no room for (a full disk, a user's quota spent).
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def read_at_most(path: str | os.PathLike, limit: int) -> bytes | None:
    """The bytes of ``path``, or None where it holds more than ``limit`` (``/dev/zero`` or a photo named by mistake is
    not read to the end); OSError as ``open`` raises it."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def sync_filesystem(path: str | os.PathLike, files: list[Path] | None = None) -> None:
    """Make everything written on ``path``'s filesystem durable with one syncfs(2) (Linux), a barrier for a
    whole batch of files; where syncfs is unavailable, fsync ``files`` (None: every file under the folder ``path``)
    and their directories one by one."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    if files is None:
        files = [f for f in Path(path).rglob("*") if f.is_file()]
    for f in files:
        fsync_file(f)
    for d in {Path(f).parent for f in files}:
        fsync_dir(d)


def atomic_write(path: str | os.PathLike, data: bytes, durable: bool = True, mode: int | None = None) -> Path:
    """Write ``data`` to a temporary name beside ``path``, then rename it into place.

    A reader sees the old file or the complete new one. With ``durable`` the
    data and the rename are fsynced. ``mode``: the file's permissions from its
    first byte on (else the umask's). On failure the temporary file is removed
    and the error raised.
    """
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        if mode is not None:
            tmp.unlink(missing_ok=True)
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
            os.chmod(tmp, mode)  # whatever the umask
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def check_whole(con: sqlite3.Connection) -> None:
    """Read every page of ``con``'s database once (SQLite's quick_check); a damaged one (a card that rots a page keeps
    the file's size and time) raises the bare :class:`sqlite3.DatabaseError` SQLite's CORRUPT comes as, saying where."""
    found = con.execute("PRAGMA quick_check(1)").fetchone()[0]
    if found != "ok":
        raise sqlite3.DatabaseError("integrity check: " + " ".join(found.split()))


def set_aside(path: str | os.PathLike, tag: str = "corrupt") -> Path:
    """Move a file that cannot be read (an SQLite file with its ``-wal`` and ``-shm``) to ``<name>.<tag>-<time>`` beside it,
    kept for a look, so a new one can be started; returns where it went."""
    import time

    path = Path(path)
    stamp = f"{path.name}.{tag}-{time.strftime('%Y%m%d-%H%M%S')}"
    aside, n = path.with_name(stamp), 1
    while any(Path(f"{aside}{suffix}").exists() for suffix in ("", "-wal", "-shm")):  # set aside twice in a second
        n += 1
        aside = path.with_name(f"{stamp}-{n}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            os.replace(src, Path(f"{aside}{suffix}"))
    return aside


def moved_here(stored: str, root: str | os.PathLike, parts: int = 2) -> Path | None:
    """Where the file a database row names as ``stored`` lies under ``root`` now (its last ``parts`` path parts kept),
    when that is another place than ``stored`` and the file is there: the state directory was restored or copied to
    another path (a copy must not read or delete the original's files), or a relative one is opened from another
    working directory. None: the row needs no change, or the file is gone."""
    here = Path(root).joinpath(*PurePath(stored).parts[-parts:])
    if os.path.abspath(here) == os.path.abspath(stored) or not here.is_file():
        return None
    return here


def file_now(stored: str, root: str | os.PathLike) -> Path:
    """The file a row names as ``stored``, read from here: where :func:`moved_here` finds it under ``root``, else as
    the row names it (a reader that may not point the row at it: a command, the page)."""
    return moved_here(stored, root) or Path(stored)


def relocate_rows(db, table: str, key: str, root: str | os.PathLike) -> int:
    """Point the ``file`` column of ``table``'s rows (SQLite connection ``db``, rows named by ``key``) at the photos
    under ``root`` where :func:`moved_here` finds them elsewhere than recorded; returns how many rows changed."""
    rows = db.execute(f"SELECT {key}, file FROM {table}").fetchall()
    moved = [(str(here), k) for k, f in rows if (here := moved_here(f, root)) is not None]
    if moved:
        db.executemany(f"UPDATE {table} SET file = ? WHERE {key} = ?", moved)
    return len(moved)


def replace_row_file(
    db, lock, table: str, key: str, row_id: str, old: str, new: str | os.PathLike, data: bytes, size_column: str = ""
) -> bool:
    """Write ``data`` durably at ``new`` and point ``table``'s row ``row_id`` (named by ``key``; SQLite connection
    ``db`` used under ``lock``) at it where the row still names the file ``old``, which is then removed if another;
    True where it did. A row deleted or moved meanwhile keeps what it has and ``new`` is removed, so no file is left
    without its row and no row without its file. ``size_column``: a column that holds the file's bytes, set too."""
    new = Path(new)
    atomic_write(new, data)
    size = f", {size_column} = {len(data)}" if size_column else ""
    with lock:
        done = db.execute(f"UPDATE {table} SET file = ?{size} WHERE {key} = ? AND file = ?", (str(new), row_id, old)).rowcount == 1
    if not done:  # (where ``new`` is ``old``, no row names it any longer: the row is gone)
        new.unlink(missing_ok=True)
    elif os.path.abspath(new) != os.path.abspath(old):
        Path(old).unlink(missing_ok=True)
    return done


def connect_writable(path: str | os.PathLike) -> sqlite3.Connection:
    """A read-write connection to the SQLite database ``path`` (autocommit, any thread, waiting up to 30 s for a lock),
    after removing the empty write-ahead log and index that a reader running as another user left beside it.

    SQLite makes ``-wal`` and ``-shm`` as whoever opens a database in WAL mode first; where a closed writer left none,
    a read-only look by another member of the service's group (``edge-agent status`` while the daemon is stopped)
    makes them as that user, and the writer's next start could read but never write ("attempt to write a readonly
    database" on its first result). A log with content (commits not yet folded in) is never removed."""
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    try:
        stale = (not wal.exists() or wal.stat().st_size == 0) and any(p.exists() and not os.access(p, os.W_OK) for p in (wal, shm))
        if stale:
            shm.unlink(missing_ok=True)
            wal.unlink(missing_ok=True)
    except OSError:  # (a folder this user cannot change: SQLite's own error says what it says)
        pass
    return sqlite3.connect(path, check_same_thread=False, timeout=30, isolation_level=None)


def read_only_disk(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies on a disk mounted read-only (as an SD card that is failing remounts itself)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def failing_disk(path: str | os.PathLike) -> OSError | None:
    """The input/output error (EIO) the disk under the folder ``path`` gives a small file written to it, flushed and
    read back, as an SD card that is dying or was pulled out does; None where it takes it whole or fails otherwise
    (full, read-only, no such folder)."""
    probe = Path(path) / f".disk-probe-{os.getpid()}"
    try:
        try:
            fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            try:
                os.write(fd, b"edge-agent")
                os.fsync(fd)
            finally:
                os.close(fd)
            probe.read_bytes()
        finally:
            probe.unlink(missing_ok=True)
    except OSError as exc:
        return exc if exc.errno == errno.EIO else None
    return None


def connect_readonly(path: str | os.PathLike, timeout: float = 30.0) -> sqlite3.Connection:
    """A read-only connection to the SQLite database ``path`` (any thread), opened as immutable where its disk is
    mounted read-only and no write-ahead log with content lies beside it: SQLite cannot open a WAL database read-only
    on such a disk without its index, and there nothing can change it (a failing SD card: ``status``, the page and the
    backup still read a ledger its daemon closed)."""
    wal = Path(f"{path}-wal")
    frozen = read_only_disk(Path(path).parent) and (not wal.exists() or wal.stat().st_size == 0)
    return sqlite3.connect(f"file:{path}?mode=ro{'&immutable=1' if frozen else ''}", uri=True, timeout=timeout, check_same_thread=False)
