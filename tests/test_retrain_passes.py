"""How often a retrain runs a model over its gate photos and true labels: its candidate once after training, the
stored versions it is gated against once per version and set of gate photos (kept, :mod:`trainer.loop.gate_logits`)."""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the trainer needs the 'train' extra")

from .conftest import encode, leaf_image  # noqa: E402
from .test_recheck import _open_gate  # noqa: E402
from .test_verdict_on_features import CLASSES, make_features_store  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


class _Counted:
    """Rows each retrain phase runs through any LeafNet outside training (``seen[phase]``)."""

    def __init__(self, monkeypatch) -> None:
        from trainer.models import LeafNet

        self.seen, self.phase, self.trainer = Counter(), "start", {}
        features = LeafNet.features

        def counted(net, x):
            if not torch.is_grad_enabled():  # inference, not a training step
                self.seen[self.phase] += len(x)
            return features(net, x)

        monkeypatch.setattr(LeafNet, "features", counted)

    def progress(self, phase: str, **_) -> None:
        self.phase = phase


def _add_expert_labels(samples, n: int, start: int) -> None:
    for i in range(n):
        samples.add(
            {
                "id": f"{start + i:064x}",
                "kind": "expert",
                "label": CLASSES[i % 3],
                "confidence": 1.0,
                "engine_version": "v0001",
                "ext": ".jpg",
            },
            encode(leaf_image(start + i, hue=40 * (i % 3))),
        )


def _retrain(store, samples, tmp_path, counted: _Counted):
    from edge_agent.config import parse_config
    from trainer.retrain import retrain

    trainer = {**counted.trainer, "calibrate": True}
    cfg = parse_config({"store": {"path": str(store.root), "require_signature": False}, "trainer": trainer})
    counted.seen.clear()
    result = retrain(cfg, store, samples, tmp_path / "strategy", progress=counted.progress)
    assert result.published, result.reason
    return result


@pytest.fixture(scope="module")
def features_store(tmp_path_factory, signing_key):
    return make_features_store(tmp_path_factory.mktemp("features-store"), signing_key)


@pytest.fixture
def loop(features_store, tmp_path, monkeypatch):
    from engines.store import EngineStore
    from trainer.samples import SampleStore

    store = EngineStore(shutil.copytree(features_store[0], tmp_path / "store"))
    samples = SampleStore(tmp_path / "trainer")
    counted = _Counted(monkeypatch)
    counted.trainer = _open_gate(tmp_path, per_class=25)  # 25 a class: enough validation photos for a verdict
    yield store, samples, counted
    samples.close()


def test_a_retrain_runs_its_candidate_over_each_gate_photo_and_true_label_once_and_a_stored_version_never_again(loop, tmp_path):
    """After training, the gate, the calibration, the verdict and the rehearsal memory share the candidate's features;
    the version in service's logits on the gate photos are kept (its own retrain had them). On the 672 shipped gate
    photos each pass cost about 30 s on a 2-core CPU."""
    from trainer.loop.gate_logits import FOLDER

    store, samples, counted = loop
    _add_expert_labels(samples, 12, 900)
    first = _retrain(store, samples, tmp_path, counted)
    val = first.metrics["gate"]["validation_photos"]
    assert first.metrics["calibration"]["photos"] == val >= 10
    truth = first.metrics["samples"]["labelled"] + first.metrics["samples"]["expert"]  # no memory yet: a first retrain
    assert counted.seen["gate"] == 2 * val, counted.seen  # the candidate once, v0001 once (and kept)
    assert counted.seen["calibrating"] == truth, counted.seen  # the verdict's class statistics; the temperature reuses the gate's logits
    assert counted.seen["keeping the strategy's memory"] == 0, counted.seen  # the memory chooses by the verdict's features
    kept = sorted(p.name.split("-")[0] for p in (samples.root / FOLDER).glob("*.npy"))
    assert kept == ["v0001", "v0002"]  # and the published candidate's, which the retrain had
    _add_expert_labels(samples, 12, 950)
    second = _retrain(store, samples, tmp_path, counted)
    assert second.published == "v0003" and counted.seen["gate"] == val, counted.seen  # v0002 and v0001 (its root) read
    assert second.metrics["gate"]["current_top1"] == first.metrics["gate"]["candidate_top1"]  # v0002 on the same photos
    assert second.metrics["gate"]["root_top1"] == first.metrics["gate"]["current_top1"]  # v0001
    assert sorted(p.name.split("-")[0] for p in (samples.root / FOLDER).glob("*.npy")) == ["v0001", "v0002", "v0003"]


@pytest.mark.parametrize("damage", ["torn", "foreign shape", "foreign type"])
def test_kept_logits_that_cannot_be_read_are_computed_again_and_replaced(tmp_path, damage):
    from engines.store import EngineStore
    from trainer.loop.gate_logits import GateLogits, photos_digest
    from trainer.models import build_model, logits_on
    from trainer.publish import publish_model

    torch.manual_seed(0)
    model = build_model(3).eval()
    version = publish_model(model, CLASSES, tmp_path / "store", version="v0001")
    x = torch.randn(6, 3, 128, 128).half()
    kept = GateLogits(tmp_path / "trainer", photos_digest(x))
    want = kept.of(version, model, x)
    torch.testing.assert_close(want, logits_on(model, x))
    (path,) = (tmp_path / "trainer" / "gate-logits").glob("*.npy")
    if damage == "torn":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "foreign shape":
        np.save(path, np.zeros((7, 3), np.float32))
    else:
        np.save(path, np.zeros((6, 3), np.float64))
    again = GateLogits(tmp_path / "trainer", photos_digest(x)).of(EngineStore(tmp_path / "store").open(), model, x)
    torch.testing.assert_close(again, want)
    assert np.load(path).shape == (6, 3) and np.load(path).dtype == np.float32  # replaced by what was computed
    assert torch.equal(GateLogits(tmp_path / "trainer", photos_digest(x)).of(version, _Refuses(), x), again)  # read, not run


class _Refuses(torch.nn.Module):
    num_classes = 3

    def forward(self, x):
        raise AssertionError("the kept logits were not read")


def test_the_gate_photos_digest_changes_with_any_value_and_the_folder_keeps_only_what_a_retrain_used(tmp_path):
    from trainer.loop.gate_logits import GateLogits, photos_digest

    x = torch.zeros(5, 3, 8, 8, dtype=torch.uint8)
    y = x.clone()
    assert photos_digest(x) == photos_digest(y)
    y[4, 2, 7, 7] = 1
    assert photos_digest(x) != photos_digest(y)
    assert photos_digest(x) != photos_digest(x.half()) and photos_digest(x) != photos_digest(x[:4])
    stale = tmp_path / "gate-logits" / "v0001-0000-ffff.npy"
    stale.parent.mkdir()
    np.save(stale, np.zeros((5, 3), np.float32))
    GateLogits(tmp_path, photos_digest(x)).prune()
    assert not stale.exists()


def test_logits_shipped_with_the_package_are_read_only_for_the_version_and_photos_they_name(tmp_path, caplog):
    """A new device's first retrain reads the shipped version's logits from the package (``default_data/gate-logits``)
    and keeps them; shipped logits of other photos are not used, and a torn shipped file is computed past."""
    from trainer.loop.gate_logits import GateLogits, file_name, photos_digest
    from trainer.models import build_model, logits_on
    from trainer.publish import publish_model

    torch.manual_seed(0)
    model = build_model(3).eval()
    version = publish_model(model, CLASSES, tmp_path / "store", version="v0001")
    x, other = torch.randn(6, 3, 128, 128).half(), torch.randn(6, 3, 128, 128).half()
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    want = logits_on(model, x)
    np.save(shipped / file_name(version, photos_digest(x)), want.numpy())
    np.save(shipped / file_name(version, photos_digest(other)), np.zeros((6, 3), np.float32) + 7)
    got = GateLogits(tmp_path / "a", photos_digest(x), shipped=shipped).of(version, _Refuses(), x)
    assert torch.equal(got, want) and (tmp_path / "a" / "gate-logits" / file_name(version, photos_digest(x))).is_file()
    torch.testing.assert_close(GateLogits(tmp_path / "b", photos_digest(x), shipped=tmp_path / "none").of(version, model, x), want)
    other_logits = GateLogits(tmp_path / "c", photos_digest(other), shipped=shipped).of(version, model, other)
    assert torch.equal(other_logits, torch.full((6, 3), 7.0))  # its own file: the name is the photos' digest
    (shipped / file_name(version, photos_digest(x))).write_bytes(b"\x93NUMPY torn")
    torch.testing.assert_close(GateLogits(tmp_path / "d", photos_digest(x), shipped=shipped).of(version, model, x), want)
