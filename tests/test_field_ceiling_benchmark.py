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
