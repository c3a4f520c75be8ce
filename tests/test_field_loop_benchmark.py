"""The field loop benchmark's own arithmetic: the split it draws and what its summary counts."""

from __future__ import annotations

import pytest

from benchmarks.field_loop import split_field, summarise


def _field(tmp_path, per_class: dict[str, int]):
    for cls, n in per_class.items():
        (tmp_path / cls).mkdir()
        for i in range(n):
            (tmp_path / cls / f"{i}.jpg").write_bytes(f"{cls}-{i}".encode())
    (tmp_path / "Not_a_class").mkdir()
    (tmp_path / "Not_a_class" / "x.jpg").write_bytes(b"x")
    (tmp_path / "A" / "copy.jpg").write_bytes(b"A-0")  # the same bytes under another name: kept once
    return tmp_path


def test_the_field_split_is_stratified_disjoint_deduplicated_and_the_same_for_a_seed(tmp_path):
    root = _field(tmp_path, {"A": 40, "B": 20})
    test, stream = split_field(root, ["A", "B"], seed=1, test_fraction=0.25)
    assert sorted(y for _, y in test) == [0] * 10 + [1] * 5
    assert len(stream) == 45 and not {p for p, _ in test} & {p for p, _ in stream}
    assert all("Not_a_class" not in str(p) and p.name != "copy.jpg" for p, _ in test + stream)
    assert (test, stream) == split_field(root, ["A", "B"], seed=1, test_fraction=0.25)
    assert [p for p, _ in stream] != [p for p, _ in split_field(root, ["A", "B"], seed=2, test_fraction=0.25)[1]]
    assert [y for _, y in stream[:10]] != sorted(y for _, y in stream[:10])  # shuffled across classes


def _day(day, field, published=None, pseudo=None):
    retrain = {"published": published, "reason": "r"} if published is not None else None
    return {
        "day": day,
        "field": field,
        "lab": 0.9,
        "pseudo_labels": 0 if pseudo is None else 5,
        "pseudo_precision": pseudo,
        "expert_labels": 10 * day,
        "retrain": retrain,
    }


def test_the_summary_counts_a_published_version_worse_on_the_field_than_the_one_before():
    run = {
        "settings": {"seed": 1},
        "start": {"field": 0.10, "lab": 0.9},
        "days": [_day(1, 0.10), _day(2, 0.40, "v1001"), _day(3, 0.35, "v1002", pseudo=0.8), _day(4, 0.35, "")],
    }
    arm = summarise({"device": [run]})["arms"]["device"]
    assert arm["published"] == 2 and arm["refused"] == 1
    assert arm["published_worse_on_field"] == 1
    assert arm["days"][2]["pseudo_precision_min"] == 0.8 and arm["days"][0]["pseudo_precision_min"] is None


def test_the_measure_gives_each_engine_the_photos_its_own_manifest_asks_for(tmp_path):
    """v2000 takes 192 px photos: measuring it with the 128 px default once stopped the benchmark before day 1."""
    from benchmarks.field_loop import _Measure
    from edge_agent.config import default_store_path, parse_config
    from edge_agent.state import seed_store
    from engines.store import EngineStore

    from .conftest import encode, leaf_image

    photos = []
    for i in range(3):
        photos.append((tmp_path / f"{i}.jpg", i))
        photos[-1][0].write_bytes(encode(leaf_image(i, (300, 240))))
    seed_store(default_store_path(), tmp_path / "engines")
    store = EngineStore(tmp_path / "engines")
    assert store.open().manifest["preprocess"]["size"] != 128
    figures = _Measure(parse_config({}), photos, photos[:2])(store)
    assert set(figures) == {"field", "lab"} and all(0.0 <= v <= 1.0 for v in figures.values())


def test_a_set_value_is_read_as_toml_and_a_malformed_one_or_full_mode_is_refused_with_the_fix(tmp_path):
    from benchmarks._sets import config_sets
    from benchmarks.field_loop import main

    assert config_sets(["trainer.field_check_min=6", 'engine.precision="fp32"', "trainer.unlabelled_term=false"]) == {
        "trainer": {"field_check_min": 6, "unlabelled_term": False},
        "engine": {"precision": "fp32"},
    }
    with pytest.raises(SystemExit, match="SECTION.KEY=VALUE"):
        config_sets(["field_check_min=6"])
    with pytest.raises(SystemExit, match="not TOML.*quotes"):
        config_sets(["engine.precision=fp32"])
    with pytest.raises(SystemExit) as refused:  # the services of full mode run as a new user's, with no configuration
        main(["--out", str(tmp_path), "--mode", "full", "--set", "trainer.field_check_min=6"])
    assert refused.value.code == 2 and not any(tmp_path.iterdir())
