"""A review-pool photo becomes a pseudo-label once the engine in service answers it sure in a class trust now covers.

A photo sure of a class not yet trusted joins the review pool as a *check* (:mod:`edge_agent.review.checks`), and
waits there unlabelled. Trust is earned later, from the expert's checks; and after a swap the pool is answered again
by the engine in service (:mod:`edge_agent.review.reanswer`). A photo that engine answers ``confident`` at
``trust_from`` in a class trusted now is what :func:`edge_agent.labelling.decide` makes a pseudo-label when such a
photo arrives, so it becomes one while it waits: :meth:`TrustedPool.run` (the pipeline's inference thread, idle) moves
it from the pool to the pseudo-labels for the trainer, within the class's share of the version's pseudo-labels
(``per_class_cap``), its row changed only while it is as it was read (a photo the expert labels meanwhile keeps the
expert's label) and its file left where it is. Only the serving version's answers count: a photo still holding an
older engine's answer waits for the engine in service to answer it again, and a photo answered again needs ``[labels]
reanswer_confidence`` where that is set higher (every swap is one more chance for a hard photo to cross the bar). It
looks again whenever the engine serving, the trusted classes or the pool's answers change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_agent.labelling import LabelQueuer
    from edge_agent.ledger_rows import QueueEntry
    from edge_agent.results import ResultsDB

__all__ = ["TrustedPool"]


class TrustedPool:
    """The review pool's photos that trust now covers, made pseudo-labels (see the module)."""

    def __init__(self, db: ResultsDB, labels: LabelQueuer) -> None:
        self.db, self.labels = db, labels
        #: Pool photos made pseudo-labels since the process started.
        self.made = 0
        self._looked: tuple | None = None  # (version, trusted classes, pool answers) the last look was made with

    def run(self, version: str, answered: int = 0) -> list[QueueEntry]:
        """Make pseudo-labels of the pool's photos engine ``version`` answered sure in a class trusted now; those made.
        ``answered``: how many pool photos were answered again so far (a new answer is a reason to look again). Reads
        the checks' stamp alone (one query) where nothing changed since the last look."""
        classes = self.labels.trust.trusted_classes()
        looked = (version, classes, answered)
        if looked == self._looked or classes == frozenset():
            self._looked = looked
            return []
        policy = self.labels.policy
        chosen = self.labels.to_pseudo(self.db.pool_sure(version, classes, policy.pseudo_threshold, policy.reanswer_confidence))
        try:
            made = set(self.db.make_pseudo(chosen)) if chosen else set()
        except BaseException:
            self.labels.not_made(chosen)
            raise
        self.labels.not_made([e for e in chosen if e.sha256 not in made])
        self._looked = looked
        self.made += len(made)
        return [e for e in chosen if e.sha256 in made]
