"""Reads of a database another process writes: a missing table reads as empty, a locked file is an error, never []."""

from __future__ import annotations

import sqlite3

import pytest

from edge_agent.results import LedgerUnreadable, missing_table, query_readonly


@pytest.fixture
def held(tmp_path):
    """A WAL database with one row, and a writer that then holds it in exclusive mode (as a stuck writer would)."""
    path = tmp_path / "results.sqlite"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE results (x)")
    writer.execute("INSERT INTO results VALUES (1)")
    yield path, writer
    writer.close()


def test_a_database_without_the_table_asked_for_reads_as_empty_and_one_with_it_reads_its_rows(held):
    path, _ = held
    assert query_readonly(path, "SELECT x FROM results") == [(1,)]
    assert query_readonly(path, "SELECT x FROM alerts") == []  # the daemon has not made that table yet
    assert query_readonly(path.with_name("absent.sqlite"), "SELECT 1") == []


def test_a_locked_database_raises_ledger_unreadable_naming_the_file_instead_of_reading_as_empty(held):
    path, writer = held
    writer.execute("PRAGMA locking_mode=EXCLUSIVE")
    writer.execute("INSERT INTO results VALUES (2)")  # takes the lock and keeps it
    with pytest.raises(LedgerUnreadable, match="results.sqlite: could not be read") as err:
        query_readonly(path, "SELECT x FROM results", timeout=0.2)
    assert isinstance(err.value, sqlite3.OperationalError)  # code that caught SQLite's errors still does
    writer.close()  # the lock goes with the writer; the rows stay
    assert query_readonly(path, "SELECT x FROM results ORDER BY x") == [(1,), (2,)]


def test_without_sqlites_error_code_python_3_10_tells_a_missing_table_from_a_lock_by_reading_the_schema(held):
    path, writer = held
    bare = sqlite3.OperationalError("no error code, as Python 3.10 raises it")

    def missing() -> bool:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.2)
        try:
            return missing_table(con, bare)
        finally:
            con.close()

    assert missing()  # the schema reads: the statement failed on what the file lacks
    writer.execute("PRAGMA locking_mode=EXCLUSIVE")
    writer.execute("INSERT INTO results VALUES (3)")
    assert not missing()  # the schema does not read: the file is locked
