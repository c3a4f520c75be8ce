"""The field simulation (fast mode on a few real photos) and the benchmark suite's pieces."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the simulation trains: the 'train' extra")

from benchmarks.simulate import SimSettings, simulate, split_photos  # noqa: E402

# Not both_cores although it trains: small models with no time bound, so make test runs this module on the other
# worker, beside the both_cores tests; that worker's tests summed 809-821 s against the both_cores worker's 974-991 s.

CLASSES = ["Tomato___healthy", "Potato___Early_blight", "Apple___Black_rot"]


@pytest.fixture(scope="module")
def small_field(plantvillage, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("field")
    for c in CLASSES:
        (root / c).mkdir()
        for p in sorted((plantvillage / c).glob("*.jpg"))[:30]:
            shutil.copy(p, root / c / p.name)
    return root


def test_splits_are_disjoint_stratified_and_drop_duplicates(small_field, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(small_field, data)
    dup = next((data / CLASSES[0]).iterdir())
    shutil.copy(dup, data / CLASSES[1] / "same-bytes-other-class.jpg")  # one photo filed twice
    s = split_photos(data, SimSettings())
    parts = [s.test, s.val, s.labelled, s.stream]
    paths = [str(x.path) for part in parts for x in part]
    assert len(paths) == len(set(paths)) == 90 and s.duplicates == 1
    for part in (s.test, s.val, s.labelled):
        assert {x.label for x in part} == {0, 1, 2}  # every class in every split
    assert len(s.test) == len(s.val) == 9 and len(s.labelled) == 15


def test_fast_simulation_reports_days_precision_and_plots(small_field, tmp_path):
    s = SimSettings(day_size=10, days=3, epochs=4, patience=4, swa_epochs=0, retrain_epochs=1, retrain_at=5, tau=0.34)
    report = simulate(small_field, tmp_path / "out", s)
    for key in ("supervised_top1", "ssl_top1", "pseudo_label_precision", "days"):
        assert key in report
    assert [d["day"] for d in report["days"]] == [1, 2, 3]
    accepted = sum(d["accepted"] for d in report["days"])
    assert accepted > 0, "tau 0.34 on 3 classes (uniform is 0.33) must accept some pseudo-labels"
    correct = sum(d["accepted_correct"] for d in report["days"])
    assert report["pseudo_label_precision"] == round(correct / accepted, 4)
    assert any(d["retrain"] for d in report["days"])  # 5 new samples trigger a retrain
    assert 0 <= report["pseudo_labels_trained"] <= accepted  # the last retrain's pseudo-labels, after its recheck
    assert report["trained_pseudo_label_precision"] is None or 0 <= report["trained_pseudo_label_precision"] <= 1
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["ssl_top1"] == report["ssl_top1"] == report["days"][-1]["test_top1"]
    for name in ("report.md", "accuracy.png", "precision.png", "confusion.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    sweep = report["threshold_sweep"]
    assert sweep["engine_version"] == report["supervised_engine_version"] and sweep["photos"] == report["split"]["stream"]
    counts = [r["accepted"] for r in sweep["rows"]]
    assert counts == sorted(counts, reverse=True) and counts[0] <= sweep["photos"]
    assert all(r["precision"] is None or 0 <= r["precision"] <= 1 for r in sweep["rows"])
    assert 0 <= sweep["ece"] <= 1
    assert "expected calibration error" in (tmp_path / "out" / "report.md").read_text()
    assert "| tau | accepted |" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize("choice", ["device", "random"])
def test_expert_arm_labels_k_a_day_within_the_budget(small_field, tmp_path, choice):
    """The expert labels K photos a day from the review pool (below tau), never more than the budget; the labels
    reach the trainer as expert samples with their true class."""
    from trainer.samples import SampleStore

    s = SimSettings(
        day_size=10,
        days=3,
        epochs=2,
        patience=2,
        swa_epochs=0,
        retrain_epochs=1,
        retrain_at=1000,
        tau=0.99,
        expert_per_day=2,
        expert_choice=choice,
        expert_budget=5,
        calibrate=False,
    )
    report = simulate(small_field, tmp_path / "out", s)
    assert [d["expert_labels"] for d in report["days"]] == [2, 2, 1] and report["expert_labels"] == 5
    split = split_photos(small_field, s)
    experts = [x for x in SampleStore(tmp_path / "out" / "fast" / "trainer").all() if x.kind == "expert"]
    assert len(experts) == 5 and all(x.label == split.classes[split.truth[x.id]] for x in experts)
    with pytest.raises(ValueError, match="fast mode only"):
        simulate(small_field, tmp_path / "full", SimSettings(mode="full", day_size=10, days=1, expert_per_day=2))


def test_simulation_refuses_bad_requests(small_field, tmp_path):
    with pytest.raises(ValueError, match="full days"):
        simulate(small_field, tmp_path / "a", SimSettings(day_size=10, days=50, epochs=1, swa_epochs=0))
    (tmp_path / "b" / "store").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="earlier simulation"):
        simulate(small_field, tmp_path / "b", SimSettings(day_size=10, days=1, epochs=1, swa_epochs=0))
    cli = subprocess.run(
        [sys.executable, "-m", "benchmarks.simulate", "--data", str(small_field), "--out", str(tmp_path / "c"), "--day-size", "500"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 2 and "too few photos for one day of 500" in cli.stderr


# ---- benchmark suite pieces -----------------------------------------------------------
def test_model_flops_match_the_architecture(tiny_store):
    from benchmarks.floor import model_flops

    version = next(p for p in tiny_store.iterdir() if p.name.startswith("v"))
    convs = [(3, 32, 128), (32, 64, 64), (64, 128, 32), (128, 256, 16)]  # cin, cout, output side (same padding)
    macs = sum(cin * cout * 9 * side * side for cin, cout, side in convs) + 256 * 256 + 256 * 3
    assert model_flops(version / "model.onnx") == 2 * macs


def test_power_says_why_when_no_meter_can_be_read(monkeypatch, tmp_path):
    import benchmarks.power as power

    monkeypatch.setattr(power, "RAPL", tmp_path / "absent")
    monkeypatch.setitem(sys.modules, "jtop", None)  # import fails like on a laptop
    r = power.measure_power(lambda: 1, 0.05)
    assert r["meter"] is None and "jtop" in r["unavailable"] and "RAPL" in r["unavailable"]
    assert "mean_w" not in r  # never an invented figure


def test_power_from_a_rapl_counter(monkeypatch, tmp_path):
    import benchmarks.power as power

    counter = tmp_path / "energy_uj"
    counter.write_text("1000000")
    monkeypatch.setattr(power, "RAPL", counter)
    monkeypatch.setitem(sys.modules, "jtop", None)
    calls = []

    def work():  # each inference costs 0.5 J on this fake counter
        calls.append(1)
        counter.write_text(str(1000000 + 500000 * len(calls)))
        return 1

    r = power.measure_power(work, 0.05)
    assert r["meter"].startswith("Intel RAPL") and r["joules_per_inference"] == pytest.approx(0.5)


def test_baseline_reuse_refuses_another_split(small_field, tmp_path):
    s = dict(day_size=10, days=1, epochs=2, patience=2, swa_epochs=0, val_fraction=0.25)  # 24 validation photos: calibrated
    first = simulate(small_field, tmp_path / "a", SimSettings(**s))
    again = simulate(small_field, tmp_path / "b", SimSettings(**s, baseline_from=str(tmp_path / "a")))
    assert again["supervised_top1"] == first["supervised_top1"]  # the same weights, not retrained
    fitted = first["calibration"]["v0001"]
    assert fitted["skipped"] is None and fitted["photos"] == 24
    assert again["calibration"]["v0001"] == fitted  # its temperature kept, not fitted a second time (that would say T = 1)
    with pytest.raises(ValueError, match="other data, splits or seed"):
        simulate(small_field, tmp_path / "c", SimSettings(day_size=10, days=1, seed=1, baseline_from=str(tmp_path / "a")))


def test_seed_series_resumes_and_summarises(tmp_path, monkeypatch):
    """benchmarks.seeds: a seed with a finished report is not run again; an interrupted one is; mean and sd."""
    from benchmarks import seeds

    def report(sup, ssl, prec, retrain=None, trained=None):
        days = [{"day": 1, "retrain": retrain}, {"day": 2, "retrain": None}]
        return {
            "supervised_top1": sup,
            "ssl_top1": ssl,
            "gain_points": round((ssl - sup) * 100, 1),
            "pseudo_label_precision": prec,
            "pseudo_labels_accepted": 500,
            "wall_s": 10.0,
            "days": days,
            **({"trained_pseudo_label_precision": trained} if trained else {}),
        }

    (tmp_path / "seed-1").mkdir()
    (tmp_path / "seed-1" / "report.json").write_text(json.dumps(report(0.70, 0.74, 0.93, {"published": "v0002"})))
    (tmp_path / "seed-2").mkdir()  # interrupted: no report; its leftovers are cleared and the seed runs again
    (tmp_path / "seed-2" / "junk").write_text("x")
    ran = []

    def fake_run(cmd, check, cwd):
        out = Path(cmd[cmd.index("--out") + 1])
        assert not out.exists()
        ran.append(int(cmd[cmd.index("--seed") + 1]))
        out.mkdir()
        (out / "report.json").write_text(json.dumps(report(0.80, 0.78, 0.95, {"published": None}, trained=0.97)))

    monkeypatch.setattr(seeds.subprocess, "run", fake_run)
    assert seeds.main(["--out", str(tmp_path), "--seeds", "1", "2", "--data", "unused"]) == 0
    assert ran == [2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["gain_points"]["mean"] == pytest.approx(1.0)
    assert summary["gain_points"]["sd"] == pytest.approx(4.2426, abs=1e-3)
    assert [r["published"] for r in summary["runs"]] == [1, 0]
    assert summary["trained_pseudo_label_precision"] == {"mean": 0.97, "sd": 0.0, "runs": 1}  # seed 1's older report has none
    text = (tmp_path / "summary.md").read_text()
    assert "| mean |" in text and "| 0.9300 | - |" in text and "| 0.9700 +- 0.0000 |" in text


@pytest.fixture(scope="module")
def small_simulation(small_field, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bounds") / "sim"
    simulate(small_field, out, SimSettings(day_size=10, days=1, epochs=3, patience=3, swa_epochs=0, tau=0.34, calibrate=False))
    return out


def test_ssl_bounds_fine_tunes_every_arm_on_the_simulations_splits(small_simulation):
    from benchmarks import ssl_bounds

    result = ssl_bounds.run(small_simulation, list(ssl_bounds.ARMS), epochs=1, lr=1e-3, threads=2)
    report = json.loads((small_simulation / "report.json").read_text())
    assert result["split"] == report["split"]
    rows = {r["arm"]: r for r in result["rows"]}
    assert list(rows) == ["baseline", *ssl_bounds.ARMS]
    labelled, stream, sure = report["split"]["labelled"], report["split"]["stream"], result["stream"]["confident"]
    assert 0 < sure < stream, "tau 0.34 over 3 classes: some stream photos confident, not all"
    assert rows["labelled"]["photos"] == labelled
    assert rows["pseudo"]["photos"] == rows["confident-true"]["photos"] == labelled + sure
    assert rows["all-true"]["photos"] == rows["consistency"]["photos"] == labelled + stream
    assert all(0 <= r["val"] <= 1 and 0 <= r["test"] <= 1 for r in rows.values())
    text = ssl_bounds.markdown(result)
    assert text.count("\n| ") == len(rows) + 1 and f"{sure} at softmax >= 0.34" in text


def test_ssl_bounds_refuses_unknown_arms_and_changed_photos(small_simulation, small_field, tmp_path):
    from benchmarks import ssl_bounds

    with pytest.raises(SystemExit, match="unknown arm.*oracle"):
        ssl_bounds.run(small_simulation, ["labelled", "oracle"], epochs=1, lr=1e-3, threads=1)
    moved = tmp_path / "data"
    shutil.copytree(small_field, moved)
    next((moved / CLASSES[0]).iterdir()).unlink()  # one photo fewer: other splits
    with pytest.raises(SystemExit, match="no longer give that simulation's splits"):
        ssl_bounds.run(small_simulation, ["labelled"], epochs=1, lr=1e-3, threads=1, data=str(moved))


def test_consistency_loss_counts_only_confident_weak_views():
    import torch

    from benchmarks.ssl_bounds import consistency_loss, strong_augment

    weak = torch.tensor([[0.95, 0.05], [0.6, 0.4], [0.02, 0.98]])
    strong = torch.tensor([[0.0, 2.0], [5.0, -5.0], [0.0, 2.0]], requires_grad=True)
    loss = consistency_loss(strong, weak, 0.9)
    ce = torch.nn.functional.cross_entropy(strong.detach(), torch.tensor([0, 0, 1]), reduction="none")
    assert loss.item() == pytest.approx((ce[0] + ce[2]).item() / 3)  # row 1 is unsure: zero, still in the mean
    loss.backward()
    assert strong.grad[1].abs().sum() == 0 and strong.grad[0].abs().sum() > 0
    assert consistency_loss(strong, weak, 1.01).item() == 0
    x = torch.randn(4, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    out = strong_augment()(x, torch.Generator().manual_seed(1))
    assert out.shape == x.shape and (out == 0).float().mean() > 0.01  # cutout blanks a square


def test_expert_arms_summary_has_the_issue_keys():
    from benchmarks.experts import markdown, summarise

    def report(seed, sup, top1, experts):
        days = [{"day": 1, "test_top1": sup, "retrain": None}, {"day": 2, "test_top1": top1, "retrain": {"published": "v0002"}}]
        return {
            "settings": {"seed": seed},
            "supervised_top1": sup,
            "ssl_top1": top1,
            "gain_points": round((top1 - sup) * 100, 2),
            "pseudo_label_precision": 0.97,
            "pseudo_labels_accepted": 300,
            "expert_labels": experts,
            "days": days,
        }

    s = summarise(
        {
            "none": [report(1, 0.70, 0.70, 0), report(2, 0.72, 0.73, 0)],
            "device-10": [report(1, 0.70, 0.78, 100), report(2, 0.72, 0.80, 100)],
        }
    )
    assert s["expert_labels"] == {"none": 0, "device-10": 100}
    arm = s["arms"]["device-10"]
    assert arm["top1_mean"] == pytest.approx(0.79) and arm["gain_mean"] == pytest.approx(8.0) and arm["top1_sd"] > 0
    assert arm["days_top1_mean"] == pytest.approx([0.71, 0.79]) and arm["retrains_published"] == 2
    assert "| device-10 | 2 |" in markdown(s)
