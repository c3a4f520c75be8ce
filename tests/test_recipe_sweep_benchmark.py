"""benchmarks.recipe_sweep: the release's recipe trained per variant and seed, the field scored for the history only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.recipe_sweep import main, parse_variant

from .conftest import make_class_folders

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer

NAMES = ["Apple___healthy", "Corn_(maize)___healthy", "Tomato___healthy"]


def test_a_variant_names_the_release_settings_it_changes_and_a_malformed_one_says_the_form():
    assert parse_variant("lite1:224:flips:3") == {"arch": "efficientnet-lite1", "size": 224, "augmentation": "flips", "epochs": 3}
    assert parse_variant("LeafNet5:128:field:55:0.002")["lr"] == 0.002
    with pytest.raises(SystemExit, match="expected arch:size:augmentation:epochs"):
        parse_variant("lite0:192")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("sweep")
    lab = make_class_folders(root / "lab", NAMES, 20)
    make_class_folders(root / "field" / "apple-orchard", NAMES[:1], 6)
    make_class_folders(root / "field" / "corn-field", NAMES[1:2], 6)
    out = root / "out"
    args = ["--out", str(out), "--plantvillage", str(lab), "--field", str(root / "field"), "--workers", "2", "--alphas", "0.5"]
    assert main([*args, "--variants", "lite0:64:flips:1", "--seeds", "20251120", "3", "--keep"]) == 0
    return root, lab, out


def test_each_variant_and_seed_is_one_run_with_its_history_and_the_summary_gives_mean_and_spread(swept):
    _, _, out = swept
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["seed"]) for r in runs] == [("lite0:64:flips:1", 20251120), ("lite0:64:flips:1", 3)]
    for r in runs:
        assert set(r["final"]) == {"val", "test", "field", "orchard", "corn"} and 0 <= r["final"]["field"] <= 1
        assert {"val_top1", "test_top1", "field_top1"} <= set(r["history"][0]) and "wise_0.5" in r
    summary = (out / "summary.md").read_text()
    assert "| lite0:64:flips:1 | 2 | fine-tuned | " in summary and " +- " in summary and "WiSE-FT a=0.5" in summary
    assert not (out / "work").exists()  # the runs' checkpoints go; the kept one stays
    again = out.parent / "again"
    assert main(["--out", str(again), "--summarise", str(out / "runs.jsonl")]) == 0
    assert (again / "summary.md").read_text().split("\n", 3)[3] == summary.split("\n", 3)[3]  # all but the command line


def test_the_kept_training_is_one_the_release_finishes_without_training_again(swept, tmp_path):
    """The GPU-to-release hand-off: the sweep's kept ``trained.pt`` (the release's seed) in a release's work folder."""
    import torch

    from trainer.release import ReleaseSettings, train_release

    _, lab, out = swept
    kept = torch.load(out / "trained.pt", map_location="cpu", weights_only=False)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "trained.pt").write_bytes((out / "trained.pt").read_bytes())
    settings = ReleaseSettings(size=64, epochs=1, threads=2)
    model, info, _, _ = train_release(lab, tmp_path / "work", settings, progress=False)
    assert info["history"] == kept["info"]["history"] and not (tmp_path / "work" / "checkpoint.pt").exists()
    assert all(torch.equal(v, kept["state_dict"][k]) for k, v in model.state_dict().items())


def test_no_run_starts_once_the_budget_is_spent(tmp_path, capsys):
    pytest.importorskip("torch")
    lab = make_class_folders(tmp_path / "lab", NAMES, 4)
    out = tmp_path / "out"
    assert main(["--out", str(out), "--plantvillage", str(lab), "--field", str(Path(tmp_path / "field")), "--budget", "0"]) == 0
    assert "budget spent: lite0:192:flips:3 seed 20251120 not run" in capsys.readouterr().out
    assert (out / "runs.jsonl").read_text() == "" and not (out / "trained.pt").exists()
