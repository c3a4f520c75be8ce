"""The label policy: which answers become pseudo-labels, which go to the expert, and how many a class may queue.

:func:`decide` is the policy itself, pure (the daemon and any simulation of it call the same function): a confident
answer becomes a pseudo-label only for a class the expert's checks have shown right often enough
(:mod:`edge_agent.review.checks`), but for a share drawn by photo (its audits); any other class's confident answers go
to the expert, as checks.
:class:`LabelQueuer` applies it to a batch of classified photos: it keeps the per-class cap on pseudo-labels of each
engine version and writes the chosen photos to the spool, the batch's queue files made durable before the caller
commits the rows that list them; :meth:`LabelQueuer.to_pseudo` applies it to photos waiting in the review pool, whose
class has earned trust since (:mod:`edge_agent.review.trusted_pool`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from edge_agent.ledger_rows import QueueEntry
from edge_agent.log import get_logger
from edge_agent.results import ResultsDB
from edge_agent.review.checks import TrustBook, audited, covered
from edge_agent.spool import Origin, PhotoSpool, QueueFull, SpoolItem

if TYPE_CHECKING:
    from edge_agent.classifier import Prediction
    from edge_agent.config import LabelsSection

__all__ = ["Kind", "decide", "LabelQueuer", "Queued", "Answer"]

#: Where a photo's answer goes: the trainer as a pseudo-label, or the pool the expert is asked from.
Kind = Literal["pseudo", "review"]


def decide(verdict: str, confidence: float, policy: LabelsSection, trusted: bool = True, audit: bool = False) -> Kind | None:
    """Only a ``confident`` verdict at ``pseudo_threshold`` or above that trust covers (``trust_confidence``:
    :func:`edge_agent.review.checks.covered`), for a ``trusted`` class, becomes a pseudo-label, unless ``audit``
    (the photo is of the share :func:`edge_agent.review.checks.audited` keeps for the expert); any other confident
    answer goes to review (a check, or a photo for the unlabelled pool); ``unknown`` always goes to review (a new class may be born
    there), and so does an answer below ``review_threshold``, or one sure by the softmax that the verdict refused for
    its distance from the training photos; anything else is not queued."""
    if verdict == "confident" and confidence >= policy.pseudo_threshold:
        return "pseudo" if trusted and not audit and covered(verdict, confidence, policy) else "review"
    if verdict == "unknown" or confidence < policy.review_threshold or confidence >= policy.pseudo_threshold:
        return "review"
    return None


class Answer(Protocol):
    """A classified photo as the queuer reads it (the pipeline's job)."""

    sha256: str
    photo_id: str
    data: bytes
    ext: str
    origin: Origin | None
    prediction: Prediction


@dataclass
class Queued:
    """What :meth:`LabelQueuer.queue` did with a batch."""

    entries: list[QueueEntry] = field(default_factory=list)  # for the commit that lists the queue files
    kinds: dict[str, Kind] = field(default_factory=dict)  # sha256 -> where it went
    skipped: int = 0  # wanted a place, but the quota was reached


class LabelQueuer:
    """Applies :func:`decide` to batches, with the per-class cap on pseudo-labels per engine version and the spool's quota."""

    def __init__(self, db: ResultsDB, spool: PhotoSpool, policy: LabelsSection) -> None:
        self.db = db
        self.spool = spool
        self.policy = policy
        self.trust = TrustBook(db, policy)
        self.full = False  # the last batch found the quota reached
        self._counts: dict[str, dict[str, int]] = {}  # engine version -> label -> pseudo-labels queued
        self._lock = threading.Lock()  # the counts: the pipeline's sink thread queues, its inference thread promotes
        self.log = get_logger("labelling")

    def _of(self, version: str) -> dict[str, int]:
        if version not in self._counts:
            self._counts[version] = dict(self.db.pseudo_counts(version))
        return self._counts[version]

    def _count(self, version: str, label: str, step: int) -> None:
        with self._lock:
            counts = self._of(version)
            counts[label] = counts.get(label, 0) + step

    def _take(self, version: str, label: str) -> bool:
        """Count one more pseudo-label of ``label`` for ``version``, unless the class has its share (``per_class_cap``)."""
        with self._lock:
            counts = self._of(version)
            if counts.get(label, 0) >= self.policy.per_class_cap:
                return False
            counts[label] = counts.get(label, 0) + 1  # counted now, so a batch of one class cannot overshoot the cap
            return True

    def queue(self, answers: Sequence[Answer]) -> Queued:
        """Write the photos the policy queues to the spool (one durability barrier); returns the rows to commit."""
        wanted: list[tuple[Answer, Kind]] = []
        trusted = self.trust.now()  # one look at the expert's checks per batch
        for a in answers:
            p = a.prediction
            kind = decide(p.verdict, p.confidence, self.policy, trusted(p.label), audited(a.sha256, self.policy))
            if kind == "pseudo" and not self._take(p.engine_version, p.label):
                continue  # the class has its share of this version's pseudo-labels
            if kind is not None:
                wanted.append((a, kind))
        out = Queued()
        if not wanted:
            return out
        try:
            files: list[Path | None] = self.spool.put_many([SpoolItem(k, a.sha256, a.data, a.ext, a.origin) for a, k in wanted])
        except QueueFull as exc:
            files, reason = [None] * len(wanted), str(exc)
        else:
            reason = "label queue quota reached"
        for (a, kind), f in zip(wanted, files):
            p = a.prediction
            if f is None:
                out.skipped += 1
                if kind == "pseudo":
                    self._count(p.engine_version, p.label, -1)
                continue
            out.entries.append(QueueEntry(a.sha256, a.photo_id, kind, p.label, p.confidence, p.engine_version, str(f), len(a.data)))
            out.kinds[a.sha256] = kind
        if out.skipped and not self.full:
            self.log.warning("label_queue_full", reason=reason, policy="predictions continue, queuing paused")
        self.full = bool(out.skipped)
        return out

    def not_committed(self, answer: Answer, kind: Kind | None) -> None:
        """``answer`` was queued but its row was not stored (a duplicate found at commit): it no longer counts."""
        if kind == "pseudo":
            self._count(answer.prediction.engine_version, answer.prediction.label, -1)

    def to_pseudo(self, pool: Sequence[tuple[QueueEntry, str | None]]) -> list[QueueEntry]:
        """Of review-pool photos, each with the verdict of its answer, those :func:`decide` makes pseudo-labels with
        the checks as they stand now, within each class's share of its version's pseudo-labels (counted: hand those
        that were not made to :meth:`not_made`)."""
        trusted = self.trust.now()
        return [
            e
            for e, verdict in pool
            if e.label is not None
            and e.engine_version is not None
            and decide(verdict or "", e.confidence or 0.0, self.policy, trusted(e.label), audited(e.sha256, self.policy)) == "pseudo"
            and self._take(e.engine_version, e.label)
        ]

    def not_made(self, entries: Sequence[QueueEntry]) -> None:
        """Photos :meth:`to_pseudo` chose whose rows changed before they became pseudo-labels: they no longer count."""
        for e in entries:
            if e.label is not None and e.engine_version is not None:
                self._count(e.engine_version, e.label, -1)

    def recount(self) -> None:
        """Forget the counts (a failed commit); they are read again from the results database."""
        with self._lock:
            self._counts.clear()
