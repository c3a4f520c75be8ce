"""Every answer carries a verdict: ``confident``, ``unsure`` or ``unknown``, computed from what the engine returns.

A softmax alone cannot say "this is not a plant I know": a network trained on lab photos answers a field photo, an
unknown disease or a dark frame with a probability like any other, and often a high one. So the verdict also asks
how far the photo's logit vector lies from those of the photos the model was trained on: the squared Mahalanobis
distance to the nearest class mean, with one covariance shared by the classes (Lee et al. 2018). The manifest's
``verdict`` section says where it is measured (``trainer/verdict_fit.py`` fits it):

- ``on = "features"`` (v3000 on): on the network's pooled features. The model computes the distances itself and
  returns them as a second output (named by ``output``, one number a class); the section holds the thresholds.
- ``on = "logits"`` (v2000 and before; the default where ``on`` is absent): on the logits, which every model
  returns; the section holds the class means and the covariance's inverse, and the distance is computed here.

The distance thresholds are fitted on held-out lab photos.

- ``unknown``: the photo is nearly one colour, too dark, too bright or blurred, or its distance is beyond
  ``unknown_distance``: unlike anything trained on (another crop, a disease no class names, not a leaf).
- ``confident``: softmax at least the pseudo-label threshold *and* distance within ``confident_distance``: only
  these become pseudo-labels.
- ``unsure``: everything else; it goes to the expert.

A manifest without a ``verdict`` section (versions published before it existed) gets the documented fallback:
the image checks, and ``confident`` from the softmax alone; :attr:`Judge.mode` says which applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engines.errors import EdgeAgentError

__all__ = ["DISTANCE_OUTPUT", "PHRASES", "VERDICTS", "Judge", "Verdict", "VerdictSpec", "VerdictSpecError", "image_checks", "phrase"]

VERDICTS = ("confident", "unsure", "unknown")
#: The name of a model's second output, its squared distances to each class (a verdict on the features).
DISTANCE_OUTPUT = "distance"
#: What a farmer reads for each verdict (the class name alone for ``confident``).
PHRASES = {"confident": "", "unsure": "not sure: ask an expert", "unknown": "not a plant I know"}


def phrase(verdict: str | None, label: str) -> str:
    """The answer as a farmer reads it: the class for ``confident``, else what the verdict means and the best guess."""
    if verdict in (None, "confident"):
        return label
    return f"{PHRASES.get(verdict, verdict)} (best guess {label})"


class VerdictSpecError(EdgeAgentError, ValueError):
    """A manifest's ``verdict`` section is malformed (wrong shapes, not finite, thresholds out of order)."""


@dataclass(frozen=True)
class Verdict:
    """One photo's verdict, why (empty for ``confident``), and its distance (None in the fallback)."""

    verdict: str
    reason: str
    distance: float | None


@dataclass(frozen=True)
class VerdictSpec:
    """The manifest's ``verdict`` section, checked."""

    means: np.ndarray | None  # [K, K]: each class's mean logit vector (None on the features)
    precision: np.ndarray | None  # [K, K]: inverse of the shared covariance (None on the features)
    confident_distance: float
    unknown_distance: float
    min_contrast: float
    min_brightness: float
    max_brightness: float
    min_sharpness: float
    on: str = "logits"  # "logits": computed here from the means and precision; "features": the model's own output
    output: str | None = None  # on the features: the model output holding the distances [N, K]

    @classmethod
    def from_manifest(cls, manifest: dict) -> "VerdictSpec | None":
        """None where the manifest has no ``verdict`` section; :class:`VerdictSpecError` where it is malformed."""
        section = manifest.get("verdict")
        if section is None:
            return None
        k = len(manifest.get("classes", []))
        fix = "(fix: republish the version with edge-trainer)"
        on = section.get("on", "logits") if isinstance(section, dict) else None
        if on not in ("logits", "features"):
            raise VerdictSpecError(f"manifest 'verdict' section: 'on' is {on!r}, not 'logits' or 'features' {fix}")
        try:
            image = {key: float(section["image"][key]) for key in ("min_contrast", "min_brightness", "max_brightness", "min_sharpness")}
            limits = float(section["confident_distance"]), float(section["unknown_distance"])
            if on == "features":
                output = section["output"]
                if not isinstance(output, str) or not output:
                    raise ValueError(f"'output' must name the model output holding the distances, got {output!r}")
                spec = cls(None, None, *limits, **image, on="features", output=output)
            else:
                means = np.asarray(section["means"], np.float64)
                precision = np.asarray(section["precision"], np.float64)
                spec = cls(means, precision, *limits, **image)
        except (KeyError, TypeError, ValueError) as exc:
            raise VerdictSpecError(f"manifest 'verdict' section: {exc!r} {fix}") from None
        if on == "logits":
            if spec.means.shape != (k, k) or spec.precision.shape != (k, k):
                raise VerdictSpecError(
                    f"manifest 'verdict' section: means {spec.means.shape} and precision {spec.precision.shape} must be ({k}, {k})"
                )
            if not (np.isfinite(spec.means).all() and np.isfinite(spec.precision).all()):
                raise VerdictSpecError("manifest 'verdict' section: values must be finite numbers")
        values = [
            spec.confident_distance,
            spec.unknown_distance,
            spec.min_contrast,
            spec.min_brightness,
            spec.max_brightness,
            spec.min_sharpness,
        ]
        if not np.isfinite(values).all():
            raise VerdictSpecError("manifest 'verdict' section: values must be finite numbers")
        if not 0 < spec.confident_distance <= spec.unknown_distance:
            raise VerdictSpecError("manifest 'verdict' section: need 0 < confident_distance <= unknown_distance")
        return spec


def image_checks(batch: np.ndarray, mean, std, chunk: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per photo of a normalised batch [N,3,H,W]: contrast (std of luminance), brightness (mean luminance), both in
    [0,1] pixel units, and sharpness (variance of the luminance's 4-neighbour Laplacian).

    ``chunk`` photos at a time: the trainer judges its 672 gate photos at once, whose temporaries at 192 px took
    0.59 GB in one piece and 0.05 GB in chunks of 32 (the same figures)."""
    s, m = np.asarray(std, np.float32).reshape(1, 3, 1, 1), np.asarray(mean, np.float32).reshape(1, 3, 1, 1)
    parts = []
    for i in range(0, len(batch), chunk):
        px = batch[i : i + chunk] * s + m
        lum = 0.299 * px[:, 0] + 0.587 * px[:, 1] + 0.114 * px[:, 2]
        lap = 4 * lum[:, 1:-1, 1:-1] - lum[:, :-2, 1:-1] - lum[:, 2:, 1:-1] - lum[:, 1:-1, :-2] - lum[:, 1:-1, 2:]
        parts.append((lum.std(axis=(1, 2)), lum.mean(axis=(1, 2)), lap.var(axis=(1, 2))))
    if len(parts) == 1:  # a daemon's batch: as computed, no copy
        return parts[0]
    if not parts:
        return np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, np.float32)
    return tuple(np.concatenate(column) for column in zip(*parts))  # type: ignore[return-value]


class Judge:
    """Turns a batch's logits (with the model's distances, on the features; and its input, for the image checks) into
    verdicts."""

    def __init__(self, spec: VerdictSpec | None, confident_probability: float, mean, std) -> None:
        self.spec = spec
        self.p = confident_probability
        self.mean, self.std = mean, std
        if spec is not None and spec.on == "logits":
            self._pm = spec.means @ spec.precision  # [K, K]: rows mu_c P
            self._mpm = np.einsum("ck,ck->c", self._pm, spec.means)  # mu_c P mu_c

    @property
    def mode(self) -> str:
        if self.spec is None:
            return f"softmax >= {self.p} only (the manifest has no verdict statistics)"
        return (
            f"softmax >= {self.p} and distance ({self.spec.on}) to the training photos <= {self.spec.confident_distance:g} "
            f"(unknown beyond {self.spec.unknown_distance:g})"
        )

    def distances(self, logits: np.ndarray, allowed: np.ndarray | None = None, distances: np.ndarray | None = None) -> np.ndarray:
        """Squared Mahalanobis distance of each photo to its nearest class mean (among ``allowed`` classes): on the
        logits computed here, on the features the model's own ``distances`` [N, K]."""
        if self.spec.on == "features":
            if distances is None or np.shape(distances) != np.shape(logits):
                raise VerdictSpecError(
                    f"the verdict is on the features: the model's {self.spec.output!r} output [N, classes] is needed, got "
                    f"{None if distances is None else np.shape(distances)} (an engine that returns the logits alone)"
                )
            d = np.nan_to_num(np.asarray(distances, np.float64), nan=np.inf)  # FP16 overflow: infinitely far
        else:
            z = logits.astype(np.float64)
            zpz = np.einsum("nk,kj,nj->n", z, self.spec.precision, z)
            d = np.maximum(zpz[:, None] - 2 * z @ self._pm.T + self._mpm[None], 0)
        return (d if allowed is None else d[:, allowed]).min(axis=1)

    def judge(
        self,
        logits: np.ndarray,
        probs: np.ndarray,
        batch: np.ndarray,
        allowed: np.ndarray | None = None,
        distances: np.ndarray | None = None,
    ) -> list[Verdict]:
        """Verdicts for the logits the engine returned (and its ``distances``, for a verdict on the features), ``probs``
        as answered (over the ``allowed`` classes, if only some)."""
        contrast, brightness, sharpness = image_checks(batch, self.mean, self.std)
        d = self.distances(logits, allowed, distances) if self.spec is not None else [None] * len(logits)
        s = self.spec
        lim = (s.min_contrast, s.min_brightness, s.max_brightness, s.min_sharpness) if s else (0.02, 0.06, 0.97, 0.0)
        out = []
        for i in range(len(logits)):
            dist = None if d[i] is None else float(d[i])
            if contrast[i] < lim[0]:
                out.append(Verdict("unknown", "the photo is nearly one colour", dist))
            elif brightness[i] < lim[1]:
                out.append(Verdict("unknown", "the photo is too dark", dist))
            elif brightness[i] > lim[2]:
                out.append(Verdict("unknown", "the photo is overexposed", dist))
            elif sharpness[i] < lim[3]:
                out.append(Verdict("unknown", "the photo is blurred", dist))
            elif dist is not None and dist > s.unknown_distance:
                out.append(Verdict("unknown", "unlike the photos the model was trained on", dist))
            elif probs[i].max() < self.p:
                out.append(Verdict("unsure", f"probability {probs[i].max():.2f} below {self.p}", dist))
            elif dist is not None and dist > s.confident_distance:
                out.append(Verdict("unsure", "further from the training photos than a confident answer may be", dist))
            else:
                out.append(Verdict("confident", "", dist))
        return out
