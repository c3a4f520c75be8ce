"""Whose answers a retrain's distillation keeps: the version it starts from, or with ``[trainer] distill_from =
"root"`` the lineage's first version's (the shipped model's lab answers); the manifest says which."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the 'train' extra (torch) is not installed")

from .test_continual import settings, toy  # noqa: E402
from .test_recheck import _open_gate  # noqa: E402
from .test_unlabelled_term import farm  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


def _gap(model, teacher, x) -> float:
    """Mean KL divergence of ``model``'s answers from ``teacher``'s on ``x``."""
    with torch.no_grad():
        p = torch.log_softmax(model.eval()(x), 1)
        q = torch.softmax(teacher.eval()(x), 1)
    return float(torch.nn.functional.kl_div(p, q, reduction="batchmean"))


def test_a_candidate_is_distilled_towards_the_teacher_it_is_given_not_the_version_it_starts_from(tmp_path):
    from trainer.continual import train_generation
    from trainer.models import build_model
    from trainer.strategies.base import get_strategy

    torch.manual_seed(0)
    start = build_model(3)
    other = build_model(3)
    with torch.no_grad():  # a teacher with answers of its own: sure of the third class whatever the photo
        other.head.bias.copy_(torch.tensor([0.0, 0.0, 3.0]))
    data = toy()
    cfg = settings(epochs=3, distill=20.0, distill_photos="all")
    own, _ = train_generation(start, data, get_strategy("finetune")(tmp_path / "a"), cfg, 5e-3)
    taught, _ = train_generation(start, data, get_strategy("finetune")(tmp_path / "b"), cfg, 5e-3, teacher=other)
    assert _gap(taught, other, data.x) < 0.5 * _gap(own, other, data.x)
    assert _gap(own, start, data.x) < _gap(taught, start, data.x)


@pytest.mark.parametrize("distill_from", ["start", "root"])
def test_a_second_retrain_is_distilled_towards_the_engine_in_service_or_the_lineages_first_version(
    tiny_store, tmp_path, monkeypatch, distill_from
):
    from edge_agent.config import parse_config
    from trainer import retrain as retrain_mod
    from trainer.field_check import FieldDecision
    from trainer.publish import load_weights

    store, samples = farm(tiny_store, tmp_path)
    root = store.current()
    cfg = parse_config(
        {"trainer": {**_open_gate(tmp_path), "field_check_every": 4, "unlabelled_term": False, "distill_from": distill_from}}
    )
    first = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")
    assert first.published and store.open(first.published).manifest["training"]["distilled_towards"] == root
    real_train, seen = retrain_mod.train_generation, []
    monkeypatch.setattr(
        retrain_mod,
        "train_generation",
        lambda start, *a, **k: seen.append((start.state_dict(), k["teacher"].state_dict())) or real_train(start, *a, **k),
    )
    monkeypatch.setattr(retrain_mod, "field_gate", lambda *a: FieldDecision(True, "the tiny model's field check is not what is tested"))
    second = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")

    served = load_weights(store.open(first.published)).state_dict()
    shipped = load_weights(store.open(root)).state_dict()
    weight = next(k for k, v in served.items() if v.is_floating_point() and not torch.equal(v, shipped[k]))  # one the first retrain moved
    started, teacher = seen[0]
    assert torch.equal(started[weight], served[weight])  # either way it starts from the one in service
    assert torch.equal(teacher[weight], (shipped if distill_from == "root" else served)[weight])
    manifest = store.open(second.published).manifest["training"]
    assert manifest["distilled_towards"] == (root if distill_from == "root" else first.published)
    assert manifest["settings"]["distill_from"] == distill_from
    samples.close()


@pytest.mark.parametrize("method", ["self_training", "consistency"])
def test_a_second_retrains_unlabelled_candidate_is_distilled_towards_the_lineages_first_version_too(
    tiny_store, tmp_path, monkeypatch, method
):
    from edge_agent.config import parse_config
    from trainer import retrain as retrain_mod
    from trainer.field_check import FieldDecision
    from trainer.loop import second_candidate
    from trainer.publish import load_weights

    store, samples = farm(tiny_store, tmp_path)
    root = store.current()
    trainer = {**_open_gate(tmp_path), "field_check_every": 4, "unlabelled_field_min": 8, "distill_from": "root"}
    cfg = parse_config({"trainer": {**trainer, "unlabelled_method": method}})
    monkeypatch.setattr(retrain_mod, "field_gate", lambda *a: FieldDecision(True, "the tiny model's field check is not what is tested"))
    first = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")
    assert first.published
    real_teach, real_train, teachers = second_candidate.teach, second_candidate.train_generation, []
    monkeypatch.setattr(
        second_candidate, "teach", lambda *a, **k: real_teach(*a[:5], 0.0, **{**k, "floor": 0.0})
    )  # the tiny model is unsure
    monkeypatch.setattr(
        second_candidate, "train_generation", lambda *a, **k: teachers.append(k["teacher"].state_dict()) or real_train(*a, **k)
    )
    second = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")

    assert len(teachers) == 1 and second.metrics["unlabelled"]["pool_photos"] == 24  # the second candidate was trained
    served = load_weights(store.open(first.published)).state_dict()
    shipped = load_weights(store.open(root)).state_dict()
    weight = next(k for k, v in served.items() if v.is_floating_point() and not torch.equal(v, shipped[k]))
    assert torch.equal(teachers[0][weight], shipped[weight]) and not torch.equal(teachers[0][weight], served[weight])
    samples.close()
