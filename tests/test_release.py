"""The release: one command trains, calibrates, builds INT8, signs and writes the store; upgrades install it once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engines.signing import TrustedKeys, load_or_create_key
from engines.store import EngineStore

from .conftest import REPO, make_class_folders

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer

NAMES = ["Tomato___healthy", "Pepper,_bell___healthy", "Orange___Haunglongbing_(Citrus_greening)"]
SIZE = 128  # the release's input side here (its default is 256): what is tested is the command, at a quarter of the pixels


def release(data: Path, out: Path, key: Path, work: Path, epochs: int = 1):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "release",
            "--data",
            str(data),
            "--key",
            str(key),
            "--out",
            str(out),
            "--work",
            str(work),
            "--epochs",
            str(epochs),
            "--size",
            str(SIZE),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("release")
    data = make_class_folders(root / "data", NAMES, 40)
    key = load_or_create_key(root / "keys" / "release.key")
    out = release(data, root / "store", key.path, root / "work")
    assert out.returncode == 0, out.stderr[-3000:]
    return root, data, key, out


def test_the_release_command_writes_a_signed_store_with_its_split_and_verdict(released):
    root, data, key, out = released
    store = EngineStore(root / "store")
    v = store.open(trust=TrustedKeys({key.public_hex: "release key"}))
    from trainer.release import RELEASE_VERSION, ReleaseSettings

    assert v.name == RELEASE_VERSION == "v4000" and v.signed_by == "release key" and store.versions() == ["v4000"]
    m = v.manifest
    assert m["model"]["arch"] == "efficientnet-lite0" and m["classes"] == sorted(NAMES) and m.get("parent") is None
    assert m["input"]["shape"] == [None, 3, SIZE, SIZE] and m["preprocess"]["mean"] == [127 / 255] * 3
    assert ReleaseSettings().size == 256 and m["training"]["settings"]["size"] == SIZE  # the size asked for, not the default
    assert m["training"]["pretrained"]["sha256"].startswith("57934424") and m["training"]["settings"]["freeze_batchnorm"]
    assert {"onnx", "int8", "torch", "split"} <= set(m["artifacts"]) and "verdict_agreement_with_fp32" in m["metrics"]["int8"]
    assert m["verdict"]["confident_distance"] <= m["verdict"]["unknown_distance"] and m["verdict"]["on"] == "features"
    import onnx

    assert [o.name for o in onnx.load(str(v.artifact("onnx"))).graph.output] == ["logits", "distance"]
    split = json.loads(v.artifact("split").read_text())
    assert sum(map(len, split.values())) == 120 and not set(split["test"]) & set(split["train"])
    assert "test top-1" in out.stdout and "s of training" in out.stdout


def test_a_release_run_resumes_from_its_checkpoint(released, tmp_path):
    root, data, key, _ = released
    ckpt = root / "work" / "checkpoint.pt"
    assert ckpt.is_file()
    work = tmp_path / "work"
    shutil.copytree(root / "work", work)
    out = release(data, tmp_path / "store", key.path, work, epochs=2)
    assert out.returncode == 0, out.stderr[-3000:]
    assert '"resumed"' in out.stderr or "resumed" in out.stderr
    assert "trained_ignored" in out.stderr  # the finished 1-epoch training is another recipe: not reused
    history = EngineStore(tmp_path / "store").open().manifest["training"]["history"]
    assert [h["epoch"] for h in history] == [1, 2]


def test_a_release_finishes_from_a_training_of_its_own_recipe_done_on_another_machine_without_training_again(released, tmp_path):
    """What a GPU machine trained (``--device cuda``, the same recipe) comes back as ``work/trained.pt``: the release
    here calibrates, builds and signs it, and trains nothing; where it ran and on how many threads do not matter."""
    import torch

    root, data, key, _ = released
    work = tmp_path / "work"
    work.mkdir()
    saved = torch.load(root / "work" / "trained.pt", map_location="cpu", weights_only=False)
    saved["settings"] |= {"device": "cuda", "threads": 16}
    saved["info"]["trained_on"] = "cuda"  # as train_release records a GPU run (a file from before it: the settings' device)
    torch.save(saved, work / "trained.pt")  # no checkpoint.pt: only the finished training came back
    out = release(data, tmp_path / "store", key.path, work)
    assert out.returncode == 0, out.stderr[-3000:]
    events = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    assert [e["trained_on"] for e in events if e["event"] == "training_reused"] == ["cuda"]
    assert not (work / "checkpoint.pt").exists()  # fit never ran
    mine = EngineStore(tmp_path / "store").open().manifest
    theirs = EngineStore(root / "store").open().manifest
    assert mine["training"]["history"] == theirs["training"]["history"]
    assert mine["metrics"]["test"]["top1"] == theirs["metrics"]["test"]["top1"]
    assert mine["training"]["trained_on"] == "cuda" and theirs["training"]["trained_on"] == "cpu"  # the manifest says where


@pytest.mark.one_core  # trains nothing: beside the other tests (tests/conftest.py)
def test_a_release_asked_to_train_on_a_gpu_torch_does_not_see_stops_before_decoding_a_photo(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    data = make_class_folders(tmp_path / "data", NAMES, 4)
    key = load_or_create_key(tmp_path / "release.key")
    cmd = [sys.executable, "-m", "trainer", "release", "--data", str(data), "--key", str(key.path), "--out", str(tmp_path / "store")]
    out = subprocess.run([*cmd, "--work", str(tmp_path / "work"), "--device", "cuda"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "device 'cuda': torch" in out.stderr and "sees no CUDA GPU on this machine" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "work").exists() and not (tmp_path / "store").exists()
    bad = subprocess.run([*cmd, "--work", str(tmp_path / "work"), "--device", "tpu"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "device 'tpu': not a torch device" in bad.stderr


@pytest.mark.one_core  # trains nothing: beside the other tests (tests/conftest.py)
def test_a_release_without_the_key_file_stops_before_training_a_thing(tmp_path):
    data = make_class_folders(tmp_path / "data", NAMES, 12)
    out = release(data, tmp_path / "store", tmp_path / "nowhere.key", tmp_path / "work")
    assert out.returncode == 2 and f"edge-trainer: {tmp_path / 'nowhere.key'}: no release key there" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and '"photos_loaded"' not in out.stderr and '"epoch"' not in out.stderr  # not one photo
    assert not (tmp_path / "work").exists()  # no checkpoint either
    assert not (tmp_path / "store").exists() and not (tmp_path / "nowhere.key").exists()


def test_recorded_split_reads_the_split_file_and_names_a_missing_photo(released, tmp_path):
    from trainer.data import DatasetError, recorded_split

    root, data, _, _ = released
    v = EngineStore(root / "store").open()
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    (copy / "Tomato___healthy" / "extra.jpg").write_bytes((copy / "Tomato___healthy" / "img_000.jpg").read_bytes())  # the folder grew
    parts = recorded_split(v, copy)
    assert sorted(map(len, parts.values())) == sorted(map(len, json.loads(v.artifact("split").read_text()).values()))
    assert all(v.classes[s.label] == s.path.parent.name for s in parts["test"])
    gone = copy / json.loads(v.artifact("split").read_text())["test"][0]
    gone.unlink()
    with pytest.raises(DatasetError, match=f"{gone.name}: listed in v4000's split.json but not found"):
        recorded_split(v, copy)


# ---- upgrading a state directory made with an earlier release ------------------------------------------


def _store_with(path: Path, versions: list[str], key) -> EngineStore:
    """A store holding copies of the tiny model under ``versions``, each signed."""
    import numpy as np
    import torch

    from trainer.models import build_model
    from trainer.publish import publish_model

    torch.manual_seed(0)
    x = np.zeros((2, 3, 128, 128), np.float32)
    for v in versions:
        publish_model(build_model(3).eval(), NAMES, path, held_out=(x, np.array([0, 1])), signing_key=key, version=v)
    return EngineStore(path)


@pytest.mark.one_core  # trains nothing: beside the other tests (tests/conftest.py)
def test_an_upgrade_installs_the_shipped_release_once_and_keeps_the_devices_own_versions(tmp_path, signing_key):
    """A device serving a bare release moves to the new one; one serving its own retrain keeps it, and the new
    release waits beside it (``release-pending``) for the trainer's field check."""
    pytest.importorskip("torch")
    from edge_agent.upgrade import adopt_shipped_release, pending_release

    shipped = _store_with(tmp_path / "shipped", ["v1000"], signing_key)
    bare = _store_with(tmp_path / "bare" / "engines", ["v0001"], signing_key)
    assert adopt_shipped_release(bare, shipped.root) == "v1000" and bare.current() == "v1000" and pending_release(bare) is None
    device = _store_with(tmp_path / "state" / "engines", ["v0001", "v0002"], signing_key)
    assert device.current() == "v0002" and device.read_manifest("v0002")["parent"] == "v0001"  # the farm's own retrain
    assert adopt_shipped_release(device, shipped.root) == "v1000"
    assert device.versions() == ["v0001", "v0002", "v1000"] and device.current() == "v0002"
    assert pending_release(device) == "v1000"
    device.open("v1000", trust=TrustedKeys({signing_key.public_hex: "k"}))  # the signature survives the copy
    assert adopt_shipped_release(device, shipped.root) is None and device.current() == "v0002"  # once
    device.set_current("v1000")
    _store_with(device.root, [None], signing_key)  # a retrain of the release follows it
    assert device.versions()[-1] == "v1001"


@pytest.mark.one_core  # trains nothing: beside the other tests (tests/conftest.py)
def test_publishing_under_a_name_older_than_the_store_is_refused(tmp_path, signing_key):
    pytest.importorskip("torch")
    from engines.store import StoreError

    store = _store_with(tmp_path / "s", ["v0005"], signing_key)
    with pytest.raises(StoreError, match="next version is v0006"):
        _store_with(store.root, ["v0003"], signing_key)


@pytest.mark.one_core  # trains nothing: beside the other tests (tests/conftest.py)
def test_after_an_upgrade_the_rehearsal_memory_is_relabelled_by_class_name_and_other_state_set_aside(tmp_path, signing_key):
    torch = pytest.importorskip("torch")
    from edge_agent.log import get_logger
    from trainer.lineage import adopt_strategy_state

    old = _store_with(tmp_path / "engines", ["v0001", "v0002"], signing_key)  # the device's own lineage: NAMES
    strategy = tmp_path / "strategy"
    (strategy / "rehearsal").mkdir(parents=True)
    (strategy / "ewc").mkdir()
    (strategy / "ewc" / "ewc.pt").write_bytes(b"old parameters")
    torch.save({"x": torch.zeros(3, 3, 8, 8), "y": torch.tensor([0, 1, 2])}, strategy / "rehearsal" / "memory.pt")
    shipped = _store_with(tmp_path / "shipped", ["v1000"], signing_key)
    from edge_agent.upgrade import adopt_shipped_release

    adopt_shipped_release(old, shipped.root)
    new_classes = ["Apple___healthy", *sorted(NAMES)[:2]]  # a release whose classes differ: one dropped, one new, reordered
    done = adopt_strategy_state(old, "v1000", new_classes, strategy, get_logger("test"))
    assert done is not None and "2 rehearsal photos relabelled by class name, 1 dropped" in done
    memory = torch.load(strategy / "rehearsal" / "memory.pt", weights_only=True)
    names = [NAMES[i] for i in (0, 1, 2)]
    assert [new_classes[int(i)] for i in memory["y"]] == [n for n in names if n in new_classes]
    assert (strategy / "ewc.before-v0001" / "ewc.pt").read_bytes() == b"old parameters" and not (strategy / "ewc").exists()
    assert adopt_strategy_state(old, "v1000", new_classes, strategy, get_logger("test")) is None  # once


def test_a_release_trained_without_field_augmentation_records_so_and_its_retrains_do_not_compose(tmp_path):
    """The lab recipe (the ablation's reference): ``augmentation`` None trains on the clean photos, the manifest says
    so, and BatchNorm statistics for its descendants come from the photos they train on."""
    torch = pytest.importorskip("torch")
    from trainer.batchnorm import batchnorm_photos
    from trainer.release import ReleaseSettings, finish_release, train_release

    data = make_class_folders(tmp_path / "data", NAMES, 40)
    settings = ReleaseSettings(epochs=1, swa_epochs=0, batch_size=16, threads=2, freeze_batchnorm=False, size=SIZE)
    model, info, folder, photos = train_release(data, tmp_path / "work", settings, progress=False, augmentation=None)
    assert info["augmentation"] is None and info["bn_x"].shape[0] == len(photos["train"].samples)
    version = finish_release(model, info, folder, photos, tmp_path / "store", None, settings)
    training = version.manifest["training"]
    assert training["augmentation"] is None and training["batchnorm"].startswith("exact over the ")
    assert batchnorm_photos(training, photos["train"].samples, torch.zeros(0, 3, 128, 128), 0)[0] is None


def _lite_store(path: Path, version: str, key, classes: list[str]) -> EngineStore:
    """A store whose only version is a small EfficientNet-Lite0 (64 px, Lite's normalisation): another input."""
    import numpy as np
    import torch

    from trainer.models import build_model, data_config
    from trainer.publish import publish_model

    torch.manual_seed(1)
    x = np.zeros((2, 3, 64, 64), np.float32)
    spec = data_config("efficientnet-lite0", 64)
    publish_model(
        build_model(len(classes), "efficientnet-lite0").eval(),
        classes,
        path,
        spec=spec,
        held_out=(x, np.array([0, 1])),
        signing_key=key,
        version=version,
    )
    return EngineStore(path)


def test_a_v1000_state_directory_upgraded_keeps_its_samples_and_the_field_check_decides_what_serves(tmp_path, signing_key):
    """The farm's v1001 (LeafNet, 128 px) serves; an upgrade brings v2000 (EfficientNet-Lite0, 64 px). The next retrain
    starts from v2000 on every sample the farm has, compares v2000 with v1001 on the field check (each given the
    photos through its own preprocessing) and publishes a version of the new lineage only where it is no worse than
    the one serving; the expert's labels stay, the old rehearsal tensors are set aside."""
    torch = pytest.importorskip("torch")
    import hashlib

    from edge_agent.config import parse_config
    from edge_agent.upgrade import adopt_shipped_release, pending_release
    from trainer.retrain import retrain
    from trainer.samples import SampleStore

    from .conftest import encode, leaf_image

    device = _store_with(tmp_path / "state" / "engines", ["v1000", "v1001"], signing_key)
    shipped = _lite_store(tmp_path / "shipped", "v2000", signing_key, NAMES)
    strategy = tmp_path / "state" / "trainer" / "strategy"
    (strategy / "rehearsal").mkdir(parents=True)
    torch.save({"x": torch.zeros(3, 3, 128, 128), "y": torch.tensor([0, 1, 2])}, strategy / "rehearsal" / "memory.pt")
    (strategy / "lineage.json").write_text(json.dumps({"root": "v1000", "classes": NAMES}))
    samples = SampleStore(tmp_path / "state" / "trainer")
    for i in range(24):  # the farm's expert labels, as photos
        data = encode(leaf_image(i, hue=40 * (i % 3)))
        samples.add(
            {
                "id": hashlib.sha256(data).hexdigest(),
                "kind": "expert",
                "label": NAMES[i % 3],
                "confidence": 1.0,
                "engine_version": "v1001",
                "ext": ".jpg",
            },
            data,
        )
    labelled = make_class_folders(tmp_path / "labelled", NAMES, 12)
    cfg = parse_config(
        {
            "store": {"path": str(device.root), "require_signature": False},
            "trainer": {
                "labelled_data": str(labelled),
                "epochs": 1,
                "int8": False,
                "field_check_every": 2,
                "field_check_min": 6,
                "nice": 0,
            },
        }
    )

    assert adopt_shipped_release(device, shipped.root) == "v2000" and device.current() == "v1001"
    assert pending_release(device) == "v2000"
    announced = []
    result = retrain(cfg, device, samples, strategy, announce=announced.append, signing_key=signing_key)

    assert samples.counts()["expert"] == 24  # nothing the expert said is lost
    assert (strategy / "rehearsal.before-v1000" / "memory.pt").exists()  # 128 px tensors mean nothing to a 64 px model
    serving = device.current()
    if result.published:  # a version of the new lineage serves only where it was no worse than v1001 on the field
        assert device.read_manifest(result.published)["parent"] == "v2000" and serving == result.published
        assert pending_release(device) is None
        if announced[0] == "v2000":  # the bare release served first (no worse than v1001), then its retrain followed
            assert announced == ["v2000", result.published]
        else:  # v1001 served until the candidate beat it
            check = result.metrics["gate"]["against_serving"]
            assert check["version"] == "v1001" and check["field_photos"] >= 6 and check["publish"]
    elif serving == "v2000":  # the bare release was no worse than v1001 on the field check: it serves meanwhile
        assert pending_release(device) is None and announced[0] == "v2000"
    else:  # v1001 was better: it keeps serving, the release keeps waiting, and the next samples try again
        assert serving == "v1001" and pending_release(device) == "v2000" and "v1001" in result.reason
    samples.close()


@pytest.mark.one_core  # trains nothing: beside the other tests (tests/conftest.py)
def test_against_serving_gives_each_model_the_photos_through_its_own_preprocessing_and_classes(tmp_path):
    """A model that answers by the input's side and mean: the version in service sees its 128 px ImageNet-normalised
    tensors and its own class order, the candidate its 64 px Lite tensors."""
    torch = pytest.importorskip("torch")
    import types

    from edge_agent.preprocess import PreprocessSpec
    from trainer.loop.release_adoption import against_serving
    from trainer.samples import Sample
    from trainer.strategies.base import Generation

    from .conftest import encode, leaf_image

    class BySide(torch.nn.Module):
        def __init__(self, side: int, answer: int, k: int = 3):
            super().__init__()
            self.side, self.answer, self.num_classes = side, answer, k

        def forward(self, x):
            assert x.shape[-1] == self.side, f"given {x.shape[-1]} px, takes {self.side}"
            out = torch.zeros(len(x), self.num_classes)
            out[:, self.answer] = 1
            return out

    photos = []
    for i in range(8):
        f = tmp_path / f"{i}.jpg"
        f.write_bytes(encode(leaf_image(i)))
        photos.append(Sample(str(i), "expert", NAMES[0], 1.0, "v1001", str(f), float(i), None))
    serving_classes = [NAMES[2], NAMES[0], NAMES[1]]  # its own order: NAMES[0] is its index 1
    serving = types.SimpleNamespace(name="v1001", classes=serving_classes, manifest={"preprocess": PreprocessSpec().to_manifest()})
    field = Generation(torch.zeros(8, 3, 64, 64), torch.zeros(8, dtype=torch.long), sample_ids=[str(i) for i in range(8)])
    right = against_serving(serving, BySide(128, 1), BySide(64, 0), field, photos, 8, 2, 6)
    assert right.publish and right.metrics["field_current_top1"] == 1.0 and right.metrics["field_candidate_top1"] == 1.0
    worse = against_serving(serving, BySide(128, 1), BySide(64, 2), field, photos, 8, 2, 6)
    assert not worse.publish and worse.reason.startswith("against v1001 in service: field check: top-1 0.0000 < current 1.0000")
