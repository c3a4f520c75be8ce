"""What a storage error means to whoever asked: a full disk, records another process held locked, a damaged
database, a read-only disk or a folder this user may not write, told apart by their codes (SQLite's result code, the
OS's errno), never by their text."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from engines.durable import NO_ROOM, failing_disk, read_only_disk, set_aside

__all__ = [
    "DAMAGED_RECORDS",
    "FAILING_DISK",
    "FULL_DISK",
    "LOCKED",
    "NEARLY_FULL",
    "NO_ROOM",
    "READ_ONLY_DISK",
    "access_problem",
    "damaged_file",
    "disk_problem",
    "open_or_set_aside",
    "storage_problem",
]


#: Free bytes under which a disk counts as full for a database error that carries no code (Python 3.10).
NEARLY_FULL = 4 << 20

#: SQLite's result codes (``sqlite3.SQLITE_*`` from Python 3.11, which also gives an error its ``sqlite_errorcode``).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 5, 6, 8, 10, 11, 13, 26

FULL_DISK = (
    "the device's disk is full: nothing was written. Free space (the Health page and `edge-agent status` say what holds it), then try again"
)
LOCKED = "another process held the device's records locked: nothing was written; try again in a few seconds"
#: What a look says where it met a damaged page of the ledger (:func:`edge_agent.ledger_check.request_check` asked).
DAMAGED_RECORDS = (
    "a page of the device's records is damaged (a failing SD card?): a running daemon reads them whole within seconds "
    "and restarts, and its start keeps every row that can still be read in a new ledger, the damaged one kept beside"
)


#: What ``status`` and the Health page say while the state directory's disk is mounted read-only.
READ_ONLY_DISK = (
    "the state directory's disk is mounted read-only: nothing is recorded, no photo is classified (a failing SD card "
    "remounts itself so: see `dmesg`); take a backup onto another disk now (edge-agent backup --out FILE) and move to a new card"
)

#: What the daemon, ``status`` and every command say where the state directory's disk fails reads and writes (EIO).
FAILING_DISK = (
    "the state directory's disk fails to read or write (an input/output error: an SD card that is dying or was pulled "
    "out; see `dmesg`): nothing more is recorded, the photos are left where they are. Put the card back (and run fsck); "
    "if it fails again, take a backup onto another disk while it still reads (edge-agent backup --out FILE; where some files no "
    "longer read, --salvage takes the rest) and move to a new card"
)


def storage_problem(exc: BaseException, where: str | os.PathLike | None = None) -> Literal["full", "locked", "failing", "damaged"] | None:
    """``"full"`` (no room: SQLite's FULL, ENOSPC, EDQUOT), ``"locked"`` (SQLite's BUSY or LOCKED past the wait),
    ``"failing"`` (the disk fails reads and writes: EIO, or with ``where`` a database error, other than those above,
    where that disk fails :func:`failing_disk`'s probe: SQLite then says "malformed", "disk I/O error" or "unable to
    open"),
    ``"damaged"`` (CORRUPT, NOTADB, or the integrity check's finding), or None: another error. A database error from Python 3.10 carries no code (JetPack
    6's Python), and SQLite says IOERR where a full disk keeps it from making a log's index: with ``where`` (the folder
    the database is in) either counts as ``"full"`` while that disk has less than :data:`NEARLY_FULL` free."""
    code = getattr(exc, "sqlite_errorcode", None)
    code = None if code is None else code & 0xFF  # an extended code (BUSY_SNAPSHOT...) as its primary, as missing_table reads it
    # (an I/O error too: on a full disk SQLite cannot make a database's log index, and says IOERR_SHMSIZE, not FULL)
    if code in (None, _SQLITE_IOERR) and where is not None and isinstance(exc, sqlite3.OperationalError):
        try:
            if shutil.disk_usage(where).free < NEARLY_FULL:
                return "full"
        except OSError:
            pass
    if code == _SQLITE_FULL or (isinstance(exc, OSError) and exc.errno in NO_ROOM):
        return "full"
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return "locked"
    if (isinstance(exc, OSError) and exc.errno == errno.EIO) or (
        isinstance(exc, sqlite3.DatabaseError) and where is not None and failing_disk(where)
    ):
        return "failing"
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or (code is None and type(exc) is sqlite3.DatabaseError):
        return "damaged"  # (Python 3.10 raises CORRUPT and NOTADB as the bare DatabaseError, every disk error as a subclass)
    return None


def access_problem(exc: BaseException, where: str | os.PathLike | None = None) -> str | None:
    """What a command says, in one sentence naming the file and what to do, of an error that is no fault of the disk's
    room or of the records: a file this user may not write (EACCES, EPERM, SQLite's READONLY), a disk mounted
    read-only (EROFS, or any database error where ``where`` lies on such a disk: a failing SD card remounts itself
    so, and SQLite cannot even open a database there whose log lies without its index), or a disk that fails reads
    and writes (EIO, or any database error where ``where``'s disk fails a probe: SQLite then calls a whole ledger
    "malformed"); None for any other error.
    ``where``: the state directory, named where the error names no file."""
    code = getattr(exc, "sqlite_errorcode", None)
    number = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    path = (getattr(exc, "filename", None) if isinstance(exc, OSError) else None) or where or "the state directory"
    if number == errno.EROFS or (isinstance(exc, sqlite3.Error) and where and read_only_disk(where)):
        return f"{path}: {READ_ONLY_DISK}"
    if storage_problem(exc, where) == "failing":
        return f"{path}: {FAILING_DISK}"
    if number in (errno.EACCES, errno.EPERM) or (code is not None and code & 0xFF == _SQLITE_READONLY):
        return (
            f"permission denied: {path}: run it as the service's user (sudo -u edge-agent ...), or give a --state-dir this user may write"
        )
    return None


def disk_problem(where: str | os.PathLike) -> str | None:
    """What to say of the disk under the folder ``where`` after a write there failed: :data:`READ_ONLY_DISK`,
    :data:`FAILING_DISK`, or None (the disk is well: the error was another's)."""
    if read_only_disk(where):
        return READ_ONLY_DISK
    return FAILING_DISK if failing_disk(where) else None


def damaged_file(exc: BaseException, where: str | os.PathLike) -> bool:
    """Whether ``exc``, met opening a database in the folder ``where``, says the file itself is damaged (to be set
    aside and a new one made): what SQLite calls damage (CORRUPT, NOTADB), or an error with no code (the integrity
    check's, or any from Python 3.10) unless the disk is full or read-only; never a full, locked, read-only or failing
    disk (a full card at the first start after an upgrade, which cannot make the new indexes, kept its ledger)."""
    problem = storage_problem(exc, where)
    if problem in ("full", "locked") or access_problem(exc, where):
        return False
    return problem == "damaged" or getattr(exc, "sqlite_errorcode", None) is None


def open_or_set_aside(
    path: Path, open_db: Callable[[], sqlite3.Connection]
) -> tuple[sqlite3.Connection, tuple[Path, sqlite3.DatabaseError] | None]:
    """``open_db()`` (which opens ``path``), or, where the file is damaged (:func:`damaged_file`), the file set aside
    (kept, with its log) and ``open_db()`` again on a new one; returns the connection and, where one was set aside,
    where it was kept and what SQLite said of it. A full, locked, read-only or failing disk is raised, the file as it is."""
    try:
        return open_db(), None
    except sqlite3.DatabaseError as exc:
        if not damaged_file(exc, path.parent):
            raise
        kept = (set_aside(path), exc)
    return open_db(), kept
