"""Fit the manifest's ``verdict`` section (:mod:`edge_agent.verdict`) for a trained model.

The distance is measured on one of two spaces (``on``):

- ``"logits"`` (v2000 and before): class means and one shared covariance of the logits from clean training photos
  (the covariance shrunk a little towards its average variance, so its inverse is stable with few photos a class);
  the means and the covariance's inverse go into the manifest and every device computes the distance from the logits.
- ``"features"`` (v3000 on): the same on the network's pooled features (1,280 numbers for EfficientNet-Lite0), the
  covariance kept in its ``rank`` largest within-class directions and one average variance for the rest
  (``benchmarks/verdict_features.py`` measured it: lab photos confident 0.79 -> 0.92 with no more field photos or
  unknown disease let through). Those statistics are too many for a manifest (about 90,000 numbers), so they become
  :class:`FeatureDistance`, a small module exported into the model itself (:func:`trainer.export.export_onnx`): every
  backend returns the distances beside the logits, as a second output the manifest names.

The distance thresholds come from held-out photos the model never trained on, as quantiles of their distances:

- ``confident_distance``: the ``confident_quantile`` of the held-out photos' distances (on the logits 0.8: a lab photo
  is refused ``confident`` for its distance alone a fifth of the time; chosen after measuring on the field photos,
  where 0.97 let 10 % of an unknown disease through as confident and 0.8 lets 1 %; on the features 0.97, which lets
  none of it through: ``docs/model.md``);
- ``unknown_distance``: ``unknown_factor`` times the ``unknown_quantile`` (0.995) of the same distances.

The image checks' limits are fixed (a photo nearly one colour, too dark or too bright) except sharpness, which is
a quarter of the held-out photos' 0.5 % quantile. Field photos are never used here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from edge_agent.classifier import softmax
from edge_agent.preprocess import PreprocessSpec
from edge_agent.verdict import DISTANCE_OUTPUT, Judge, VerdictSpec, image_checks
from trainer.models import features_of, logits_on
from trainer.photos import INFERENCE_BATCH, image_view

__all__ = [
    "FEATURE_RANK",
    "FeatureDistance",
    "FittedVerdict",
    "VERDICT_SPACES",
    "class_means_and_precision",
    "fit_verdict",
    "fit_verdict_for",
    "logits_of",
    "outputs_of",
    "verdicts_of",
]

#: The spaces the distance may be measured on.
VERDICT_SPACES = ("logits", "features")
#: Directions of the features' covariance kept apart (16 and 128 measured the same: docs/model.md).
FEATURE_RANK = 32
#: The held-out quantile a ``confident`` answer's distance must be within, per space (docs/model.md).
CONFIDENT_QUANTILE = {"logits": 0.8, "features": 0.97}


@torch.no_grad()
def logits_of(model: torch.nn.Module, x: torch.Tensor, batch: int = INFERENCE_BATCH) -> np.ndarray:
    """The model's logits for ``x`` in eval mode, as float64."""
    model.eval()  # the caller's model is left in eval mode, as before
    return logits_on(model, x, batch).double().numpy() if len(x) else np.zeros((0, 0))


def _low_rank(cov: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The ``rank`` largest directions of ``cov`` [D, D], their variances, and the average variance of the rest."""
    d = cov.shape[0]
    if not 0 < rank < d:
        raise ValueError(f"rank must lie between 1 and {d - 1}, got {rank}")
    lam, u = np.linalg.eigh(cov)  # ascending
    return u[:, -rank:], np.maximum(lam[-rank:], 1e-12), max(float(lam[:-rank].mean()), 1e-12)


def _class_means(x: np.ndarray, y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each class's mean of ``x`` (the origin for a class with no photo: far from everything) and the shared covariance."""
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
    return means, resid.T @ resid / max(len(resid) - 1, 1)


def class_means_and_precision(
    x: np.ndarray, y: np.ndarray, k: int, shrinkage: float = 0.05, rank: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each of the ``k`` classes' mean of ``x`` [N, D] and the inverse of one covariance shared by the classes.

    The covariance is shrunk by ``shrinkage`` towards its average variance; with ``rank``, it keeps its ``rank``
    largest directions and one average variance for all the others instead (probabilistic PCA), which is what a
    distance on a network's wide penultimate features needs (``benchmarks/verdict_features.py``). A class with no
    photo keeps its mean at the origin, far from everything."""
    means, cov = _class_means(x, y, k)
    d = x.shape[1]
    if rank is None:
        cov = (1 - shrinkage) * cov + shrinkage * np.trace(cov) / d * np.eye(d)
        precision = np.linalg.inv(cov)
    else:
        top, lam, rest = _low_rank(cov, rank)
        precision = (top / lam) @ top.T + (np.eye(d) - top @ top.T) / rest
    return means, (precision + precision.T) / 2


class FeatureDistance(nn.Module):
    """Pooled features [N, D] -> squared Mahalanobis distance to each class mean [N, K] divided by D, the covariance
    kept in a few directions plus one variance for the rest: ``(|d U|^2 / lam + |d - d U U^T|^2 / rest) / D`` for
    ``d = f - mean``.

    Divided by D, a photo like the training photos is about 1 away, not about 1,280; every term is a sum of squares (no
    difference of large numbers), so half precision (TensorRT FP16) loses only its rounding, and only a photo some
    65,000 times further than usual comes out infinite, which is ``unknown`` anyway."""

    def __init__(self, means: np.ndarray, directions: np.ndarray, variances: np.ndarray, rest: float) -> None:
        super().__init__()
        root_d = np.sqrt(means.shape[1])
        self.register_buffer("means", torch.as_tensor(means, dtype=torch.float32))  # [K, D]
        self.register_buffer("directions", torch.as_tensor(directions, dtype=torch.float32))  # [D, r]
        self.register_buffer("scaled", torch.as_tensor(directions / np.sqrt(variances)[None] / root_d, dtype=torch.float32))
        self.register_buffer("rest_scale", torch.tensor(1 / np.sqrt(rest) / root_d, dtype=torch.float32))

    @classmethod
    def fit(cls, features: np.ndarray, y: np.ndarray, k: int, rank: int = FEATURE_RANK) -> "FeatureDistance":
        """Class means and the low-rank shared covariance of ``features`` [N, D] with true labels ``y``."""
        means, cov = _class_means(features.astype(np.float64), y, k)
        top, lam, rest = _low_rank(cov, max(1, min(rank, len(features) - 1)))  # a few photos span fewer directions
        return cls(means, top, lam, rest)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        d = f[:, None, :] - self.means[None]  # [N, K, D]
        near = (d @ self.scaled).square().sum(-1)
        resid = (d - (d @ self.directions) @ self.directions.T) * self.rest_scale
        return near + resid.square().sum(-1)


@dataclass(frozen=True)
class FittedVerdict:
    """The manifest's ``verdict`` section and, on the features, the distance module the export puts into the model."""

    section: dict
    distance: FeatureDistance | None = None


@torch.no_grad()
def outputs_of(
    model: torch.nn.Module, x: torch.Tensor, distance: FeatureDistance | None = None, batch: int = INFERENCE_BATCH
) -> tuple[np.ndarray, np.ndarray | None]:
    """The logits (float64) and, with ``distance``, the distances the exported model returns for ``x``."""
    if distance is None:
        return logits_of(model, x, batch), None
    return _outputs_from(model, features_of(model, x, batch), distance, batch)


@torch.no_grad()
def _outputs_from(
    model: torch.nn.Module, f: torch.Tensor, distance: FeatureDistance | None, batch: int = INFERENCE_BATCH
) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`outputs_of` from the model's pooled features ``f`` of the photos."""
    k = model.num_classes
    head = model.head.float()
    logits = torch.cat([head(f[i : i + batch]) for i in range(0, len(f), batch)]) if len(f) else torch.zeros(0, k)
    if distance is None:
        return logits.double().numpy(), None
    dist = torch.cat([distance(f[i : i + batch]) for i in range(0, len(f), batch)]) if len(f) else torch.zeros(0, k)
    return logits.double().numpy(), dist.double().numpy()


def _section(on: str, k: int, means=None, precision=None, rank: int | None = None) -> dict:
    base = {"confident_distance": 1.0, "unknown_distance": 1.0}
    image = {"image": {"min_contrast": 0.02, "min_brightness": 0.06, "max_brightness": 0.97, "min_sharpness": 0.0}}
    if on == "features":
        return {
            "method": f"squared Mahalanobis distance of the pooled features to the nearest class mean over their width, "
            f"shared covariance in its {rank} largest directions and one variance for the rest, computed in the model",
            "on": "features",
            "output": DISTANCE_OUTPUT,
            **base,
            **image,
        }
    return {
        "method": "squared Mahalanobis distance of the logits to the nearest class mean, shared covariance",
        "means": np.round(means, 5).tolist(),
        "precision": np.round(precision, 7).tolist(),
        **base,
        **image,
    }


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
    held_distances: np.ndarray | None = None,
    rank: int | None = None,
) -> dict:
    """The ``verdict`` section: means and precision from (``train_logits``, ``train_y``), thresholds from the
    held-out photos (``held_logits``, their inputs ``held_x`` for the sharpness limit). With ``held_distances``
    (the held-out photos' distances to every class from the model's own :class:`FeatureDistance`, fitted with
    ``rank`` directions), the section is on the features and the training logits are not used."""
    k = held_logits.shape[1]
    if len(held_logits) < 10:
        raise ValueError(f"the verdict needs at least 10 held-out photos, got {len(held_logits)}")
    classes = {"classes": [str(i) for i in range(k)]}
    if held_distances is None:
        means, precision = class_means_and_precision(train_logits, train_y, k, shrinkage)
        section = _section("logits", k, means, precision)
        # Distances with the rounded numbers the device will use.
        d = Judge(VerdictSpec.from_manifest({**classes, "verdict": section}), 1.0, spec.mean, spec.std).distances(held_logits)
    else:
        section = _section("features", k, rank=rank)
        d = Judge(VerdictSpec.from_manifest({**classes, "verdict": section}), 1.0, spec.mean, spec.std).distances(
            held_logits, distances=held_distances
        )
    section["confident_distance"] = round(float(np.quantile(d, confident_quantile)), 4)
    section["unknown_distance"] = round(float(np.quantile(d, unknown_quantile) * unknown_factor), 4)
    sharp = image_checks(*image_view(held_x, spec.mean, spec.std))[2]
    section["image"]["min_sharpness"] = round(float(np.quantile(sharp, 0.005) / 4), 6)
    section["fitted"] = {
        "train_photos": int(len(train_y)),
        "held_out_photos": int(len(held_logits)),
        "confident_quantile": confident_quantile,
        "unknown_quantile": unknown_quantile,
        "unknown_factor": unknown_factor,
        **({"shrinkage": shrinkage} if held_distances is None else {"rank": rank}),
    }
    return section


def fit_verdict_for(
    model: torch.nn.Module,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    held_x: torch.Tensor,
    spec: PreprocessSpec,
    on: str = "logits",
    rank: int = FEATURE_RANK,
    train_features: torch.Tensor | None = None,
    held_features: torch.Tensor | None = None,
) -> FittedVerdict:
    """:func:`fit_verdict` for a torch model: its logits (or, ``on="features"``, its pooled features) on clean
    training photos (true labels) and held-out photos. ``train_features`` and ``held_features`` are the model's
    :func:`~trainer.models.features_of` ``train_x`` and ``held_x`` where the caller has them already (a retrain's,
    shared with its gate, calibration and rehearsal memory): those photos are not run through the model again."""
    if on not in VERDICT_SPACES:
        raise ValueError(f"the verdict's distance is on one of {VERDICT_SPACES}, not {on!r}")
    q = CONFIDENT_QUANTILE[on]
    train_f = features_of(model, train_x) if train_features is None else train_features
    held_f = features_of(model, held_x) if held_features is None else held_features
    if on == "logits":
        section = fit_verdict(
            _outputs_from(model, train_f, None)[0], train_y.numpy(), _outputs_from(model, held_f, None)[0], held_x.numpy(), spec, q
        )
        return FittedVerdict(section)
    distance = FeatureDistance.fit(train_f.double().numpy(), train_y.numpy(), model.num_classes, rank)
    held_logits, held_d = _outputs_from(model, held_f, distance)
    section = fit_verdict(np.zeros((0, 0)), train_y.numpy(), held_logits, held_x.numpy(), spec, q, held_distances=held_d, rank=rank)
    return FittedVerdict(section, distance)


def verdicts_of(
    section: dict,
    classes: list[str],
    logits: np.ndarray,
    x: np.ndarray,
    spec: PreprocessSpec,
    confident_probability: float = 0.9,
    distances: np.ndarray | None = None,
) -> list[str]:
    """The verdicts a device would give these logits (and the model's distances, for a verdict on the features), for
    the manifest's figures and the INT8 check."""
    probs = softmax(logits)
    x, mean, std = image_view(x, spec.mean, spec.std)  # stored photos' codes are read as pixels
    judge = Judge(VerdictSpec.from_manifest({"classes": classes, "verdict": section}), confident_probability, mean, std)
    return [v.verdict for v in judge.judge(logits, probs, x, distances=distances)]
