"""A storage error is told apart by its codes: a full disk, records locked, a damaged database, or something else."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from edge_agent.storage_errors import storage_problem


def _db_error(code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("(the text is never read)")
    exc.sqlite_errorcode = code  # as Python 3.11 sets it
    return exc


@pytest.mark.parametrize(
    "code, problem",
    [
        (13, "full"),
        (5, "locked"),
        (517, "locked"),
        (6, "locked"),
        (262, "locked"),
        (11, "damaged"),
        (267, "damaged"),
        (26, "damaged"),
        (1, None),
    ],
)
def test_a_database_error_is_read_by_its_primary_code_extended_ones_included(code, problem):
    assert storage_problem(_db_error(code)) == problem


def test_no_room_on_the_disk_is_a_full_disk_and_another_os_error_is_not():
    assert storage_problem(OSError(errno.ENOSPC, "No space left on device")) == "full"
    assert storage_problem(OSError(errno.EDQUOT, "Disk quota exceeded")) == "full"
    assert storage_problem(PermissionError(errno.EACCES, "Permission denied")) is None


def test_an_io_error_on_a_nearly_full_disk_is_a_full_disk_and_on_one_with_room_is_not(tmp_path, monkeypatch):
    """On a full disk SQLite cannot make a database's log index and says IOERR_SHMSIZE (4874), not FULL (seen on a
    tmpfs filled to its last byte): it was taken for damage, and a whole ledger set aside."""
    from collections import namedtuple

    import edge_agent.storage_errors as storage_errors

    usage = namedtuple("usage", "total used free")
    free = {"bytes": 1 << 20}
    monkeypatch.setattr(storage_errors.shutil, "disk_usage", lambda p: usage(1 << 30, (1 << 30) - free["bytes"], free["bytes"]))
    assert storage_problem(_db_error(4874), tmp_path) == "full"
    assert storage_problem(_db_error(4874)) is None  # (where the disk is not known)
    free["bytes"] = 1 << 30
    assert storage_problem(_db_error(4874), tmp_path) is None
