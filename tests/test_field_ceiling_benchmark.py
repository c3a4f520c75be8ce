"""benchmarks.field_ceiling: the shipped weights may be republished at another input side before the one retrain."""

from __future__ import annotations

import shutil

import numpy as np
import pytest


def test_the_shipped_weights_republished_at_another_side_are_a_new_lineage_with_the_same_weights(tiny_store, tmp_path):
    torch = pytest.importorskip("torch")
    from benchmarks.field_ceiling import resized
    from engines.store import EngineStore
    from trainer.publish import load_weights

    store = EngineStore(shutil.copytree(tiny_store, tmp_path / "engines"))
    before = store.open()
    assert before.manifest["preprocess"]["size"] == 128
    after = resized(store, 96)
    assert store.current() == after.name != before.name
    m = after.manifest
    assert (m["preprocess"]["size"], m["input"]["shape"], m["parent"]) == (96, [None, 3, 96, 96], None)
    assert m["preprocess"]["mean"] == before.manifest["preprocess"]["mean"] and list(after.classes) == list(before.classes)
    old, new = load_weights(before).state_dict(), load_weights(after).state_dict()
    assert all(torch.equal(old[k], new[k]) for k in old)
    import onnxruntime as ort

    session = ort.InferenceSession(str(after.artifact("onnx")), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: np.zeros((2, 3, 96, 96), np.float32)})[0]
    assert out.shape == (2, 3)


def test_a_candidate_store_trained_on_another_split_is_refused_before_any_work(tiny_store, tmp_path):
    from benchmarks.field_loop import starting_store

    with pytest.raises(SystemExit, match="not trained on the shipped model's split"):
        starting_store(str(tiny_store))  # no split recorded: its gate and replay photos could be its training photos
    with pytest.raises(SystemExit, match="no version to start from"):
        starting_store(str(tmp_path / "nothing"))


def test_a_candidate_store_on_the_shipped_split_stands_in_for_the_shipped_model(tmp_path):
    from benchmarks.field_loop import starting_store
    from edge_agent.config import default_store_path

    assert starting_store(None) == default_store_path()
    shipped = default_store_path()
    current = (shipped / "current").read_text().strip()
    candidate = tmp_path / "candidate"
    shutil.copytree(shipped / current, candidate / current)
    (candidate / "current").write_text(current + "\n")
    assert starting_store(str(candidate)) == candidate
    split = candidate / current / "split.json"
    split.write_text(split.read_text().replace('"test"', '"tset"', 1))  # a split changed after signing is not loaded at all
    with pytest.raises(SystemExit, match="split.json: sha256 .* does not match"):
        starting_store(str(candidate))
