"""Engine backends behind one interface, the registry, and the TensorRT plan cache."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_agent.config import parse_config
from edge_agent.preprocess import preprocess_bytes
from engines.backends._tensorrt_plan import PlanBuildError, PlanKey, load_or_build
from engines.base import BackendUnavailable, EngineError, backends, get_backend
from engines.loader import open_engine
from engines.store import EngineStore, TamperedError

from .conftest import encode, leaf_image


def ort_config(**engine):
    """An ONNX Runtime engine config; FP32 unless ``precision`` says otherwise (the default "auto" may pick INT8)."""
    return parse_config({"engine": {"type": "onnxruntime", "precision": "fp32", **engine}}).engine


def test_registry_finds_one_module_per_backend():
    found = backends()
    assert {"onnxruntime", "tensorrt"} <= set(found)
    for name, cls in found.items():
        assert cls.type == name and cls.Config.model_fields["type"].default == name
    with pytest.raises(EngineError, match="unknown engine type"):
        get_backend("tflite")


def test_onnxruntime_cpu_fp32(tiny_store):
    with open_engine(tiny_store, ort_config()) as engine:
        assert engine.provider == "CPUExecutionProvider" and engine.precision == "fp32"
        x = np.stack([preprocess_bytes(encode(leaf_image(i))) for i in range(5)])
        logits = engine.infer(x)
        assert logits.shape == (5, 3) and logits.dtype == np.float32
        assert engine.describe()["engine_version"] == "v0001"


def test_onnxruntime_int8_variant_runs_and_agrees_mostly(tiny_store):
    x = np.stack([preprocess_bytes(encode(leaf_image(i))) for i in range(6)])
    with open_engine(tiny_store, ort_config()) as fp32, open_engine(tiny_store, ort_config(precision="int8")) as int8:
        assert int8.precision == "int8"
        a, b = fp32.infer(x), int8.infer(x)
        assert b.shape == a.shape
        assert np.abs(a - b).max() < 0.5  # quantised, not identical, but close
    manifest = EngineStore(tiny_store).open().manifest
    assert 0.0 <= manifest["metrics"]["int8"]["top1_agreement_with_fp32"] <= 1.0


def test_a_publish_scores_with_onnx_runtime_one_photo_a_run_and_gets_the_whole_sets_answers(tiny_store, monkeypatch):
    """A session's arena grows with the photos of a run (Lite0 at 192 px: 0.17 GB at 16, 0.04 GB at 4; 256 px: 0.15 GB
    at 4, 0.09 GB at 1)."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from pathlib import Path

    from trainer.int8 import logits_of_onnx

    version = EngineStore(tiny_store).open()
    model = version.artifact("onnx")
    size = version.manifest["preprocess"]["size"]
    x = np.random.default_rng(0).normal(size=(10, 3, size, size)).astype(np.float16)
    whole = logits_of_onnx(Path(model), x, batch=10)
    runs: list[int] = []
    real = ort.InferenceSession.run

    def counted(self, names, feed, *rest):
        runs.extend(len(v) for v in feed.values())
        return real(self, names, feed, *rest)

    monkeypatch.setattr(ort.InferenceSession, "run", counted)
    assert np.allclose(logits_of_onnx(Path(model), x), whole, atol=1e-5)
    assert runs == [1] * 10


def test_worker_threads_do_not_spin_unless_asked(tiny_store):
    def spinning(cfg):
        with open_engine(tiny_store, parse_config({"engine": cfg}).engine) as engine:
            return engine._session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")

    assert spinning({}) == "0"
    assert spinning({"spin": True}) == "1"


@pytest.mark.both_cores
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from Linux's /proc")
@pytest.mark.parametrize("precision, batch", [("fp32", 16), ("int8", 64)])  # INT8's arena grows less per photo
def test_idle_trim_hands_a_burst_back_to_the_os(tmp_path, precision, batch):
    """A burst of large batches grows ONNX Runtime's arena; trim() must give it back (in a clean process)."""
    script = tmp_path / "burst.py"
    script.write_text(
        "import threading, numpy as np\n"
        "from edge_agent.config import default_store_path, parse_config\n"
        "from engines.loader import open_engine\n"
        "rss = lambda: int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) / 1024\n"
        f"engine = open_engine(default_store_path(), parse_config({{'engine': {{'precision': '{precision}'}}}}).engine)\n"
        "before = rss()\n"
        "side = engine.version.manifest['input']['shape'][2]\n"
        f"x = np.zeros(({batch}, 3, side, side), np.float32)\n"
        "t = threading.Thread(target=lambda: [engine.infer(x) for _ in range(10)]); t.start(); t.join()\n"
        "peak = rss()\n"
        "engine.trim()\n"
        "print(before, peak, rss())\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    before, peak, after = map(float, out.stdout.split())
    assert peak - before > 40, "the burst should have grown the arena (else this test proves nothing)"
    assert after - before < 10, f"RSS {before:.0f} MB -> {peak:.0f} MB in the burst -> {after:.0f} MB after trim()"


def test_wrong_batch_shape_is_an_error(tiny_store):
    with open_engine(tiny_store, ort_config()) as engine:
        with pytest.raises(EngineError, match="does not match input"):
            engine.infer(np.zeros((1, 3, 64, 64), np.float32))
        with pytest.raises(EngineError):
            engine.infer(np.zeros((3, 128, 128), np.float32))


def test_requested_gpu_provider_missing_fails_loudly(tiny_store):
    import onnxruntime as ort

    for provider, name in (("cuda", "CUDAExecutionProvider"), ("tensorrt", "TensorrtExecutionProvider")):
        if name in ort.get_available_providers():
            continue
        with pytest.raises(BackendUnavailable, match=name):
            open_engine(tiny_store, ort_config(provider=provider))


def test_silent_cpu_fallback_is_refused(tiny_store, monkeypatch):
    """ONNX Runtime may list CUDA as available yet fall back to CPU when the session is built."""
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    real = ort.InferenceSession

    def session(path, sess_options=None, providers=None):
        return real(path, sess_options=sess_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(ort, "InferenceSession", session)
    with pytest.raises(BackendUnavailable, match="fell back to CPUExecutionProvider"):
        open_engine(tiny_store, ort_config(provider="cuda"))


def test_tampered_model_refused_by_loader(tiny_store, tmp_path):
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    model = copy / "v0001" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(TamperedError):
        open_engine(copy, ort_config())


def test_every_file_of_a_version_is_checked_while_the_runtime_imports_and_a_tampered_one_is_refused(tiny_store, tmp_path, monkeypatch):
    """The loader hashes a version's files in threads beside the runtime's import: whichever thread a file falls to,
    and whether or not the import fails, a changed file refuses the version."""
    import json
    import shutil

    from engines.backends.onnxruntime_backend import OnnxRuntimeEngine

    names = list(json.loads((tiny_store / "v0001" / "manifest.json").read_text())["files"])
    assert len(names) >= 3
    for i, name in enumerate(names):
        copy = tmp_path / f"store-{i}"
        shutil.copytree(tiny_store, copy)
        f = copy / "v0001" / name
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
        with pytest.raises(TamperedError, match=f"v0001/{name}: sha256"):
            open_engine(copy, ort_config())

    def no_runtime(cls):
        raise ImportError("No module named 'onnxruntime'")

    monkeypatch.setattr(OnnxRuntimeEngine, "load_runtime", classmethod(no_runtime))
    with pytest.raises(TamperedError):
        open_engine(tmp_path / "store-0", ort_config())
    with pytest.raises(ImportError, match="onnxruntime"):
        open_engine(tiny_store, ort_config())


def test_a_model_replaced_between_its_check_and_its_load_is_never_served(tiny_store, tmp_path):
    """Check then use: the version is verified, then its model file is swapped for another valid network (the INT8
    one) before the runtime opens it. The runtime gets the bytes that were hashed, so the swap is refused."""
    import shutil

    from engines.backends.onnxruntime_backend import OnnxRuntimeEngine

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    opened = EngineStore(copy).open()  # every sha256 checked here
    model = opened.artifact("onnx")
    model.write_bytes(opened.artifact("int8").read_bytes())  # a valid ONNX model, not the one the manifest names
    with pytest.raises(TamperedError, match="does not match manifest"):
        OnnxRuntimeEngine(opened, ort_config())


def test_a_model_file_over_the_size_cap_is_refused(tiny_store, tmp_path, monkeypatch):
    import shutil

    from engines import store as store_mod

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    monkeypatch.setattr(store_mod, "MAX_FILE_BYTES", 1000)
    with pytest.raises(TamperedError, match="larger than"):
        open_engine(copy, ort_config())


def test_reading_a_model_file_allocates_what_it_holds_not_the_size_cap(tiny_store):
    import tracemalloc

    version = EngineStore(tiny_store).open()
    name = version.artifact("onnx").name
    tracemalloc.start()
    try:
        data = version.read_verified(name)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(data) + (1 << 20), f"read {len(data)} bytes with a peak of {peak >> 20} MiB"


def test_a_loaded_session_keeps_no_copy_of_the_model_bytes(tiny_store):
    """ONNX Runtime's Python session holds the bytes it was built from for its lifetime; the engine gives it a
    private path instead, so the model is in memory once (as the session's own tensors)."""
    with open_engine(tiny_store, ort_config()) as engine:
        assert getattr(engine._session, "_model_bytes", None) is None
        assert engine.infer(np.zeros((1, 3, 128, 128), np.float32)).shape == (1, 3)


def test_manifest_class_count_must_match_model(tiny_store, tmp_path):
    import json
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    mpath = copy / "v0001" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["classes"] = m["classes"][:2]
    mpath.write_text(json.dumps(m))
    with pytest.raises(EngineError, match="3 outputs but the manifest lists 2"):
        open_engine(copy, ort_config())


# ---- TensorRT ---------------------------------------------------------------
HAVE_TRT = importlib.util.find_spec("tensorrt") is not None and importlib.util.find_spec("pycuda") is not None


@pytest.mark.skipif(not HAVE_TRT, reason="TensorRT and pycuda are not installed (Jetson/NVIDIA GPU only); not run here")
def test_native_tensorrt_fp16_matches_onnxruntime(tiny_store, tmp_path):
    cfg = parse_config({"engine": {"type": "tensorrt", "cache_dir": str(tmp_path / "plans")}}).engine
    x = np.stack([preprocess_bytes(encode(leaf_image(i))) for i in range(40)])
    with open_engine(tiny_store, cfg) as trt_engine, open_engine(tiny_store, ort_config()) as ref:
        assert trt_engine.precision == "fp16" and trt_engine.built_plan
        np.testing.assert_allclose(trt_engine.infer(x), ref.infer(x), atol=5e-2)
    with open_engine(tiny_store, cfg) as again:
        assert not again.built_plan  # served from the plan cache


def test_tensorrt_backend_unavailable_here_says_why(tiny_store):
    if HAVE_TRT:
        pytest.skip("TensorRT present: covered by the real test")
    cfg = parse_config({"engine": {"type": "tensorrt"}}).engine
    with pytest.raises(BackendUnavailable, match="TensorRT|pycuda|CUDA"):
        open_engine(tiny_store, cfg)


def _key(**kw) -> PlanKey:
    return PlanKey(**({"onnx_sha256": "ab" * 32, "tensorrt_version": "10.3.0", "gpu_name": "Orin", "precision": "fp16"} | kw))


def test_plan_key_changes_with_every_component():
    base = _key()
    for change in (
        {"onnx_sha256": "cd" * 32},
        {"tensorrt_version": "8.6.2"},
        {"gpu_name": "RTX 4090"},
        {"precision": "fp32"},
        {"max_batch": 8},
    ):
        assert _key(**change).filename != base.filename


def test_plan_cache_builds_once_then_reuses(tmp_path):
    builds = []
    engine, built = load_or_build(_key(), tmp_path, lambda: builds.append(1) or b"PLAN", lambda b: ("engine", b))
    assert built and engine == ("engine", b"PLAN") and len(builds) == 1
    engine, built = load_or_build(_key(), tmp_path, lambda: builds.append(1) or b"PLAN", lambda b: ("engine", b))
    assert not built and len(builds) == 1
    assert (tmp_path / _key().filename).with_suffix(".json").is_file()


@pytest.mark.parametrize("failure", ["none", "raise"])
def test_stale_plan_is_rebuilt(tmp_path, failure):
    """After a JetPack upgrade an old plan fails to deserialise: rebuild instead of dying."""
    (tmp_path / _key().filename).write_bytes(b"OLD")

    def deserialize(blob):
        if blob == b"OLD":
            if failure == "raise":
                raise RuntimeError("Serialization assertion failed: version mismatch")
            return None
        return ("engine", blob)

    engine, built = load_or_build(_key(), tmp_path, lambda: b"NEW", deserialize)
    assert built and engine == ("engine", b"NEW")
    assert (tmp_path / _key().filename).read_bytes() == b"NEW"


def test_a_plan_built_after_a_tensorrt_upgrade_replaces_the_older_tensorrts_and_keeps_the_rest(tmp_path):
    from dataclasses import asdict

    def leftover(**change) -> Path:
        old = _key(**change)
        (tmp_path / old.filename).write_bytes(b"OLD")
        (tmp_path / old.filename).with_suffix(".json").write_text(json.dumps(asdict(old)))
        return tmp_path / old.filename

    jetpack5 = leftover(tensorrt_version="8.5.2")  # the same model and precision, built before the upgrade
    fp32 = leftover(tensorrt_version="8.5.2", precision="fp32")  # another precision: its own plan, not this one's
    batch = leftover(max_batch=8)  # this TensorRT, another batch profile: not known to be stale
    other = leftover(onnx_sha256="cd" * 32, tensorrt_version="8.5.2")  # another model's (a version kept)
    unknown = tmp_path / f"{_key().onnx_sha256[:12]}-fp16-{'0' * 24}.plan"
    unknown.write_bytes(b"NO KEY")  # no key beside it: kept
    _, built = load_or_build(_key(), tmp_path, lambda: b"NEW", lambda b: ("engine", b))
    assert built and not jetpack5.exists() and not jetpack5.with_suffix(".json").exists()
    assert all(p.exists() for p in (fp32, batch, other, unknown, tmp_path / _key().filename))


def test_plan_that_never_loads_is_an_error(tmp_path):
    with pytest.raises(PlanBuildError):
        load_or_build(_key(), tmp_path, lambda: b"BAD", lambda b: None)
    with pytest.raises(PlanBuildError, match="empty plan"):
        load_or_build(_key(), tmp_path, lambda: b"", lambda b: None)


def test_auto_precision_runs_int8_on_cpu_where_the_manifest_vouches_for_it(tmp_path):
    """``precision = "auto"`` (the default): INT8 on CPU when its recorded agreement with FP32 is high enough,
    FP32 when the variant is missing or its agreement too low, and the reason says which."""
    import json
    import shutil

    from edge_agent.config import default_store_path, parse_config
    from engines.backends.onnxruntime_backend import choose_precision
    from engines.loader import open_engine
    from engines.store import EngineStore

    cfg = parse_config({"engine": {"cache_dir": str(tmp_path / "cache")}}).engine
    assert cfg.precision == "auto"
    v2000 = EngineStore(default_store_path()).open("v2000")  # its INT8 gives another verdict too often (on the logits)
    precision, why = choose_precision(cfg, v2000)
    assert precision == "fp32" and "< 0.98" in why
    v3000 = EngineStore(default_store_path()).open("v3000")  # the same network, the verdict on the features: INT8 agrees
    check = v3000.manifest["metrics"]["int8"]
    assert check["verdict_agreement_with_fp32"] >= 0.98 and choose_precision(cfg, v3000)[0] == "int8"
    store_root = tmp_path / "v1000-store"  # v1000's INT8 agrees with its FP32 on 99.6 % / 98.7 %
    shutil.copytree(default_store_path(), store_root)
    (store_root / "current").write_text("v1000\n")
    shipped = EngineStore(store_root)
    version = shipped.open()
    check = version.manifest["metrics"]["int8"]
    assert choose_precision(cfg, version)[0] == "int8"  # the release's INT8 gives FP32's answers: it may run
    import onnxruntime

    sha = version.manifest["files"]["model.int8.onnx"]["sha256"][:16]
    timings = tmp_path / "cache" / "ort-precision" / f"{version.name}-{sha}-ort{onnxruntime.__version__}.json"
    with open_engine(shipped, cfg) as engine:  # measured here, once, and the faster one runs
        measured = json.loads(timings.read_text())
        assert engine.precision == ("int8" if measured["int8_ms"] <= measured["fp32_ms"] else "fp32")
        assert f"{check['top1_agreement_with_fp32']:.3f} of {check['photos']}" in engine.describe()["precision_reason"]
    for int8_ms, fp32_ms, expected in ((1.0, 2.0, "int8"), (3.0, 2.0, "fp32")):  # later starts read the timing
        timings.write_text(json.dumps({"int8_ms": int8_ms, "fp32_ms": fp32_ms}))
        with open_engine(shipped, cfg) as engine:
            assert engine.precision == expected
            assert f"INT8 {int8_ms:.2f} ms vs FP32 {fp32_ms:.2f} ms a photo here" in engine.describe()["precision_reason"]
    strict = parse_config({"engine": {"int8_min_agreement": 0.995}}).engine
    assert choose_precision(strict, version)[0] == "fp32" and "< 0.995" in choose_precision(strict, version)[1]
    assert choose_precision(parse_config({"engine": {"precision": "fp32"}}).engine, version) == ("fp32", "configured")
    trt = parse_config({"engine": {"provider": "tensorrt"}}).engine
    assert choose_precision(trt, version)[0] == "fp16"
    # a version without an INT8 variant (e.g. published with [trainer] int8 = false) runs FP32
    store = tmp_path / "store"
    shutil.copytree(store_root, store)
    manifest = store / shipped.current() / "manifest.json"
    m = json.loads(manifest.read_text())
    del m["artifacts"]["int8"]
    manifest.write_text(json.dumps(m))
    precision, why = choose_precision(cfg, EngineStore(store).open(verify=False))
    assert precision == "fp32" and "no INT8 variant" in why


def test_int8_calibrated_one_photo_at_a_time_is_the_same_file_as_four_at_a_time(tiny_store, tmp_path):
    """MinMax ranges do not depend on the batch; the calibration session's memory does (0.27 GB at 1, 0.67 GB at 4, 256 px)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from trainer.int8 import quantize_int8

    version = EngineStore(tiny_store).open()
    size = version.manifest["preprocess"]["size"]
    x = np.random.default_rng(1).normal(size=(9, 3, size, size)).astype(np.float32)
    quantize_int8(version.artifact("onnx"), tmp_path / "one.onnx", x)
    quantize_int8(version.artifact("onnx"), tmp_path / "four.onnx", x, batch=4)
    assert (tmp_path / "one.onnx").read_bytes() == (tmp_path / "four.onnx").read_bytes()


def test_int8_weights_use_all_eight_bits(tiny_store, tmp_path):
    """7-bit weights cost field answers on a CPU with VNNI (trainer/int8.py); a CPU without runs FP32 instead."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    import onnx
    from onnx import numpy_helper

    from trainer.int8 import quantize_int8

    version = EngineStore(tiny_store).open()
    size = version.manifest["preprocess"]["size"]
    quantize_int8(
        version.artifact("onnx"), tmp_path / "q.onnx", np.random.default_rng(1).normal(size=(4, 3, size, size)).astype(np.float32)
    )
    weights = [
        numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "q.onnx")).graph.initializer if t.data_type == onnx.TensorProto.INT8
    ]
    assert weights and max(int(np.abs(w.astype(np.int32)).max()) for w in weights) > 64  # 7-bit weights stop at 64
