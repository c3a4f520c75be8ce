"""ONNX Runtime backend: CPU (FP32 or the INT8 QDQ variant), CUDA, or the TensorRT execution provider.

ONNX Runtime silently falls back to the CPU when a requested provider cannot be
loaded; this backend checks which provider the session really got and refuses
to run on anything but the one asked for.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from engines.backends import _ort_precision as here
from engines.base import (
    BackendConfig,
    BackendUnavailable,
    Engine,
    EngineError,
    check_batch,
    check_distance_io,
    check_io,
    expected_input,
    register,
)
from engines.cache import cache_dir
from engines.store import StoreError, StoreVersion

if TYPE_CHECKING:
    import numpy as np

__all__ = ["OnnxRuntimeConfig", "OnnxRuntimeEngine", "PROVIDER_NAMES", "choose_precision", "provider_chain"]

PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


class OnnxRuntimeConfig(BackendConfig):
    """ONNX Runtime engine options."""

    type: Literal["onnxruntime"] = Field("onnxruntime", description="Selects this backend.")
    provider: Literal["cpu", "cuda", "tensorrt"] = Field(
        "cpu", description="Execution provider that must run the model: cpu, cuda or tensorrt (the TensorRT EP)."
    )
    precision: Literal["auto", "fp32", "fp16", "int8"] = Field(
        "auto",
        description="auto: on cpu, int8 where the store version's calibrated INT8 variant agreed with FP32 on at least "
        "`int8_min_agreement` of its check photos, runs faster than FP32 here and gives its answers here too (measured "
        "once per version, cached), "
        "fp16 on tensorrt, fp32 otherwise; the choice "
        "and its reason are logged and shown by `status`. fp32; int8 runs the INT8 QDQ model (cpu only); fp16 lets "
        "the TensorRT EP use half precision (tensorrt only).",
    )
    int8_min_agreement: float = Field(
        0.98,
        ge=0,
        le=1,
        description="auto: the least agreement with FP32 (top-1, and verdict where the manifest has one; recorded in the manifest) that INT8 needs.",
    )
    device_id: int = Field(0, ge=0, description="GPU index for cuda and tensorrt.")
    intra_op_threads: int = Field(0, ge=0, le=256, description="CPU threads per inference; 0 lets ONNX Runtime choose.")
    spin: bool = Field(
        False,
        description="Let ONNX Runtime's worker threads busy-wait between inferences (its own default): slightly lower "
        "latency, but they burn CPU the decode workers need and power a battery cannot spare.",
    )
    cache_dir: str = Field(
        "", description="TensorRT EP engine cache and the auto precision's timings; empty means $CACHE_DIRECTORY or ~/.cache/edge-agent."
    )
    trt_workspace_mb: int = Field(1024, ge=64, description="TensorRT EP builder workspace (MiB).")
    trt_max_batch: int = Field(
        32, ge=1, le=1024, description="TensorRT EP: largest batch of the engine's shape profile; bigger batches are split."
    )

    @model_validator(mode="after")
    def _precision_fits_provider(self) -> "OnnxRuntimeConfig":
        if self.precision == "int8" and self.provider != "cpu":
            raise ValueError("precision 'int8' is the CPU engine variant: use provider 'cpu'")
        if self.precision == "fp16" and self.provider != "tensorrt":
            raise ValueError("precision 'fp16' needs provider 'tensorrt' (ONNX Runtime's CPU and CUDA run the FP32 model)")
        return self


def choose_precision(config: OnnxRuntimeConfig, version: StoreVersion) -> tuple[str, str]:
    """The precision to run ``version`` at, and why (``precision = "auto"`` decides from the manifest)."""
    if config.precision != "auto":
        return config.precision, "configured"
    if config.provider == "tensorrt":
        return "fp16", "auto: the TensorRT EP runs half precision"
    if config.provider == "cuda":
        return "fp32", "auto: ONNX Runtime's CUDA provider runs the FP32 model"
    if "int8" not in version.manifest.get("artifacts", {}):
        return "fp32", f"auto: {version.name} has no INT8 variant"
    if here.x86_without_vnni():
        return "fp32", f"auto: {here.NO_VNNI}: FP32"
    check = version.manifest.get("metrics", {}).get("int8") or {}
    agreement = check.get("top1_agreement_with_fp32")
    if not isinstance(agreement, (int, float)):
        return "fp32", f"auto: {version.name}'s INT8 variant has no recorded agreement with FP32"
    if agreement < config.int8_min_agreement:
        return (
            "fp32",
            f"auto: {version.name}'s INT8 agreed with FP32 on {agreement:.3f} of its check photos where it was built < {config.int8_min_agreement}",
        )
    if "verdict" in version.manifest:
        verdicts = check.get("verdict_agreement_with_fp32")
        if not isinstance(verdicts, (int, float)):
            return "fp32", f"auto: {version.name}'s INT8 variant has no recorded verdict agreement with FP32"
        if verdicts < config.int8_min_agreement:
            return "fp32", (
                f"auto: {version.name}'s INT8 gives FP32's verdict on {verdicts:.3f} of its check photos < {config.int8_min_agreement}"
            )
    return (
        "int8",
        f"auto: {version.name}'s INT8 agreed with FP32 on {agreement:.3f} of {check.get('photos', '?')} check photos where it was built",
    )


def provider_chain(config: OnnxRuntimeConfig, precision: str, version: StoreVersion) -> list:
    """The ``providers`` argument of ``InferenceSession``: the configured provider with its documented options
    (https://onnxruntime.ai/docs/execution-providers/), then the providers ONNX Runtime may hand unsupported
    nodes to. The TensorRT EP gets an explicit shape profile (batch 1..trt_max_batch), so it builds one engine
    up front instead of one per new batch size, and caches engines and kernel timings on disk: the engines in a folder
    of the version's own (``ort-trt/<its model's sha256, 12 digits>``, which :func:`engines.prune.forget_caches` deletes
    with the version), the kernel timings, which any model reuses, in ``ort-trt`` itself."""
    if config.provider == "cpu":
        return ["CPUExecutionProvider"]
    cuda = ("CUDAExecutionProvider", {"device_id": config.device_id, "arena_extend_strategy": "kSameAsRequested"})
    if config.provider == "cuda":
        return [cuda, "CPUExecutionProvider"]
    name = version.manifest["input"]["name"]
    dims = "x".join(str(int(v)) for v in version.manifest["input"]["shape"][1:])
    own = str(((version.manifest.get("files") or {}).get("model.onnx") or {}).get("sha256", ""))[:12] or version.name
    cache = str(cache_dir(config.cache_dir, "ort-trt"))
    trt = {
        "device_id": config.device_id,
        "trt_fp16_enable": precision == "fp16",
        "trt_max_workspace_size": config.trt_workspace_mb << 20,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache_dir(config.cache_dir, f"ort-trt/{own}")),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": cache,
        "trt_profile_min_shapes": f"{name}:1x{dims}",
        "trt_profile_opt_shapes": f"{name}:{min(8, config.trt_max_batch)}x{dims}",
        "trt_profile_max_shapes": f"{name}:{config.trt_max_batch}x{dims}",
    }
    return [("TensorrtExecutionProvider", trt), cuda, "CPUExecutionProvider"]


@contextlib.contextmanager
def _private_file(data: bytes):
    """A path to ``data`` in an anonymous memory file only this process holds (Linux ``memfd``), closed on exit;
    elsewhere the bytes themselves. ONNX Runtime's Python session keeps the bytes it was given for its lifetime (13.6 MB
    for v2000's FP32 model); given a path it keeps the path, and nobody can change what the path holds."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        yield data
        return
    fd = os.memfd_create("edge-agent-model", os.MFD_CLOEXEC)
    try:
        with memoryview(data) as whole:
            view = whole
            while view:
                view = view[os.write(fd, view) :]
            view.release()
        del data  # the caller drops its reference too: the file is then the only copy
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


@register
class OnnxRuntimeEngine(Engine):
    """An ``onnxruntime.InferenceSession`` on the configured provider."""

    type = "onnxruntime"
    Config = OnnxRuntimeConfig

    @classmethod
    def load_runtime(cls) -> None:
        import onnxruntime  # noqa: F401

    def __init__(self, version: StoreVersion, config: OnnxRuntimeConfig, check_photos=None) -> None:
        super().__init__(version, config, check_photos)
        import onnxruntime as ort

        wanted = PROVIDER_NAMES[config.provider]
        available = ort.get_available_providers()
        if wanted not in available:
            hint = " (install onnxruntime-gpu, the 'jetson' extra)" if config.provider != "cpu" else ""
            raise BackendUnavailable(f"ONNX Runtime {ort.__version__} here has no {wanted}{hint}; available: {', '.join(available)}")
        self._precision, self.precision_reason = choose_precision(config, version)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if config.intra_op_threads:
            opts.intra_op_num_threads = config.intra_op_threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if config.spin else "0")
        opts.log_severity_level = 3
        providers = provider_chain(config, self._precision, version)
        self._max_batch = config.trt_max_batch if config.provider == "tensorrt" else None
        self._checked = threading.Event()  # set once the precision served is the one this machine's answer names
        self._stop_check = threading.Event()
        self._check_thread: threading.Thread | None = None
        if config.precision == "auto" and self._precision == "int8":  # same answers: the faster of the two, measured here
            self._session = self._faster(ort, opts, providers)
        else:
            self._session = self._load(ort, "int8" if self._precision == "int8" else "onnx", opts, providers)
        if self._check_thread is None:
            self._checked.set()
        active = self._session.get_providers()
        if wanted not in active:
            raise BackendUnavailable(
                f"ONNX Runtime fell back to {active[0]} instead of {wanted} (driver or library missing?); refusing to run"
            )
        self._input = self._session.get_inputs()[0]
        self._output = self._session.get_outputs()[0]
        check_io(version, self._input.name, self._input.shape, self._output.shape)
        self._distance = check_distance_io(version, {o.name: o.shape for o in self._session.get_outputs()})
        # Warm up with one photo: the arena's first region is then sized for a single photo, the size the
        # idle shrink in trim() runs with, so every region a burst adds is fully free and handed back.
        self._session.run([self._output.name], {self._input.name: self._one_photo()})
        if self._check_thread is not None:
            self._check_thread.start()

    def _load(self, ort, kind: str, opts, providers):
        """An InferenceSession of the version's ``kind`` artifact, from the bytes whose sha256 was just checked (not the
        path: a file replaced after the check is never loaded)."""
        model = self.version.artifact(kind)
        try:
            data = self.version.read_verified(model.name)
            with _private_file(data) as path:  # a path, so the session does not keep a copy of the bytes for life
                del data
                return ort.InferenceSession(path, sess_options=opts, providers=providers)
        except StoreError:
            raise
        except Exception as exc:  # onnxruntime raises its own exception types
            raise EngineError(f"{self.version.name}: ONNX Runtime could not load {model.name}: {exc}") from exc

    def _faster(self, ort, opts, providers):
        """The session of the precision this machine's cached answer names (INT8 only where it runs a photo faster than
        FP32 here and, given ``check_photos``, gives FP32's top-1 on them here: :mod:`._ort_precision`). With no answer
        yet: given ``check_photos``, FP32 (the reference answers) while a thread measures and checks INT8 against it
        and switches to it where it qualifies (about 16 s for v4000 on 2 x86 cores, so a first start is not held up);
        without, both are timed here and now."""
        self._answer = here.answer_file(self.version, self.config.cache_dir, ort.__version__)
        self._manifest_reason = self.precision_reason
        measured = here.read_answer(self._answer, with_agreement=self.check_photos is not None)
        if measured is not None:
            self._precision, self.precision_reason = here.decide(
                measured, self.version, self.config.int8_min_agreement, self.precision_reason
            )
            return self._load(ort, "int8" if self._precision == "int8" else "onnx", opts, providers)
        fp32 = self._load(ort, "onnx", opts, providers)
        if self.check_photos is None:  # timing alone (a benchmark, a test): here and now
            self._precision, self.precision_reason, session = self._checked_here(ort, opts, providers, fp32)
            return session
        self._check_thread = threading.Thread(
            target=self._check_here, args=(ort, opts, providers), name=f"precision-{self.version.name}", daemon=True
        )
        self._precision = "fp32"
        self.precision_reason += "; FP32 until INT8 is timed and checked against it on this machine (once, in the background)"
        return fp32

    def _check_here(self, ort, opts, providers) -> None:
        """Time INT8 against the FP32 session serving, check its answers on ``check_photos``, cache the answer and
        serve INT8 where it qualifies, then hand the check's memory back; stopped by :meth:`close` (nothing cached)."""
        import structlog

        log = structlog.get_logger("engines").bind(engine_version=self.version.name)
        try:
            checked = self._checked_here(ort, opts, providers, self._session)
            if checked is not None:
                self._precision, self.precision_reason, self._session = checked  # a run under way ends on its session
                log.info("engine_precision_checked", precision=checked[0], reason=checked[1])
            checked = None
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own errors, a store file gone: FP32 keeps serving
            if not self._stop_check.is_set():
                self.precision_reason = f"{self._manifest_reason}; FP32: checking INT8 here failed ({exc})"
                log.warning("engine_precision_check_failed", error=str(exc), serving="fp32")
        finally:
            if not self._stop_check.is_set():
                with contextlib.suppress(Exception):  # closed meanwhile
                    self.trim()  # the session not chosen and the check photos: 488 MB held for v4000 here otherwise
            self._checked.set()

    def _checked_here(self, ort, opts, providers, fp32):
        """(precision, reason, session) as measured against the FP32 session ``fp32`` (and on ``check_photos`` where
        given) and cached here; None where :meth:`close` stopped the check."""
        int8 = self._load(ort, "int8", opts, providers)
        check_io(self.version, int8.get_inputs()[0].name, int8.get_inputs()[0].shape, int8.get_outputs()[0].shape)
        if check_distance_io(self.version, {o.name: o.shape for o in int8.get_outputs()}) != check_distance_io(
            self.version, {o.name: o.shape for o in fp32.get_outputs()}
        ):
            raise EngineError(f"{self.version.name}: the INT8 model's outputs differ from the FP32 model's")
        measured = self._timings(int8, fp32)
        if self.check_photos is not None:  # its answers, only where INT8 would be chosen for its speed
            faster = measured["int8_ms"] <= measured["fp32_ms"]
            measured.update(
                here.agreement(int8, fp32, self._until_closed(self.check_photos(self.version))) if faster else {"agreement": None}
            )
        if self._stop_check.is_set():
            return None
        here.write_answer(self._answer, measured)
        precision, reason = here.decide(measured, self.version, self.config.int8_min_agreement, self._manifest_reason)
        return precision, reason, int8 if precision == "int8" else fp32

    def _until_closed(self, batches):
        """``batches`` until :meth:`close` asks the check to stop."""
        for batch in batches:
            if self._stop_check.is_set():
                return
            yield batch

    def wait_checked(self, timeout: float | None = None) -> bool:
        return self._checked.wait(timeout)

    def _timings(self, int8, fp32) -> dict:
        """The median milliseconds a photo of the INT8 session ``int8`` and of the FP32 session ``fp32`` here."""
        return here.timings(int8, fp32, self._one_photo())

    def _one_photo(self) -> np.ndarray:
        import numpy as np

        channels, size = expected_input(self.version)
        return np.zeros((1, channels, size, size), np.float32)

    @property
    def provider(self) -> str:
        return self._session.get_providers()[0]

    @property
    def precision(self) -> str:
        return self._precision

    def describe(self) -> dict:
        return {**super().describe(), "precision_reason": self.precision_reason}

    def _run(self, names: list[str], batch: np.ndarray) -> list[np.ndarray]:
        batch = check_batch(batch, self.version)
        step = self._max_batch or len(batch)
        if len(batch) <= step:
            return self._session.run(names, {self._input.name: batch})
        import numpy as np

        parts = [self._session.run(names, {self._input.name: batch[i : i + step]}) for i in range(0, len(batch), step)]
        return [np.concatenate(column) for column in zip(*parts)]

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self._run([self._output.name], batch)[0]

    def infer_with_distance(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if self._distance is None:
            return self.infer(batch), None
        logits, distance = self._run([self._output.name, self._distance], batch)
        return logits, distance

    def trim(self) -> None:
        """Shrink ONNX Runtime's CPU arena (kept for speed under load) with one tiny run, then trim the heap."""
        import onnxruntime as ort

        opts = ort.RunOptions()
        opts.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self._session.run([self._output.name], {self._input.name: self._one_photo()}, opts)
        super().trim()

    def close(self) -> None:
        self._stop_check.set()
        if self._check_thread is not None and self._check_thread.is_alive():
            self._check_thread.join(60)  # it stops before its next batch of check photos
        self._session = None
