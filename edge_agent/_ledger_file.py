"""The ledger's file: its tables, the upgrade of a ledger from before, and the record of a clean close that spares a
clean restart reading a season's ledger whole."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from engines.durable import atomic_write, check_whole, connect_writable

__all__ = [
    "CLOSED",
    "LEDGER_TABLES",
    "SCHEMA",
    "forget_closed",
    "missing_table",
    "open_writable",
    "record_closed",
    "unchanged_since_closed",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY,
    sha256 TEXT NOT NULL UNIQUE,
    photo_id TEXT NOT NULL,
    path TEXT,
    source TEXT NOT NULL,
    label TEXT NOT NULL,
    confidence REAL NOT NULL,
    top_k TEXT NOT NULL,
    engine_version TEXT NOT NULL,
    timings TEXT NOT NULL,
    created REAL NOT NULL,
    verdict TEXT
);
CREATE INDEX IF NOT EXISTS results_created ON results(created);
CREATE TABLE IF NOT EXISTS quarantine (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    moved_to TEXT,
    reason TEXT NOT NULL,
    source TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS label_queue (
    sha256 TEXT PRIMARY KEY,
    photo_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('pseudo', 'review', 'expert')),
    label TEXT,
    confidence REAL,
    engine_version TEXT,
    file TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS label_queue_kind ON label_queue(kind, engine_version, label);
CREATE TABLE IF NOT EXISTS unlabelled_sent (
    sha256 TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    verdict TEXT NOT NULL,
    sent REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS unlabelled_sent_time ON unlabelled_sent(sent);
CREATE TABLE IF NOT EXISTS expert_labels (
    sha256 TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    labelled REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS pool_distances (
    sha256 TEXT PRIMARY KEY,
    engine_version TEXT NOT NULL,
    distances BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS pseudo_sent (
    sha256 TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    engine_version TEXT NOT NULL,
    sent REAL NOT NULL,
    withdrawn REAL,
    confirmed REAL
);
CREATE INDEX IF NOT EXISTS pseudo_sent_class ON pseudo_sent(label, engine_version);
CREATE TABLE IF NOT EXISTS withdraw_seen (
    sha256 TEXT PRIMARY KEY,
    labelled REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS pool_answers (
    sha256 TEXT PRIMARY KEY,
    engine_version TEXT NOT NULL,
    label TEXT NOT NULL,
    confidence REAL NOT NULL,
    top_k TEXT NOT NULL,
    verdict TEXT,
    verdict_reason TEXT,
    answered REAL NOT NULL
);
"""

#: The ledger's tables, in the order a damaged ledger's rows are copied into a new one (:mod:`engines.salvage`).
LEDGER_TABLES = (
    "results",
    "quarantine",
    "label_queue",
    "unlabelled_sent",
    "expert_labels",
    "pool_distances",
    "pool_answers",
    "pseudo_sent",
    "withdraw_seen",
)


def open_writable(path: Path, check: bool) -> sqlite3.Connection:
    """``path`` opened to write (WAL, every commit synced), its tables made and a ledger from before upgraded (the
    columns and indexes added since); with ``check``, read whole once for damage (SQLite's quick_check)."""
    db = connect_writable(path)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # a committed result survives a power cut
        had_seen = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'withdraw_seen'").fetchone()
        db.executescript(SCHEMA)
        if not had_seen:  # a ledger from before withdrawals: the expert's labels so far withdraw nothing
            db.execute("INSERT OR IGNORE INTO withdraw_seen (sha256, labelled) SELECT sha256, labelled FROM expert_labels")
        columns = {row[1] for row in db.execute("PRAGMA table_info(results)")}
        if "verdict" not in columns:  # a ledger from before verdicts: its rows keep NULL
            db.execute("ALTER TABLE results ADD COLUMN verdict TEXT")
        if "plant" not in columns:  # a ledger from before plants: its photos stand alone
            db.execute("ALTER TABLE results ADD COLUMN plant TEXT")
        if "verdict_reason" not in columns:  # a ledger from before reasons were kept: its rows keep NULL
            db.execute("ALTER TABLE results ADD COLUMN verdict_reason TEXT")
        if "taken" not in columns:  # a ledger from before capture times: its photos count as taken when classified
            db.execute("ALTER TABLE results ADD COLUMN taken REAL")
        for name in ("lat", "lon"):  # a ledger from before places: its photos have none
            if name not in columns:
                db.execute(f"ALTER TABLE results ADD COLUMN {name} REAL")
        db.execute("CREATE INDEX IF NOT EXISTS results_when ON results(COALESCE(taken, created))")  # the Photos page's days
        db.execute("CREATE INDEX IF NOT EXISTS results_place ON results(lat) WHERE lat IS NOT NULL")  # photos near a place
        # the Map's newest photos with a place, and how many have one, read from these alone (a farm may have none)
        db.execute("CREATE INDEX IF NOT EXISTS results_placed ON results(id) WHERE lat IS NOT NULL AND lon IS NOT NULL")
        db.execute("DROP INDEX IF EXISTS results_plant")  # (plant alone, before 2026-12-04: the one below serves)
        db.execute("CREATE INDEX IF NOT EXISTS results_plant_created ON results(plant, created) WHERE plant IS NOT NULL")
        # counts by class and verdict (the Photos, Map and Diseases pages, /metrics) read this, not a season's rows
        db.execute("CREATE INDEX IF NOT EXISTS results_label_verdict ON results(label, verdict)")
        db.execute("CREATE INDEX IF NOT EXISTS results_photo_id ON results(photo_id)")  # a photo named by its id
        # where each class was found (the Diseases page): the sure answers alone, with what it reads of them
        db.execute(
            "CREATE INDEX IF NOT EXISTS results_sure ON results(label, plant, COALESCE(taken, created), sha256) WHERE verdict = 'confident'"
        )
        if check:  # a truncated file passes the above
            check_whole(db)
    except BaseException:
        db.close()
        raise
    return db


#: Beside ``results.sqlite``: what ``stat`` said of it when the last connection closed it whole (no write-ahead log
#: left), so the daemon's next start reads it whole for damage only where it changed since (a power cut, a card that
#: cut it short, a copy or a restore), not after every clean restart (seconds from a Pi's card at a season's end).
CLOSED = ".closed.json"


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def record_closed(path: Path) -> None:
    """Record ``path`` as closed whole, where no write-ahead log is left beside it (another process may still use it)."""
    try:
        if not Path(f"{path}-wal").exists():
            atomic_write(Path(f"{path}{CLOSED}"), json.dumps(_stat_key(path)).encode())
    except OSError:  # a full or read-only disk: the next start reads it whole, as before
        pass


def unchanged_since_closed(path: Path) -> bool:
    """Whether ``path`` is as its last close left it whole: no write-ahead log with content beside it and the same
    size, mtime and inode as recorded then."""
    wal = Path(f"{path}-wal")
    try:
        if wal.exists() and wal.stat().st_size > 0:  # (an empty one: a reader's since, as `status` leaves)
            return False
        return json.loads(Path(f"{path}{CLOSED}").read_text()) == _stat_key(path)
    except (OSError, ValueError):
        return False


def forget_closed(path: Path) -> None:
    """Forget that ``path`` was closed whole, once damage was seen in it: the daemon's next start reads it whole, finds
    the damage and sets it aside (a card that rots a page keeps the file's size and time, so the record still matched)."""
    try:
        Path(f"{path}{CLOSED}").unlink(missing_ok=True)
    except OSError:  # a read-only card: the start cannot set anything aside there either
        pass


def missing_table(con: sqlite3.Connection, exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` says the statement asked for a table or column the file does not have yet (SQLite's generic
    SQLITE_ERROR), not that the file could not be read (busy, locked, I/O)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF == sqlite3.SQLITE_ERROR
    try:  # Python 3.10: a file whose schema reads now failed on what it lacks
        con.execute("PRAGMA schema_version").fetchall()
    except sqlite3.Error:
        return False
    return True
