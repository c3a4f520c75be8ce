"""A hot swap the golden photos doubt is settled by labelled lab photos: a retrain that learnt the field is adopted,
a network that misnames its outputs is still refused."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from edge_agent._truth import PER_CLASS, judge_on_truth, truth_photos
from edge_agent.config import default_store_path, parse_config
from edge_agent.hotswap import EngineWatcher, SwapRefused, verify_candidate
from edge_agent.preprocess import PreprocessSpec, preprocess_file
from engines.loader import open_engine
from engines.store import EngineStore

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


@pytest.fixture(scope="module")
def shipped():
    """The shipped engine (the one ``make run`` serves), opened as the daemon opens it."""
    store = EngineStore(default_store_path())
    engine = open_engine(store, parse_config({}).engine, store.current(), trust=None)
    yield engine
    engine.close()


def _misnamed(engine, classes):
    """The same network under a manifest that names its outputs ``classes`` (what a buggy export would sign)."""
    manifest = {**engine.version.manifest, "classes": classes}
    return types.SimpleNamespace(
        version=types.SimpleNamespace(manifest=manifest), classes=classes, engine_version="v9999", infer=engine.infer
    )


def _golden_where_the_old_engine_was_wrong(engine, n=4):
    """Golden photos of apple scab that the engine in service had called black rot, surely (as v4000 did in the orchard)."""
    spec = PreprocessSpec.from_manifest(engine.version.manifest["preprocess"])
    scab = [p for p, c in truth_photos() if c == "Apple___Apple_scab"]
    return [(preprocess_file(scab[i % len(scab)], spec), engine.classes.index("Apple___Black_rot")) for i in range(n)]


def test_the_truth_photos_are_a_few_labelled_gate_photos_of_every_shipped_class():
    photos = truth_photos()
    classes = [c for _, c in photos]
    assert len(set(classes)) == 38 and max(classes.count(c) for c in set(classes)) == PER_CLASS
    manifest = json.loads((photos[0][0].parents[2] / "manifest.json").read_text())
    gate = {f["file"] for f in manifest["files"] if f["set"] == "gate"}
    assert all(str(p.relative_to(p.parents[2])) in gate for p, _ in photos)  # never a photo the model trained on


def test_a_retrain_the_golden_photos_doubt_is_adopted_when_it_is_right_on_the_labelled_photos(shipped):
    golden = _golden_where_the_old_engine_was_wrong(shipped)
    measured = verify_candidate(shipped, {**shipped.version.manifest}, "v4000", golden, 0.5)
    assert measured["agreement"] == 0.0  # it calls them scab: the old engine's answers, not the truth
    assert measured["truth"]["passed"] and measured["truth"]["right"] >= 0.9
    assert measured["golden_overruled"].startswith("agrees with v4000 on 0% of 4 golden photos")


def test_a_network_whose_outputs_are_misnamed_is_refused_when_the_golden_photos_doubt_it(shipped):
    golden = [(g, shipped.classes.index("Apple___Apple_scab")) for g, _ in _golden_where_the_old_engine_was_wrong(shipped)]
    reversed_names = _misnamed(shipped, shipped.classes[::-1])
    reference = {**shipped.version.manifest, "classes": shipped.classes}
    with pytest.raises(SwapRefused, match=r"golden photos \(< 50%\), and right on \d+% of \d+ labelled lab photos"):
        verify_candidate(reversed_names, reference, "v4000", golden, 0.5)


def test_two_swapped_outputs_are_refused_on_the_labelled_photos_of_those_classes(shipped):
    """Only two classes wrong: 95 % right in all, but every photo of scab and of black rot wrong."""
    names = list(shipped.classes)
    a, b = names.index("Apple___Apple_scab"), names.index("Apple___Black_rot")
    names[a], names[b] = names[b], names[a]
    result = judge_on_truth(_misnamed(shipped, names), 0.5)
    assert result["right"] >= 0.5 and result["classes_all_wrong"] == ["Apple___Apple_scab", "Apple___Black_rot"]
    assert not result["passed"]


def test_a_doubted_version_with_no_labelled_photo_of_its_classes_is_refused_as_before():
    manifest = {"input": {"shape": [None, 3, 4, 4]}, "preprocess": {"size": 4}}
    engine = types.SimpleNamespace(
        version=types.SimpleNamespace(manifest=manifest), classes=["a", "b"], engine_version="v2", infer=lambda x: np.eye(2)[[1] * len(x)]
    )
    golden = [(np.zeros((3, 4, 4), np.float32), 0)] * 3
    with pytest.raises(SwapRefused, match="0% of 3 golden photos .*no labelled photo of its classes to settle it"):
        verify_candidate(engine, {**manifest, "classes": ["a", "b"]}, "v1", golden, 0.5)


def test_a_missing_or_garbled_data_manifest_gives_no_truth_photos_rather_than_an_error(tmp_path):
    assert truth_photos(tmp_path) == ()
    (tmp_path / "manifest.json").write_text("{not json")
    assert truth_photos(tmp_path) == ()
    (tmp_path / "manifest.json").write_text(json.dumps({"files": [{"file": "gate/x/gone.jpg", "class": "x", "set": "gate"}, 7]}))
    assert truth_photos(tmp_path) == ()  # listed but not on disk


def test_the_serving_report_gives_the_share_right_on_the_labelled_photos_when_they_overruled_the_golden_ones():
    watcher = EngineWatcher.__new__(EngineWatcher)
    watcher.pipeline = types.SimpleNamespace(counters={"processed": 10, "inference_errors": 0})
    watcher._counters_then, watcher.serving_since = (0, 0), 0.0
    watcher.swap_measured = {"golden": 1, "agreement": 0.0, "truth": {"right": 0.972, "passed": True}}
    assert watcher.serving_report()["agreement"] == 0.972  # a staged rollout does not stop a canary on it
    watcher.swap_measured = {"golden": 16, "agreement": 0.8}
    assert watcher.serving_report()["agreement"] == 0.8
