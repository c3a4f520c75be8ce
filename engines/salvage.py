"""What can still be read of a damaged SQLite file, copied into a new one: a page a card rots costs the rows on it,
not the season's.

A table's rows are read by ranges of rowid, each found from the table's own tree, so a damaged index costs nothing
(the new file rebuilds it) and a damaged leaf costs only the rows it held; a range that fails is halved until the
rowids that cannot be read are found. The damaged file is only read (opened read-only), never changed.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engines.durable import fsync_dir, set_aside

__all__ = ["Salvage", "salvage_file", "salvage_rows"]

#: Rowids read at a time; a range that fails is halved down to one rowid.
_CHUNK = 1024
#: What :func:`_seek` says where the table's tree cannot be read on the way.
_UNREADABLE = object()
#: Where a table's highest rowid cannot be read: stop after this many ranges in a row that hold nothing readable.
_EMPTY_RUN = 64


@dataclass
class Salvage:
    """What :func:`salvage_rows` copied: rows kept per table, and rows lost (as an index that reads whole counts the
    table's rows; where none does, the rowids that could not be read: an upper bound)."""

    kept: dict[str, int] = field(default_factory=dict)
    unread: dict[str, int] = field(default_factory=dict)
    #: Tables whose rows lost an index counted (the others' is an upper bound).
    counted: set[str] = field(default_factory=set)
    #: Tables whose layout could not be read at all (the file's first page, or the table's root, damaged).
    unreadable: list[str] = field(default_factory=list)

    @property
    def lossless(self) -> bool:
        """Whether every row of every table was read (the damage lay in indexes, or in pages no row lives on)."""
        return not self.unreadable and not any(self.unread.values())

    def describe(self) -> str:
        """One clause saying what was kept and what was lost, for a log line or a status note."""
        parts = []
        for table, n in self.kept.items():
            lost = self.unread.get(table, 0)
            if not n and not lost:
                continue  # (an empty table: nothing to say)
            bound = "" if table in self.counted else "at most "
            parts.append(f"{table}: {n} rows kept" + (f", {bound}{lost} lost" if lost else ""))
        parts += [f"{table}: nothing readable" for table in self.unreadable]
        return "; ".join(parts) or "no rows"


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in con.execute(f'PRAGMA table_info("{table}")')]


def salvage_rows(src: str | Path, dst: sqlite3.Connection, tables: Sequence[str]) -> Salvage:
    """Copy every row of ``tables`` that can be read from the SQLite file ``src`` into ``dst`` (tables already made
    there; the columns both have, rowids kept, a row ``dst``'s constraints refuse counted as lost) in one transaction."""
    found = Salvage()
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    try:
        dst.execute("BEGIN IMMEDIATE")
        for table in tables:
            try:
                theirs = _columns(source, table)
            except sqlite3.DatabaseError:  # the file's schema (its first page) cannot be read
                found.unreadable.append(table)
                continue
            columns = [c for c in theirs if c in set(_columns(dst, table))]
            if not columns:
                continue  # (a table this file never had: one from before it was added)
            kept, unread, counted = _copy_table(source, dst, table, columns)
            if counted:
                found.counted.add(table)
            if kept == 0 and unread == 0 and _unreadable(source, table):
                found.unreadable.append(table)  # (its root is damaged: no range could be read)
                continue
            found.kept[table], found.unread[table] = kept, unread
        dst.execute("COMMIT")
    except BaseException:
        if dst.in_transaction:
            dst.execute("ROLLBACK")
        raise
    finally:
        source.close()
    return found


def salvage_file(
    path: str | Path,
    make: Callable[[Path], sqlite3.Connection],
    tables: Sequence[str],
    keep_if: Callable[[Salvage], bool] = lambda found: True,
) -> tuple[Path | None, Salvage]:
    """Replace the damaged SQLite file ``path`` with a new one holding what can be read of ``tables``: the new file is
    made beside it (``make(path)`` opens a file with its tables), filled (:func:`salvage_rows`) and closed first, and
    only then is the damaged one set aside (kept, with its -wal and -shm) and the new one put in its place, so a
    failure on the way (a full disk) leaves ``path`` as it was. Where ``keep_if`` refuses what was read, nothing
    changes. Returns where the damaged file went (None: it stayed) and what was read."""
    path = Path(path)
    new = path.with_name(f"{path.name}.salvage")
    _remove(new)  # (left by a salvage that was stopped)
    try:
        con = make(new)
        try:
            found = salvage_rows(path, con, tables)
        finally:
            con.close()  # the last connection folds its write-ahead log into the file
        if not keep_if(found):
            _remove(new)
            return None, found
    except BaseException:
        _remove(new)
        raise
    aside = set_aside(path)
    os.replace(new, path)
    fsync_dir(path.parent)
    wal = Path(f"{aside}-wal")
    if not wal.exists() or wal.stat().st_size == 0:  # (made empty by the read above: the file alone is the copy)
        for suffix in ("-wal", "-shm"):
            Path(f"{aside}{suffix}").unlink(missing_ok=True)
    return aside, found


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _copy_table(source: sqlite3.Connection, dst: sqlite3.Connection, table: str, columns: list[str]) -> tuple[int, int, bool]:
    names = ", ".join(f'"{c}"' for c in columns)
    select = f'SELECT rowid, {names} FROM "{table}" WHERE rowid BETWEEN ? AND ?'
    insert = f'INSERT OR IGNORE INTO "{table}" (rowid, {names}) VALUES ({", ".join("?" * (len(columns) + 1))})'
    listed = _listed_rowids(source, table)
    try:
        top = source.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0] or 0
    except sqlite3.DatabaseError:  # the tree's right edge is damaged: an index says where it ends, else read on until
        top = listed[1] if listed else None  # nothing more is found
    kept = unread = unread_before_last = 0
    first = _seek(source, table)
    start, empty_run = first if isinstance(first, int) else 1, 0
    while (start <= top) if top is not None else (empty_run < _EMPTY_RUN):
        rows, failed = _read_range(source, select, start, start + _CHUNK - 1)
        kept += sum(dst.execute(insert, row).rowcount for row in rows)
        unread += failed
        if rows:
            empty_run, unread_before_last = 0, unread
        else:
            empty_run += 1
        start += _CHUNK
        if not rows and not failed:  # rowids never used or deleted (retention's): the tree says where its next row is
            after = _seek(source, table, start - 1)
            if after is None:
                break  # (the tree holds nothing past here)
            if after is not _UNREADABLE:
                start = max(start, after)
    if listed:  # an index that reads whole names every row the table had
        return kept, max(0, listed[0] - kept), True
    if top is None:  # rowids past the last row read may never have been used: not counted as lost
        unread = unread_before_last
    return kept, unread, False


def _seek(source: sqlite3.Connection, table: str, after: int = -(2**63)) -> int | None | object:
    """The table's first rowid after ``after``, as its own tree says: None where it holds none, ``_UNREADABLE``
    where the pages on the way cannot be read."""
    try:
        (found,) = source.execute(f'SELECT min(rowid) FROM "{table}" WHERE rowid > ?', (after,)).fetchone()
    except sqlite3.DatabaseError:
        return _UNREADABLE
    return found


def _listed_rowids(source: sqlite3.Connection, table: str) -> tuple[int, int] | None:
    """How many rows ``table`` had and its highest rowid, as the first of its full indexes that reads whole says."""
    try:
        indexes = [row[1] for row in source.execute(f'PRAGMA index_list("{table}")') if not row[4]]  # (no partial one)
    except sqlite3.DatabaseError:
        return None
    for index in indexes:
        try:
            return tuple(source.execute(f'SELECT count(*), coalesce(max(rowid), 0) FROM "{table}" INDEXED BY "{index}"').fetchone())
        except sqlite3.DatabaseError:
            continue
    return None


def _unreadable(source: sqlite3.Connection, table: str) -> bool:
    try:
        source.execute(f'SELECT * FROM "{table}" NOT INDEXED LIMIT 1').fetchall()
    except sqlite3.DatabaseError:
        return True
    return False


def _read_range(source: sqlite3.Connection, select: str, low: int, high: int) -> tuple[list, int]:
    """The rows of rowids ``low``..``high`` that can be read, and how many rowids could not be."""
    try:
        return source.execute(select, (low, high)).fetchall(), 0
    except sqlite3.DatabaseError:
        if low == high:
            return [], 1
    middle = (low + high) // 2
    rows_low, failed_low = _read_range(source, select, low, middle)
    rows_high, failed_high = _read_range(source, select, middle + 1, high)
    return rows_low + rows_high, failed_low + failed_high
