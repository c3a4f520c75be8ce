"""Learning without Forgetting (Li & Hoiem, 2016): distil the previous model's outputs on new data."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from edge_agent.trainer_config import LwfConfig
from trainer.strategies.base import Generation, Strategy, register


def distill_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) at ``temperature``, scaled by T^2, over the classes the teacher knows: one value a photo."""
    k = teacher_logits.shape[1]
    t = float(temperature)
    student, teacher = F.log_softmax(logits[:, :k] / t, dim=1), F.softmax(teacher_logits / t, dim=1)
    return (t * t) * F.kl_div(student, teacher, reduction="none").sum(1)


@register
class LwF(Strategy):
    """``temperature`` softens both distributions; ``weight`` weighs the term."""

    type = "lwf"
    Config = LwfConfig
    config: LwfConfig

    def before(self, model, previous, data: Generation) -> Generation:
        self.teacher = copy.deepcopy(previous).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        return data

    def penalty(self, model, x, logits):
        with torch.no_grad():
            old = self.teacher(x)
        return self.config.weight * distill_loss(logits, old, self.config.temperature).mean()
