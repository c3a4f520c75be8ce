"""benchmarks.retrain_cost refuses missing photo folders in one line before any work, and sums up its seeds."""

from __future__ import annotations

import json

import pytest

from benchmarks.retrain_cost import main, summarise


def test_a_missing_field_or_lab_folder_is_named_with_the_flag_that_sets_it_before_anything_is_written(tmp_path):
    (tmp_path / "field" / "apple-orchard").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"nope/apple-orchard: no such folder; give --data and --field"):
        main(["--out", str(tmp_path / "out"), "--data", str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match=r"lab: no such folder; give --lab"):
        main(["--out", str(tmp_path / "out"), "--data", str(tmp_path / "field"), "--lab", str(tmp_path / "lab")])
    assert not (tmp_path / "out").exists()


def test_the_summary_gives_the_second_retrain_of_a_then_run_and_the_command_that_made_it(tmp_path):
    for seed, (field, waiting) in enumerate([(0.8, 100), (0.9, 100)], 1):
        then = {
            "labels_added": 200,
            "after": {"field": field, "lab": 0.97},
            "published": "v4002",
            "retrain_seconds": 250.0,
            "peak_rss_mb_both": 1300,
            "samples": {"expert": 300, "waiting": waiting},
        }
        run = {
            "labels": 200,
            "field_test_photos": 300,
            "lab_test_photos": 672,
            "before": {"field": 0.1, "lab": 0.98},
            "after": {"field": 0.7, "lab": 0.97},
            "published": "v4001",
            "retrain_seconds": 200.0,
            "retrain_peak_rss_mb": 1200,
            "sets": {"trainer": {"labels_per_retrain": 300}},
            "then": then,
        }
        (tmp_path / f"seed-{seed}.json").write_text(json.dumps(run))
    text = summarise(tmp_path)
    assert text.startswith("# One retrain on an expert's field labels, then a second after more arrive\n")
    assert "--labels 200 --set trainer.labels_per_retrain=300 --then 200`; 2 seeds" in text
    assert "Then 200 more labels and a second retrain: field top-1 0.850 +- 0.071, lab top-1 0.970 +- 0.000" in text
    assert "trained on 300.000 +- 0.000 expert labels (100.000 +- 0.000 waiting); wall time 250.000 +- 0.000 s" in text
