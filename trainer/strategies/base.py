"""The interface every continual-learning strategy implements, and their registry.

A strategy is one module in :mod:`trainer.strategies` with a :class:`Strategy`
subclass decorated with :func:`register`, whose ``Config`` is its options class
in :mod:`edge_agent.trainer_config` (``[trainer.strategy]``, chosen by ``type``).
The registry is the engine backends' (:mod:`engines.plugins`). The shared
training loop (:mod:`trainer.continual`) calls its hooks:

* :meth:`Strategy.before` once, with the model in service (a frozen copy) and
  the new generation's data: to snapshot a teacher, add replay data, ...;
* :meth:`Strategy.penalty` every step: a term added to the loss;
* :meth:`Strategy.after` once the candidate is trained: to update what it
  keeps across generations (Fisher information, a memory), saved under its
  state directory so it survives restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch

from edge_agent.trainer_config import StrategyConfig
from engines.plugins import Registry
from trainer import photos
from trainer.models import Classifier

__all__ = ["Strategy", "Generation", "STRATEGIES", "register", "strategies", "get_strategy"]


class Generation:
    """The data of one training round: photos, labels, and for pseudo-labels their confidence.

    ``pseudo`` marks pseudo-labelled rows; ``weight`` is their confidence, and for a true label its weight in the
    cross-entropy (1.0 for labelled photos, ``[trainer] expert_weight`` for an expert's). ``replayed`` marks the
    labelled photos replayed in every retrain (:mod:`trainer.labelled`), which ``[trainer] replay_per_epoch`` draws from.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        weight: torch.Tensor | None = None,
        pseudo: torch.Tensor | None = None,
        sample_ids: list[str] | None = None,
        replayed: torch.Tensor | None = None,
    ) -> None:
        self.x, self.y = x, y
        self.weight = weight if weight is not None else torch.ones(len(y))
        self.pseudo = pseudo if pseudo is not None else torch.zeros(len(y), dtype=torch.bool)
        self.sample_ids = sample_ids or []
        self.replayed = replayed if replayed is not None else torch.zeros(len(y), dtype=torch.bool)

    def __add__(self, other: "Generation") -> "Generation":
        return Generation(
            photos.join([self.x, other.x]),
            torch.cat([self.y, other.y]),
            torch.cat([self.weight, other.weight]),
            torch.cat([self.pseudo, other.pseudo]),
            self.sample_ids + other.sample_ids,
            torch.cat([self.replayed, other.replayed]),
        )

    def __len__(self) -> int:
        return len(self.x)

    def subset(self, keep: torch.Tensor) -> "Generation":
        """The rows where the boolean mask ``keep`` is true."""
        ids = [i for i, k in zip(self.sample_ids, keep.tolist()) if k] if self.sample_ids else []
        return Generation(self.x[keep], self.y[keep], self.weight[keep], self.pseudo[keep], ids, self.replayed[keep])


class Strategy:
    """A way of fighting forgetting: hooks the training loop calls, with ``config`` its typed options."""

    #: The ``[trainer.strategy] type`` that selects this strategy.
    type: ClassVar[str]
    #: Its options class (edge_agent.trainer_config).
    Config: ClassVar[type[StrategyConfig]]

    def __init__(self, state_dir: Path, config: StrategyConfig | None = None, seed: int = 0) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config = config if config is not None else self.Config()
        self.seed = seed

    def before(self, model: Classifier, previous: Classifier, data: Generation) -> Generation:
        """Called before training; may return extra data to train on (replay)."""
        return data

    def penalty(self, model: Classifier, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return logits.new_zeros(())

    def after(self, model: Classifier, data: Generation, features: torch.Tensor | None = None) -> None:
        """Called after training the accepted candidate; ``features``, where given, are its
        :func:`~trainer.models.features_of` ``data.x[~data.pseudo]`` (the true labels; computed once by the retrain)."""


#: Every strategy, by the ``type`` that selects it.
STRATEGIES: Registry[type[Strategy]] = Registry("strategy", "trainer.strategies", skip=("base",))
register = STRATEGIES.register
strategies = STRATEGIES.all
get_strategy = STRATEGIES.get
