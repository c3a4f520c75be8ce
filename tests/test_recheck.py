"""Pseudo-labels scored again by the engine in service before a retrain (trainer/recheck.py and its wiring)."""

from __future__ import annotations

import json
import shutil
import time

import pytest

torch = pytest.importorskip("torch", reason="the trainer needs the 'train' extra")

from trainer.recheck import Recheck, recheck  # noqa: E402

from .conftest import encode, leaf_image, make_class_folders  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


class Corner(torch.nn.Module):
    """Sure of class 0 when the top-left pixel is bright, of class 1 otherwise: it sees which way up a photo is."""

    def forward(self, x):
        bright = (x[:, 0, 0, 0] > 0).float()
        return torch.stack([bright, 1 - bright], 1) * 20


def _open_gate(tmp_path, per_class: int = 4) -> dict:
    """[trainer] for a one-epoch retrain whose gate lets anything through: what is tested is what comes before it."""
    return {
        "labelled_data": str(make_class_folders(tmp_path / "labelled", CLASSES, per_class)),
        "epochs": 1,
        "int8": False,
        "gate_tolerance": 1.0,
        "gate_max_class_drop": 1.0,
        "field_check_every": 0,
        "calibrate": False,
    }


def test_a_label_must_hold_in_every_mirror_image():
    x = torch.full((3, 3, 128, 128), -1.0)
    x[0] = 1.0  # bright everywhere: class 0 whichever way up
    x[1, :, 0, 0] = 1.0  # only the top-left corner: class 0 as it is, class 1 once flipped
    # x[2] dark everywhere: class 1 in every view
    r = recheck(Corner(), x, tau=0.9, batch=2)  # two batches
    assert r.labels.tolist() == [0, 0, 1]
    assert r.keep.tolist() == [True, False, True]
    assert r.confidence[1] < 1e-6 and r.confidence[0] > 0.99
    assert r.summary(torch.tensor([1, 0, 1])) == {"checked": 3, "kept": 2, "relabelled": 1, "held_back": 1}
    assert recheck(Corner(), x, tau=1.01).keep.sum() == 0  # nothing is ever that sure
    assert len(recheck(Corner(), x[:0], tau=0.9).labels) == 0


CLASSES = ["Tomato___healthy", "Pepper,_bell___healthy", "Orange___Haunglongbing_(Citrus_greening)"]


@pytest.mark.parametrize("enabled", [True, False])
def test_retrain_trains_on_the_teachers_labels_and_holds_back_the_rest(tiny_store, tmp_path, monkeypatch, enabled):
    from edge_agent.config import parse_config
    from engines.store import EngineStore
    from trainer import retrain as service
    from trainer.samples import SampleStore

    store = EngineStore(shutil.copytree(tiny_store, tmp_path / "store"))
    samples = SampleStore(tmp_path / "trainer")
    received = [CLASSES[0], CLASSES[0], CLASSES[2], CLASSES[1]]  # what the daemon said
    ids = []
    for i, label in enumerate(received):
        data = encode(leaf_image(500 + i))
        ids.append(f"{i:064x}")
        samples.add({"id": ids[-1], "kind": "pseudo", "label": label, "confidence": 0.95, "engine_version": "v0001", "ext": ".jpg"}, data)
        time.sleep(0.01)  # distinct arrival times: the order the trainer reads them in
    teacher = Recheck(torch.tensor([1, 0, 2, 1]), torch.tensor([0.95, 0.5, 0.99, 0.97]), torch.tensor([True, False, True, True]))
    seen = []
    monkeypatch.setattr(service, "recheck", lambda model, x, tau, should_stop=None: seen.append((len(x), tau)) or teacher)
    cfg = parse_config({"labels": {"pseudo_threshold": 0.9}, "trainer": {**_open_gate(tmp_path), "recheck_pseudo": enabled}})
    result = service.retrain(cfg, store, samples, tmp_path / "strategy")
    assert result.published
    trained = json.loads(samples.get_state("last_retrain_pseudo"))
    manifest = store.read_manifest(result.published)["training"]
    if enabled:
        assert seen == [(4, 0.9)]
        assert trained == {ids[0]: CLASSES[1], ids[2]: CLASSES[2], ids[3]: CLASSES[1]}  # relabelled, held back, kept, kept
        assert manifest["pseudo_recheck"] == result.metrics["pseudo_recheck"] == {"checked": 4, "kept": 3, "relabelled": 1, "held_back": 1}
        assert manifest["samples"]["pseudo"] == 3
    else:
        assert seen == []
        assert trained == dict(zip(ids, received))
        assert manifest["pseudo_recheck"] is None and manifest["samples"]["pseudo"] == 4
    assert samples.counts()["new"] == 0  # held back or not, every sample was considered by this generation
    samples.close()


def test_a_retrain_trains_on_the_newest_pseudo_labels_of_each_class_and_deletes_the_older(tiny_store, tmp_path):
    from edge_agent.config import parse_config
    from engines.store import EngineStore
    from trainer import retrain as service
    from trainer.samples import SampleStore

    store = EngineStore(shutil.copytree(tiny_store, tmp_path / "store"))
    samples = SampleStore(tmp_path / "trainer")
    received = [CLASSES[0], CLASSES[0], CLASSES[2], CLASSES[1]]
    ids = []
    for i, label in enumerate(received):
        ids.append(f"{i:064x}")
        sample = {"id": ids[-1], "kind": "pseudo", "label": label, "confidence": 0.95, "engine_version": "v0001", "ext": ".jpg"}
        samples.add(sample, encode(leaf_image(500 + i)))
        time.sleep(0.01)
    cfg = parse_config({"trainer": {**_open_gate(tmp_path), "recheck_pseudo": False, "pseudo_per_class": 1}})
    service.retrain(cfg, store, samples, tmp_path / "strategy")
    assert json.loads(samples.get_state("last_retrain_pseudo")) == dict(zip(ids[1:], received[1:]))  # the older of two went
    assert {s.id for s in samples.all()} == set(ids[1:]) and samples.get_state("pseudo_deleted") == "1"
    samples.close()


@pytest.mark.parametrize("expert", [False, True])
def test_a_retrain_on_pseudo_labels_alone_takes_the_cautious_step(tiny_store, tmp_path, monkeypatch, expert):
    """Pseudo-labels alone carry little (the measured bound): pseudo_only_lr and a step among pseudo_only_steps; with
    an expert's label among the samples, the full step of lr and interpolate."""
    from edge_agent.config import parse_config
    from engines.store import EngineStore
    from trainer import retrain as service
    from trainer.samples import SampleStore

    store = EngineStore(shutil.copytree(tiny_store, tmp_path / "store"))
    samples = SampleStore(tmp_path / "trainer")
    for i in range(4):
        kind = "expert" if expert and i == 0 else "pseudo"
        samples.add(
            {"id": f"{i:064x}", "kind": kind, "label": CLASSES[i % 3], "confidence": 0.95, "engine_version": "v0001", "ext": ".jpg"},
            encode(leaf_image(700 + i)),
        )
    used = []
    real = service.train_generation
    monkeypatch.setattr(
        service,
        "train_generation",
        lambda prev, data, strategy, settings, lr, interpolate, **kw: (
            used.append((lr, interpolate)) or real(prev, data, strategy, settings, lr, interpolate, **kw)
        ),
    )
    cfg = parse_config(
        {
            "trainer": {
                **_open_gate(tmp_path),
                "recheck_pseudo": False,
                "lr": 3e-3,
                "interpolate": 0.9,
                "pseudo_only_lr": 4e-4,
                "pseudo_only_steps": [0.4],
            }
        }
    )
    result = service.retrain(cfg, store, samples, tmp_path / "strategy")
    assert result.published
    if expert:
        assert used[0] == (3e-3, 0.9) and "step" not in result.metrics
    else:  # trained all the way, then the step chosen among pseudo_only_steps (here only one)
        assert used[0] == (4e-4, 1.0) and result.metrics["step"]["step"] == 0.4
    samples.close()
