"""benchmarks.retrain_memory's reading of its samples (the retrain itself is a benchmark: minutes, not a test)."""

from __future__ import annotations

from benchmarks.retrain_memory import segments


def test_consecutive_samples_of_one_step_become_one_row_with_its_lowest_and_highest_resident_size():
    samples = [[0.0, 300, "-"], [0.25, 310, "train_generation"], [0.5, 900, "train_generation"], [0.75, 700, "train_generation"]]
    samples += [[1.0, 650, "teach"], [1.25, 800, "train_generation"]]
    rows = segments(samples)
    assert [(r["step"], r["min_mb"], r["max_mb"]) for r in rows] == [
        ("-", 300, 300),
        ("train_generation", 310, 900),
        ("teach", 650, 650),
        ("train_generation", 800, 800),  # a second training is its own row, not merged with the first
    ]
    assert rows[1]["from_s"] == 0.25 and rows[1]["to_s"] == 0.75


def test_no_samples_give_no_rows():
    assert segments([]) == []
