"""The Jetson paths against fakes of their documented APIs (tests/fakes): native TensorRT + pycuda,
ONNX Runtime's TensorRT/CUDA provider options. They fail on the mistakes a real Jetson would expose:
a context used from another thread, a missing stream synchronise, swapped copy arguments, FP16 I/O
tensors, a batch outside the profile, a plan from another TensorRT version. The table of calls is
docs/jetson-api.md."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from edge_agent.config import parse_config
from edge_agent.preprocess import preprocess_bytes
from engines.backends._tensorrt_plan import PlanBuildError, build_plan
from engines.base import BackendUnavailable, EngineError
from engines.loader import open_engine
from tests import fakes
from tests.conftest import encode, leaf_image


def trt_config(tmp_path, **engine):
    return parse_config({"engine": {"type": "tensorrt", "cache_dir": str(tmp_path / "plans"), **engine}}).engine


def ort_config(**engine):
    return parse_config({"engine": {"type": "onnxruntime", "precision": "fp32", **engine}}).engine


@pytest.fixture(scope="module")
def photos() -> np.ndarray:
    return np.stack([preprocess_bytes(encode(leaf_image(i))) for i in range(40)])


@pytest.fixture(scope="module")
def reference(tiny_store, photos) -> np.ndarray:
    with open_engine(tiny_store, ort_config()) as ref:
        return ref.infer(photos)


def in_thread(fn):
    """Run ``fn`` in a new thread (as the daemon's pipeline worker does) and return its result or raise its error."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("version", ["10.3.0", "8.6.2", "8.5.2"])
def test_native_tensorrt_runs_in_a_worker_thread_and_matches_onnxruntime(monkeypatch, tmp_path, tiny_store, photos, reference, version):
    f = fakes.install(monkeypatch, tensorrt_version=version)
    with open_engine(tiny_store, trt_config(tmp_path)) as engine:
        assert engine.built_plan and engine.precision == "fp16" and engine.provider == f"TensorRT {version}"
        out = in_thread(lambda: engine.infer(photos))  # not the thread that made the context
        assert out.dtype == np.float32 and out.shape == reference.shape
        np.testing.assert_allclose(out, reference, atol=2e-2)
        assert (out.argmax(1) == reference.argmax(1)).mean() >= 0.95
        assert f.cuda.current_context() is None  # the context was popped again
    assert f.cuda.events.count("free") == 2 and f.cuda.events.count("detach") == 1
    with open_engine(tiny_store, trt_config(tmp_path)) as again:
        assert not again.built_plan  # the cached plan deserialised


def test_fp16_io_tensors_are_read_and_written_in_their_dtype(monkeypatch, tmp_path, tiny_store, photos, reference):
    fakes.install(monkeypatch, io_dtype="float16")
    with open_engine(tiny_store, trt_config(tmp_path)) as engine:
        assert engine._host_in.dtype == np.float16 and engine._outs[engine._out_name][0].dtype == np.float16
        out = engine.infer(photos)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, reference, atol=2e-2)


def test_batches_beyond_the_profile_are_split(monkeypatch, tmp_path, tiny_store, photos, reference):
    fakes.install(monkeypatch)
    with open_engine(tiny_store, trt_config(tmp_path, max_batch=16, opt_batch=8)) as engine:
        out = engine.infer(photos)  # 40 photos: 16 + 16 + 8
        assert engine._context.launches == 3
    np.testing.assert_allclose(out, reference, atol=2e-2)


def test_a_stale_plan_from_another_tensorrt_is_rebuilt(monkeypatch, tmp_path, tiny_store):
    fakes.install(monkeypatch, tensorrt_version="10.3.0")
    with open_engine(tiny_store, trt_config(tmp_path)) as engine:
        assert engine.built_plan
    [plan] = (tmp_path / "plans" / "trt-plans").glob("*.plan")
    # a plan 10.0 built now sits under 10.3's name (a restored backup, a copied cache): TensorRT refuses it
    fakes.install(monkeypatch, tensorrt_version="10.0.1")
    with open_engine(tiny_store, trt_config(tmp_path)) as old:
        assert old.built_plan  # another version: another key, so a plan of its own
    old_plan = next(p for p in (tmp_path / "plans" / "trt-plans").glob("*.plan") if p != plan)
    shutil.copy(old_plan, plan)
    fakes.install(monkeypatch, tensorrt_version="10.3.0")
    with capture_logs() as logs, open_engine(tiny_store, trt_config(tmp_path)) as rebuilt:
        assert rebuilt.built_plan
        assert rebuilt.infer(np.zeros((1, 3, 128, 128), np.float32)).shape == (1, 3)
    assert [e["action"] for e in logs if e["event"] == "trt_plan_stale"] == ["rebuilding"]


def test_tensorrt_older_than_8_5_is_refused_with_the_reason(monkeypatch, tmp_path, tiny_store):
    fakes.install(monkeypatch, tensorrt_version="8.2.1")
    with pytest.raises(BackendUnavailable, match="8.2.1 predates the named I/O tensor API"):
        open_engine(tiny_store, trt_config(tmp_path))


def test_no_cuda_device_says_so(monkeypatch, tmp_path, tiny_store):
    f = fakes.install(monkeypatch)
    f.cuda.DEVICES.clear()
    with pytest.raises(BackendUnavailable, match="no CUDA device"):
        open_engine(tiny_store, trt_config(tmp_path))


def test_a_failed_start_releases_the_context(monkeypatch, tmp_path, tiny_store):
    f = fakes.install(monkeypatch)
    monkeypatch.setattr(f.trt.IExecutionContext, "set_tensor_address", lambda self, name, memory: False)
    with pytest.raises(EngineError, match="refused the device address"):
        open_engine(tiny_store, trt_config(tmp_path))
    assert f.cuda.current_context() is None and f.cuda.events.count("detach") == 1


def test_build_plan_on_tensorrt_8_asks_for_an_explicit_batch_network(monkeypatch, tiny_store):
    """TensorRT 8's ONNX parser refuses an implicit-batch network: the flag is what makes it parse."""
    f = fakes.install(monkeypatch, tensorrt_version="8.6.2")
    onnx = tiny_store / "v0001" / "model.onnx"
    assert build_plan(onnx, "input", (3, 128, 128)).startswith(b"FAKETRT")
    original = f.trt.Builder.create_network
    monkeypatch.setattr(f.trt.Builder, "create_network", lambda self, flags=0: original(self, 0))
    with pytest.raises(PlanBuildError, match="explicit batch"):
        build_plan(onnx, "input", (3, 128, 128))


def test_build_plan_refuses_a_bad_profile_and_a_broken_onnx(monkeypatch, tiny_store, tmp_path):
    fakes.install(monkeypatch)
    onnx = tiny_store / "v0001" / "model.onnx"
    with pytest.raises(PlanBuildError, match="failed to build"):
        build_plan(onnx, "input", (3, 128, 128), min_batch=8, opt_batch=4, max_batch=2)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(onnx.read_bytes()[:200])
    with pytest.raises(PlanBuildError, match="could not parse"):
        build_plan(broken, "input", (3, 128, 128))


def test_tensorrt_11_without_fp16_flag_is_refused(monkeypatch, tiny_store):
    fakes.install(monkeypatch, tensorrt_version="11.0.0")
    with pytest.raises(PlanBuildError, match="no BuilderFlag.FP16"):
        build_plan(tiny_store / "v0001" / "model.onnx", "input", (3, 128, 128))


def test_the_fakes_catch_the_misuses_a_jetson_would(monkeypatch):
    """The fakes themselves: what they refuse, so a passing test above means the calls are right."""
    f = fakes.install(monkeypatch)
    cuda = f.cuda
    cuda.init()
    with pytest.raises(cuda.LogicError, match="invalid device context"):
        cuda.mem_alloc(64)  # no context pushed in this thread
    ctx = cuda.Device(0).retain_primary_context()
    ctx.push()
    try:
        host = cuda.pagelocked_empty((4,), np.float32)
        host[:] = [1, 2, 3, 4]
        dev = cuda.mem_alloc(host.nbytes)
        stream = cuda.Stream()
        with pytest.raises(TypeError):
            cuda.memcpy_htod_async(host, dev, stream)  # arguments swapped
        cuda.memcpy_htod_async(dev, host, stream)
        back = np.zeros(4, np.float32)
        cuda.memcpy_dtoh_async(back, dev, stream)
        assert not back.any()  # nothing ran yet: the stream was not synchronised
        stream.synchronize()
        assert back.tolist() == [1, 2, 3, 4]
        with pytest.raises(cuda.LogicError):
            in_thread(lambda: stream.synchronize())  # the context is not current in that thread
    finally:
        cuda.Context.pop()
    with pytest.raises(TypeError):
        f.trt.Runtime(f.trt.Logger(f.trt.Logger.WARNING)).deserialize_cuda_engine("plan.plan")  # a path, not bytes


# ---- ONNX Runtime's GPU providers ---------------------------------------------


class _RecordingSession:
    """Stands in for onnxruntime-gpu's InferenceSession: checks the provider options against the names ONNX Runtime
    parses (onnxruntime/core/providers/tensorrt/tensorrt_execution_provider_info.cc and the CUDA EP's), then runs the
    model on the CPU while reporting the providers asked for, as a session on a Jetson would."""

    seen: list = []
    real: type

    def __init__(self, path, sess_options=None, providers=None):
        from tests.fakes.onnxruntime_gpu import check_providers

        check_providers(providers)
        type(self).seen.append(providers)
        self._real = self.real(path, sess_options=sess_options, providers=["CPUExecutionProvider"])
        self._providers = [p if isinstance(p, str) else p[0] for p in providers]

    def get_providers(self):
        return self._providers

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.fixture
def gpu_onnxruntime(monkeypatch):
    import onnxruntime as ort

    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    _RecordingSession.seen, _RecordingSession.real = [], ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession", _RecordingSession)
    return _RecordingSession


def test_tensorrt_ep_gets_documented_options_and_a_shape_profile(gpu_onnxruntime, tiny_store, tmp_path, photos, reference):
    cfg = ort_config(provider="tensorrt", precision="auto", cache_dir=str(tmp_path / "cache"), trt_max_batch=16)
    with open_engine(tiny_store, cfg) as engine:
        assert engine.precision == "fp16" and engine.provider == "TensorrtExecutionProvider"
        out = engine.infer(photos)  # 40 > 16: split to stay inside the profile
    np.testing.assert_allclose(out, reference, atol=1e-4)
    (name, trt), (cuda_name, cuda), cpu = gpu_onnxruntime.seen[0]
    assert (name, cuda_name, cpu) == ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    assert trt["trt_fp16_enable"] is True and trt["trt_engine_cache_enable"] is True
    from engines.store import EngineStore

    store = EngineStore(tiny_store)
    own = store.read_manifest(store.current())["files"]["model.onnx"]["sha256"][:12]
    assert trt["trt_engine_cache_path"] == str(tmp_path / "cache" / "ort-trt" / own)  # a folder the version's deletion removes
    assert trt["trt_timing_cache_path"] == str(tmp_path / "cache" / "ort-trt") and Path(trt["trt_engine_cache_path"]).is_dir()
    assert trt["trt_profile_min_shapes"] == "input:1x3x128x128"
    assert trt["trt_profile_max_shapes"] == "input:16x3x128x128"
    assert trt["trt_max_workspace_size"] == 1024 << 20
    assert cuda == {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"}


def test_cuda_ep_gets_documented_options(gpu_onnxruntime, tiny_store):
    with open_engine(tiny_store, ort_config(provider="cuda", precision="auto")) as engine:
        assert engine.precision == "fp32" and engine.provider == "CUDAExecutionProvider"
    assert gpu_onnxruntime.seen[0] == [
        ("CUDAExecutionProvider", {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"}),
        "CPUExecutionProvider",
    ]


def test_the_provider_check_refuses_what_onnxruntime_refuses():
    from tests.fakes.onnxruntime_gpu import check_providers

    with pytest.raises(ValueError, match="Unknown provider option: trt_fp16"):
        check_providers([("TensorrtExecutionProvider", {"trt_fp16": True})])
    with pytest.raises(ValueError, match="trt_profile_min_shapes"):
        check_providers(
            [
                (
                    "TensorrtExecutionProvider",
                    {
                        "trt_profile_min_shapes": "input:1,3,128,128",
                        "trt_profile_max_shapes": "input:8x3x128x128",
                        "trt_profile_opt_shapes": "input:8x3x128x128",
                    },
                )
            ]
        )
    with pytest.raises(ValueError, match="all three"):
        check_providers([("TensorrtExecutionProvider", {"trt_profile_min_shapes": "input:1x3x128x128"})])
    with pytest.raises(ValueError, match="arena_extend_strategy"):
        check_providers([("CUDAExecutionProvider", {"arena_extend_strategy": "sameAsRequested"})])


# ---- power with jtop ------------------------------------------------------------


@pytest.fixture
def fake_jtop(monkeypatch, tmp_path):
    import sys

    import benchmarks.power as power
    from tests.fakes import jtop

    module = jtop.make_module()
    monkeypatch.setitem(sys.modules, "jtop", module)
    monkeypatch.setattr(power, "RAPL", tmp_path / "absent")
    monkeypatch.setattr(power, "_jtop", _fast(power._jtop))
    return module


def _fast(meter):
    """jtop's interval shortened so a test window of a fraction of a second holds several samples."""
    return lambda work, seconds: meter(work, seconds, interval=0.02)


def _work(per_call: int = 4, pause: float = 0.002):
    def work() -> int:
        time.sleep(pause)
        return per_call

    return work


def test_jtop_power_in_watts_and_joules_per_inference(fake_jtop):
    from benchmarks.power import measure_power

    fake_jtop.TRACE_MW[:] = [6000, 9000]  # board total alternating 6 and 9 W: 7.5 W on average
    fake_jtop.NVPMODEL, fake_jtop.JETSON_CLOCKS = "15W", True
    r = measure_power(_work(), 0.4, gpu=True)
    assert r["meter"] == "jtop VDD_IN (board total)"
    assert 6.0 <= r["mean_w"] <= 9.0 and r["samples"] >= 5  # watts, not milliwatts
    assert r["joules_per_inference"] == pytest.approx(r["mean_w"] * r["window_s"] / r["inferences"], rel=0.2)
    assert r["nvpmodel"] == "15W" and r["jetson_clocks"] is True


def test_jtop_without_nvpmodel_or_jetson_clocks_records_none(fake_jtop):
    from benchmarks.power import measure_power

    fake_jtop.NVPMODEL, fake_jtop.JETSON_CLOCKS = None, None
    r = measure_power(_work(), 0.2)
    assert r["nvpmodel"] is None and r["jetson_clocks"] is None and r["mean_w"] == pytest.approx(7.5)


@pytest.mark.parametrize("board, reason", [("no service", "jtop.service is not active"), ("no sensors", "no power sensor")])
def test_jtop_that_cannot_measure_says_why(fake_jtop, board, reason):
    from benchmarks.power import measure_power

    if board == "no service":
        fake_jtop.SERVICE_RUNNING = False
    else:
        fake_jtop.SENSORS = False
    r = measure_power(_work(), 0.1)
    assert r["meter"] is None and reason in r["unavailable"] and "mean_w" not in r
