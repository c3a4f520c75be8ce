"""Native TensorRT backend (Jetson): an FP16 plan built from the version's ONNX, run with pycuda.

The plan is cached per ONNX sha256 + TensorRT version + GPU + precision (see
:mod:`engines.backends._tensorrt_plan`) and rebuilt when it no longer deserialises.
It uses TensorRT's named I/O tensor API (``num_io_tensors``, ``set_tensor_address``,
``set_input_shape``, ``execute_async_v3``): TensorRT 8.5 and later, so JetPack 5.1
(8.5), JetPack 6.0 (8.6) and JetPack 6.1/6.2 (10.3). Older TensorRT is refused with
the reason. Inference runs in a pipeline worker thread, not the thread that built
the engine, so every CUDA call is made with the device's primary context pushed
onto the calling thread (CUDA context stacks are per thread). The API calls are
listed in docs/jetson-api.md with the tests that cover them.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Literal

import structlog
from pydantic import Field, model_validator

from engines.base import BackendConfig, BackendUnavailable, Engine, EngineError, check_batch, check_distance_io, check_io, register
from engines.cache import cache_dir
from engines.store import StoreVersion

if TYPE_CHECKING:
    import numpy as np

__all__ = ["TensorRTConfig", "TensorRTEngine"]


class TensorRTConfig(BackendConfig):
    """Native TensorRT engine options."""

    type: Literal["tensorrt"] = Field("tensorrt", description="Selects this backend.")
    precision: Literal["fp16", "fp32"] = Field("fp16", description="Arithmetic of the built plan.")
    device_id: int = Field(0, ge=0, description="CUDA device index.")
    max_batch: int = Field(32, ge=1, le=1024, description="Largest batch the plan accepts; bigger batches are split.")
    opt_batch: int = Field(8, ge=1, le=1024, description="Batch size TensorRT tunes kernels for.")
    workspace_mb: int = Field(1024, ge=64, description="Builder workspace (MiB).")
    cache_dir: str = Field("", description="Plan cache; empty means $CACHE_DIRECTORY or ~/.cache/edge-agent, under trt-plans/.")

    @model_validator(mode="after")
    def _opt_within_max(self) -> "TensorRTConfig":
        if self.opt_batch > self.max_batch:
            raise ValueError("opt_batch must not exceed max_batch")
        return self


#: The oldest TensorRT with the named I/O tensor API this backend calls.
MIN_TENSORRT = (8, 5)


def _import_runtime():
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise BackendUnavailable(f"TensorRT Python bindings not importable ({exc}); install JetPack's python3-libnvinfer") from exc
    version = tuple(int(p) for p in trt.__version__.split(".")[:2])
    if version < MIN_TENSORRT:
        raise BackendUnavailable(
            f"TensorRT {trt.__version__} predates the named I/O tensor API (8.5+) this backend uses; "
            "use JetPack 5.1 or later, or the ONNX Runtime backend"
        )
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise BackendUnavailable(f"pycuda not importable ({exc}); install the 'jetson' extra") from exc
    try:
        cuda.init()
        if cuda.Device.count() == 0:
            raise BackendUnavailable("no CUDA device found")
    except cuda.Error as exc:
        raise BackendUnavailable(f"CUDA driver unavailable: {exc}") from exc
    return trt, cuda


@register
class TensorRTEngine(Engine):
    """A TensorRT plan with page-locked host buffers and one CUDA stream."""

    type = "tensorrt"
    Config = TensorRTConfig

    def __init__(self, version: StoreVersion, config: TensorRTConfig, check_photos=None) -> None:
        super().__init__(version, config, check_photos)
        trt, cuda = _import_runtime()
        self._trt, self._cuda = trt, cuda
        from engines.backends._tensorrt_plan import PlanKey, build_plan, load_or_build

        device = cuda.Device(config.device_id)
        self._ctx = device.retain_primary_context()
        self._ctx.push()
        self._dev_in = self._stream = self._context = self._engine = None
        self._outs: dict = {}  # output name -> (page-locked host buffer, device buffer)
        try:
            onnx = version.read_verified(version.artifact("onnx").name)  # read once: the bytes hashed are the bytes built
            spec = version.manifest["input"]
            shape = tuple(int(v) for v in spec["shape"][1:])
            key = PlanKey(
                onnx_sha256=hashlib.sha256(onnx).hexdigest(),
                tensorrt_version=trt.__version__,
                gpu_name=device.name(),
                precision=config.precision,
                opt_batch=config.opt_batch,
                max_batch=config.max_batch,
            )
            self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
            self._engine, self.built_plan = load_or_build(
                key,
                cache_dir(config.cache_dir, "trt-plans"),
                build=lambda: build_plan(
                    onnx, spec["name"], shape, config.precision, 1, config.opt_batch, config.max_batch, config.workspace_mb
                ),
                deserialize=self._runtime.deserialize_cuda_engine,
                log=structlog.get_logger("engines").bind(engine_version=version.name),
            )
            self._context = self._engine.create_execution_context()
            self._setup_buffers(shape)
        except BaseException:
            self._release()
            self._cuda.Context.pop()
            self._ctx.detach()
            self._ctx = None
            raise
        self._cuda.Context.pop()

    # ---- buffers and one run (called with the context pushed) ------------
    def _io(self) -> list[tuple[str, bool, np.dtype]]:
        import numpy as np

        trt, e = self._trt, self._engine
        return [
            (n, e.get_tensor_mode(n) == trt.TensorIOMode.INPUT, np.dtype(trt.nptype(e.get_tensor_dtype(n))))
            for n in (e.get_tensor_name(i) for i in range(e.num_io_tensors))
        ]

    def _setup_buffers(self, shape: tuple[int, int, int]) -> None:
        cuda, n = self._cuda, self.config.max_batch
        io = self._io()
        inputs = [x for x in io if x[1]]
        outputs = {x[0]: x[2] for x in io if not x[1]}
        classes = len(self.version.classes)
        shapes = {name: tuple(self._engine.get_tensor_shape(name)) for name in outputs}  # [-1, classes]: batch is dynamic
        distance = check_distance_io(self.version, shapes)
        logits = self.version.manifest.get("output", {}).get("name")
        logits = logits if logits in outputs else next(iter(outputs), None)
        wanted = [logits, *([distance] if distance else [])]
        if len(inputs) != 1 or None in wanted or set(outputs) != set(wanted):
            raise EngineError(f"expected one input and {len(wanted)} output(s) {wanted}, plan has {[x[0] for x in io]}")
        self._in_name, _, in_dtype = inputs[0]
        self._out_name, self._distance = logits, distance
        check_io(self.version, self._in_name, (n, *shape), shapes[logits])
        # The plan's I/O may be FP16 even though the ONNX is FP32: the buffers take the plan's dtypes.
        self._host_in = cuda.pagelocked_empty((n, *shape), in_dtype)
        self._dev_in = cuda.mem_alloc(self._host_in.nbytes)
        for name in wanted:
            host = cuda.pagelocked_empty((n, classes), outputs[name])
            self._outs[name] = (host, cuda.mem_alloc(host.nbytes))
        self._stream = cuda.Stream()
        for name, mem in ((self._in_name, self._dev_in), *((k, v[1]) for k, v in self._outs.items())):
            if not self._context.set_tensor_address(name, int(mem)):
                raise EngineError(f"TensorRT refused the device address of tensor {name!r}")

    def _run(self, batch: np.ndarray) -> list[np.ndarray]:
        import numpy as np

        cuda, k = self._cuda, len(batch)
        self._host_in[:k] = batch  # casts to the plan's input dtype
        if not self._context.set_input_shape(self._in_name, tuple(batch.shape)):
            raise EngineError(f"TensorRT refused input shape {tuple(batch.shape)} (outside the plan's profile?)")
        cuda.memcpy_htod_async(self._dev_in, self._host_in[:k], self._stream)
        if not self._context.execute_async_v3(stream_handle=self._stream.handle):
            raise EngineError("TensorRT execution failed (see its log)")
        for host, dev in self._outs.values():
            cuda.memcpy_dtoh_async(host[:k], dev, self._stream)
        self._stream.synchronize()
        return [np.array(host[:k], dtype=np.float32) for host, _ in self._outs.values()]

    def _release(self) -> None:
        """Free the device buffers and the stream while the context is current, then let go of TensorRT's objects."""
        for mem in (self._dev_in, *(dev for _, dev in self._outs.values())):
            if mem is not None:
                mem.free()
        self._outs = {}
        self._dev_in = self._stream = self._context = self._engine = None

    # ---- Engine interface ---------------------------------------------------
    @property
    def provider(self) -> str:
        return f"TensorRT {self._trt.__version__}"

    @property
    def precision(self) -> str:
        return self.config.precision

    def _all(self, batch: np.ndarray) -> list[np.ndarray]:
        import numpy as np

        batch = check_batch(batch, self.version)
        step = self.config.max_batch
        self._ctx.push()
        try:
            parts = [self._run(batch[i : i + step]) for i in range(0, len(batch), step)]
        finally:
            self._cuda.Context.pop()
        return [np.concatenate(column) for column in zip(*parts)]

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self._all(batch)[0]

    def infer_with_distance(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        out = self._all(batch)
        return out[0], out[1] if self._distance else None

    def close(self) -> None:
        if getattr(self, "_ctx", None) is not None:
            self._ctx.push()
            try:
                self._release()
            finally:
                self._cuda.Context.pop()
                self._ctx.detach()
                self._ctx = None
