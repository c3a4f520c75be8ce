"""The alerts ledger and the outbox: every alert raised, and every message not yet delivered, on disk.

A message stays in the outbox until its destination took it (an MQTT broker's PUBACK, a webhook's 2xx), across
restarts; a failed attempt waits twice as long as the one before, up to ``retry_max_s``. The outbox's files take at
most about ``quota_bytes`` of disk (its log included): past that the oldest messages of the least important kind go
first (results, then state, then alerts), and the count of what was dropped is kept and shown, never hidden. A file
SQLite cannot read, at the start or later, is kept aside and a new one started, so neither a start nor the alerts stop on it.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from edge_agent.alerts.rules import Candidate
from edge_agent.storage_errors import open_or_set_aside, storage_problem
from engines.durable import check_whole, connect_writable, set_aside
from engines.errors import EdgeAgentError

__all__ = ["DeliveryError", "PartialDelivery", "Message", "Outbox", "PRIORITY"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY,
    result_id INTEGER NOT NULL,
    created REAL NOT NULL,
    device TEXT NOT NULL,
    label TEXT NOT NULL,
    confidence REAL NOT NULL,
    verdict TEXT NOT NULL,
    photo_id TEXT NOT NULL,
    sha256 TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS alerts_class ON alerts(label, device, created);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY,
    dest TEXT NOT NULL,
    kind TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    created REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_try REAL NOT NULL,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox(dest, next_try);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

#: What the quota drops first (lowest first).
PRIORITY = {"result": 0, "health": 1, "engine": 1, "state": 1, "digest": 2, "alert": 3}


class DeliveryError(EdgeAgentError):
    """A destination did not take a message (a dead broker or endpoint, a refusal); it stays in the outbox."""


class PartialDelivery(DeliveryError):
    """A destination took the first messages of a batch (``done``, their ids) and then failed on the next."""

    def __init__(self, message: str, done: list[int]) -> None:
        super().__init__(message)
        self.done = done


@dataclass(frozen=True)
class Message:
    id: int
    dest: str
    kind: str
    topic: str
    payload: bytes
    qos: int
    retain: bool
    created: float
    attempts: int


class Outbox:
    """One SQLite file (``alerts.sqlite`` in the state directory), used from the alert worker and the web process."""

    def __init__(self, path: str | Path, quota_bytes: int, retry_max_s: float = 300.0) -> None:
        self.path = Path(path)
        self.quota_bytes = quota_bytes
        self.retry_max_s = retry_max_s
        self._lock = threading.Lock()
        #: What was done about a file SQLite could not read (None: nothing), for the daemon's status.
        self.recovered: str | None = None
        self._db, kept = open_or_set_aside(self.path, self._open)  # a truncated, overwritten or rotted file
        if kept is not None:
            self._said_aside(kept[0], f"unreadable ({kept[1]})")

    def _said_aside(self, aside: Path, why: str) -> None:
        """Say in :attr:`recovered` that the file was kept as ``aside``, and why."""
        self.recovered = (
            f"{self.path.name} was {why}: kept as {aside.name}, a new outbox was started; alerts not yet delivered then "
            "are in the old file, and the quiet period starts afresh"
        )

    def renew_if_damaged(self, exc: BaseException) -> bool:
        """Where ``exc`` (met by a round of the worker or a courier) says a page is damaged and this outbox's own check
        agrees (the error may have been the ledger's), set it aside and start a new one, as a start would; returns
        whether it did. Before, every round failed on the page until the daemon was restarted, and no alert went out."""
        if storage_problem(exc) != "damaged":
            return False
        with self._lock:
            try:
                self._db.execute("PRAGMA shrink_memory")  # read the pages from the disk, not from the cache
                check_whole(self._db)
                return False
            except sqlite3.DatabaseError:
                pass
            self._db.close()
            self._said_aside(set_aside(self.path), f"found damaged ({exc})")
            self._db = self._open()
        return True

    def _open(self) -> sqlite3.Connection:
        db = connect_writable(self.path)
        try:
            if db.execute("PRAGMA page_count").fetchone()[0] == 0:  # a new file: freed pages go back to the disk
                db.execute("PRAGMA auto_vacuum = INCREMENTAL")
            db.execute("PRAGMA journal_mode=WAL")
            # the quota is of disk, not of payloads: the log is checkpointed often and cut back to a tenth of it
            db.execute(f"PRAGMA journal_size_limit = {max(64 << 10, self.quota_bytes // 10)}")
            db.execute(f"PRAGMA wal_autocheckpoint = {max(16, self.quota_bytes // 10 // 4096)}")
            db.executescript(SCHEMA)
            check_whole(db)  # a rotted page (at most queue_mb: milliseconds)
        except BaseException:
            db.close()
            raise
        return db

    def disk_bytes(self) -> int:
        """What the outbox's files take on disk (the database and its log)."""
        return sum(Path(f"{self.path}{s}").stat().st_size for s in ("", "-wal") if Path(f"{self.path}{s}").exists())

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- state: the results cursor, counters ------------------------------------
    def get(self, key: str, default: str = "") -> str:
        with self._lock:
            row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO state (key, value) VALUES (?, ?)", (key, value))

    def _bump(self, key: str, by: int) -> None:
        self._db.execute(
            "INSERT INTO state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + ?",
            (key, str(by), by),
        )

    # ---- alerts -----------------------------------------------------------------
    def last_alert(self, label: str, device: str) -> float | None:
        with self._lock:
            row = self._db.execute("SELECT MAX(created) FROM alerts WHERE label = ? AND device = ?", (label, device)).fetchone()
        return row[0]

    def record(self, c: Candidate, messages: list[tuple[str, str, str, bytes, int, bool]], cursor: int) -> int:
        """Record an alert and queue its messages ``(dest, kind, topic, payload, qos, retain)`` and move the results
        cursor, in one transaction: a crash leaves either all of it or none. Returns the alert's id."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute(
                    "INSERT INTO alerts (result_id, created, device, label, confidence, verdict, photo_id, sha256) VALUES (?,?,?,?,?,?,?,?)",
                    (c.result_id, c.created, c.device, c.label, c.confidence, c.verdict, c.photo_id, c.sha256),
                )
                self._put(messages)
                self._db.execute("INSERT OR REPLACE INTO state (key, value) VALUES ('cursor', ?)", (str(cursor),))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return cur.lastrowid

    def alerts_since(self, since: float, until: float = math.inf) -> int:
        """How many alerts were raised from ``since`` to before ``until``."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM alerts WHERE created >= ? AND created < ?", (since, until)).fetchone()[0]

    def alerts(self, since: float = 0.0, limit: int = 100) -> list[dict]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, result_id, created, device, label, confidence, verdict, photo_id FROM alerts WHERE created >= ? "
                "ORDER BY id DESC LIMIT ?",
                (since, limit),
            ).fetchall()
        keys = ("id", "result_id", "created", "device", "label", "confidence", "verdict", "photo_id")
        return [dict(zip(keys, r)) for r in rows]

    # ---- the outbox -------------------------------------------------------------
    def put(self, messages: list[tuple[str, str, str, bytes, int, bool]], cursor: int | None = None) -> None:
        """Queue messages ``(dest, kind, topic, payload, qos, retain)`` (and move the results cursor) atomically."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._put(messages)
                if cursor is not None:
                    self._db.execute("INSERT OR REPLACE INTO state (key, value) VALUES ('cursor', ?)", (str(cursor),))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _put(self, messages: list[tuple[str, str, str, bytes, int, bool]]) -> None:
        now = time.time()
        self._db.executemany(
            "INSERT INTO outbox (dest, kind, topic, payload, qos, retain, created, next_try) VALUES (?,?,?,?,?,?,?,?)",
            [(d, k, t, bytes(p), q, int(r), now, now) for d, k, t, p, q, r in messages],
        )
        self._enforce_quota()

    def _enforce_quota(self) -> None:
        """Past the quota, the least important messages go. What the payloads may take is the quota less what the
        file's pages and the rows' overhead already take beyond the payloads themselves, so the file stays within it."""
        used = self._db.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM outbox").fetchone()[0]
        if used <= self.quota_bytes // 2:
            return
        page = self._db.execute("PRAGMA page_size").fetchone()[0]
        pages, free = self._db.execute("PRAGMA page_count").fetchone()[0], self._db.execute("PRAGMA freelist_count").fetchone()[0]
        overhead = max(0, (pages - free) * page - used)
        room = max(self.quota_bytes // 4, self.quota_bytes * 8 // 10 - overhead)  # a fifth kept for the log
        if used <= room:
            return
        order = " ".join(f"WHEN '{k}' THEN {p}" for k, p in PRIORITY.items())
        rows = self._db.execute(f"SELECT id, LENGTH(payload) FROM outbox ORDER BY CASE kind {order} ELSE 1 END, id").fetchall()
        drop = []
        for row_id, size in rows:
            if used <= room:
                break
            drop.append((row_id,))
            used -= size
        self._db.executemany("DELETE FROM outbox WHERE id = ?", drop)
        self._bump("dropped", len(drop))
        self._db.execute("PRAGMA incremental_vacuum")

    def due(self, dest: str, limit: int = 50, now: float | None = None) -> list[Message]:
        """The oldest messages for ``dest`` whose next attempt is due: also those set further ahead than any wait, by a
        clock since set back (they would otherwise wait until it caught up: months of alerts held)."""
        now = time.time() if now is None else now
        with self._lock:
            rows = self._db.execute(
                "SELECT id, dest, kind, topic, payload, qos, retain, created, attempts FROM outbox WHERE dest = ? "
                "AND (next_try <= ? OR next_try > ?) ORDER BY id LIMIT ?",
                (dest, now, now + self.retry_max_s, limit),
            ).fetchall()
        return [Message(r[0], r[1], r[2], r[3], bytes(r[4]), r[5], bool(r[6]), r[7], r[8]) for r in rows]

    def retry_now(self, dest: str) -> None:
        """Make every message for ``dest`` due now (its peer came back)."""
        with self._lock:
            self._db.execute("UPDATE outbox SET next_try = ? WHERE dest = ? AND next_try > ?", (time.time(), dest, time.time()))

    def delivered(self, ids: list[int], dest: str) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
            self._bump(f"sent:{dest}", len(ids))
            self._db.execute("COMMIT")
            self._db.execute("PRAGMA incremental_vacuum")  # the delivered messages' pages back to the disk

    def failed(self, ids: list[int], dest: str, error: str) -> float:
        """Count a failed attempt; each message waits 2^attempts seconds (up to ``retry_max_s``). Returns the wait (never
        more than ``retry_max_s``)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_try = ? + MIN(?, (1 << MIN(attempts, 20))) WHERE id = ?",
                [(error[:500], time.time(), self.retry_max_s, i) for i in ids],
            )
            self._bump(f"failed:{dest}", len(ids))
            self._db.execute("COMMIT")
            row = self._db.execute("SELECT MIN(next_try) FROM outbox WHERE dest = ?", (dest,)).fetchone()
        return min(self.retry_max_s, max(0.0, (row[0] or time.time()) - time.time()))

    def counts(self) -> dict:
        """Pending messages per destination, bytes held, and the sent / failed / dropped counters."""
        with self._lock:
            pending = dict(self._db.execute("SELECT dest, COUNT(*) FROM outbox GROUP BY dest").fetchall())
            used = self._db.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM outbox").fetchone()[0]
            state = dict(self._db.execute("SELECT key, value FROM state").fetchall())
        counters = {k: int(v) for k, v in state.items() if k.startswith(("sent:", "failed:")) or k == "dropped"}
        out = {"pending": pending, "bytes": used, "disk_bytes": self.disk_bytes(), "quota_bytes": self.quota_bytes, **counters}
        return out | ({"recovered": self.recovered} if self.recovered else {})
