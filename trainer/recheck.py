"""Pseudo-labels scored again by the model in service before a retrain trains on them.

A pseudo-label is what some engine said about a photo when it arrived, possibly several versions ago. Before
each retrain the teacher (the engine in service, which passed the gate after it) looks at every pseudo-labelled
photo again, as it is and in its three mirror images (flipped left-right, upside down, transposed: a leaf has no
up, and training augments with flips). The photo is trained on with the class the teacher gives the photo as it
is, and that class's lowest probability over the four views as its confidence, only where that is still at or
above the pseudo-label threshold; otherwise it is held back (kept, and looked at again by the next teacher).

Requiring the views to agree is a stricter test than the daemon's single look, at the cost of a few pseudo-labels:
on the field simulation's baselines it raised the precision of the pseudo-labels at tau 0.9 in every one of five
runs (0.969 -> 0.975 on average) and held back 12-22 % of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.models import Classifier, inference_copy
from trainer.photos import INFERENCE_BATCH
from trainer.stop import check

__all__ = ["MIRRORS", "Recheck", "recheck"]

MIRRORS = (
    lambda x: x,
    lambda x: x.flip(3),  # left-right
    lambda x: x.flip(2),  # upside down
    lambda x: x.transpose(2, 3),  # about the diagonal
)


@dataclass
class Recheck:
    labels: torch.Tensor  # the teacher's class for each photo (as it is)
    confidence: torch.Tensor  # that class's lowest probability over the photo and its mirror images
    keep: torch.Tensor  # confidence >= tau

    def summary(self, previous_labels: torch.Tensor) -> dict:
        """Counts for the manifest: kept (of which relabelled: the teacher now names another class) and held back."""
        return {
            "checked": len(self.keep),
            "kept": int(self.keep.sum()),
            "relabelled": int((self.keep & (self.labels != previous_labels)).sum()),
            "held_back": int((~self.keep).sum()),
        }


@torch.no_grad()
def recheck(model: Classifier, x: torch.Tensor, tau: float, batch: int = INFERENCE_BATCH, should_stop=lambda: False) -> Recheck:
    """Score the preprocessed photos ``x`` with ``model`` (eval mode) over :data:`MIRRORS`."""
    model = inference_copy(model)
    labels, confidence = [], []
    for i in range(0, len(x), batch):
        check(should_stop, "while rechecking pseudo-labels")
        chunk = x[i : i + batch]
        probs = torch.stack([F.softmax(model(view(chunk)), 1) for view in MIRRORS])  # views x photos x classes
        label = probs[0].argmax(1)
        labels.append(label)
        confidence.append(probs.gather(2, label.view(1, -1, 1).expand(len(MIRRORS), -1, 1)).squeeze(2).min(0).values)
    if not labels:
        empty = torch.zeros(0)
        return Recheck(empty.long(), empty, empty.bool())
    conf = torch.cat(confidence)
    return Recheck(torch.cat(labels), conf, conf >= tau)
