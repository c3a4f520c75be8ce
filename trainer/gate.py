"""The publish gate: a candidate replaces the engine in service only if it is not worse.

Both are evaluated on the trainer's validation photos, which it never trains on.
The candidate passes if its top-1 is at least the current top-1 minus
``tolerance`` (``[trainer] gate_tolerance``, 2 points by default), and at least the lineage's first version's
minus the same or ``[trainer] lab_drift_max`` where that is smaller (so small losses cannot add up over generations), and no class collapses: for every
class with at least ``min_class_photos`` validation photos, recall may not drop
by more than ``max_class_drop`` (default 0.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainer.models import Classifier
from trainer.train import evaluate, scored

__all__ = ["GateDecision", "gate"]


@dataclass
class GateDecision:
    publish: bool
    reason: str
    metrics: dict = field(default_factory=dict)


def gate(
    candidate: Classifier,
    current: Classifier,
    x: torch.Tensor,
    y: torch.Tensor,
    classes: list[str],
    tolerance: float = 0.005,
    max_class_drop: float = 0.3,
    min_class_photos: int = 3,
    root: Classifier | None = None,
    candidate_logits: torch.Tensor | None = None,
    current_logits: torch.Tensor | None = None,
    root_logits: torch.Tensor | None = None,
    root_tolerance: float | None = None,
) -> GateDecision:
    """``root``: the first version of the lineage; the candidate must not be more than ``tolerance`` below it
    either, so a series of candidates each a little worse than the last cannot add up to a real loss.
    ``candidate_logits``, ``current_logits``, ``root_logits``: a model's logits on ``x`` where the caller has them (a
    retrain's candidate's, shared with its calibration and verdict; a stored version's, :mod:`trainer.loop.gate_logits`):
    that model is then not run again. ``root_tolerance``: how far below ``root``, where less than ``tolerance``
    (``[trainer] lab_drift_max``)."""
    if len(x) == 0:
        return GateDecision(False, "no validation photos: cannot check the candidate")

    def of(model: Classifier, z: torch.Tensor | None, rows: torch.Tensor | None = None):
        if z is None:
            return evaluate(model, x, y) if rows is None else evaluate(model, x[rows], y[rows])
        return scored(z, y) if rows is None else scored(z[rows], y[rows])

    known = y < current.num_classes
    cand = of(candidate, candidate_logits)
    every = bool(known.all())  # no new class among the photos: the same photos, evaluated once each
    cur = of(current, current_logits, None if every else known)
    cand_known = cand if every or not known.any() else of(candidate, candidate_logits, known)
    metrics = {
        "validation_photos": int(len(x)),
        "candidate_top1": round(cand.top1, 4),
        "current_top1": round(cur.top1, 4),
        "candidate_top1_on_current_classes": round(cand_known.top1, 4),
        "tolerance": tolerance,
    }
    counts = torch.bincount(y, minlength=candidate.num_classes).tolist()
    collapsed = [
        classes[c]
        for c in range(min(current.num_classes, len(cur.per_class)))
        if counts[c] >= min_class_photos and cur.per_class[c] - cand.per_class[c] > max_class_drop
    ]
    if collapsed:
        metrics["collapsed_classes"] = collapsed
        return GateDecision(False, f"class recall collapsed: {', '.join(collapsed)}", metrics)
    if cand_known.top1 < cur.top1 - tolerance:
        return GateDecision(False, f"top-1 {cand_known.top1:.4f} < current {cur.top1:.4f} - {tolerance}", metrics)
    below = tolerance if root_tolerance is None else min(tolerance, root_tolerance)
    if root is not None and (root is not current or below < tolerance):
        known_root = y < root.num_classes
        if root is current:  # the first retrain of a lineage: the line below its first version is the tighter one
            base, cand_root = cur.top1, cand_known.top1
        elif bool(known_root.all()):  # the photos themselves, not a copy (672 photos at 192 px: 149 MB)
            base, cand_root = of(root, root_logits).top1, cand.top1
        else:
            base, cand_root = of(root, root_logits, known_root).top1, of(candidate, candidate_logits, known_root).top1
        metrics["root_top1"] = round(base, 4)
        if below != tolerance:
            metrics["root_tolerance"] = below
        if cand_root < base - below:
            return GateDecision(False, f"top-1 {cand_root:.4f} < first version's {base:.4f} - {below}", metrics)
    return GateDecision(True, "candidate is not worse", metrics)
