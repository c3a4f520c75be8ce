"""The ledger's rows of the pseudo-labels handed to the trainer, and of those withdrawn since.

:class:`WithdrawnRows` is a part of :class:`edge_agent.results.ResultsDB` (its connection, lock and reads), kept in a
module of its own beside it. ``pseudo_sent`` holds each pseudo-label the trainer acknowledged (its class and the engine
version that made it), marked ``withdrawn`` when the expert found a sure answer of that class by that engine wrong
(:mod:`edge_agent.review.withdraw`) and ``confirmed`` once the trainer has taken it back; ``withdraw_seen`` the expert
labels already read for that.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable

from edge_agent._ledger_file import missing_table

__all__ = ["PUT_SENT", "WithdrawnRows"]

#: A pseudo-label the trainer acknowledged: (sha256, class, engine version, when, withdrawn: None or when).
PUT_SENT = "INSERT OR REPLACE INTO pseudo_sent (sha256, label, engine_version, sent, withdrawn) VALUES (?,?,?,?,?)"


class WithdrawnRows:
    """The rows of pseudo-labels delivered and withdrawn (a part of :class:`edge_agent.results.ResultsDB`)."""

    _db: sqlite3.Connection
    _lock: threading.Lock
    _query: Callable[..., list[tuple]]
    _rollback: Callable[[], None]

    def withdraw_seen(self) -> dict[str, float]:
        """sha256 -> when its expert label was labelled, for the labels already read by the withdrawal step."""
        return dict(self._query("SELECT sha256, labelled FROM withdraw_seen"))

    def withdraw(self, found: Iterable[tuple[str, str]], seen: Iterable[tuple[str, float]]) -> tuple[int, int]:
        """In one transaction: every pseudo-label of each (class, engine version) in ``found`` taken back, those still
        queued returned to the review pool (their files where they are) and those delivered marked to be withdrawn
        from the trainer; the expert labels ``seen`` recorded as read. Returns (returned to the pool, to withdraw)."""
        now = time.time()
        pooled = marked = 0
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                for label, version in found:
                    cur.execute(
                        "UPDATE label_queue SET kind = 'review' WHERE kind = 'pseudo' AND label = ? AND engine_version = ?",
                        (label, version),
                    )
                    pooled += cur.rowcount
                    cur.execute(
                        "UPDATE pseudo_sent SET withdrawn = ? WHERE label = ? AND engine_version = ? AND withdrawn IS NULL",
                        (now, label, version),
                    )
                    marked += cur.rowcount
                cur.executemany("INSERT OR REPLACE INTO withdraw_seen (sha256, labelled) VALUES (?,?)", list(seen))
                cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        return pooled, marked

    def withdraw_delivered(self, sha256: str, label: str, engine_version: str) -> None:
        """A pseudo-label the trainer acknowledged after it had left the queue's pseudo-labels (taken back while in
        flight): recorded as delivered and to be withdrawn at once."""
        now = time.time()
        with self._lock:
            self._db.execute(PUT_SENT, (sha256, label, engine_version, now, now))

    def withdrawals_due(self, limit: int) -> list[tuple[str, str, str]]:
        """Up to ``limit`` delivered pseudo-labels to withdraw that the trainer has not yet confirmed: (sha256, class,
        engine version), oldest withdrawal first."""
        return self._query(
            "SELECT sha256, label, engine_version FROM pseudo_sent WHERE withdrawn IS NOT NULL AND confirmed IS NULL"
            " ORDER BY withdrawn, sha256 LIMIT ?",
            (limit,),
        )

    def confirm_withdrawn(self, sha256: str) -> bool:
        """The trainer has taken back the pseudo-label of ``sha256``; False where none waited for that."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE pseudo_sent SET confirmed = ? WHERE sha256 = ? AND withdrawn IS NOT NULL AND confirmed IS NULL",
                (time.time(), sha256),
            )
        return cur.rowcount == 1

    def prune_pseudo_sent(self, before: float, since: float = -math.inf) -> int:
        """Forget the pseudo-labels delivered from ``since`` to before ``before``, but those withdrawn and not yet
        confirmed by the trainer (still to tell it); how many rows went."""
        with self._lock:
            return self._db.execute(
                "DELETE FROM pseudo_sent WHERE sent >= ? AND sent < ? AND (withdrawn IS NULL OR confirmed IS NOT NULL)", (since, before)
            ).rowcount

    def withdrawn_counts(self) -> dict[str, tuple[int, int]]:
        """Per class: delivered pseudo-labels withdrawn, and of them those the trainer confirmed ({} from a ledger from
        before withdrawals)."""
        try:
            rows = self._query(
                "SELECT label, COUNT(*), COUNT(confirmed) FROM pseudo_sent WHERE withdrawn IS NOT NULL GROUP BY label ORDER BY label"
            )
        except sqlite3.OperationalError as exc:
            if not missing_table(self._db, exc):
                raise
            return {}
        return {label: (n, confirmed) for label, n, confirmed in rows}
