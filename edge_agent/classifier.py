"""Photos in, predictions out: preprocessing + an engine + softmax, shared by ``classify`` and the daemon."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from edge_agent.preprocess import PreprocessSpec, preprocess_bytes, read_limited
from edge_agent.verdict import Judge, VerdictSpec, VerdictSpecError
from engines.base import Engine

__all__ = ["Classifier", "Prediction", "softmax"]


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class Prediction:
    label: str
    confidence: float
    top_k: list[tuple[str, float]]
    engine_version: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    verdict: str = "unsure"  # confident | unsure | unknown (edge_agent.verdict)
    verdict_reason: str = ""
    distances: np.ndarray | None = None  # on the features: the model's squared distances to each class (float32)

    @property
    def ms(self) -> float:
        return round(sum(self.timings_ms.values()), 3)


class Classifier:
    """An engine together with the preprocessing its manifest prescribes and the verdict its statistics allow.

    ``confident_probability`` is the least softmax a ``confident`` verdict needs ([labels] pseudo_threshold)."""

    def __init__(
        self,
        engine: Engine,
        top_k: int = 3,
        max_file_bytes: int | None = None,
        max_pixels: int | None = None,
        confident_probability: float = 0.9,
        crops: list[str] | tuple[str, ...] = (),
    ) -> None:
        caps = {k: v for k, v in {"max_file_bytes": max_file_bytes, "max_pixels": max_pixels}.items() if v is not None}
        self.engine = engine
        self.allowed = None  # with crops: a mask of the classes answers are chosen among
        if crops:
            self.allowed = np.array([any(c.split("___")[0] == crop for crop in crops) for c in engine.classes])
            if not self.allowed.any():
                raise ValueError(
                    f"[classify] crops = {list(crops)} names none of {engine.engine_version}'s classes "
                    f"(crops are class-name prefixes such as {engine.classes[0].split('___')[0]!r})"
                )
        self.spec = PreprocessSpec.from_manifest(engine.version.manifest["preprocess"], **caps)
        self.top_k = min(top_k, len(engine.classes) if self.allowed is None else int(self.allowed.sum()))
        self.judge = Judge(VerdictSpec.from_manifest(engine.version.manifest), confident_probability, self.spec.mean, self.spec.std)
        self._on_features = self.judge.spec is not None and self.judge.spec.on == "features"  # the engine's distances needed
        if self._on_features and getattr(type(engine), "infer_with_distance", None) is Engine.infer_with_distance:
            raise VerdictSpecError(
                f"{engine.engine_version}'s verdict needs the model's {self.judge.spec.output!r} output, which the "
                f"{engine.type!r} backend does not return (use onnxruntime or tensorrt)"
            )

    @classmethod
    def configured(cls, engine: Engine, cfg) -> "Classifier":
        """The classifier as the configuration (:class:`edge_agent.config.AppConfig`) sets it up."""
        return cls(
            engine,
            top_k=cfg.classify.top_k,
            max_file_bytes=cfg.preprocess.max_file_bytes,
            max_pixels=cfg.preprocess.max_pixels,
            confident_probability=cfg.labels.pseudo_threshold,
            crops=cfg.classify.crops,
        )

    def predict_tensors(self, batch: np.ndarray) -> list[Prediction]:
        """Predictions for a preprocessed batch [N,3,H,W], each with its verdict."""
        t0 = time.perf_counter()
        logits, distances = self.engine.infer_with_distance(batch) if self._on_features else (self.engine.infer(batch), None)
        logits = logits.astype(np.float64)
        probs = softmax(logits if self.allowed is None else np.where(self.allowed, logits, -np.inf))
        verdicts = self.judge.judge(logits, probs, batch, self.allowed, distances)
        infer_ms = (time.perf_counter() - t0) * 1000 / len(batch)
        classes = self.engine.classes
        out = []
        for i, (row, v) in enumerate(zip(probs, verdicts)):
            order = np.argsort(-row)[: self.top_k]
            out.append(
                Prediction(
                    label=classes[order[0]],
                    confidence=float(row[order[0]]),
                    top_k=[(classes[i], round(float(row[i]), 6)) for i in order],
                    engine_version=self.engine.engine_version,
                    timings_ms={"infer": round(infer_ms, 3)},
                    verdict=v.verdict,
                    verdict_reason=v.reason,
                    distances=None if distances is None else np.asarray(distances[i], np.float32),
                )
            )
        return out

    def predict_bytes(self, data: bytes) -> Prediction:
        """Prediction for one photo's bytes; raises :class:`~edge_agent.preprocess.ImageRejected`."""
        t0 = time.perf_counter()
        x = preprocess_bytes(data, self.spec)
        pre_ms = (time.perf_counter() - t0) * 1000
        pred = self.predict_tensors(x[None])[0]
        pred.timings_ms = {"preprocess": round(pre_ms, 3), **pred.timings_ms}
        return pred

    def predict_file(self, path: str | os.PathLike) -> Prediction:
        t0 = time.perf_counter()
        data = read_limited(path, self.spec)
        read_ms = (time.perf_counter() - t0) * 1000
        pred = self.predict_bytes(data)
        pred.timings_ms = {"read": round(read_ms, 3), **pred.timings_ms}
        return pred
