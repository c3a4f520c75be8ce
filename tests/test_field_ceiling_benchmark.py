"""benchmarks.field_ceiling: the shipped weights may be republished at another input side before the one retrain, and
the expert's photos chosen by a rule (the typical rule takes one photo from each cluster)."""

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


def test_the_first_rule_is_the_streams_own_order_and_every_rule_is_named():
    from benchmarks.field_ceiling import CHOICES, chosen

    stream = [(f"p{i}.jpg", i % 4) for i in range(10)]
    assert chosen("first", stream, 4, store=None, cfg=None, seed=1) == stream[:4]
    assert chosen("typical", stream, 20, store=None, cfg=None, seed=1) == stream  # more wanted than there are: all
    assert set(CHOICES) == {"first", "margin", "spread", "draw", "typical", "typical-logits", "typical-distances"}
    with pytest.raises(SystemExit):
        from benchmarks.field_ceiling import main

        main(["--out", "/nonexistent-never-written", "--choose", "least"])


def test_the_engine_rules_cluster_what_the_engine_returns_and_refuse_an_engine_without_distances(tiny_store, tmp_path):
    """``typical-logits`` takes one photo of each cluster of the engine's logits (as many as asked, never two copies of
    one photo, which the stream's order would give); ``typical-distances`` needs the verdict's distance output, which a
    model whose verdict is on its logits lacks."""
    pytest.importorskip("torch")
    from benchmarks.field_ceiling import chosen
    from edge_agent.config import parse_config
    from engines.store import EngineStore

    from .conftest import encode, leaf_image

    stream = []
    for i in range(24):
        path = tmp_path / f"p{i}.jpg"
        path.write_bytes(encode(leaf_image(100 if i < 6 else i)))  # the stream's first six: one photo copied
        stream.append((path, i % 3))
    store = EngineStore(shutil.copytree(tiny_store, tmp_path / "engines"))
    picks = chosen("typical-logits", stream, 6, store, parse_config({}), seed=1)
    assert len(picks) == 6 == len({str(p) for p, _ in picks}) and all(p in stream for p in picks)
    assert sum(p in stream[:6] for p in picks) <= 1
    assert picks == chosen("typical-logits", stream, 6, store, parse_config({}), seed=1)  # the seed fixes the draw
    with pytest.raises(SystemExit, match="returns no distances"):
        chosen("typical-distances", stream, 6, store, parse_config({}), seed=1)
