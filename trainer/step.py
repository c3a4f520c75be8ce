"""How far a retrain on pseudo-labels alone moves the model: the step chosen on the gate photos' log-loss.

Pseudo-labels are the model's own confident answers, so a retrain on them alone has little to learn (at most
+1.6 points on this data, the measured bound) and can easily lose more than that: fitted to a few hundred photos,
the weights drift away from what the engine in service learned from its whole training set. The trainer
therefore tries several points on the line from the engine in service to the retrained weights
(``previous + a x (trained - previous)``, WiSE-FT), each with its BatchNorm statistics recomputed on the photos
the retrain used, and keeps the one with the lowest log-loss (mean cross-entropy) on the gate's validation photos.
Log-loss rather than top-1: on 184 photos top-1 moves in steps of one photo, while the log-loss sees every
photo's margin, so it ranks steps that top-1 cannot tell apart. ``a = 0`` keeps the weights and adapts only the
BatchNorm statistics to the photos the device has seen. The gate then judges the chosen candidate as any other.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.batchnorm import recompute_batchnorm
from trainer.continual import interpolate_weights
from trainer.model import LeafNet
from trainer.stop import check

__all__ = ["StepChoice", "choose_step"]


@dataclass
class StepChoice:
    step: float
    tried: list[dict]  # per step: {"step", "gate_log_loss", "gate_top1"}

    def summary(self) -> dict:
        return {"step": self.step, "tried": self.tried}


@torch.no_grad()
def _score(model: LeafNet, x: torch.Tensor, y: torch.Tensor, batch: int = 128) -> tuple[float, float]:
    model.eval()
    loss, right = 0.0, 0
    for i in range(0, len(x), batch):
        logits = model(x[i : i + batch])
        loss += F.cross_entropy(logits, y[i : i + batch], reduction="sum").item()
        right += int((logits.argmax(1) == y[i : i + batch]).sum())
    return loss / len(x), right / len(x)


def choose_step(
    trained: LeafNet, previous: LeafNet, steps: list[float], bn_x: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
    should_stop=lambda: False,
) -> tuple[LeafNet, StepChoice]:
    """The candidate ``previous + a x (trained - previous)`` for the ``a`` in ``steps`` with the lowest log-loss on
    ``val_x``/``val_y`` (ties: the larger step), its BatchNorm statistics recomputed on ``bn_x``."""
    if not steps:
        raise ValueError("no step to try")
    if len(val_x) == 0:
        raise ValueError("no validation photos to choose a step on")
    best, tried = None, []
    for a in sorted(set(steps), reverse=True):
        check(should_stop, "while choosing the step")
        model = copy.deepcopy(trained)
        if a < 1.0:
            interpolate_weights(model, previous, a)
        recompute_batchnorm(model, bn_x)
        loss, top1 = _score(model, val_x, val_y)
        tried.append({"step": a, "gate_log_loss": round(loss, 4), "gate_top1": round(top1, 4)})
        if best is None or loss < best[0]:
            best = (loss, a, model)
    return best[2], StepChoice(best[1], tried)
