"""The results store: every prediction in SQLite (WAL), which is also the exactly-once ledger.

A photo is done when its row is committed; the row is keyed by the photo's
sha256, so a photo seen again after a crash (or a second copy of the same
bytes) is recognised and never produces a second result. The label queue's
index lives in the same database, so a result and its queue entry commit
together.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent._ledger_file import LEDGER_TABLES, forget_closed, missing_table, open_writable, record_closed, unchanged_since_closed
from edge_agent._pool_rows import PUT_DISTANCES, PoolRows
from edge_agent._withdrawn_rows import PUT_SENT, WithdrawnRows
from edge_agent.capture_place import NEAR_M, Place, near_sql, place_of
from edge_agent.ledger_rows import LedgerColumns, QueueEntry, ResultRow, result_record
from edge_agent.storage_errors import damaged_file, storage_problem
from engines.durable import connect_readonly, relocate_rows, set_aside
from engines.errors import EdgeAgentError
from engines.salvage import salvage_file

if TYPE_CHECKING:
    pass

__all__ = ["LedgerUnreadable", "ResultsDB", "missing_table", "query_readonly", "query_snapshot"]


class LedgerUnreadable(EdgeAgentError, sqlite3.OperationalError):
    """A database another process writes could not be read now (locked past the wait, an I/O error): never an empty
    answer, which a page would show as "no photos" and a clean-up pass would take as "nothing to keep"."""


def query_readonly(path: str | Path, sql: str, args: tuple | list = (), timeout: float = 30.0) -> list[tuple]:
    """Rows of ``sql`` (with ``args``) on a database another process is writing (read-only; [] while it does not
    exist yet, or has not yet made the table asked for). Takes no write lock: the writer never waits for a reader.
    Raises :class:`LedgerUnreadable` when the file is there but cannot be read within ``timeout`` seconds."""
    return query_snapshot(path, [(sql, args)], timeout)[0]


def query_snapshot(path: str | Path, queries: Sequence[tuple[str, tuple | list]], timeout: float = 30.0) -> list[list[tuple]]:
    """The rows of each ``(sql, args)`` of ``queries``, all read from one state of the database (one read
    transaction: a write between them is in all or none), as :func:`query_readonly` reads one."""
    if not Path(path).exists():
        return [[] for _ in queries]
    con = connect_readonly(path, timeout)
    try:
        if len(queries) > 1:
            con.execute("BEGIN")
        return [con.execute(sql, args).fetchall() for sql, args in queries]
    except sqlite3.OperationalError as exc:
        if missing_table(con, exc):
            return [[] for _ in queries]
        raise LedgerUnreadable(
            f"{path}: could not be read ({type(exc).__name__}: {exc}); another process may hold it locked: "
            "try again, and if it lasts, see the daemon's log (journalctl -u edge-agent)"
        ) from exc
    finally:
        con.close()


#: A result named by photo id, sha256 prefix (8+ characters) or original path (indexed, tried first).
_REF = "(photo_id = ? OR (sha256 >= ? AND sha256 < ?))"
#: A result named by the path it arrived as (a scan: tried only where :data:`_REF` names none).
_PATH = "path = ?"
#: A result named by its file name alone (a full scan: tried only where :data:`_REF` and :data:`_PATH` name none).
_NAMED = "(length(path) > length(?) AND substr(path, -length(?)) = ? AND substr(path, -length(?) - 1, 1) = '/')"


def _ref_args(ref: str) -> tuple:
    """The parameters of :data:`_REF` for ``ref``: a photo id, or a sha256 prefix of 8 or more characters (any case) as
    the range of hashes it begins (read from the hashes' index, as the photo id is from its own)."""
    prefix = ref.lower() if len(ref) >= 8 else ""
    return (ref, prefix, prefix + "~" if prefix else "")


class ResultsDB(PoolRows, WithdrawnRows):
    """Thread-safe access to ``results.sqlite`` (one connection, serialised by a lock)."""

    def __init__(self, path: str | Path, readonly: bool = False, check: bool = False) -> None:
        """``check``: read the whole file once for damage (SQLite's quick_check) before it is used: the daemon's start
        does where the ledger changed since it was last closed whole (:meth:`open_or_recover`); a label from the page
        or the command line does not (a season's ledger takes about 150 ms a read here, and the daemon has read it)."""
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.Lock()
        self._readers = threading.local()  # per-thread read connections: WAL lets them read while a commit fsyncs
        self._reader_cons: list[sqlite3.Connection] = []  # every one of them, closed with the ledger
        self.damage_seen: str | None = None  # what SQLite said of a damaged page (or a failing disk) met since it was opened
        self.disk_fails = False  # what damage_seen names was the disk failing every read and write (EIO), not a page
        if readonly:
            self._db = connect_readonly(self.path, 10)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = open_writable(self.path, check)
        #: Whether this open read the whole file for damage (the daemon's background check then waits a day).
        self.read_whole = bool(check) and not readonly

    @classmethod
    def open_or_recover(cls, path: str | Path, expected: bool = False) -> tuple["ResultsDB", str | None]:
        """The ledger at ``path``; one that SQLite calls damaged (truncated, or a page a card rotted) is replaced by a
        new one holding every row that can still be read of it (:func:`engines.salvage.salvage_file`: a rotted page
        costs the rows on it), and one found empty where a ledger was ``expected`` (photos were processed) by a new
        one; either is kept beside, with its -wal and -shm. Returns the ledger and what happened (None when nothing
        did), for ``status``. An error of a full, locked, read-only or failing disk (as a new index, made at the first
        start after an upgrade, meets on a full card), anything SQLite does not call damage, is raised, the ledger
        left as it is."""
        path = Path(path)
        existed = path.exists()
        try:
            db = cls(path, check=not unchanged_since_closed(path))
            if not (expected and existed and db.counts()["processed"] == 0):
                return db, None
            db.close()
        except sqlite3.DatabaseError as exc:
            if not damaged_file(exc, path.parent):
                raise  # a full, locked, read-only or failing disk is no damage to the file: it is kept as it is
            aside, found = salvage_file(path, lambda new: open_writable(new, check=False), LEDGER_TABLES)
            lost = "results" in found.unreadable or found.unread.get("results", 0) > 0
            note = (
                f"{path.name} was damaged ({exc}): kept as {aside.name}; a new ledger holds what could be read of it "
                f"({found.describe()})" + ("; the photos of the results lost stay in processed/" if lost else "")
            )
            db = cls(path)
            db.read_whole = True  # (written just now from every page that could be read)
            return db, note
        aside = set_aside(path)
        note = (
            f"{path.name} was empty, although photos were processed: kept as {aside.name}, a new ledger was started; "
            "results from before are not listed (their photos stay in processed/)"
        )
        return cls(path), note

    def close(self) -> None:
        """Close every connection, the threads' readers first: the last to close folds the write-ahead log into
        ``results.sqlite``, so a stopped daemon's ledger is that one file (a copy of it alone holds every result)."""
        with self._lock:
            for con in self._reader_cons:
                con.close()
            self._reader_cons.clear()
            self._db.close()
        if not self.readonly and self.damage_seen is None:
            record_closed(self.path)

    def damaged(self, exc: BaseException) -> bool:
        """Whether ``exc``, met reading or writing this ledger, says a page of it is damaged (SQLite's CORRUPT or
        NOTADB: a card that rots a page keeps the file's size and time) or its disk fails (EIO: nothing can be
        recorded); if so the ledger forgets it was closed whole, so the daemon's next start reads it whole and sets
        it aside where it is damaged (:meth:`open_or_recover`)."""
        problem = storage_problem(exc, self.path.parent)
        if problem not in ("damaged", "failing"):
            return False
        self.damage_seen = f"{type(exc).__name__}: {exc}"
        self.disk_fails = problem == "failing"
        forget_closed(self.path)
        return True

    # ---- writing ---------------------------------------------------------
    def commit(
        self, results: Iterable[ResultRow] = (), queued: Iterable[QueueEntry] = (), distances: Mapping[str, tuple[str, bytes]] | None = None
    ) -> list[bool]:
        """Insert results and queue entries in one transaction, with the ``distances`` (sha256 -> (engine version,
        float32 bytes): the verdict's squared distances to each class) of those that join the review pool. Returns, per
        result, whether it was inserted (False: that photo already had a result, which was left untouched)."""
        inserted = []
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                for r in results:
                    cur.execute(
                        "INSERT OR IGNORE INTO results (sha256, photo_id, path, source, label, confidence, top_k,"
                        " engine_version, timings, created, verdict, plant, verdict_reason, taken, lat, lon)"
                        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (
                            r.sha256,
                            r.photo_id,
                            r.path,
                            r.source,
                            r.label,
                            r.confidence,
                            json.dumps(r.top_k),
                            r.engine_version,
                            json.dumps(r.timings),
                            r.created,
                            r.verdict,
                            r.plant,
                            r.verdict_reason,
                            r.taken,
                            r.lat,
                            r.lon,
                        ),
                    )
                    inserted.append(cur.rowcount == 1)
                for q in queued:
                    cur.execute(
                        "INSERT OR IGNORE INTO label_queue (sha256, photo_id, kind, label, confidence, engine_version,"
                        " file, bytes, created) VALUES (?,?,?,?,?,?,?,?,?)",
                        (q.sha256, q.photo_id, q.kind, q.label, q.confidence, q.engine_version, q.file, q.bytes, q.created),
                    )
                    if q.kind == "review" and distances and q.sha256 in distances and cur.rowcount == 1:
                        cur.execute(PUT_DISTANCES, (q.sha256, *distances[q.sha256]))
                cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        return inserted

    def _rollback(self) -> None:
        """Roll back if a transaction is still open: SQLite has already rolled back after some errors (a full disk),
        and a ROLLBACK then would replace the error that says why with "no transaction is active"."""
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def add_quarantine(self, path: str, moved_to: str | None, reason: str, source: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO quarantine (path, moved_to, reason, source, created) VALUES (?,?,?,?,?)",
                (path, moved_to, reason, source, time.time()),
            )

    def mark_expert(self, sha256: str, label: str, file: str) -> bool:
        """An expert gave a queued photo its true class: it becomes a training label. False where the photo is in no
        queue any more (its label delivered meanwhile; the expert's label is recorded all the same): queue it again."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.execute(
                    "UPDATE label_queue SET kind = 'expert', label = ?, confidence = 1.0, file = ? WHERE sha256 = ?", (label, file, sha256)
                )
                queued = cur.rowcount > 0
                cur.execute("INSERT OR REPLACE INTO expert_labels (sha256, label, labelled) VALUES (?,?,?)", (sha256, label, time.time()))
                cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        return queued

    def remove_queued_entry(self, entry: QueueEntry, first: Callable[[], object] = lambda: None, delivered: bool = False) -> bool:
        """Delete ``entry``'s row only while it is as it was read (not relabelled since, by this process or another),
        calling ``first`` (delete or move its file) inside the same write transaction; False, nothing done, if not.
        ``delivered``: the trainer acknowledged it (a pseudo-label is then recorded in ``pseudo_sent``, to be withdrawn
        should its engine's sure answers of its class be found wrong: :mod:`edge_agent.review.withdraw`)."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                same = cur.execute(
                    "SELECT 1 FROM label_queue WHERE sha256 = ? AND kind = ? AND label IS ? AND file = ?",
                    (entry.sha256, entry.kind, entry.label, entry.file),
                ).fetchone()
                if same:
                    first()
                    cur.execute("DELETE FROM label_queue WHERE sha256 = ?", (entry.sha256,))
                    if delivered and entry.kind == "pseudo":
                        cur.execute(PUT_SENT, (entry.sha256, entry.label, entry.engine_version or "", time.time(), None))
                cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        return same is not None

    def expert_labels_since(self, since: float, until: float = math.inf) -> int:
        """How many photos an expert labelled from ``since`` to before ``until`` (the per-day review budget)."""
        return self._query("SELECT COUNT(*) FROM expert_labels WHERE labelled >= ? AND labelled < ?", (since, until))[0][0]

    def expert_stamp(self) -> tuple[int, float]:
        """(how many expert labels, the newest's time): changes whenever the expert labels or relabels a photo."""
        n, newest = self._query("SELECT COUNT(*), COALESCE(MAX(labelled), 0) FROM expert_labels")[0]
        return int(n), float(newest)

    def plant_answers(self, plant: str) -> list[tuple[list, str]]:
        """Every answer given for ``plant``'s photos, oldest first: (top-k, verdict)."""
        rows = self._query("SELECT top_k, COALESCE(verdict, 'unsure') FROM results WHERE plant = ? ORDER BY id", (plant,))
        return [(json.loads(top_k), verdict) for top_k, verdict in rows]

    def plant_photos(self, plant: str) -> list[tuple[str, float, Place | None]]:
        """Each of ``plant``'s photos, oldest first: (sha256, when it was taken, :attr:`ResultRow.when`, where)."""
        kept = LedgerColumns(self._query)
        when, lat, lon = kept.when, kept.or_null("lat"), kept.or_null("lon")
        rows = self._query(f"SELECT sha256, {when}, {lat}, {lon} FROM results WHERE plant = ? ORDER BY {when}, id", (plant,))
        return [(sha, t, place_of(la, lo)) for sha, t, la, lo in rows]

    def rename_plant(self, old: str, new: str) -> int:
        """Every photo of plant ``old`` made a photo of ``new`` (merged with its photos where it has some); how many."""
        with self._lock:
            return self._db.execute("UPDATE results SET plant = ? WHERE plant = ?", (new, old)).rowcount

    def labels_near(self, place: tuple[float, float], within_m: float, since: float, until: float) -> dict[str, str]:
        """The expert's label of each photo taken within ``within_m`` metres of ``place`` between ``since`` and
        ``until`` (when taken, else classified): sha256 -> class (none from a ledger without places or labels)."""
        kept = LedgerColumns(self._query)
        if not kept.has("lat"):
            return {}
        near, args = near_sql(place, within_m, "r.")
        when = kept.when_of("r.")
        try:
            said = self._query(
                f"SELECT e.sha256, e.label FROM expert_labels e JOIN results r ON r.sha256 = e.sha256 WHERE {near}"
                f" AND {when} BETWEEN ? AND ?",
                (*args, since, until),
            )
        except sqlite3.OperationalError as exc:
            if missing_table(self._db, exc):
                return {}
            raise
        return dict(said)

    def plant_labels(self, plant: str) -> dict[str, str]:
        """The expert's label of each of ``plant``'s photos that has one (sha256 -> class)."""
        try:
            said = self._query(
                "SELECT e.sha256, e.label FROM expert_labels e JOIN results r ON r.sha256 = e.sha256 WHERE r.plant = ?", (plant,)
            )
        except sqlite3.OperationalError as exc:
            if missing_table(self._db, exc):
                return {}  # a ledger older than the table: no labels
            raise
        return dict(said)

    def relocate_queue(self, root: Path) -> int:
        """Queue rows naming a photo under another path of the queue folder (the state directory restored or copied
        elsewhere) are pointed at it under ``root``, so that no queued label is dropped as missing; returns how many."""
        with self._lock:
            return relocate_rows(self._db, "label_queue", "sha256", root)

    # ---- reading ---------------------------------------------------------
    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def has(self, sha256: str) -> bool:
        """Whether a photo already has a result (the exactly-once ledger); never waits for a commit."""
        con = getattr(self._readers, "con", None)
        if con is None:  # (closed by close(), from another thread)
            con = self._readers.con = connect_readonly(self.path)
            with self._lock:
                self._reader_cons.append(con)
        return con.execute("SELECT 1 FROM results WHERE sha256 = ?", (sha256,)).fetchone() is not None

    def results(
        self, since: float | None = None, plant: str | None = None, near: tuple[float, float] | None = None, within_m: float = NEAR_M
    ) -> Iterator[dict]:
        """Every result classified from ``since`` on (only ``plant``'s photos, and those taken within ``within_m``
        metres of ``near``, where given), oldest first, as ``edge-agent results`` prints them."""
        kept = LedgerColumns(self._query)  # read-only, maybe not yet upgraded
        where, args = ["created >= ?"], [since or 0.0]
        if plant:
            where.append(f"{kept.or_null('plant')} = ?")
            args.append(plant)
        if near is not None:
            sql, near_args = near_sql(near, within_m) if kept.has("lat") else ("0", [])  # no places yet: none near
            where.append(sql)
            args += near_args
        rows = self._query(f"SELECT {kept.row_sql()} FROM results WHERE {' AND '.join(where)} ORDER BY id", tuple(args))
        said = self.expert_labels()
        for row in map(ResultRow.from_sql, rows):
            yield result_record(row, said.get(row.sha256))

    def expert_labels(self) -> dict[str, str]:
        """The expert's label of every photo that has one (sha256 -> class; none from a ledger older than the table)."""
        try:
            return dict(self._query("SELECT sha256, label FROM expert_labels"))
        except sqlite3.OperationalError as exc:
            if missing_table(self._db, exc):
                return {}
            raise

    def counts(self) -> dict:
        q = self._query
        return {
            "processed": q("SELECT COUNT(*) FROM results")[0][0],
            "quarantined": q("SELECT COUNT(*) FROM quarantine")[0][0],
            "queued_pseudo_labels": q("SELECT COUNT(*) FROM label_queue WHERE kind = 'pseudo'")[0][0],
            "queued_expert_labels": q("SELECT COUNT(*) FROM label_queue WHERE kind = 'expert'")[0][0],
            "review_queue": q("SELECT COUNT(*) FROM label_queue WHERE kind = 'review'")[0][0],
        }

    def per_class(self) -> dict[str, int]:
        return dict(self._query("SELECT label, COUNT(*) FROM results GROUP BY label ORDER BY label"))

    def per_class_confident(self) -> dict[str, int]:
        """Of each class's answers, those the model was sure of (a result from before verdicts counts as sure)."""
        return dict(self._query("SELECT label, COUNT(*) FROM results WHERE COALESCE(verdict, 'confident') = 'confident' GROUP BY label"))

    def pseudo_counts(self, engine_version: str) -> dict[str, int]:
        return dict(
            self._query(
                "SELECT label, COUNT(*) FROM label_queue WHERE kind = 'pseudo' AND engine_version = ? GROUP BY label", (engine_version,)
            )
        )

    def queued(self, kind: str | None = None) -> list[QueueEntry]:
        sql = "SELECT sha256, photo_id, kind, label, confidence, engine_version, file, bytes, created FROM label_queue"
        rows = self._query(sql + (" WHERE kind = ? ORDER BY created" if kind else " ORDER BY created"), (kind,) if kind else ())
        return [QueueEntry(*r) for r in rows]

    def queued_for_delivery(self, limit: int) -> list[QueueEntry]:
        """Pseudo and expert labels waiting for the trainer, oldest first."""
        rows = self._query(
            "SELECT sha256, photo_id, kind, label, confidence, engine_version, file, bytes, created FROM label_queue"
            " WHERE kind IN ('pseudo', 'expert') ORDER BY created LIMIT ?",
            (limit,),
        )
        return [QueueEntry(*r) for r in rows]

    def queue_entry(self, sha256: str) -> QueueEntry | None:
        rows = self._query(
            "SELECT sha256, photo_id, kind, label, confidence, engine_version, file, bytes, created FROM label_queue WHERE sha256 = ?",
            (sha256,),
        )
        return QueueEntry(*rows[0]) if rows else None

    def last_result_id(self) -> int:
        """The id of the newest result (0: none yet)."""
        return self._query("SELECT COALESCE(MAX(id), 0) FROM results")[0][0]

    def queue_length(self) -> int:
        """Pseudo and expert labels not yet delivered to the trainer."""
        return self._query("SELECT COUNT(*) FROM label_queue WHERE kind IN ('pseudo', 'expert')")[0][0]

    def sources(self) -> list[str]:
        """The sources results came from (``inbox``, ``camera:<source>``, ...)."""
        return [src for (src,) in self._query("SELECT DISTINCT source FROM results")]

    def photos_by_id(self, photo_ids: Collection[str]) -> list[tuple[str, float, str]]:
        """(sha256, created, path or "") of the results with these photo ids."""
        ids = list(photo_ids)[:10000]
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        return self._query(f"SELECT sha256, created, COALESCE(path, '') FROM results WHERE photo_id IN ({marks})", tuple(ids))

    def prune_results(
        self, before: float, source: str | None = None, keep: Collection[str] = (), batch: int = 5000, since: float | None = None
    ) -> int:
        """Delete result rows older than ``before`` (and from ``since`` on, if given; of ``source`` only, if given), except
        those whose sha256 is in ``keep``, in batches (the pipeline's commits wait for one batch at most); returns how
        many went. The newest row always stays: ids are never reused, so a cursor over them (the alerts') never points
        past a new result."""
        where = "id > ? AND created < ? AND id < (SELECT MAX(id) FROM results)"
        where += (" AND source = ?" if source is not None else "") + (" AND created >= ?" if since is not None else "")
        extra = (*((source,) if source is not None else ()), *((since,) if since is not None else ()))
        gone, last = 0, 0
        while True:
            with self._lock:
                rows = self._db.execute(
                    f"SELECT id, sha256 FROM results WHERE {where} ORDER BY id LIMIT ?", (last, before, *extra, batch)
                ).fetchall()
                drop = [(i,) for i, sha in rows if sha not in keep]
                if drop:
                    self._db.execute("BEGIN IMMEDIATE")
                    self._db.executemany("DELETE FROM results WHERE id = ?", drop)
                    self._db.execute("COMMIT")
            gone += len(drop)
            if len(rows) < batch:
                return gone
            last = rows[-1][0]

    def queue_bytes(self) -> int:
        return self._query("SELECT COALESCE(SUM(bytes), 0) FROM label_queue")[0][0]

    def _named(self, ref: str, columns: str = "sha256") -> list[tuple]:
        """``columns`` of the results ``ref`` names (at most two): by photo id, sha256 prefix (8+ characters) or
        original path; failing those, by the file name alone (as ``review list`` and ``results`` show it)."""
        rows = self._query(f"SELECT {columns} FROM results WHERE {_REF} LIMIT 2", _ref_args(ref))
        if not rows and ref:
            rows = self._query(f"SELECT {columns} FROM results WHERE {_PATH} LIMIT 2", (ref,))
        if not rows and ref and "/" not in ref:
            rows = self._query(f"SELECT {columns} FROM results WHERE {_NAMED} LIMIT 2", (ref,) * 4)
        return rows

    def find_result(self, ref: str) -> tuple[str, str, str | None, str, float, str, float] | None:
        """A result by photo id, sha256 prefix (8+ characters), original path or file name: (sha256, photo id, path,
        class, confidence, engine version, when), or None (none, or more than one: :meth:`results_named` says which)."""
        rows = self._named(ref, "sha256, photo_id, path, label, confidence, engine_version, created")
        return tuple(rows[0]) if len(rows) == 1 else None

    def results_named(self, ref: str) -> int:
        """How many results ``ref`` names, up to 2 (:meth:`find_result`): 2 is a name several photos had."""
        return len(self._named(ref))

    def find_queued(self, ref: str) -> QueueEntry | None:
        """A queue entry by photo id or sha256 prefix, or by what names its result (:meth:`find_result`)."""
        columns = "sha256, photo_id, kind, label, confidence, engine_version, file, bytes, created"
        rows = self._query(
            f"SELECT {columns} FROM label_queue WHERE photo_id = ? OR sha256 LIKE ? LIMIT 2", (ref, ref + "%" if len(ref) >= 8 else "\0")
        )
        if not rows:
            named = self._named(ref)
            rows = self._query(f"SELECT {columns} FROM label_queue WHERE sha256 = ?", named[0]) if len(named) == 1 else []
        return QueueEntry(*rows[0]) if len(rows) == 1 else None
