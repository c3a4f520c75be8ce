"""ONNX -> TensorRT plan, and the plan cache.

A plan only works with the TensorRT version and the GPU it was built for, so the
cache key is the ONNX file's sha256 + TensorRT version + GPU name + precision +
batch profile. A cached plan that fails to deserialise (the usual breakage after
a JetPack upgrade) is deleted and rebuilt.

The cache logic (:func:`load_or_build`) takes the build and deserialise steps as
functions, so it is tested without a GPU; :func:`build_plan` needs TensorRT.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from engines.base import EngineError
from engines.durable import atomic_write

__all__ = ["PlanKey", "build_plan", "load_or_build", "PlanBuildError"]

T = TypeVar("T")


class PlanBuildError(EngineError):
    """TensorRT could not build or load a plan."""


@dataclass(frozen=True)
class PlanKey:
    onnx_sha256: str
    tensorrt_version: str
    gpu_name: str
    precision: str  # "fp16" | "fp32"
    min_batch: int = 1
    opt_batch: int = 8
    max_batch: int = 32

    @property
    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:24]

    @property
    def filename(self) -> str:
        return f"{self.onnx_sha256[:12]}-{self.precision}-{self.digest}.plan"


def load_or_build(
    key: PlanKey, cache_dir: Path, build: Callable[[], bytes], deserialize: Callable[[bytes], T | None], log: Any = None
) -> tuple[T, bool]:
    """Return (engine, built_now). Uses the cached plan for ``key`` when it deserialises,
    else builds one, stores it atomically beside a JSON copy of the key, and loads it; a plan built now replaces those
    of the same model and precision an earlier TensorRT built (a JetPack upgrade's leftovers, 10-30 MB each)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    plan_path = cache_dir / key.filename
    if plan_path.is_file():
        try:
            engine = deserialize(plan_path.read_bytes())
        except Exception as exc:  # TensorRT raises assorted errors on a stale plan
            engine, why = None, str(exc)
        else:
            why = "deserialisation returned nothing"
        if engine is not None:
            return engine, False
        if log is not None:
            log.warning("trt_plan_stale", plan=str(plan_path), reason=why, action="rebuilding")
        plan_path.unlink(missing_ok=True)
    plan = build()
    if not plan:
        raise PlanBuildError("TensorRT produced an empty plan")
    atomic_write(plan_path, plan)
    atomic_write(plan_path.with_suffix(".json"), (json.dumps(asdict(key), indent=2) + "\n").encode(), durable=False)
    engine = deserialize(plan)
    if engine is None:
        raise PlanBuildError(f"a freshly built plan for {key.filename} does not deserialise")
    for old in _older_tensorrt(key, cache_dir):
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)
        if log is not None:
            log.info("trt_plan_deleted", plan=str(old), reason=f"built by another TensorRT than {key.tensorrt_version}")
    return engine, True


def _older_tensorrt(key: PlanKey, cache_dir: Path) -> list[Path]:
    """The plans in ``cache_dir`` for ``key``'s model and precision whose recorded key names another TensorRT version."""
    found = []
    for plan in cache_dir.glob(f"{key.onnx_sha256[:12]}-{key.precision}-*.plan"):
        try:
            recorded = json.loads(plan.with_suffix(".json").read_text())
        except (OSError, ValueError):
            continue  # no key beside it: not known to be stale, kept
        if (
            isinstance(recorded, dict)
            and recorded.get("onnx_sha256") == key.onnx_sha256
            and recorded.get("tensorrt_version") not in (None, key.tensorrt_version)
        ):
            found.append(plan)
    return found


def build_plan(
    onnx_path: str | Path | bytes,
    input_name: str,
    input_shape: tuple[int, int, int],
    precision: str = "fp16",
    min_batch: int = 1,
    opt_batch: int = 8,
    max_batch: int = 32,
    workspace_mb: int = 1024,
) -> bytes:
    """Build a serialised TensorRT plan from ONNX (a file, or its bytes already read and verified: the bytes
    hashed are the bytes built), with the TensorRT 8.5-8.6 or 10.x Python API.

    TensorRT 8 parses ONNX only into an explicit-batch network (the flag must be given); in 10 every network is
    explicit-batch and the flag is deprecated. ``platform_has_fast_fp16`` is consulted before 10 only (deprecated in
    10.5). TensorRT 11 removes ``BuilderFlag.FP16`` (strongly typed networks): refused with the reason.
    """
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    if precision == "fp16" and not hasattr(trt.BuilderFlag, "FP16"):
        raise PlanBuildError(
            f"TensorRT {trt.__version__} has no BuilderFlag.FP16 (strongly typed networks only): "
            "configure precision 'fp32' or use TensorRT 8.5-10"
        )
    flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    model = onnx_path if isinstance(onnx_path, bytes) else Path(onnx_path).read_bytes()
    if not parser.parse(model):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise PlanBuildError(f"TensorRT could not parse {'the ONNX model' if isinstance(onnx_path, bytes) else onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    if precision == "fp16":
        if major < 10 and not builder.platform_has_fast_fp16:
            raise PlanBuildError("this GPU has no fast FP16; configure precision 'fp32'")
        config.set_flag(trt.BuilderFlag.FP16)
    elif precision != "fp32":
        raise PlanBuildError(f"unsupported TensorRT precision {precision!r}")
    profile = builder.create_optimization_profile()
    profile.set_shape(input_name, (min_batch, *input_shape), (opt_batch, *input_shape), (max_batch, *input_shape))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise PlanBuildError("TensorRT failed to build the engine (see its log above)")
    return bytes(plan)
