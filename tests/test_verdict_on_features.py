"""The verdict measured on the network's pooled features: fitted by the trainer, computed inside the exported model as
its second output, read by every backend, judged by the daemon, and inherited by a retrain."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the trainer needs the 'train' extra")

from edge_agent.preprocess import normalize  # noqa: E402
from edge_agent.verdict import Judge, VerdictSpec, VerdictSpecError  # noqa: E402
from engines.base import EngineError  # noqa: E402

from . import fakes  # noqa: E402
from .conftest import encode, leaf_image  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer

CLASSES = ["Tomato___healthy", "Pepper,_bell___healthy", "Orange___Haunglongbing_(Citrus_greening)"]


def _photos(n: int, start: int = 0) -> np.ndarray:
    return np.stack([normalize(leaf_image(start + i, (128, 128), hue=40 * (i % 3))) for i in range(n)]).astype(np.float32)


@pytest.fixture(scope="module")
def features_store(tmp_path_factory, signing_key):
    """A signed store whose one version (LeafNet, 3 classes) carries a verdict on its features."""
    return make_features_store(tmp_path_factory.mktemp("features-store"), signing_key)


def make_features_store(root, signing_key):
    """(the store at ``root``, its model, its fitted verdict): :func:`features_store`."""
    from trainer.models import build_model
    from trainer.publish import publish_model
    from trainer.verdict_fit import fit_verdict_for

    torch.manual_seed(0)
    model = build_model(3).eval()
    x, y = _photos(30), np.arange(30) % 3
    fitted = fit_verdict_for(model, torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(_photos(12, 100)), _spec(), on="features")
    publish_model(
        model,
        CLASSES,
        root,
        calibration=x[:8],
        held_out=(x, y),
        signing_key=signing_key,
        verdict=fitted.section,
        distance=fitted.distance,
        version="v0001",
    )
    return root, model, fitted


def _spec():
    from edge_agent.preprocess import DEFAULT_SPEC

    return DEFAULT_SPEC


def _config(extra: dict | None = None):
    from edge_agent.config import parse_config

    return parse_config({"store": {"require_signature": False}, "engine": {"precision": "fp32"}, **(extra or {})})


def test_the_feature_distance_is_the_low_rank_mahalanobis_distance_the_benchmark_measured():
    from trainer.verdict_fit import FeatureDistance, class_means_and_precision

    rng = np.random.default_rng(0)
    f = rng.normal(size=(300, 40)) * np.linspace(3, 0.2, 40)
    y = np.arange(300) % 4
    f[y == 1] += 2.0
    module = FeatureDistance.fit(f, y, 4, rank=6)
    means, precision = class_means_and_precision(f, y, 4, rank=6)
    probe = rng.normal(size=(7, 40))
    want = np.einsum("nkd,de,nke->nk", probe[:, None] - means[None], precision, probe[:, None] - means[None])
    got = module(torch.from_numpy(probe).float()).double().numpy()
    np.testing.assert_allclose(got, want / 40, rtol=1e-3)  # over the features' width


def test_a_few_photos_fit_as_many_directions_as_they_span_not_more():
    from trainer.verdict_fit import FeatureDistance

    module = FeatureDistance.fit(np.random.default_rng(1).normal(size=(5, 64)), np.arange(5) % 2, 2, rank=32)
    assert module.directions.shape == (64, 4)
    assert torch.isfinite(module(torch.zeros(1, 64))).all()


def test_the_exported_model_returns_the_distances_beside_the_logits_and_int8_leaves_them_in_float(features_store):
    import onnx

    from engines.store import EngineStore
    from trainer.int8 import outputs_of_onnx
    from trainer.verdict_fit import outputs_of

    root, model, fitted = features_store
    version = EngineStore(root).open()
    x = _photos(6, 200)
    logits, distances = outputs_of_onnx(version.artifact("onnx"), x)
    want_logits, want_d = outputs_of(model, torch.from_numpy(x), fitted.distance)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(distances, want_d, rtol=1e-3)
    assert version.manifest["verdict"]["on"] == "features" and version.manifest["verdict"]["output"] == "distance"
    assert "means" not in version.manifest["verdict"]  # the statistics live in the model, not the manifest
    int8 = onnx.load(str(version.artifact("int8")))
    dequantized = {o for n in int8.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    distance_nodes = [n for n in int8.graph.node if n.name.startswith("/distance/")]
    assert distance_nodes and all(i not in dequantized for n in distance_nodes if n.op_type == "MatMul" for i in n.input[1:])
    assert "verdict_agreement_with_fp32" in version.manifest["metrics"]["int8"]


def test_the_daemon_judges_with_the_engines_distances(features_store):
    from edge_agent.classifier import Classifier
    from engines.loader import open_engine

    root, _, fitted = features_store
    cfg = _config({"store": {"path": str(root), "require_signature": False}})
    with open_engine(root, cfg.engine) as engine:
        logits, distances = engine.infer_with_distance(_photos(4, 300))
        assert distances.shape == logits.shape == (4, 3)
        clf = Classifier.configured(engine, cfg)
        assert clf.judge.spec.on == "features" and "features" in clf.judge.mode
        limit = fitted.section["confident_distance"]
        preds = clf.predict_tensors(_photos(4, 300))
        for p, d in zip(preds, distances.min(1)):
            assert p.verdict != "confident" or d <= limit
        assert all(np.allclose(p.distances, d, rtol=1e-5) and p.distances.dtype == np.float32 for p, d in zip(preds, distances))
        # far from every class mean: unknown, whatever the softmax says
        engine.infer_with_distance = lambda batch: (np.array([[30.0, 0.0, 0.0]], np.float32), np.full((1, 3), 1e9, np.float32))
        far = clf.predict_tensors(_photos(1, 400))[0]
        assert far.verdict == "unknown" and far.verdict_reason == "unlike the photos the model was trained on"
        engine.infer_with_distance = lambda batch: (np.array([[30.0, 0.0, 0.0]], np.float32), np.full((1, 3), np.inf, np.float16))
        assert clf.predict_tensors(_photos(1, 400))[0].verdict == "unknown"  # FP16 overflow reads as infinitely far


def test_the_pipeline_keeps_the_engines_distances_of_each_photo_it_puts_in_the_review_pool(features_store, tmp_path):
    import hashlib

    from edge_agent.config import LabelsSection, PipelineSection
    from edge_agent.pipeline import Job
    from edge_agent.preprocess import preprocess_bytes
    from edge_agent.review.queue import to_ask
    from engines.loader import open_engine

    from .test_pipeline import drop, make_pipeline

    root, _, _ = features_store
    cfg = _config({"store": {"path": str(root), "require_signature": False}})
    photos = {hashlib.sha256(f.read_bytes()).hexdigest(): f.read_bytes() for f in drop(tmp_path / "inbox", 6)}
    with open_engine(root, cfg.engine) as engine:
        policy = LabelsSection(review_threshold=0.8, pseudo_threshold=0.8, trust_checks=0)
        p, db, *_ = make_pipeline(tmp_path, engine, policy=policy, settings=PipelineSection(max_batch=3, max_wait_ms=0))
        try:
            for f in sorted((tmp_path / "inbox").iterdir()):
                p.submit(Job("inbox", f))
            assert p.drain(60)
        finally:
            p.stop()
        own = {sha: engine.infer_with_distance(preprocess_bytes(data, p.classifier.spec)[None])[1][0] for sha, data in photos.items()}
    pool = {e.sha256 for e, *_ in db.review_pool()}
    kept = {sha: d for sha, d, _ in db.pool_distances()}
    assert len(pool) == 6 and set(kept) == pool  # (only the pool's: tests/test_review_typical.py)
    assert db._query("SELECT COUNT(*) FROM pool_distances")[0][0] == len(pool)
    assert all(np.allclose(d, own[sha], rtol=1e-4) for sha, d in kept.items())  # the engine's own distances
    assert {it.entry.sha256 for it in to_ask(db, 0, LabelsSection(ask_order="typical"))} == pool


def test_a_manifest_on_the_features_with_a_model_that_lacks_the_output_is_refused_naming_it(features_store, tmp_path):
    from engines.loader import open_engine
    from engines.store import EngineStore

    root, _, _ = features_store
    version = EngineStore(root).open()
    m = dict(version.manifest, verdict=dict(version.manifest["verdict"], output="distances_v2"))
    from engines.backends.onnxruntime_backend import OnnxRuntimeEngine

    with pytest.raises(EngineError, match="'distances_v2', which the model lacks"):
        OnnxRuntimeEngine(type(version)(version.name, version.path, m), _config().engine)
    with open_engine(root, _config().engine) as engine:  # the version as published opens
        assert engine.infer_with_distance(_photos(1))[1] is not None


def test_a_judge_on_the_features_given_no_distances_says_what_it_needs():
    section = {
        "on": "features",
        "output": "distance",
        "confident_distance": 5.0,
        "unknown_distance": 9.0,
        "image": {"min_contrast": 0.0, "min_brightness": 0.0, "max_brightness": 1.0, "min_sharpness": 0.0},
    }
    spec = VerdictSpec.from_manifest({"classes": ["a", "b"], "verdict": section})
    judge = Judge(spec, 0.9, (0.5,) * 3, (0.25,) * 3)
    x = _photos(1)
    with pytest.raises(VerdictSpecError, match="'distance' output"):
        judge.judge(np.zeros((1, 2)), np.full((1, 2), 0.5), x)
    for bad, message in ((dict(section, on="pixels"), "'on' is 'pixels'"), (dict(section, output=""), "'output' must name")):
        with pytest.raises(VerdictSpecError, match=message):
            VerdictSpec.from_manifest({"classes": ["a", "b"], "verdict": bad})


def test_the_tensorrt_backend_returns_both_outputs(monkeypatch, tmp_path, features_store):
    from engines.backends.tensorrt_backend import TensorRTConfig, TensorRTEngine
    from engines.store import EngineStore

    fakes.install(monkeypatch)
    root, _, _ = features_store
    version = EngineStore(root).open()
    config = TensorRTConfig(precision="fp32", cache_dir=str(tmp_path / "cache"), max_batch=4, opt_batch=2)
    engine = TensorRTEngine(version, config)
    try:
        x = _photos(6, 500)  # two batches of the plan's 4
        logits, distances = engine.infer_with_distance(x)
        from trainer.int8 import outputs_of_onnx

        want_logits, want_d = outputs_of_onnx(version.artifact("onnx"), x)
        np.testing.assert_allclose(logits, want_logits, atol=1e-4)
        np.testing.assert_allclose(distances, want_d, rtol=1e-4)
        np.testing.assert_allclose(engine.infer(x), want_logits, atol=1e-4)
    finally:
        engine.close()
    lacking = type(version)(version.name, version.path, dict(version.manifest, verdict=dict(version.manifest["verdict"], output="d2")))
    with pytest.raises(EngineError, match="'d2', which the model lacks"):
        TensorRTEngine(lacking, config)


def test_a_retrain_of_a_version_on_the_features_measures_its_verdict_there_too(features_store, tmp_path):
    from edge_agent.config import parse_config
    from engines.store import EngineStore
    from trainer.retrain import retrain
    from trainer.samples import SampleStore

    root, _, _ = features_store
    store = EngineStore(shutil.copytree(root, tmp_path / "store"))
    samples = SampleStore(tmp_path / "trainer")
    for i in range(12):
        samples.add(
            {"id": f"{i:064x}", "kind": "expert", "label": CLASSES[i % 3], "confidence": 1.0, "engine_version": "v0001", "ext": ".jpg"},
            encode(leaf_image(600 + i, hue=40 * (i % 3))),
        )
        time.sleep(0.005)
    from .test_recheck import _open_gate

    trainer = _open_gate(tmp_path, per_class=25)  # 25 a class: enough validation photos for a verdict
    cfg = parse_config({"store": {"path": str(store.root), "require_signature": False}, "trainer": trainer})
    result = retrain(cfg, store, samples, tmp_path / "strategy")
    samples.close()
    assert result.published, result.reason
    child = store.open(result.published)
    assert child.manifest["verdict"]["on"] == "features" and child.manifest["parent"] == "v0001"
    from trainer.int8 import outputs_of_onnx

    assert len(outputs_of_onnx(child.artifact("onnx"), _photos(2))) == 2
    assert json.loads(json.dumps(child.manifest["verdict"]["fitted"]))["rank"] >= 1


def test_the_features_benchmark_takes_the_head_input_not_the_distance_computations_and_scores_the_models_own_rule(features_store):
    from benchmarks.verdict_features import _embed, feature_session, rules
    from edge_agent.preprocess import DEFAULT_SPEC
    from engines.store import EngineStore

    root, model, _ = features_store
    version = EngineStore(root).open()
    session, name = feature_session(version.artifact("onnx"), threads=1)
    x = _photos(3, 700)
    logits, features = session.run([session.get_outputs()[0].name, name], {session.get_inputs()[0].name: x})
    want = model.head(torch.from_numpy(features)).detach().numpy()
    np.testing.assert_allclose(want, logits, atol=1e-4)  # the head's input: the pooled features
    assert features.shape == (3, model.head.in_features)
    photos = []
    for i in range(12):
        path = root.parent / f"photo-{i}.jpg"
        path.write_bytes(encode(leaf_image(800 + i, hue=40 * (i % 3))))
        photos.append((path, CLASSES[i % 3]))
    data = {n: _embed(session, name, DEFAULT_SPEC, photos, CLASSES) for n in ("train", "val", "lab")}
    assert data["lab"]["distance"].shape == (12, 3)
    shipped = [r for r in rules(data, version.manifest, [0.97], 2) if "(shipped)" in r]
    assert shipped == ["features, the model's own distances and the manifest's threshold (shipped)"]
