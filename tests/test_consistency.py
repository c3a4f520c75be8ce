"""A retrain's consistency term: only the pool photos the model is sure of teach, each class they name counts alike,
and the field check decides whether the candidate trained with it serves."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the trainer needs the 'train' extra")

from trainer.loop.consistency import Consistency, balanced  # noqa: E402

from .test_field_check import _photos  # noqa: E402
from .test_unlabelled_term import farm  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


class Linear(torch.nn.Module):
    """A linear model over the photo's mean colour, scaled so its answers are as sure as ``scale`` makes them."""

    def __init__(self, scale: float, num_classes: int = 3):
        super().__init__()
        self.fc = torch.nn.Linear(3, num_classes)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(num_classes, 3) * scale)
            self.fc.bias.zero_()

    def forward(self, x):
        return self.fc(x.float().mean(dim=(2, 3)))


def _coloured(n: int) -> torch.Tensor:
    """Photos whose mean colour names class i % 3 (flips keep it)."""
    x = torch.zeros(n, 3, 8, 8)
    for i in range(n):
        x[i, i % 3] = 1.0
    return x


def test_the_term_learns_nothing_from_photos_the_model_is_not_sure_of():
    model, gen = Linear(scale=0.01), torch.Generator().manual_seed(0)
    term = Consistency(_coloured(6), threshold=0.95)
    assert term.loss(model, torch.arange(6), gen, n_true=6, micro=4) == 0.0
    assert model.fc.weight.grad is None and term.tally["views"] == 6 and term.tally["sure"] == 0


def test_the_photos_the_model_is_sure_of_teach_their_strong_views_and_are_counted_by_class():
    model, gen = Linear(scale=20.0), torch.Generator().manual_seed(0)
    term = Consistency(_coloured(6), threshold=0.95)
    value = term.loss(model, torch.arange(6), gen, n_true=6, micro=4)
    assert value > 0 and model.fc.weight.grad.abs().sum() > 0
    assert term.tally["sure"] == 6 and term.tally["sure_by_class"] == {0: 2, 1: 2, 2: 2}


@pytest.mark.parametrize("parts_before_stop, passes", [(1, 1), (3, 3)])  # in the sure answers' pass, in the learning one
def test_a_stop_asked_during_the_term_is_taken_before_its_next_part(parts_before_stop, passes):
    from trainer.stop import Stopped

    model, gen = Linear(scale=20.0), torch.Generator().manual_seed(0)
    seen = []
    model.register_forward_pre_hook(lambda _m, inputs: seen.append(len(inputs[0])))
    asked = []

    def should_stop():
        asked.append(1)
        return len(asked) > parts_before_stop

    with pytest.raises(Stopped, match="while training"):
        Consistency(_coloured(6), threshold=0.95).loss(model, torch.arange(6), gen, n_true=6, micro=4, should_stop=should_stop)
    assert len(seen) == passes  # 6 photos are two parts of 4 in each pass


def test_each_class_the_sure_answers_name_counts_alike_however_common():
    target = torch.tensor([0, 0, 0, 1, 2])
    sure = torch.tensor([True, True, True, True, False])
    w = balanced(target, sure, num_classes=3)
    assert w[:3].sum() == pytest.approx(w[3]) and w[4] == 0  # three photos of class 0 weigh what one of class 1 does
    assert w.sum() == pytest.approx(4.0)  # the sure photos' weights add up to their count


def test_a_step_draws_ratio_pool_photos_per_labelled_photo():
    term = Consistency(_coloured(5), ratio=3)
    idx = term.draw(4, torch.Generator().manual_seed(1))
    assert len(idx) == 12 and int(idx.max()) < 5


@pytest.mark.parametrize("field_prefers", [False, True])
def test_a_retrain_with_the_consistency_term_trains_a_second_candidate_and_the_field_check_decides(
    tiny_store, tmp_path, monkeypatch, field_prefers
):
    from edge_agent.config import parse_config
    from trainer import retrain as retrain_mod
    from trainer.loop import second_candidate

    from .test_recheck import _open_gate

    store, samples = farm(tiny_store, tmp_path)
    real_train, trained = retrain_mod.train_generation, []
    for module in (retrain_mod, second_candidate):  # the first candidate, then the second
        monkeypatch.setattr(module, "train_generation", lambda *a, **k: trained.append(k.get("consistency")) or real_train(*a, **k))
    monkeypatch.setattr(second_candidate, "prefer", lambda *a: (field_prefers, {"field_top1_with": 0.5, "field_top1_without": 0.5}))
    cfg = parse_config(
        {
            "trainer": {
                **_open_gate(tmp_path),
                "field_check_every": 4,
                "unlabelled_field_min": 8,
                "unlabelled_method": "consistency",
                "consistency_threshold": 0.01,
            }
        }
    )
    result = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")
    term = result.metrics["unlabelled"]
    assert term["method"] == "consistency" and term["pool_photos"] == 24 and term["kept"] is field_prefers
    assert trained[0] is None and trained[1] is not None and term["views"] > 0 and term["sure"] == term["views"]
    assert samples.counts()["expert"] == 32  # the pool is not the samples
    samples.close()


def test_an_empty_pool_leaves_the_first_candidate():
    from trainer.loop.second_candidate import _with_consistency

    first = object()
    chosen, used, summary = _with_consistency(first, "data", None, None, None, None, 0, 1, None, None, None, _photos(0), lambda: False)
    assert chosen is first and used == "data" and summary["reason"] == "no unlabelled photos" and not summary["kept"]
