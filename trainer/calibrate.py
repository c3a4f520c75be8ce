"""Temperature scaling (Guo et al., 2017): make the engine's softmax mean what it says.

A small network trained to ~100 % on a few hundred photos is over-confident: the field simulation's
baseline is right only 93 % of the time where its softmax says >= 0.9. The daemon turns exactly that
number into pseudo-labels (``[labels] pseudo_threshold``), and a farmer reads it as "how sure". One
scalar ``T`` is fitted by minimising the negative log-likelihood on held-out photos and folded into the
classifier's last layer (``W / T``, ``b / T``): the exported engine's softmax is then calibrated at no
inference cost, on every backend, and its argmax - every top-1 - is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from trainer.models import Classifier, logits_on
from trainer.photos import INFERENCE_BATCH

__all__ = ["Calibration", "calibrate", "calibration_error", "expected_calibration_error", "fit_temperature", "fold_temperature"]

#: Fewest held-out photos a temperature is fitted on; below it the model is published as trained.
MIN_PHOTOS = 20
MIN_MISTAKES = 3  # fewer wrong answers among the held-out photos: no temperature is fitted
#: The temperature is searched in [1/T_LIMIT, T_LIMIT].
T_LIMIT = 10.0


@dataclass
class Calibration:
    """What :func:`calibrate` did: the temperature folded in and the held-out figures before and after."""

    temperature: float
    photos: int
    nll_before: float
    nll_after: float
    ece_before: float
    ece_after: float
    skipped: str | None = None

    def summary(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The ``T`` in [1/10, 10] minimising mean NLL of ``softmax(logits / T)``; golden-section on log T.

    The NLL is convex in 1/T, hence unimodal in log T: the search cannot stop in a local minimum."""
    if len(logits) == 0:
        raise ValueError("no photos to fit a temperature on")
    logits, labels = logits.detach().double(), labels.detach()

    def nll(log_t: float) -> float:
        return F.cross_entropy(logits / math.exp(log_t), labels).item()

    lo, hi = -math.log(T_LIMIT), math.log(T_LIMIT)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(60):  # interval shrinks by 0.618 per step: far below float resolution of log T
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = nll(b)
    return math.exp((lo + hi) / 2)


def expected_calibration_error(logits: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> float:
    """Mean |accuracy - confidence| over equal-width confidence bins, weighted by the photos in each."""
    conf, pred = F.softmax(logits.detach().double(), 1).max(1)
    return calibration_error(conf, pred == labels, bins)


def calibration_error(confidence: torch.Tensor, right: torch.Tensor, bins: int = 15) -> float:
    """:func:`expected_calibration_error` from top-1 confidences and whether each top-1 was right."""
    conf, right = torch.as_tensor(confidence, dtype=torch.double), torch.as_tensor(right).double()
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.double)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (conf > lo) & (conf <= hi)
        if in_bin.any():
            ece += in_bin.double().mean().item() * abs(right[in_bin].mean().item() - conf[in_bin].mean().item())
    return ece


@torch.no_grad()
def fold_temperature(model: Classifier, temperature: float) -> Classifier:
    """Divide the classifier's weights and bias by ``temperature``, in place: logits become ``logits / T``."""
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    model.head.weight.div_(temperature)
    model.head.bias.div_(temperature)
    return model


@torch.no_grad()
def calibrate(
    model: Classifier, x: torch.Tensor, y: torch.Tensor, batch: int = INFERENCE_BATCH, logits: torch.Tensor | None = None
) -> Calibration:
    """Fit a temperature on held-out photos ``x``/``y`` and fold it into ``model`` (in place); ``logits``, the model's
    on ``x`` where the caller has them, spare running it again.

    With fewer than :data:`MIN_PHOTOS` photos (or fewer than two classes among them), or fewer than
    :data:`MIN_MISTAKES` wrong answers among them, nothing is folded and ``skipped`` says why: a temperature fitted on
    a handful of photos would be noise, and one fitted where the model is never wrong only sharpens it."""
    model.eval()
    logits = logits_on(model, x, batch) if logits is None else logits.float()
    mistakes = int((logits.argmax(1) != y).sum()) if len(x) else 0
    if len(x) < MIN_PHOTOS or len(torch.unique(y)) < 2 or mistakes < MIN_MISTAKES:
        why = (
            f"{len(x)} held-out photos in {len(torch.unique(y))} classes (need {MIN_PHOTOS} in 2 or more)"
            if len(x) < MIN_PHOTOS or len(torch.unique(y)) < 2
            else f"{mistakes} mistakes on {len(x)} held-out photos (need {MIN_MISTAKES}): with (almost) none the fit only "
            "sharpens the softmax towards its floor, which says nothing about photos to come"
        )
        nll = F.cross_entropy(logits, y).item() if len(x) else float("nan")
        ece = expected_calibration_error(logits, y) if len(x) else float("nan")
        return Calibration(1.0, len(x), nll, nll, ece, ece, skipped=why)
    t = fit_temperature(logits, y)
    fold_temperature(model, t)
    return Calibration(
        t,
        len(x),
        F.cross_entropy(logits.double(), y).item(),
        F.cross_entropy(logits.double() / t, y).item(),
        expected_calibration_error(logits, y),
        expected_calibration_error(logits / t, y),
    )
