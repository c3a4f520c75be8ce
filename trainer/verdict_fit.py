"""Fit the manifest's ``verdict`` section (:mod:`edge_agent.verdict`) for a trained model.

Class means and one shared covariance of the logits come from clean training photos (the covariance shrunk a
little towards its average variance, so its inverse is stable with few photos a class); the distance thresholds
come from held-out photos the model never trained on, as quantiles of their distances:

- ``confident_distance``: the ``confident_quantile`` of the held-out photos' distances (0.8: a lab photo is refused
  ``confident`` for its distance alone a fifth of the time; chosen after measuring on the field photos, where 0.97
  let 10 % of an unknown disease through as confident and 0.8 lets 1 %: ``docs/model.md``);
- ``unknown_distance``: ``unknown_factor`` times the ``unknown_quantile`` (0.995) of the same distances.

The image checks' limits are fixed (a photo nearly one colour, too dark or too bright) except sharpness, which is
a quarter of the held-out photos' 0.5 % quantile. Field photos are never used here.
"""

from __future__ import annotations

import numpy as np
import torch

from edge_agent.classifier import softmax
from edge_agent.preprocess import PreprocessSpec
from edge_agent.verdict import Judge, VerdictSpec, image_checks
from trainer.models import inference_copy
from trainer.photos import INFERENCE_BATCH

__all__ = ["class_means_and_precision", "fit_verdict", "fit_verdict_for", "logits_of", "verdicts_of"]


@torch.no_grad()
def logits_of(model: torch.nn.Module, x: torch.Tensor, batch: int = INFERENCE_BATCH) -> np.ndarray:
    """The model's logits for ``x`` in eval mode, as float64."""
    model.eval()  # the caller's model is left in eval mode, as before
    model = inference_copy(model)
    return torch.cat([model(x[i : i + batch]) for i in range(0, len(x), batch)]).double().numpy() if len(x) else np.zeros((0, 0))


def class_means_and_precision(
    x: np.ndarray, y: np.ndarray, k: int, shrinkage: float = 0.05, rank: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each of the ``k`` classes' mean of ``x`` [N, D] and the inverse of one covariance shared by the classes.

    The covariance is shrunk by ``shrinkage`` towards its average variance; with ``rank``, it keeps its ``rank``
    largest directions and one average variance for all the others instead (probabilistic PCA), which is what a
    distance on a network's wide penultimate features needs (``benchmarks/verdict_features.py``). A class with no
    photo keeps its mean at the origin, far from everything."""
    d = x.shape[1]
    means = np.zeros((k, d))
    centred = []
    for c in range(k):
        rows = x[y == c]
        if len(rows) == 0:
            continue
        means[c] = rows.mean(0)
        centred.append(rows - means[c])
    resid = np.concatenate(centred)
    cov = resid.T @ resid / max(len(resid) - 1, 1)
    if rank is None:
        cov = (1 - shrinkage) * cov + shrinkage * np.trace(cov) / d * np.eye(d)
        precision = np.linalg.inv(cov)
    else:
        if not 0 < rank < d:
            raise ValueError(f"rank must lie between 1 and {d - 1}, got {rank}")
        lam, u = np.linalg.eigh(cov)  # ascending
        top, rest = u[:, -rank:], max(float(lam[:-rank].mean()), 1e-12)
        precision = (top / lam[-rank:]) @ top.T + (np.eye(d) - top @ top.T) / rest
    return means, (precision + precision.T) / 2


def fit_verdict(
    train_logits: np.ndarray,
    train_y: np.ndarray,
    held_logits: np.ndarray,
    held_x: np.ndarray,
    spec: PreprocessSpec,
    confident_quantile: float = 0.8,
    unknown_quantile: float = 0.995,
    unknown_factor: float = 1.5,
    shrinkage: float = 0.05,
) -> dict:
    """The ``verdict`` section: means and precision from (``train_logits``, ``train_y``), thresholds from the
    held-out photos (``held_logits``, their inputs ``held_x`` for the sharpness limit)."""
    k = train_logits.shape[1]
    if len(held_logits) < 10:
        raise ValueError(f"the verdict needs at least 10 held-out photos, got {len(held_logits)}")
    means, precision = class_means_and_precision(train_logits, train_y, k, shrinkage)
    section = {
        "method": "squared Mahalanobis distance of the logits to the nearest class mean, shared covariance",
        "means": np.round(means, 5).tolist(),
        "precision": np.round(precision, 7).tolist(),
        "confident_distance": 1.0,
        "unknown_distance": 1.0,
        "image": {"min_contrast": 0.02, "min_brightness": 0.06, "max_brightness": 0.97, "min_sharpness": 0.0},
    }
    # Distances with the rounded numbers the device will use.
    probe = VerdictSpec.from_manifest({"classes": [str(i) for i in range(k)], "verdict": section})
    d = Judge(probe, 1.0, spec.mean, spec.std).distances(held_logits)
    section["confident_distance"] = round(float(np.quantile(d, confident_quantile)), 4)
    section["unknown_distance"] = round(float(np.quantile(d, unknown_quantile) * unknown_factor), 4)
    sharp = image_checks(held_x, spec.mean, spec.std)[2]
    section["image"]["min_sharpness"] = round(float(np.quantile(sharp, 0.005) / 4), 6)
    section["fitted"] = {
        "train_photos": int(len(train_logits)),
        "held_out_photos": int(len(held_logits)),
        "confident_quantile": confident_quantile,
        "unknown_quantile": unknown_quantile,
        "unknown_factor": unknown_factor,
        "shrinkage": shrinkage,
    }
    return section


def fit_verdict_for(
    model: torch.nn.Module, train_x: torch.Tensor, train_y: torch.Tensor, held_x: torch.Tensor, spec: PreprocessSpec
) -> dict:
    """:func:`fit_verdict` for a torch model: its logits on clean training photos (true labels) and held-out photos."""
    return fit_verdict(logits_of(model, train_x), train_y.numpy(), logits_of(model, held_x), held_x.numpy(), spec)


def verdicts_of(
    section: dict, classes: list[str], logits: np.ndarray, x: np.ndarray, spec: PreprocessSpec, confident_probability: float = 0.9
) -> list[str]:
    """The verdicts a device would give these logits (for the manifest's figures and the INT8 check)."""
    probs = softmax(logits)
    judge = Judge(VerdictSpec.from_manifest({"classes": classes, "verdict": section}), confident_probability, spec.mean, spec.std)
    return [v.verdict for v in judge.judge(logits, probs, x)]
