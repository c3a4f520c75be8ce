"""How far a retrain on pseudo-labels alone moves the model: the step chosen on the gate photos' log-loss.

Pseudo-labels are the model's own confident answers, so a retrain on them alone has little to learn (at most
+1.6 points on this data, the measured bound) and can easily lose more than that: fitted to a few hundred photos,
the weights drift away from what the engine in service learned from its whole training set. The trainer
therefore tries several points on the line from the engine in service to the retrained weights
(``previous + a x (trained - previous)``, WiSE-FT), each with its BatchNorm statistics recomputed on the photos
the retrain used, and keeps the smallest step whose log-loss (mean cross-entropy) on the gate's validation photos is
within one standard error of the lowest: a step further from the engine in service must be better by more than 184
photos can measure. Log-loss rather than top-1: top-1 moves in steps of one photo, the log-loss sees every photo's
margin. ``a = 0`` keeps the weights and adapts only the BatchNorm statistics to the photos the device has seen.
The gate then judges the chosen candidate as any other.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.batchnorm import recompute_batchnorm
from trainer.models import Classifier, inference_copy
from trainer.photos import INFERENCE_BATCH
from trainer.stop import check

__all__ = ["StepChoice", "at_step", "choose_step", "interpolate_weights"]


@dataclass
class StepChoice:
    step: float
    tried: list[dict]  # per step: gate_log_loss, gate_top1, above_lowest (mean), standard_error

    def summary(self) -> dict:
        return {"step": self.step, "tried": self.tried}


def interpolate_weights(model: torch.nn.Module, previous: torch.nn.Module, alpha: float) -> None:
    """``model`` <- ``previous`` + ``alpha`` x (``model`` - ``previous``), in place, for every floating-point tensor
    of the same shape (a head grown for new classes keeps its trained rows). Weight-space ensembling of a fine-tuned
    model with the one it started from (WiSE-FT, Wortsman et al. 2022) keeps most of what fine-tuning gained while
    giving back less of what the starting model knew."""
    before = previous.state_dict()
    with torch.no_grad():
        for name, value in model.state_dict().items():
            old = before.get(name)
            if old is not None and old.shape == value.shape and value.dtype.is_floating_point:
                value.copy_(old + alpha * (value - old))


@torch.no_grad()
def _losses(
    model: Classifier, x: torch.Tensor, y: torch.Tensor, should_stop=lambda: False, batch: int = INFERENCE_BATCH
) -> tuple[torch.Tensor, float]:
    """Per-photo cross-entropy and top-1."""
    model = inference_copy(model)
    losses, right = [], 0
    for i in range(0, len(x), batch):
        check(should_stop, "while choosing the step")
        logits = model(x[i : i + batch])
        losses.append(F.cross_entropy(logits, y[i : i + batch], reduction="none").double())
        right += int((logits.argmax(1) == y[i : i + batch]).sum())
    return torch.cat(losses), right / len(x)


def at_step(trained: Classifier, previous: Classifier, a: float, bn_x: torch.Tensor | None, should_stop=lambda: False) -> Classifier:
    """A copy of ``previous + a x (trained - previous)`` with its BatchNorm statistics recomputed on ``bn_x`` (None:
    kept, for a network trained with them held)."""
    model = copy.deepcopy(trained)
    if a < 1.0:
        interpolate_weights(model, previous, a)
    return model.eval() if bn_x is None else recompute_batchnorm(model, bn_x, should_stop=should_stop)


def choose_step(
    trained: Classifier,
    previous: Classifier,
    steps: list[float],
    bn_x: torch.Tensor | None,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    should_stop=lambda: False,
    search_photos: int = 192,
    seed: int = 0,
) -> tuple[Classifier, StepChoice]:
    """The candidate ``previous + a x (trained - previous)`` for the smallest ``a`` in ``steps`` whose log-loss on
    ``val_x``/``val_y`` is within one standard error of the lowest (the one-standard-error rule: a larger step must
    be better by more than the gate photos can measure), its BatchNorm statistics recomputed on ``bn_x``.

    The standard error is that of the mean per-photo difference from the lowest-loss step (paired: the same photos).
    While searching, the statistics come from at most ``search_photos`` of ``bn_x`` (seeded sample); the chosen
    candidate gets them from all of ``bn_x``."""
    if not steps:
        raise ValueError("no step to try")
    if len(val_x) == 0:
        raise ValueError("no validation photos to choose a step on")
    if len(set(steps)) == 1:  # nothing to choose between
        return at_step(trained, previous, steps[0], bn_x, should_stop), StepChoice(steps[0], [{"step": steps[0]}])
    sample = bn_x
    if bn_x is not None and len(bn_x) > search_photos:
        sample = bn_x[torch.randperm(len(bn_x), generator=torch.Generator().manual_seed(seed))[:search_photos]]

    scored = {}
    for a in sorted(set(steps)):
        check(should_stop, "while choosing the step")
        scored[a] = _losses(at_step(trained, previous, a, sample, should_stop), val_x, val_y, should_stop)
    best = min(scored, key=lambda a: float(scored[a][0].mean()))
    tried, chosen = [], None
    for a, (losses, top1) in scored.items():
        diff = losses - scored[best][0]
        se = float(diff.std() / len(diff) ** 0.5) if len(diff) > 1 else 0.0
        within = float(diff.mean()) <= se
        if within and chosen is None:
            chosen = a  # steps ascending: the smallest within one standard error
        tried.append(
            {
                "step": a,
                "gate_log_loss": round(float(losses.mean()), 4),
                "gate_top1": round(top1, 4),
                "above_lowest": round(float(diff.mean()), 4),
                "standard_error": round(se, 4),
            }
        )
    return at_step(trained, previous, chosen, bn_x, should_stop), StepChoice(chosen, tried)
