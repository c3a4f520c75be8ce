"""Latency and throughput of every engine available on this machine, on real preprocessed photos."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_agent.config import default_store_path, parse_config
from edge_agent.preprocess import PreprocessSpec, preprocess_file
from engines.base import BackendUnavailable, EngineError
from engines.loader import open_engine

__all__ = ["EngineCase", "LatencyResult", "measure", "CASES", "real_batch"]


@dataclass(frozen=True)
class EngineCase:
    name: str
    engine: dict  # the [engine] table


CASES = [
    EngineCase("ONNX Runtime CPU FP32", {"type": "onnxruntime", "provider": "cpu", "precision": "fp32"}),
    EngineCase("ONNX Runtime CPU INT8", {"type": "onnxruntime", "provider": "cpu", "precision": "int8"}),
    EngineCase("ONNX Runtime CUDA FP32", {"type": "onnxruntime", "provider": "cuda"}),
    EngineCase("ONNX Runtime TensorRT-EP FP16", {"type": "onnxruntime", "provider": "tensorrt", "precision": "fp16"}),
    EngineCase("TensorRT FP16 (native)", {"type": "tensorrt", "precision": "fp16"}),
]


@dataclass
class LatencyResult:
    case: str
    batch: int
    mean_ms: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    images_per_s: float | None = None
    provider: str | None = None
    unavailable: str | None = None


def real_batch(photos: list[Path], n: int, store: Path | None = None) -> np.ndarray:
    """``n`` real photos (cycled if fewer), preprocessed as the store's current version's manifest says."""
    from engines.store import EngineStore

    spec = PreprocessSpec.from_manifest(EngineStore(store or default_store_path()).open().manifest["preprocess"])
    return np.stack([preprocess_file(photos[i % len(photos)], spec) for i in range(n)])


def measure(case: EngineCase, batch: np.ndarray, warmup: int = 10, iters: int = 100, store: Path | None = None) -> LatencyResult:
    cfg = parse_config({"engine": case.engine}).engine
    try:
        engine = open_engine(store or default_store_path(), cfg)
    except (BackendUnavailable, EngineError) as exc:
        return LatencyResult(case.name, len(batch), unavailable=str(exc))
    with engine:
        for _ in range(warmup):
            engine.infer(batch)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            engine.infer(batch)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        mean = statistics.fmean(times)
        return LatencyResult(
            case.name,
            len(batch),
            mean_ms=round(mean, 3),
            p50_ms=round(times[len(times) // 2], 3),
            p99_ms=round(times[min(len(times) - 1, int(len(times) * 0.99))], 3),
            images_per_s=round(len(batch) * 1000 / mean, 1),
            provider=engine.provider,
        )
