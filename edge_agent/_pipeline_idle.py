"""What the inference thread does while no photo waits: the review pool answered again, wrong pseudo-labels taken
back, and the pool's photos that trust now covers made pseudo-labels.

:class:`IdleWork` is a part of :class:`edge_agent.pipeline.Pipeline` (its classifier, ledger, label queue and log),
kept in a module of its own beside it; photos always come first (each call does a batch and returns).
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_agent.classifier import Classifier
    from edge_agent.labelling import LabelQueuer
    from edge_agent.results import ResultsDB
    from edge_agent.review.reanswer import PoolAnswers
    from edge_agent.review.trusted_pool import TrustedPool
    from edge_agent.review.withdraw import Withdrawals

__all__ = ["IdleWork"]


class IdleWork:
    """The inference thread's idle work (a part of :class:`edge_agent.pipeline.Pipeline`, which sets these)."""

    classifier: Classifier
    db: ResultsDB
    labels: LabelQueuer
    pool_answers: PoolAnswers | None
    trusted_pool: TrustedPool
    withdrawals: Withdrawals
    counters: dict
    _pool_answered: int
    _pool_warned: str | None

    def _pool_due(self) -> bool:
        return self.pool_answers is not None and self.pool_answers.due(self.classifier.engine.engine_version)

    def _answer_pool(self) -> bool:
        """Answer a batch of the review pool again where it is due (:mod:`edge_agent.review.reanswer`; the inference
        thread, idle); whether more is due."""
        if not self._pool_due():
            return False
        try:
            self._pool_answered += self.pool_answers.run(self.classifier)
        except Exception as exc:  # a locked ledger, an engine error: tried again a minute on, photos first meanwhile
            if isinstance(exc, sqlite3.DatabaseError) and self.db.damaged(exc):
                self.log.error("ledger_damaged", error=repr(exc), met_by="the review pool's answers")
            else:
                self.log.warning("pool_answers_failed", error=repr(exc))
            return False
        if self._pool_due():
            return True
        if self._pool_answered:  # (the journal says when the questions follow the engine in service again)
            self.log.info("review_pool_answered_again", photos=self._pool_answered, engine_version=self.classifier.engine.engine_version)
            self._pool_answered = 0
        return False

    def _pool_to_pseudo(self) -> None:
        """Take back the pseudo-labels the expert's latest checks found wrong (:mod:`edge_agent.review.withdraw`), then
        make pseudo-labels of the review pool's photos that trust now covers (:mod:`edge_agent.review.trusted_pool`;
        the inference thread, idle)."""
        version = self.classifier.engine.engine_version
        try:
            taken = self.withdrawals.run()
            if taken is not None and taken.found:
                self.labels.recount()  # (the pseudo-labels returned to the pool no longer count in their class's share)
                self.log.warning(
                    "pseudo_labels_withdrawn",
                    found_wrong=[f"{label} by {v}" for label, v in taken.found],
                    returned_to_review=taken.pooled,
                    to_withdraw_from_trainer=taken.marked,
                    why="the expert found a sure answer of the class by that engine wrong",
                )
            made = self.trusted_pool.run(version, self.pool_answers.answered if self.pool_answers else 0)
        except Exception as exc:  # a locked ledger: looked at again in a second, photos first meanwhile
            if isinstance(exc, sqlite3.DatabaseError) and self.db.damaged(exc):
                self.log.error("ledger_damaged", error=repr(exc), met_by="the review pool's pseudo-labels")
            elif self._pool_warned != repr(exc):
                self.log.warning("pool_pseudo_labels_failed", error=repr(exc))
            self._pool_warned = repr(exc)
            return
        self._pool_warned = None
        if made:
            self.counters["queued_pseudo"] += len(made)
            classes = sorted({e.label or "" for e in made})
            self.log.info("review_pool_made_pseudo_labels", photos=len(made), classes=classes, engine_version=version)
