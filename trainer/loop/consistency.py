"""A retrain's consistency term (FixMatch, Sohn et al. 2020): the model's answer to a lightly changed view of a photo
nobody labelled, where it is sure, is the target for a heavily changed view of the same photo.

Each training step draws ``ratio`` pool photos per labelled photo of the batch. The weak view (flips only) is
answered without gradients; where the answer's confidence reaches ``threshold`` it becomes the hard target of the
strong view (flips, rotation, zoom, colour and cutout), weighted so that each class the sure answers name counts
alike in the step (the field's commonest class cannot take over) and scaled by ``weight`` over the batch's labelled
count, as the labelled term is. The sure answers are the model's own as it trains, so the term grows as it learns the
field; the field check decides whether a candidate trained with it serves (:mod:`trainer.loop.unlabelled_term`'s
rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from edge_agent.preprocess import DEFAULT_SPEC, PreprocessSpec
from trainer.augment import Augment
from trainer.stop import check

__all__ = ["Consistency", "balanced"]


def balanced(target: torch.Tensor, sure: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Weights for the sure photos (0 for the others) that add up to their count, shared equally by the classes they
    name, so a class named three times as often weighs the same as one named once."""
    counts = torch.bincount(target[sure], minlength=num_classes).float()
    named = int((counts > 0).sum())
    if named == 0:
        return torch.zeros(len(target))
    return torch.where(sure, float(sure.sum()) / (named * counts[target]).clamp(min=1), torch.zeros(()))


@dataclass
class Consistency:
    """The pool photos ``x`` and the term's parameters; ``tally`` counts what the steps did."""

    x: torch.Tensor
    threshold: float = 0.95
    weight: float = 1.0
    ratio: int = 1
    spec: PreprocessSpec = DEFAULT_SPEC
    tally: dict = field(default_factory=lambda: {"views": 0, "sure": 0, "sure_by_class": {}})

    def __post_init__(self) -> None:
        self._weak = Augment(max_degrees=0.0, brightness=0.0, contrast=0.0, noise_std=0.0, spec=self.spec)
        self._strong = Augment(
            max_degrees=30.0, brightness=0.4, contrast=0.4, noise_std=0.03, spec=self.spec, cutout=(0.2, 0.5), zoom=(0.8, 1.4)
        )

    def draw(self, labelled: int, generator: torch.Generator) -> torch.Tensor:
        """Indices of the pool photos for a step with ``labelled`` labelled photos."""
        return torch.randint(len(self.x), (self.ratio * labelled,), generator=generator)

    def loss(
        self, model: torch.nn.Module, idx: torch.Tensor, generator: torch.Generator, n_true: int, micro: int, should_stop=lambda: False
    ) -> float:
        """Back-propagate the term over the pool photos ``idx`` (``micro`` at a time, a stop request seen between parts);
        returns its value."""
        parts = []
        with torch.no_grad():
            for j in range(0, len(idx), micro):
                check(should_stop, "while training")
                parts.append(F.softmax(model(self._weak(self.x[idx[j : j + micro]], generator)), 1))
        probs = torch.cat(parts)
        conf, target = probs.max(1)
        sure = conf >= self.threshold
        self.tally["views"] += len(idx)
        self.tally["sure"] += int(sure.sum())
        if not sure.any():
            return 0.0
        classes, counts = target[sure].unique(return_counts=True)
        for c, n in zip(classes.tolist(), counts.tolist()):
            self.tally["sure_by_class"][c] = self.tally["sure_by_class"].get(c, 0) + n
        w = balanced(target, sure, probs.shape[1])
        rows = torch.nonzero(sure).flatten()
        total = 0.0
        for j in range(0, len(rows), micro):
            check(should_stop, "while training")
            part = rows[j : j + micro]
            logits = model(self._strong(self.x[idx[part]], generator))
            term = self.weight * (w[part] * F.cross_entropy(logits, target[part], reduction="none")).sum() / (self.ratio * max(1, n_true))
            term.backward()
            total += float(term.detach())
        return total
