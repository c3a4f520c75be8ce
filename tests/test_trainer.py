"""Supervised training: data discovery, splits, preprocessing parity, augmentation, publish."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the 'train' extra (torch) is not installed")

from edge_agent.preprocess import preprocess_file  # noqa: E402
from engines.store import EngineStore  # noqa: E402
from trainer.augment import Augment  # noqa: E402
from trainer.data import DatasetError, TensorDataset, scan_folder, stratified_split  # noqa: E402
from trainer.train import TrainSettings, train_supervised  # noqa: E402

from .conftest import make_class_folders  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer

ODD_NAMES = ["Pepper,_bell___healthy", "Orange___Haunglongbing_(Citrus_greening)", "Tomato___Spider_mites Two-spotted_spider_mite"]


def test_preprocessing_parity_trainer_equals_daemon_bit_for_bit(plantvillage):
    photos = (
        sorted((plantvillage / "Tomato___Late_blight").glob("*.jpg"))[:4]
        + sorted((plantvillage / "Pepper,_bell___healthy").glob("*.jpg"))[:4]
    )
    folder = scan_folder(plantvillage)
    samples = [s for s in folder.samples if s.path in set(photos)]
    ds = TensorDataset(samples)
    assert len(ds) == 8
    for i, s in enumerate(ds.samples):
        x, y = ds[i]
        daemon = preprocess_file(s.path)
        assert x.numpy().tobytes() == daemon.tobytes()  # bit for bit
        assert folder.classes[int(y)] == s.path.parent.name


def test_scan_keeps_odd_class_names_in_sorted_order(tmp_path):
    root = make_class_folders(tmp_path / "data", ODD_NAMES, 3)
    (root / ".hidden").mkdir()
    (root / ODD_NAMES[0] / "notes.txt").write_text("not a photo")
    folder = scan_folder(root)
    assert folder.classes == sorted(ODD_NAMES)
    assert folder.counts() == {n: 3 for n in sorted(ODD_NAMES)}


def test_dataset_errors(tmp_path):
    with pytest.raises(DatasetError, match="not a directory"):
        scan_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="found 0 class folder"):
        scan_folder(tmp_path / "empty")
    root = make_class_folders(tmp_path / "one", ["Only"], 2)
    with pytest.raises(DatasetError, match="found 1 class folder"):
        scan_folder(root)
    root = make_class_folders(tmp_path / "two", ["A", "B"], 2)
    (root / "C").mkdir()
    (root / "C" / "readme.txt").write_text("x")
    with pytest.raises(DatasetError, match="no photos: 'C'"):
        scan_folder(root)


def test_stratified_split_is_deterministic_disjoint_and_stratified(tmp_path):
    root = make_class_folders(tmp_path / "d", ["A", "B", "C"], 20, size=(32, 32))
    samples = scan_folder(root).samples
    a = stratified_split(samples, {"test": 0.1, "val": 0.1}, seed=7)
    b = stratified_split(samples, {"test": 0.1, "val": 0.1}, seed=7)
    c = stratified_split(samples, {"test": 0.1, "val": 0.1}, seed=8)
    assert a == b and a != c
    paths = [s.path for part in a.values() for s in part]
    assert len(paths) == len(set(paths)) == 60
    for part, n in (("test", 2), ("val", 2), ("train", 16)):
        assert sorted(s.label for s in a[part]) == sorted([0, 1, 2] * n)


def test_split_keeps_a_training_photo_for_tiny_classes(tmp_path):
    root = make_class_folders(tmp_path / "d", ["A", "B"], 1, size=(32, 32))
    split = stratified_split(scan_folder(root).samples, {"test": 0.5, "val": 0.4}, seed=1)
    assert len(split["train"]) == 2


def test_unreadable_photos_are_skipped_and_reported(tmp_path):
    root = make_class_folders(tmp_path / "d", ["A", "B"], 2, size=(32, 32))
    (root / "A" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0garbage")
    ds = TensorDataset(scan_folder(root).samples)
    assert len(ds) == 4 and len(ds.skipped) == 1 and "broken.jpg" in ds.skipped[0][0]


def test_augmentation_changes_training_batches_only():
    x = torch.randn(4, 3, 128, 128)
    aug = Augment()
    out = aug(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and not torch.allclose(out, x)
    again = aug(x, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)  # reproducible with a seed
    still = Augment(max_degrees=0, brightness=0, contrast=0, noise_std=0, hflip=False, vflip=False)(x.clamp(-1.5, 1.5))
    assert torch.allclose(still, x.clamp(-1.5, 1.5), atol=1e-4)  # identity when every jitter is off


def test_train_publishes_a_complete_version(tmp_path):
    root = make_class_folders(tmp_path / "data", ODD_NAMES, 10)
    settings = TrainSettings(epochs=2, batch_size=8, patience=5, threads=2)
    version = train_supervised(root, tmp_path / "store", settings, progress=False)
    m = version.manifest
    assert m["classes"] == sorted(ODD_NAMES)
    assert set(m["artifacts"]) == {"onnx", "int8", "torch"}
    assert m["input"] == {"name": "input", "shape": [None, 3, 128, 128], "dtype": "float32"}
    assert m["preprocess"]["interpolation"] == "area" and m["preprocess"]["size"] == 128
    assert m["training"]["split"]["test_photos"] == 3 and m["training"]["split"]["val_photos"] == 3
    assert m["training"]["epochs_run"] == 2
    for key in ("val", "test", "int8", "onnx_max_abs_diff"):
        assert key in m["metrics"]
    assert m["metrics"]["onnx_max_abs_diff"] < 1e-4
    assert EngineStore(tmp_path / "store").current() == version.name
    assert "3 held-out photos" in m["metrics"]["calibration"]["skipped"]  # too few to fit a temperature on


def _noisy_classes(root: Path) -> Path:
    """Three classes of 70 photos, every third filed under the next class: no model can be sure of all of them."""
    make_class_folders(root, ["A", "B", "C"], 70, size=(40, 40))
    for i, name in enumerate("ABC"):
        for photo in sorted((root / name).iterdir())[::3]:
            photo.rename(root / "ABC"[(i + 1) % 3] / f"moved-{photo.name}")
    return root


@pytest.fixture(scope="module")
def noisy_release(tmp_path_factory) -> tuple[Path, Path]:
    """:func:`_noisy_classes`, and a store of one version trained on it for one epoch without calibration (INT8
    built): trained once for the tests that calibrate it; each copies the store (:func:`_copy_of`)."""
    root = tmp_path_factory.mktemp("noisy")
    data = _noisy_classes(root / "data")
    train_supervised(data, root / "store", TrainSettings(epochs=1, batch_size=16, threads=2, calibrate=False), progress=False)
    return data, root / "store"


def _copy_of(store: Path, to: Path) -> EngineStore:
    """A copy of the store at ``store``, opened at ``to``."""
    import shutil

    shutil.copytree(store, to)
    return EngineStore(to)


def test_train_folds_the_temperature_fitted_on_validation(tmp_path, noisy_release):
    """The published ONNX's softmax is the trained model's divided by the fitted temperature; top-1 is unchanged."""
    from trainer.calibrate import fit_temperature
    from trainer.publish import load_weights

    root, trained = noisy_release
    settings = TrainSettings(epochs=1, batch_size=16, int8=False, threads=2)
    plain = _copy_of(trained, tmp_path / "plain").open()  # these settings, without calibrating
    scaled = train_supervised(root, tmp_path / "scaled", settings, progress=False)
    assert "calibration" not in plain.manifest["metrics"]
    cal = scaled.manifest["metrics"]["calibration"]
    assert cal["skipped"] is None and cal["photos"] == 21 and cal["nll_after"] <= cal["nll_before"]
    folder = scan_folder(root)
    val = TensorDataset(stratified_split(folder.samples, {"test": 0.1, "val": 0.1}, settings.seed)["val"])
    with torch.no_grad():
        raw, folded = load_weights(plain)(val.x), load_weights(scaled)(val.x)
    # CPU training is not bit-reproducible, so compare each run with its own fit rather than the two runs.
    assert fit_temperature(folded, val.y) == pytest.approx(1.0, rel=0.02)  # nothing left to fit
    assert fit_temperature(raw, val.y) != pytest.approx(1.0, rel=0.1)  # an untrained-ish model is not calibrated
    assert cal["temperature"] != pytest.approx(1.0, rel=0.1)
    assert scaled.manifest["metrics"]["val"]["top1"] == pytest.approx((folded.argmax(1) == val.y).float().mean().item(), abs=1e-4)


def test_early_stopping(tmp_path, monkeypatch):
    import trainer.train as tt

    root = make_class_folders(tmp_path / "data", ["A", "B"], 10, size=(48, 48))
    flat = tt.Evaluation(top1=0.5, loss=0.7, per_class=[0.5, 0.5], confusion=[[1, 1], [1, 1]])
    monkeypatch.setattr(tt, "evaluate", lambda *a, **k: flat)  # validation never improves
    settings = TrainSettings(epochs=50, batch_size=8, patience=2, int8=False)
    t = train_supervised(root, tmp_path / "store", settings, progress=False).manifest["training"]
    assert t["best_epoch"] == 1 and t["epochs_run"] == 3


def test_cli_rejects_a_bad_dataset_with_a_clear_message(tmp_path):
    (tmp_path / "data").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "train", "--data", str(tmp_path / "data"), "--store", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == 2
    assert "bad dataset" in out.stderr and "class folder" in out.stderr


def test_init_from_a_store_version(tmp_path):
    root = make_class_folders(tmp_path / "data", ODD_NAMES, 6, size=(48, 48))
    settings = TrainSettings(epochs=1, batch_size=8, int8=False)
    first = train_supervised(root, tmp_path / "a", settings, progress=False)
    settings.init = f"{tmp_path / 'a'}:{first.name}"
    second = train_supervised(root, tmp_path / "b", settings, progress=False)
    init = second.manifest["training"]["init"]
    assert init["version"] == "v0001" and init["onnx_sha256"] == first.manifest["files"]["model.onnx"]["sha256"]
    other = make_class_folders(tmp_path / "other", ["X", "Y"], 10, size=(48, 48))
    with pytest.raises(DatasetError, match="classes differ"):
        train_supervised(other, tmp_path / "c", settings, progress=False)


def _labelled(cfg, classes):
    from trainer.labelled import labelled_sources, load_labelled

    got = load_labelled(labelled_sources(cfg, classes))
    return got.train, got.val


def test_gate_validation_folder_is_held_out_whole(tmp_path):
    """With [trainer] validation_data the whole labelled folder is replayed and the gate judges on the other folder;
    without it, val_fraction of the labelled folder is held out."""
    from edge_agent.config import parse_config

    names = ["Apple___healthy", "Tomato___healthy"]
    labelled = make_class_folders(tmp_path / "labelled", names, 10)
    held_out = make_class_folders(tmp_path / "held-out", names[::-1], 3)  # other order: mapped by name
    classes = ["Tomato___healthy", "Apple___healthy", "Corn___healthy"]
    train, val = _labelled(parse_config({"trainer": {"labelled_data": str(labelled), "validation_data": str(held_out)}}), classes)
    assert len(train) == 20 and len(val) == 6
    assert sorted(val.y.tolist()) == [0, 0, 0, 1, 1, 1]
    train, val = _labelled(parse_config({"trainer": {"labelled_data": str(labelled), "val_fraction": 0.2}}), classes)
    assert len(train) == 16 and len(val) == 4


def test_no_configuration_uses_the_shipped_photos(tmp_path):
    """With no labelled_data / validation_data the shipped gate (the shipped model's 672 test photos) and replay
    photos (8 a class) serve; a user's own folder replaces its half; shipped_data = false leaves nothing to gate on."""
    import json

    from edge_agent.config import default_data_path, default_store_path, parse_config
    from engines.store import EngineStore
    from trainer.labelled import labelled_sources

    classes = EngineStore(default_store_path()).open(verify=False).classes
    src = labelled_sources(parse_config({}), classes)
    assert (src.origin, len(src.val), len(src.train)) == ("shipped", 672, 8 * 38)
    manifest = json.loads((default_data_path() / "manifest.json").read_text())
    assert manifest["model_version"] == EngineStore(default_store_path()).current() and len(manifest["files"]) == 672 + 8 * 38
    assert (default_data_path() / "NOTICE").read_text().count("CC BY 4.0") >= 1
    own = make_class_folders(tmp_path / "val", classes[:2], 3)
    src = labelled_sources(parse_config({"trainer": {"validation_data": str(own)}}), classes)
    assert (src.origin, len(src.val), len(src.train)) == ("configured+shipped", 6, 8 * 38)
    assert labelled_sources(parse_config({"trainer": {"shipped_data": False}}), classes).val == []
    # an engine with other classes finds none of the shipped photos usable
    assert labelled_sources(parse_config({}), ["Corn___healthy", "Wheat___rust"]).val == []


def test_cli_logging_options_go_before_or_after_the_subcommand():
    from trainer.cli import build_parser

    p = build_parser()
    assert p.parse_args(["--log-level", "debug", "status"]).log_level == "debug"
    assert p.parse_args(["status", "--log-level", "error", "--log-format", "json"]).log_level == "error"
    assert p.parse_args(["--log-format", "console", "serve"]).log_format == "console"
    assert p.parse_args(["retrain"]).log_level == "info"
    with pytest.raises(SystemExit):
        p.parse_args(["status", "--log-level", "loud"])


def test_calibrate_with_batchnorm_sets_the_exact_statistics_over_the_training_split(tmp_path, noisy_release):
    """`edge-trainer calibrate --batchnorm`: how the shipped model is brought up to exact BatchNorm statistics."""
    from trainer.batchnorm import recompute_batchnorm
    from trainer.publish import load_weights

    root, trained = noisy_release
    old = _copy_of(trained, tmp_path / "store").open()
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "calibrate", "--batchnorm", "--data", str(root), "--store", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == 0, out.stderr
    new = EngineStore(tmp_path / "store").open()
    split = old.manifest["training"]["split"]
    train = stratified_split(scan_folder(root).samples, {"test": split["test_fraction"], "val": split["val_fraction"]}, split["seed"])[
        "train"
    ]
    assert new.manifest["training"]["batchnorm"] == f"exact statistics over the {len(train)} training photos"
    expected = recompute_batchnorm(load_weights(old), TensorDataset(train).x)
    got = load_weights(new)
    for name, buf in expected.named_buffers():
        if name.endswith(("running_mean", "running_var")):
            torch.testing.assert_close(dict(got.named_buffers())[name], buf, rtol=1e-4, atol=1e-5)
    assert any(
        not torch.allclose(a, b)
        for (n, a), (_, b) in zip(load_weights(old).named_buffers(), got.named_buffers())
        if n.endswith("running_var")
    )  # they did change


def test_calibrate_publishes_a_calibrated_child_of_an_older_version(tmp_path, noisy_release):
    """`edge-trainer calibrate`: for versions published before calibration (e.g. the shipped one)."""
    from trainer.publish import load_weights, publish_model
    from trainer.train import recalibrate

    root, trained = noisy_release
    old = _copy_of(trained, tmp_path / "store").open()
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "calibrate", "--data", str(root), "--store", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == 0, out.stderr
    assert "published v0002 (from v0001)" in out.stdout and "temperature" in out.stdout
    new = EngineStore(tmp_path / "store").open()
    assert new.name == "v0002" and new.manifest["parent"] == "v0001"
    assert new.manifest["training"]["recalibrated_from"] == "v0001"
    assert new.manifest["training"]["split"] == old.manifest["training"]["split"]  # the held-out photos stay known
    assert set(new.manifest["artifacts"]) == {"onnx", "int8", "torch"}
    cal = new.manifest["metrics"]["calibration"]
    assert cal["photos"] == 21 and cal["nll_after"] <= cal["nll_before"]
    assert new.manifest["metrics"]["val"]["top1"] == old.manifest["metrics"]["val"]["top1"]  # same predictions
    x = TensorDataset(scan_folder(root).samples[:12]).x
    with torch.no_grad():
        before, after = load_weights(old)(x), load_weights(new)(x)
    rounding = 0.5e-4 / cal["temperature"]  # the manifest records the temperature to 4 decimals
    torch.testing.assert_close(after, before / cal["temperature"], rtol=1e-4 + rounding, atol=1e-5)

    other = make_class_folders(tmp_path / "other", ["X", "Y", "Z"], 10, size=(40, 40))
    with pytest.raises(DatasetError, match="class folders differ"):
        recalibrate(other, tmp_path / "store")
    bare = publish_model(load_weights(old), ["A", "B", "C"], tmp_path / "bare")  # no training split recorded
    with pytest.raises(DatasetError, match="no training split"):
        recalibrate(root, tmp_path / "bare", bare.name)
    few = make_class_folders(tmp_path / "few", ["A", "B", "C"], 10, size=(40, 40))
    with pytest.raises(DatasetError, match="held-out photos"):
        recalibrate(few, tmp_path / "store", "v0001")


def test_calibrate_with_batchnorm_composes_the_photos_of_a_field_trained_version(tmp_path, noisy_release):
    """A release trained on composed field-like batches keeps statistics of that distribution: recomputing them over
    its clean training photos would cost it 5 points (v1000), so ``--batchnorm`` composes them as it was trained."""
    from dataclasses import asdict

    from trainer.fieldaug import BN_PASSES, FieldAugSettings
    from trainer.publish import load_weights, publish_model
    from trainer.train import recalibrate

    root, trained = noisy_release
    old = _copy_of(trained, tmp_path / "store").open()
    training = {**old.manifest["training"], "augmentation": asdict(FieldAugSettings())}
    release = publish_model(load_weights(old), ["A", "B", "C"], tmp_path / "store", training=training, parent=old.name)
    field = recalibrate(root, tmp_path / "store", release.name, batchnorm=True)
    how = field.manifest["training"]["batchnorm"]
    assert how.startswith(f"exact over {BN_PASSES} composed passes of ") and "lab photos" in how
    plain = recalibrate(root, tmp_path / "store", old.name, batchnorm=True)
    assert plain.manifest["training"]["batchnorm"].startswith("exact statistics over the ")
    bn = [k for k in load_weights(field).state_dict() if k.endswith("running_mean")]
    assert any(not torch.equal(load_weights(field).state_dict()[k], load_weights(plain).state_dict()[k]) for k in bn)


def test_gate_refuses_a_candidate_below_the_first_version_even_if_close_to_the_current(monkeypatch):
    """Each generation a little worse than the last must not add up: the lineage's root is a floor too."""
    from types import SimpleNamespace

    import torch

    from trainer import gate as gate_mod
    from trainer.models import build_model

    root, current, candidate = build_model(3), build_model(3), build_model(3)
    scores = {id(root): 0.94, id(current): 0.93, id(candidate): 0.915}
    monkeypatch.setattr(gate_mod, "evaluate", lambda m, x, y: SimpleNamespace(top1=scores[id(m)], per_class=[scores[id(m)]] * 3))
    x, y = torch.zeros(9, 3, 128, 128), torch.tensor([0, 1, 2] * 3)
    assert gate_mod.gate(candidate, current, x, y, ["a", "b", "c"], tolerance=0.02).publish
    d = gate_mod.gate(candidate, current, x, y, ["a", "b", "c"], tolerance=0.02, root=root)
    assert not d.publish and "first version's 0.9400" in d.reason and d.metrics["root_top1"] == 0.94
    scores[id(candidate)] = 0.925
    assert gate_mod.gate(candidate, current, x, y, ["a", "b", "c"], tolerance=0.02, root=root).publish


def test_lab_drift_max_draws_the_line_below_the_first_version_from_the_first_retrain_on(monkeypatch):
    """[trainer] lab_drift_max: the line below the lineage's first version, tighter than gate_tolerance; on a
    lineage's first retrain (the first version in service) it is the line that binds."""
    from types import SimpleNamespace

    import torch

    from trainer import gate as gate_mod
    from trainer.models import build_model

    root, current, candidate = build_model(3), build_model(3), build_model(3)
    scores = {id(root): 0.94, id(current): 0.935, id(candidate): 0.925}
    monkeypatch.setattr(gate_mod, "evaluate", lambda m, x, y: SimpleNamespace(top1=scores[id(m)], per_class=[scores[id(m)]] * 3))
    x, y = torch.zeros(9, 3, 128, 128), torch.tensor([0, 1, 2] * 3)
    assert gate_mod.gate(candidate, current, x, y, ["a", "b", "c"], tolerance=0.02, root=root).publish
    d = gate_mod.gate(candidate, current, x, y, ["a", "b", "c"], tolerance=0.02, root=root, root_tolerance=0.01)
    assert not d.publish and d.reason == "top-1 0.9250 < first version's 0.9400 - 0.01" and d.metrics["root_tolerance"] == 0.01
    first = gate_mod.gate(candidate, root, x, y, ["a", "b", "c"], tolerance=0.02, root=root, root_tolerance=0.01)
    assert not first.publish and "first version's 0.9400 - 0.01" in first.reason  # the first retrain: root in service
    assert gate_mod.gate(candidate, root, x, y, ["a", "b", "c"], tolerance=0.02, root=root).publish
    assert "root_top1" not in gate_mod.gate(candidate, root, x, y, ["a", "b", "c"], tolerance=0.02, root=root).metrics


def test_the_gate_judges_the_first_version_on_the_validation_photos_themselves_not_a_copy(monkeypatch):
    """A boolean index copies the tensor (149 MB for 672 photos at 192 px): the retrain's peak memory was the gate's."""
    from types import SimpleNamespace

    import torch

    from trainer import gate as gate_mod
    from trainer.models import build_model

    root, current, candidate = build_model(3), build_model(3), build_model(3)
    seen = []

    def evaluate(m, x, y):
        seen.append((m, x))
        return SimpleNamespace(top1=0.9, per_class=[0.9] * 3)

    monkeypatch.setattr(gate_mod, "evaluate", evaluate)
    x, y = torch.zeros(9, 3, 128, 128), torch.tensor([0, 1, 2] * 3)
    assert gate_mod.gate(candidate, current, x, y, ["a", "b", "c"], tolerance=0.02, root=root).publish
    assert all(xs is x for _, xs in seen) and [m for m, _ in seen].count(candidate) == 1
    seen.clear()
    grown = build_model(4)  # a class the first version lacks: judged on the photos of its classes
    assert gate_mod.gate(grown, current, x, torch.tensor([0, 1, 3] * 3), ["a", "b", "c", "d"], tolerance=0.5, root=root).publish
    assert [len(xs) for m, xs in seen if m is root] == [6]


def test_an_evaluation_feeds_the_model_eight_photos_at_a_time_to_keep_a_retrains_peak_memory_down():
    import torch

    from trainer.models import build_model
    from trainer.train import evaluate

    model, sizes = build_model(3), []
    model.register_forward_pre_hook(lambda _m, args: sizes.append(len(args[0])))  # kept by the inference copy
    ev = evaluate(model, torch.zeros(19, 3, 64, 64), torch.tensor([0, 1, 2] * 6 + [0]))
    assert sizes == [8, 8, 3] and len(ev.per_class) == 3


def test_no_temperature_is_fitted_where_the_model_is_never_wrong():
    """On held-out photos it gets all right, minimising the NLL only sharpens the softmax (to T = 0.1): refused."""
    import torch

    from trainer.calibrate import calibrate
    from trainer.models import build_model

    torch.manual_seed(0)
    model = build_model(3).eval()
    x = torch.randn(30, 3, 128, 128)
    with torch.no_grad():
        y = model(x).argmax(1)  # the model's own answers: no mistakes
    before = model.head.weight.clone()
    cal = calibrate(model, x, y)
    assert cal.temperature == 1.0 and "0 mistakes on 30 held-out photos" in cal.skipped
    assert torch.equal(model.head.weight, before)
    y_wrong = y.clone()
    y_wrong[:5] = (y_wrong[:5] + 1) % 3  # five mistakes: fitted
    assert calibrate(model, x, y_wrong).skipped is None


def test_samples_a_stopped_publish_left_pending_are_settled_on_the_next_start(tmp_path, tiny_store):
    """Marked pending (with a tag the manifest records) before the publish: a trainer killed after the version became
    visible finds them used by it; killed before, finds them new again. Never the same samples in two versions."""
    import shutil

    from trainer.retrain import settle_published
    from trainer.samples import SampleStore

    shutil.copytree(tiny_store, tmp_path / "store")
    store = EngineStore(tmp_path / "store")
    samples = SampleStore(tmp_path / "trainer")
    ids = []
    for i in range(4):
        data = f"photo {i}".encode()
        ids.append(hashlib.sha256(data).hexdigest())
        samples.add({"id": ids[-1], "ext": ".jpg", "kind": "expert", "label": "A", "confidence": 1.0, "engine_version": "v0001"}, data)
    stored = samples.all()
    samples.mark_pending([s for s in stored if s.id in ids[:2]], "v0001-1")  # this publish went through before the kill
    samples.mark_pending([s for s in stored if s.id in ids[2:]], "v0001-2")  # this one did not
    v1 = store.open()
    manifest = {k: v for k, v in v1.manifest.items() if k not in ("version", "files", "created", "parent")}
    published = store.publish({n: v1.path / n for n in v1.manifest["files"]}, {**manifest, "training": {"sample_batch": "v0001-1"}})
    assert samples.counts()["new"] == 0  # pending samples are not new: nothing retrains them meanwhile
    assert settle_published(store, samples) == {"v0001-1": published.name, "v0001-2": None}
    gens = {s.id: s.generation for s in samples.all()}
    assert [gens[i] for i in ids] == [published.name, published.name, None, None]
    assert settle_published(store, samples) == {}  # settled once
