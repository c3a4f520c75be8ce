"""A season's labels bounded per retrain: the new ones first, then a class-balanced draw (trainer/loop/label_budget.py)."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter

import pytest

from trainer.loop.label_budget import choose
from trainer.samples import Sample

from .conftest import encode, leaf_image


def _sample(n: int, label: str, kind: str = "expert", new: bool = False) -> Sample:
    return Sample(f"{n:064x}", kind, label, 1.0, "v4000", f"/x/{n}.jpg", float(n), None if new else "v4001")


def test_every_label_is_kept_within_the_budget_or_with_none():
    samples = [_sample(i, "A") for i in range(5)]
    assert choose(samples, 5, "s") == (samples, set())
    assert choose(samples, 0, "s") == (samples, set())


def test_the_new_labels_come_first_and_the_older_fill_what_is_left_a_class_at_a_time():
    old = [_sample(i, "A") for i in range(20)] + [_sample(100 + i, "B") for i in range(2)]
    new = [_sample(200 + i, "C", new=True) for i in range(3)]
    kept, waiting = choose(old + new, 9, "s")
    assert len(kept) == 9 and len(waiting) == len(old) + len(new) - 9
    assert set(new) <= set(kept)  # every new one
    assert Counter(s.label for s in kept) == {"A": 4, "B": 2, "C": 3}  # B's two older labels both, A the rest
    assert [s.received for s in kept] == sorted(s.received for s in kept)  # in the order they came
    assert {s.id for s in kept} | waiting == {s.id for s in old + new} and not {s.id for s in kept} & waiting


def test_a_new_class_with_one_label_is_never_crowded_out_by_a_busy_one():
    new = [_sample(i, "A", new=True) for i in range(50)] + [_sample(99, "Z", new=True)]
    kept, _ = choose(new, 10, "s")
    assert Counter(s.label for s in kept) == {"A": 9, "Z": 1}
    assert {s.received for s in kept if s.label == "A"} == {float(i) for i in range(41, 50)}  # the newest of the busy class


def test_a_classes_expert_labels_are_drawn_before_its_pseudo_labels():
    samples = [_sample(i, "A", "pseudo") for i in range(10)] + [_sample(50 + i, "A") for i in range(3)]
    kept, _ = choose(samples, 4, "s")
    assert Counter(s.kind for s in kept) == {"expert": 3, "pseudo": 1}


def test_each_retrain_draws_other_older_labels_and_in_a_few_every_one_comes_back():
    old = [_sample(i, "A") for i in range(40)]
    draws = [{s.id for s in choose(old, 10, f"20251120/{n}")[0]} for n in range(40, 60)]
    assert len({frozenset(d) for d in draws}) > 15  # drawn anew, not the same ten each time
    assert set().union(*draws) == {s.id for s in old}  # none left out for good
    assert choose(old, 10, "20251120/41")[0] == choose(old, 10, "20251120/41")[0]  # the same seed, the same draw


torch = pytest.importorskip("torch", reason="the trainer needs the 'train' extra")
CLASSES = ["Tomato___healthy", "Pepper,_bell___healthy", "Orange___Haunglongbing_(Citrus_greening)"]


@pytest.mark.both_cores
def test_a_retrain_trains_on_the_budget_and_leaves_none_of_the_rest_as_new(tiny_store, tmp_path, capsys):
    from edge_agent.config import parse_config
    from engines.store import EngineStore
    from trainer import retrain as service
    from trainer.cli import main
    from trainer.samples import SampleStore

    from .test_recheck import _open_gate

    store = EngineStore(shutil.copytree(tiny_store, tmp_path / "store"))
    samples = SampleStore(tmp_path / "trainer")
    for i in range(7):
        sample = {"id": f"{i:064x}", "kind": "expert", "label": CLASSES[i % 3], "confidence": 1.0, "engine_version": "v0001", "ext": ".jpg"}
        samples.add(sample, encode(leaf_image(700 + i)))
        time.sleep(0.01)
    tc = {**_open_gate(tmp_path), "labels_per_retrain": 4}
    result = service.retrain(parse_config({"trainer": tc}), store, samples, tmp_path / "strategy")
    assert result.published, result.reason
    assert result.metrics["samples"]["expert"] == 4 and result.metrics["samples"]["waiting"] == 3
    assert samples.counts()["new"] == 0  # the three left out are not new: the next retrain waits for new labels
    trained = store.read_manifest(result.published)["training"]["samples"]
    assert trained["expert"] == 4 and trained["waiting"] == 3
    last = {"published": result.published, "reason": result.reason, "metrics": result.metrics}
    (tmp_path / "trainer" / "status.json").write_text(json.dumps({"pid": 1, "updated": 0, "state": "idle", "last_retrain": last}))
    main(["status", "--state-dir", str(tmp_path)])
    assert "trained on 4 of the 7 labels it could, the new ones first; 3 wait for a later retrain's draw" in capsys.readouterr().out
    samples.close()
