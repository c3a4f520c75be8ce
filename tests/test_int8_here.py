"""INT8 runs only where it gives FP32's answers on this machine, not only on the machine that built it."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from edge_agent._truth import precision_check  # noqa: E402
from edge_agent.config import default_store_path, parse_config  # noqa: E402
from edge_agent.log import get_logger  # noqa: E402
from engines.backends import _ort_precision  # noqa: E402
from engines.backends._ort_precision import INT8_DRIFT  # noqa: E402
from engines.backends._ort_precision import agreement as _agreement  # noqa: E402
from engines.backends.onnxruntime_backend import OnnxRuntimeEngine  # noqa: E402
from engines.base import EngineError  # noqa: E402
from engines.loader import open_engine  # noqa: E402
from engines.store import EngineStore, StoreError  # noqa: E402

pytestmark = pytest.mark.both_cores  # it times a burst of inference: make test runs it beside the waiting tests, never beside a trainer


def _v1000(tmp_path) -> EngineStore:
    """A copy of the shipped store serving v1000 (128 px: its INT8 variant is quick to check)."""
    root = shutil.copytree(default_store_path(), tmp_path / "store")
    (root / "current").write_text("v1000\n")
    return EngineStore(root)


def _measured(tmp_path, store: EngineStore):
    version = store.open()
    sha = version.manifest["files"]["model.int8.onnx"]["sha256"][:16]
    return tmp_path / "cache" / "ort-precision" / f"{version.name}-{sha}-ort{ort.__version__}.json"


def _timed(monkeypatch, int8_ms: float, fp32_ms: float) -> None:
    """INT8 and FP32 time a photo at these figures here, so which of the two is faster does not depend on the machine
    the test runs on (on some CPUs INT8 is the slower: then nothing is checked, as it would not be chosen anyway)."""
    monkeypatch.setattr(OnnxRuntimeEngine, "_timings", lambda self, int8, fp32: {"fp32_ms": fp32_ms, "int8_ms": int8_ms})


class _Session:
    """An ONNX Runtime session's surface, answering the class in each photo's first pixel, shifted by ``shift`` on
    the photos listed in ``wrong``."""

    def __init__(self, wrong=()):
        self.wrong = set(wrong)

    def get_inputs(self):
        return [type("I", (), {"name": "x"})()]

    def get_outputs(self):
        return [type("O", (), {"name": "logits"})()]

    def run(self, names, feed):
        x = feed["x"]
        idx = x[:, 0, 0, 0].astype(int)
        answer = np.array([(i % 3 + (1 if i in self.wrong else 0)) % 3 for i in idx])
        return [np.eye(3, dtype=np.float32)[answer]]


def test_int8s_agreement_with_fp32_is_counted_photo_by_photo_over_every_batch():
    photos = np.zeros((10, 3, 2, 2), np.float32)
    photos[:, 0, 0, 0] = np.arange(10)
    batches = [photos[:4], photos[4:8], photos[8:]]
    assert _agreement(_Session(wrong={1, 9}), _Session(), iter(batches)) == {"agreement": 0.8, "photos": 10}
    assert _agreement(_Session(), _Session(), iter(batches)) == {"agreement": 1.0, "photos": 10}
    assert _agreement(_Session(), _Session(), iter([])) == {"agreement": None, "photos": 0}


def test_the_check_photos_are_every_shipped_gate_photo_as_the_version_takes_them(tmp_path):
    version = _v1000(tmp_path).open()
    size = version.manifest["preprocess"]["size"]
    batches = list(precision_check(version))
    assert all(b.shape[1:] == (3, size, size) and b.dtype == np.float32 for b in batches)
    assert sum(len(b) for b in batches) == 672 and max(len(b) for b in batches) == 16
    assert list(precision_check(version, root=tmp_path / "nowhere")) == []  # no shipped photos: nothing to check on


@pytest.mark.one_core  # trains and times nothing (the timings are given): beside the other tests (tests/conftest.py)
def test_int8_that_gives_other_answers_here_than_where_it_was_built_is_not_run(tmp_path, monkeypatch):
    _timed(monkeypatch, int8_ms=1.0, fp32_ms=2.0)  # INT8 the faster: its answers decide
    store = _v1000(tmp_path)
    recorded = store.open().manifest["metrics"]["int8"]["top1_agreement_with_fp32"]  # 0.996, measured where it was built
    cfg = parse_config({"engine": {"cache_dir": str(tmp_path / "cache")}}).engine
    asked = []

    def check(version):
        asked.append(version.name)
        return precision_check(version)

    with open_engine(store, cfg, check_photos=check) as engine:  # measured here, once, while FP32 serves
        assert engine.wait_checked(120)
        measured = json.loads(_measured(tmp_path, store).read_text())
        assert asked == ["v1000"]
        assert measured["photos"] == 672 and 0 <= measured["agreement"] <= 1
        here_ok = measured["agreement"] >= max(cfg.int8_min_agreement, recorded - INT8_DRIFT)
        assert engine.precision == ("int8" if here_ok else "fp32")
    with open_engine(store, cfg, check_photos=check):
        assert asked == ["v1000"]  # later starts read the answer
    cases = [  # (agreement here, precision run); v1000 recorded 0.996: the bar is 0.991
        (round(recorded - INT8_DRIFT - 0.002, 4), "fp32"),
        (0.982, "fp32"),  # v4000's INT8 on an AVX2 CPU without VNNI: 0.982 of 672, built at 1.000
        (recorded, "int8"),
        (None, "int8"),  # not measured (FP32 was slower when it was): the manifest's figure decides
    ]
    for here, expected in cases:
        _measured(tmp_path, store).write_text(json.dumps({"int8_ms": 1.0, "fp32_ms": 2.0, "agreement": here, "photos": 672}))
        with open_engine(store, cfg, check_photos=check) as engine:
            assert engine.precision == expected, here
            reason = engine.describe()["precision_reason"]
            if expected == "fp32":
                assert f"here only on {here:.3f} of 672 check photos" in reason and "8-bit arithmetic" in reason
            elif here is not None:
                assert f"agreeing with FP32 here on {here:.3f} of 672 check photos" in reason
    assert asked == ["v1000"]
    _measured(tmp_path, store).write_text(json.dumps({"int8_ms": 1.0, "fp32_ms": 2.0}))  # timed before this check existed
    with open_engine(store, cfg) as engine:  # no check photos (a benchmark, a test): the timing alone decides
        assert engine.precision == "int8" and asked == ["v1000"]
    with open_engine(store, cfg, check_photos=check) as engine:
        assert engine.wait_checked(120) and asked == ["v1000", "v1000"]  # measured again, now with the check


def test_int8_slower_than_fp32_here_is_not_run_and_its_answers_are_not_checked(tmp_path, monkeypatch):
    _timed(monkeypatch, int8_ms=3.0, fp32_ms=2.0)
    store = _v1000(tmp_path)
    cfg = parse_config({"engine": {"cache_dir": str(tmp_path / "cache")}}).engine
    asked = []
    with open_engine(store, cfg, check_photos=lambda version: asked.append(version.name) or precision_check(version)) as engine:
        assert engine.wait_checked(120)
        assert engine.precision == "fp32" and asked == []  # nothing to check: INT8 would not run anyway
        assert "INT8 3.00 ms vs FP32 2.00 ms a photo here: FP32 is faster" in engine.describe()["precision_reason"]
    assert json.loads(_measured(tmp_path, store).read_text()) == {"fp32_ms": 2.0, "int8_ms": 3.0, "agreement": None}
    with open_engine(store, cfg, check_photos=lambda version: asked.append(version.name)) as engine:
        assert engine.precision == "fp32" and asked == []  # later starts read the answer, timed once


def test_a_start_that_reads_the_answer_loads_only_the_precision_it_names_and_a_garbled_answer_is_measured_again(tmp_path, monkeypatch):
    _timed(monkeypatch, int8_ms=1.0, fp32_ms=2.0)
    store = _v1000(tmp_path)
    cfg = parse_config({"engine": {"cache_dir": str(tmp_path / "cache")}}).engine
    few = lambda version: itertools.islice(precision_check(version), 1)  # noqa: E731  16 photos: the check, quickly
    loaded, real = [], OnnxRuntimeEngine._load
    monkeypatch.setattr(OnnxRuntimeEngine, "_load", lambda self, ort, kind, *a: loaded.append(kind) or real(self, ort, kind, *a))
    with open_engine(store, cfg, check_photos=few) as engine:
        assert engine.wait_checked(120) and loaded == ["onnx", "int8"]  # the first start serves FP32, then times INT8
    answers = [
        ({"int8_ms": 3.0, "fp32_ms": 2.0, "agreement": None}, "fp32", ["onnx"]),  # no INT8 session built only to drop it
        ({"int8_ms": 1.0, "fp32_ms": 2.0, "agreement": 0.5, "photos": 672}, "fp32", ["onnx"]),
        ({"int8_ms": 1.0, "fp32_ms": 2.0, "agreement": 1.0, "photos": 672}, "int8", ["int8"]),
    ]
    for answer, precision, sessions in answers:
        _measured(tmp_path, store).write_text(json.dumps(answer))
        loaded.clear()
        with open_engine(store, cfg, check_photos=few) as engine:
            assert engine.precision == precision and loaded == sessions, answer
    for garbled in ('{"int8_ms": 1.0, "fp32_ms": 2.0, "agreement": "all"}', '["int8"]', '{"int8_ms": "fast"', ""):
        _measured(tmp_path, store).write_text(garbled)
        loaded.clear()
        with open_engine(store, cfg, check_photos=few) as engine:
            assert engine.wait_checked(120) and loaded == ["onnx", "int8"], garbled  # measured again, no crash
        assert json.loads(_measured(tmp_path, store).read_text())["agreement"] is not None


def _gated(monkeypatch, *, agreement: float = 1.0):
    """Check photos that wait for the returned event before their first batch, and an agreement of ``agreement``."""
    import threading

    go = threading.Event()

    def photos(version):
        go.wait(60)
        yield from itertools.islice(precision_check(version), 2)

    monkeypatch.setattr(
        _ort_precision, "agreement", lambda int8, fp32, batches: {"agreement": agreement, "photos": len(list(batches)) * 16}
    )
    return go, photos


def test_a_first_start_serves_fp32_at_once_and_int8_once_it_is_checked_here(tmp_path, monkeypatch):
    _timed(monkeypatch, int8_ms=1.0, fp32_ms=2.0)
    go, photos = _gated(monkeypatch)
    store = _v1000(tmp_path)
    cfg = parse_config({"engine": {"cache_dir": str(tmp_path / "cache")}}).engine
    x = next(iter(precision_check(store.open())))
    trims, trim = [], OnnxRuntimeEngine.trim
    monkeypatch.setattr(OnnxRuntimeEngine, "trim", lambda self: trims.append(self.precision) or trim(self))
    with open_engine(store, cfg, check_photos=photos) as engine:
        assert engine.precision == "fp32" and not engine.wait_checked(0.2)  # opened without waiting for the check
        assert "FP32 until INT8 is timed and checked against it on this machine" in engine.describe()["precision_reason"]
        fp32 = engine.infer(x)  # answered meanwhile, by the reference precision
        assert not _measured(tmp_path, store).exists()
        go.set()
        assert engine.wait_checked(60)
        assert engine.precision == "int8" and "agreeing with FP32 here on 1.000 of 32 check photos" in engine.describe()["precision_reason"]
        assert trims == ["int8"]  # the check's memory handed back (v4000 here: 488 MB held after it otherwise, 130 trimmed)
        assert engine.infer(x).shape == fp32.shape
    assert json.loads(_measured(tmp_path, store).read_text())["agreement"] == 1.0
    with open_engine(store, cfg, check_photos=photos) as engine:
        assert engine.wait_checked(0) and engine.precision == "int8"  # later starts: the answer, at once


def test_int8_that_fails_its_check_here_leaves_fp32_serving_and_says_why(tmp_path, monkeypatch):
    _timed(monkeypatch, int8_ms=1.0, fp32_ms=2.0)
    go, photos = _gated(monkeypatch, agreement=0.9)
    go.set()
    store = _v1000(tmp_path)
    cfg = parse_config({"engine": {"cache_dir": str(tmp_path / "cache")}}).engine
    with open_engine(store, cfg, check_photos=photos) as engine:
        assert engine.wait_checked(60) and engine.precision == "fp32"
        assert "here only on 0.900 of 32 check photos" in engine.describe()["precision_reason"]

    def broken(version):
        raise OSError("the shipped check photos are unreadable")
        yield

    _measured(tmp_path, store).unlink()
    with open_engine(store, cfg, check_photos=broken) as engine:
        assert engine.wait_checked(60) and engine.precision == "fp32"
        reason = engine.describe()["precision_reason"]
        assert "checking INT8 here failed" in reason and "unreadable" in reason
    assert not _measured(tmp_path, store).exists()  # nothing cached: checked again at the next start


def test_closing_an_engine_during_its_check_stops_the_check_and_caches_nothing(tmp_path, monkeypatch):
    import time

    _timed(monkeypatch, int8_ms=1.0, fp32_ms=2.0)
    store = _v1000(tmp_path)
    cfg = parse_config({"engine": {"cache_dir": str(tmp_path / "cache")}}).engine
    served = []

    def slow(version):
        for batch in precision_check(version):
            served.append(len(batch))
            time.sleep(0.2)
            yield batch

    engine = open_engine(store, cfg, check_photos=slow)
    while not served:
        time.sleep(0.05)
    t0 = time.monotonic()
    engine.close()  # a hot swap's refused candidate, the daemon stopping
    assert time.monotonic() - t0 < 5 and engine.wait_checked(0)
    assert len(served) < 42 and not _measured(tmp_path, store).exists()  # stopped partway; nothing half-measured kept


def test_the_daemon_opens_every_engine_with_the_shipped_check_photos(tmp_path, monkeypatch):
    import edge_agent.trust as trust

    seen = []

    def spy(*a, **k):
        seen.append(k.get("check_photos"))
        raise EngineError("stop here")

    monkeypatch.setattr(trust, "open_engine", spy)
    store = _v1000(tmp_path)
    with pytest.raises(StoreError, match="stop here"):
        trust.open_trusted(store, parse_config({}).engine, None, get_logger("test"))
    assert seen and all(c is precision_check for c in seen)


def test_on_an_x86_cpu_without_vnni_auto_runs_fp32_and_says_why_without_timing_int8(tmp_path, monkeypatch):
    from engines.backends.onnxruntime_backend import choose_precision

    store = _v1000(tmp_path)
    monkeypatch.setattr(_ort_precision, "x86_without_vnni", lambda cpuinfo="/proc/cpuinfo": True)
    monkeypatch.setattr(OnnxRuntimeEngine, "_timings", lambda self, int8, fp32: pytest.fail("INT8 timed on a CPU it cannot run on"))
    cfg = parse_config({"engine": {"cache_dir": str(tmp_path / "cache")}})
    precision, why = choose_precision(cfg.engine, store.open())
    assert precision == "fp32" and "this x86 CPU has no VNNI" in why and "0.69" in why
    with open_engine(store, cfg.engine, check_photos=precision_check) as engine:
        assert engine.wait_checked(0) and engine.precision == "fp32" and "no VNNI" in engine.describe()["precision_reason"]
    assert choose_precision(parse_config({"engine": {"precision": "int8"}}).engine, store.open())[0] == "int8"  # as configured


@pytest.mark.parametrize(
    "flags,machine,without",
    [
        ("fpu sse2 avx avx2 fma", "x86_64", True),  # AVX2 only: the AMD EPYC of 2026-11-29, many laptops
        ("fpu avx2 avx512f avx512_vnni", "x86_64", False),
        ("fpu avx2 avx_vnni", "AMD64", False),
        ("fpu avx2 amx_int8", "x86_64", False),
        ("fp asimd asimddp", "aarch64", False),  # a Raspberry Pi 5: not x86
        (None, "x86_64", False),  # no flags line: cannot tell
    ],
)
def test_an_x86_cpu_without_vnni_is_told_from_its_flags(tmp_path, monkeypatch, flags, machine, without):
    import platform

    monkeypatch.undo()  # the suite's stand-in (conftest): this test reads flags itself
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\n" + (f"flags\t\t: {flags}\n" if flags else "") + "\n")
    monkeypatch.setattr(platform, "machine", lambda: machine)
    probe = _ort_precision.x86_without_vnni.__wrapped__  # the real one, past its cache
    assert probe(str(cpuinfo)) is without
    assert probe(str(tmp_path / "none")) is False  # no /proc/cpuinfo (another system): cannot tell
