"""What every architecture in the registry offers the trainer: ``features``, a linear ``head``, a head that grows."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Classifier"]


class Classifier(nn.Module):
    """A network split into ``features`` (photos -> penultimate embeddings) and ``head`` (a ``nn.Linear`` to logits).

    Calibration folds its temperature into ``head``, rehearsal selects by ``features``, continual learning grows
    ``head`` for a new class, and ``arch`` is the registry name the network was built as (recorded in manifests)."""

    head: nn.Linear
    arch: str = ""

    @property
    def num_classes(self) -> int:
        return self.head.out_features

    def features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - every architecture defines it
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def grow_head(self, num_classes: int) -> None:
        """Widen the classifier to ``num_classes`` outputs, keeping the learnt rows."""
        old = self.head
        if num_classes < old.out_features:
            raise ValueError("the head can only grow")
        new = nn.Linear(old.in_features, num_classes).to(old.weight.device, old.weight.dtype)
        with torch.no_grad():
            new.weight[: old.out_features] = old.weight
            new.bias[: old.out_features] = old.bias
        self.head = new
