"""benchmarks.retrain_cost refuses missing photo folders in one line before any work."""

from __future__ import annotations

import pytest

from benchmarks.retrain_cost import main


def test_a_missing_field_or_lab_folder_is_named_with_the_flag_that_sets_it_before_anything_is_written(tmp_path):
    (tmp_path / "field" / "apple-orchard").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"nope/apple-orchard: no such folder; give --data and --field"):
        main(["--out", str(tmp_path / "out"), "--data", str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match=r"lab: no such folder; give --lab"):
        main(["--out", str(tmp_path / "out"), "--data", str(tmp_path / "field"), "--lab", str(tmp_path / "lab")])
    assert not (tmp_path / "out").exists()
