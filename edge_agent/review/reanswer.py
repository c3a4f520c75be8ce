"""After a swap, the review pool is answered again by the engine in service, so the expert is asked where it hesitates.

A photo joins the review pool with the answer of the engine that classified it. Once a retrained version serves,
those answers are an older model's: the margin that ranks the questions, the typical order's distances, whether a
photo is a *check* (:mod:`edge_agent.review.checks`) and the guess the page shows would be the older model's, and the
expert would spend the day's questions on photos the model serving now is sure of. With ``[labels] reanswer_pool`` on
(the default) the pipeline's inference thread, while no photo waits for it, answers the pool's photos again a batch at
a time, newest first, from their files in the queue, with the engine serving and the same preprocessing
(:meth:`PoolAnswers.run`). The queue row takes the new class, confidence and version; its top-k, verdict and
distances are kept beside (the ledger's ``pool_answers`` and ``pool_distances``), and the photo's result keeps what
was answered when it arrived. A check is the newest answer read against the expert's label. A photo labelled or
pruned while it was being answered is left as it is; one whose file cannot be read or decoded keeps its answer and
is not tried again by this process. Measured in the learning loop: docs/learning-loop.md, "The pool answered again".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.preprocess import ImageRejected, preprocess_bytes, read_limited

if TYPE_CHECKING:
    from edge_agent.classifier import Classifier
    from edge_agent.results import ResultsDB

__all__ = ["PoolAnswers"]


class PoolAnswers:
    """The review pool's photos answered again by the engine in service, a batch per call, until none is left."""

    def __init__(self, db: ResultsDB, batch: int) -> None:
        self.db, self.batch = db, max(1, batch)
        #: Photos whose file could not be read or decoded (each keeps its answer; not tried again by this process).
        self.unreadable: set[str] = set()
        #: Photos answered again since the process started.
        self.answered = 0
        self._idle_until = 0.0  # (monotonic) nothing left for the engine serving, or the ledger busy: wait until then
        self._version: str | None = None

    def due(self, version: str) -> bool:
        """Whether a call to :meth:`run` with engine ``version`` may find work (a new version: at once)."""
        return version != self._version or time.monotonic() >= self._idle_until

    def run(self, classifier: Classifier, wait_s: float = 60.0) -> int:
        """Answer again up to a batch of the pool's photos that ``classifier``'s engine has not answered; how many were
        recorded. Once none is left (or the ledger cannot be read or written now) :meth:`due` says no for ``wait_s``
        seconds: photos join the pool answered by the engine in service, and a swap makes it due at once."""
        version = classifier.engine.engine_version
        if version != self._version:  # a new version's pass starts now, whatever the one before waits for
            self._version, self._idle_until = version, 0.0
        try:
            entries = self.db.answered_before(version, self.batch, self.unreadable)
            if not entries:
                self._idle_until = time.monotonic() + wait_s
                return 0
            read, tensors = [], []
            for e in entries:
                try:
                    tensors.append(preprocess_bytes(read_limited(Path(e.file), classifier.spec), classifier.spec))
                    read.append(e)
                except (ImageRejected, OSError):
                    self.unreadable.add(e.sha256)
            if not read:
                return 0
            preds = classifier.predict_tensors(np.stack(tensors))
            recorded = self.db.record_answers(zip(read, preds))
        except Exception:
            self._idle_until = time.monotonic() + wait_s
            raise
        self.answered += recorded
        return recorded
