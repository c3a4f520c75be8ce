"""The ledger's rows of the review pool: the photos waiting for the expert, their newest answers and distances, the
checks read from them, the pool's photos that become pseudo-labels, and those handed to the trainer unlabelled.

:class:`PoolRows` is a part of :class:`edge_agent.results.ResultsDB` (its connection, lock and reads), kept in a
module of its own beside it.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

from edge_agent._ledger_file import missing_table
from edge_agent.ledger_rows import Arrival, LedgerColumns, QueueEntry

if TYPE_CHECKING:
    import numpy as np

    from edge_agent.classifier import Prediction

__all__ = ["PoolRows", "PUT_DISTANCES"]

#: A review-pool photo's distances kept (its first queuing's, or the engine in service's once it answers it again).
PUT_DISTANCES = "INSERT OR REPLACE INTO pool_distances (sha256, engine_version, distances) VALUES (?,?,?)"

#: ``pool_answers`` as a ledger from before it reads (no rows).
_NO_ANSWERS = "(SELECT NULL AS sha256, NULL AS engine_version, NULL AS label, NULL AS confidence, NULL AS top_k, NULL AS verdict WHERE 0)"


def _top_k_json(p: Prediction) -> str:
    """A prediction's top-k as the ledger keeps it."""
    return json.dumps([list(t) for t in p.top_k])


class PoolRows:
    """The review pool's rows of the ledger (a part of :class:`edge_agent.results.ResultsDB`)."""

    _db: sqlite3.Connection
    _lock: threading.Lock
    _query: Callable[..., list[tuple]]
    _rollback: Callable[[], None]

    def expert_checks(self) -> list[tuple[str, str | None, str, float, str, str, float]]:
        """Every expert label beside the model's answer to that photo (the newest, where the engine in service answered
        it again in the review pool): (its class, its verdict, the expert's class, its confidence, the photo's sha256,
        the engine version that answered, when the expert labelled it), newest label first."""
        return self._answered(
            "SELECT COALESCE(a.label, r.label), CASE WHEN a.sha256 IS NULL THEN r.verdict ELSE a.verdict END, e.label,"
            " COALESCE(a.confidence, r.confidence), e.sha256, COALESCE(a.engine_version, r.engine_version), e.labelled"
            " FROM expert_labels e JOIN results r ON r.sha256 = e.sha256 LEFT JOIN {answers} a ON a.sha256 = e.sha256"
            " ORDER BY e.labelled DESC"
        )

    def review_pool(self) -> list[tuple[QueueEntry, list, str | None, Arrival]]:
        """Photos waiting for review, each with the top-k and the verdict of its newest prediction (the engine in
        service's, once it has answered the photo again: :mod:`edge_agent.review.reanswer`), and how it arrived."""
        kept = LedgerColumns(self._query)  # read-only, maybe not yet upgraded
        later = ", ".join(kept.or_null(c, "r.") for c in ("taken", "lat", "lon"))
        rows = self._answered(
            "SELECT q.sha256, q.photo_id, q.kind, q.label, q.confidence, q.engine_version, q.file, q.bytes, q.created,"
            " COALESCE(a.top_k, r.top_k, '[]'), CASE WHEN a.sha256 IS NULL THEN r.verdict ELSE a.verdict END,"
            f" r.path, r.source, r.plant, r.created, {later} FROM label_queue q LEFT JOIN results r ON r.sha256 = q.sha256"
            " LEFT JOIN {answers} a ON a.sha256 = q.sha256 AND a.engine_version = q.engine_version WHERE q.kind = 'review'"
        )
        return [(QueueEntry(*r[:9]), json.loads(r[9]), r[10], Arrival(*r[11:18])) for r in rows]

    def pool_distances(self) -> list[tuple[str, np.ndarray, bool]]:
        """What the typical order clusters (:mod:`edge_agent.review.typical`): for each photo of the review pool and
        each the expert labelled, the verdict's squared distances to each class that it was queued with, and whether
        the expert labelled it ([] from a ledger not yet upgraded)."""
        import numpy as np

        try:
            rows = self._query(
                "SELECT d.sha256, d.distances, e.sha256 IS NOT NULL FROM pool_distances d"
                " LEFT JOIN expert_labels e ON e.sha256 = d.sha256"
                " LEFT JOIN label_queue q ON q.sha256 = d.sha256 AND q.kind = 'review'"
                " WHERE e.sha256 IS NOT NULL OR q.sha256 IS NOT NULL"
            )
        except sqlite3.OperationalError as exc:
            if missing_table(self._db, exc):
                return []
            raise
        return [(sha, np.frombuffer(blob, np.float32), bool(labelled)) for sha, blob, labelled in rows]

    def forget_left_pool(self) -> int:
        """Drop the distances and newer answers kept of photos that left the review pool unlabelled (pruned, handed
        over); how many rows."""
        gone = "sha256 NOT IN (SELECT sha256 FROM label_queue WHERE kind = 'review') AND sha256 NOT IN (SELECT sha256 FROM expert_labels)"
        dropped = 0
        for table in ("pool_distances", "pool_answers"):
            if self._query(f"SELECT 1 FROM {table} WHERE {gone} LIMIT 1"):  # (no write, most minutes)
                with self._lock:
                    dropped += self._db.execute(f"DELETE FROM {table} WHERE {gone}").rowcount
        return dropped

    def answered_before(self, version: str, limit: int, skip: Collection[str] = ()) -> list[QueueEntry]:
        """Up to ``limit`` photos of the review pool whose answer is not engine ``version``'s, newest first, but those
        in ``skip``."""
        rows = self._query(
            "SELECT sha256, photo_id, kind, label, confidence, engine_version, file, bytes, created FROM label_queue"
            " WHERE kind = 'review' AND engine_version IS NOT ? ORDER BY created DESC LIMIT ?",
            (version, limit + len(skip)),
        )
        return [e for e in (QueueEntry(*r) for r in rows) if e.sha256 not in skip][:limit]

    def record_answers(self, answers: Iterable[tuple[QueueEntry, Prediction]]) -> int:
        """Each review-pool photo's new answer (its entry as read, the prediction), in one transaction: its queue row
        takes the answer's class, confidence and version, and the answer's top-k, verdict and distances are kept
        beside; a photo labelled or gone since it was read is left as it is. How many were recorded."""
        now, recorded = time.time(), 0
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                for e, p in answers:
                    cur.execute(
                        "UPDATE label_queue SET label = ?, confidence = ?, engine_version = ? WHERE sha256 = ? AND kind = 'review'"
                        " AND label IS ? AND engine_version IS ?",
                        (p.label, p.confidence, p.engine_version, e.sha256, e.label, e.engine_version),
                    )
                    if cur.rowcount != 1:
                        continue
                    recorded += 1
                    cur.execute(
                        "INSERT OR REPLACE INTO pool_answers (sha256, engine_version, label, confidence, top_k, verdict,"
                        " verdict_reason, answered) VALUES (?,?,?,?,?,?,?,?)",
                        (e.sha256, p.engine_version, p.label, p.confidence, _top_k_json(p), p.verdict, p.verdict_reason, now),
                    )
                    if p.distances is not None:
                        cur.execute(PUT_DISTANCES, (e.sha256, p.engine_version, p.distances.astype("float32").tobytes()))
                    else:  # (an engine whose verdict is on the logits: the older version's distances say nothing now)
                        cur.execute("DELETE FROM pool_distances WHERE sha256 = ?", (e.sha256,))
                cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        return recorded

    def _answered(self, sql: str, args: tuple = ()) -> list[tuple]:
        """Rows of ``sql`` with ``{answers}`` read as the review pool's newer answers (``pool_answers``), or as none
        where a ledger not yet upgraded has no such table (a reader's, before the daemon's start upgrades it)."""
        try:
            return self._query(sql.replace("{answers}", "pool_answers"), args)
        except sqlite3.OperationalError as exc:
            if not missing_table(self._db, exc):
                raise
        return self._query(sql.replace("{answers}", _NO_ANSWERS), args)

    def unlabelled_candidates(self, limit: int) -> list[tuple[QueueEntry, str]]:
        """Review-pool photos not yet handed to the trainer unlabelled, newest first, each with its newest verdict."""
        rows = self._answered(
            "SELECT q.sha256, q.photo_id, q.kind, q.label, q.confidence, q.engine_version, q.file, q.bytes, q.created,"
            " COALESCE(CASE WHEN a.sha256 IS NULL THEN r.verdict ELSE a.verdict END, 'unsure') FROM label_queue q"
            " LEFT JOIN results r ON r.sha256 = q.sha256 LEFT JOIN {answers} a ON a.sha256 = q.sha256 AND a.engine_version = q.engine_version"
            " WHERE q.kind = 'review' AND q.sha256 NOT IN (SELECT sha256 FROM unlabelled_sent) ORDER BY q.created DESC LIMIT ?",
            (limit,),
        )
        return [(QueueEntry(*r[:9]), r[9]) for r in rows]

    def mark_unlabelled_sent(self, sha256: str, label: str, verdict: str) -> None:
        """The trainer acknowledged ``sha256`` as an unlabelled photo (counted in the day's quota, never sent again)."""
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO unlabelled_sent (sha256, label, verdict, sent) VALUES (?,?,?,?)",
                (sha256, label, verdict, time.time()),
            )

    def prune_unlabelled_sent(self, before: float, since: float = -math.inf) -> int:
        """Forget the unlabelled photos handed over from ``since`` to before ``before``, but those still in the review
        pool (they would be handed over again); how many rows went."""
        with self._lock:
            return self._db.execute(
                "DELETE FROM unlabelled_sent WHERE sent >= ? AND sent < ?"
                " AND sha256 NOT IN (SELECT sha256 FROM label_queue WHERE kind = 'review')",
                (since, before),
            ).rowcount

    def unlabelled_sent_since(self, since: float, until: float = math.inf) -> dict[tuple[str, str], int]:
        """(class, verdict) -> unlabelled photos the trainer acknowledged from ``since`` to before ``until``."""
        rows = self._query(
            "SELECT label, verdict, COUNT(*) FROM unlabelled_sent WHERE sent >= ? AND sent < ? GROUP BY 1, 2", (since, until)
        )
        return {(label, verdict): n for label, verdict, n in rows}

    def pool_sure(
        self, version: str, labels: Collection[str] | None, min_confidence: float, again_from: float = 0.0
    ) -> list[tuple[QueueEntry, str | None]]:
        """Review-pool photos engine ``version`` answered with ``min_confidence`` or more (and, where that answer is
        one given again in the pool, ``again_from`` or more), in one of ``labels`` (None: any class), each with the
        verdict of that answer (:mod:`edge_agent.review.trusted_pool`)."""
        if labels is not None and not labels:
            return []
        among = "" if labels is None else f" AND q.label IN ({','.join('?' * len(labels))})"
        rows = self._answered(
            "SELECT q.sha256, q.photo_id, q.kind, q.label, q.confidence, q.engine_version, q.file, q.bytes, q.created,"
            " CASE WHEN a.sha256 IS NULL THEN r.verdict ELSE a.verdict END FROM label_queue q"
            " LEFT JOIN results r ON r.sha256 = q.sha256 AND r.engine_version = q.engine_version"
            " LEFT JOIN {answers} a ON a.sha256 = q.sha256 AND a.engine_version = q.engine_version"
            " WHERE q.kind = 'review' AND q.engine_version = ? AND q.confidence >= ?"
            f" AND (a.sha256 IS NULL OR q.confidence >= ?){among} ORDER BY q.created",
            (version, min_confidence, again_from, *(labels or ())),
        )
        return [(QueueEntry(*r[:9]), r[9]) for r in rows]

    def make_pseudo(self, entries: Iterable[QueueEntry]) -> list[str]:
        """Review-pool photos become pseudo-labels, in one transaction, each only while its row is as it was read (not
        labelled, answered again or gone since; its file stays where it is); the sha256s of those that did."""
        done = []
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                for e in entries:
                    cur.execute(
                        "UPDATE label_queue SET kind = 'pseudo' WHERE sha256 = ? AND kind = 'review' AND label IS ?"
                        " AND confidence IS ? AND engine_version IS ?",
                        (e.sha256, e.label, e.confidence, e.engine_version),
                    )
                    if cur.rowcount == 1:
                        done.append(e.sha256)
                cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        return done
