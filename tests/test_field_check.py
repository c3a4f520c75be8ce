"""The field check: expert labels held back, the gate on them, and BatchNorm adapted to the field only where it helps."""

from __future__ import annotations

import shutil
import time

import pytest

torch = pytest.importorskip("torch", reason="the trainer needs the 'train' extra")

from trainer.field_check import adapt_batchnorm, field_gate, held_back  # noqa: E402
from trainer.samples import Sample  # noqa: E402

from .conftest import encode, leaf_image  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


class Fixed(torch.nn.Module):
    """Answers ``answers[i]`` for photo i (the photo's first pixel holds i), surely."""

    def __init__(self, answers: list[int], num_classes: int = 3):
        super().__init__()
        self.answers, self.num_classes = torch.tensor(answers), num_classes

    def forward(self, x):
        i = x[:, 0, 0, 0].long()
        return torch.nn.functional.one_hot(self.answers[i], self.num_classes).float() * 20


def _photos(n: int) -> torch.Tensor:
    x = torch.zeros(n, 3, 4, 4)
    x[:, 0, 0, 0] = torch.arange(n).float()
    return x


def _expert(i: int, label: str, kind: str = "expert") -> Sample:
    return Sample(f"{i:064x}", kind, label, 1.0, "v1", f"/s/{i}.jpg", 1000.0 + i, None)


def test_every_fourth_expert_label_of_a_class_is_held_back_in_arrival_order():
    samples = [_expert(i, "A") for i in range(9)] + [_expert(100 + i, "B") for i in range(3)] + [_expert(200, "A", kind="pseudo")]
    samples.reverse()  # the store's order does not matter: arrival does
    assert held_back(samples, 4) == {f"{3:064x}", f"{7:064x}"}  # A's 4th and 8th; B has only three; never a pseudo-label
    assert held_back(samples, 0) == set()
    assert held_back(samples, 1) == {s.id for s in samples if s.kind == "expert"}


def test_a_label_the_expert_put_right_keeps_its_place_and_moves_no_other_photo_into_or_out_of_the_held_back_set():
    from dataclasses import replace

    samples = [_expert(i, "A") for i in range(8)] + [_expert(100 + i, "B") for i in range(4)]
    before = held_back(samples, 4)
    assert before == {f"{3:064x}", f"{7:064x}", f"{103:064x}"}
    moved = [replace(s, label="B", first_label="A") if s.id == f"{1:064x}" else s for s in samples]  # A's 2nd put right: B
    assert held_back(moved, 4) == before  # by label alone, A's 5th and B's 3rd photo would be held back instead
    held = [replace(s, label="B", first_label="A") if s.id == f"{3:064x}" else s for s in samples]  # a held-back one moved
    assert held_back(held, 4) == before  # still held back (never trained on), judged under its new class


def test_without_expert_labels_the_field_check_lets_the_lab_gate_decide():
    d = field_gate(Fixed([0]), Fixed([0]), _photos(0), torch.zeros(0, dtype=torch.long), expert_labels=0, every=4, min_photos=8)
    assert d.publish and d.metrics == {"field_photos": 0}


def test_a_field_check_set_too_small_to_judge_publishes_nothing_and_says_so():
    x, y = _photos(5), torch.zeros(5, dtype=torch.long)
    d = field_gate(Fixed([0] * 5), Fixed([1] * 5), x, y, expert_labels=21, every=4, min_photos=8)
    assert not d.publish
    assert "too small to judge: 5 of 8 photos" in d.reason and "every 4th expert label" in d.reason
    assert d.metrics["field_photos"] == 5 and d.metrics["expert_labels"] == 21


def test_a_candidate_one_held_back_photo_worse_is_refused_and_a_tie_publishes():
    y = torch.zeros(10, dtype=torch.long)
    current = Fixed([0] * 8 + [1, 1])  # 8 of 10 right
    one_worse = Fixed([0] * 7 + [1, 1, 1])
    d = field_gate(one_worse, current, _photos(10), y, 40, 4, 8)
    assert not d.publish and "field check: top-1 0.7000 < current 0.8000 (7 of 10 held-back photos right against 8)" in d.reason
    assert d.metrics["field_candidate_right"] == 7 and d.metrics["field_current_right"] == 8
    tie = Fixed([1] + [0] * 8 + [1])  # as many right, other photos
    assert field_gate(tie, current, _photos(10), y, 40, 4, 8).publish
    three_worse = Fixed([0] * 5 + [1] * 5)
    d = field_gate(three_worse, current, _photos(10), y, 40, 4, 8)
    assert not d.publish and d.metrics["field_candidate_top1"] == 0.5 and d.metrics["field_current_top1"] == 0.8
    better = Fixed([0] * 10)
    assert field_gate(better, current, _photos(10), y, 40, 4, 8).publish


def test_the_field_check_records_each_sides_log_loss_without_deciding_on_it():
    y = torch.zeros(10, dtype=torch.long)
    current = Fixed([0] * 8 + [1, 1])  # surely wrong on two photos: a loss of 20 each
    hedged = Hedged(torch.tensor([0] * 7 + [1, 1, 1]))  # one photo fewer right, every answer hedged
    d = field_gate(hedged, current, _photos(10), y, 40, 4, 8)
    assert not d.publish  # refused on right photos alone, though its log-loss is lower
    assert d.metrics["field_current_log_loss"] == pytest.approx(4.0, abs=1e-3)  # 2 x 20 / 10
    assert d.metrics["field_candidate_log_loss"] < 1.0 and d.metrics["field_log_loss_standard_error"] > 0


class Hedged(torch.nn.Module):
    """Answers ``answers[i]`` for photo i, only somewhat surely (a margin of 1 over the two other classes)."""

    num_classes = 3

    def __init__(self, answers: torch.Tensor):
        super().__init__()
        self.answers = answers

    def forward(self, x):
        return torch.nn.functional.one_hot(self.answers[x[:, 0, 0, 0].long()], 3).float()


def test_a_photo_of_a_class_the_engine_in_service_lacks_counts_against_it_not_the_candidate():
    y = torch.tensor([0] * 6 + [3] * 4)  # class 3 is new: only the candidate's head has it
    current = Fixed([0] * 10, num_classes=3)
    candidate = Fixed([0] * 6 + [3] * 4, num_classes=4)
    d = field_gate(candidate, current, _photos(10), y, 40, 4, 8)
    assert d.publish and d.metrics["field_current_top1"] == 0.6 and d.metrics["field_candidate_top1"] == 1.0


class Normed(torch.nn.Module):
    """One BatchNorm before a fixed read-out: right only when its statistics match the photos'."""

    num_classes = 2

    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(1, affine=False)

    def forward(self, x):
        z = self.bn(x[:, :1, 0, 0])
        return torch.cat([-z, z], 1) * 5  # class 1 above the mean, class 0 below


def _shifted(n: int, shift: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.zeros(n, 3, 2, 2)
    x[:, 0, 0, 0] = shift + (y.float() * 2 - 1) + 0.3 * torch.randn(n, generator=g)
    return x, y


def test_batchnorm_adapted_to_the_field_is_kept_only_where_the_field_check_shows_it_helps():
    model = Normed().eval()  # statistics of the lab: mean 0, variance 1
    field_x, _ = _shifted(64, 6.0, 1)  # the field's photos are brighter
    check_x, check_y = _shifted(20, 6.0, 2)
    kept, summary = adapt_batchnorm(model, field_x, check_x, check_y)
    assert summary["kept"] and kept is not model and summary["log_loss_after"] < summary["log_loss_before"]
    lab_x, lab_y = _shifted(20, 0.0, 3)  # a check set like the lab: adapting to bright photos would hurt
    same, summary = adapt_batchnorm(model, field_x, lab_x, lab_y)
    assert not summary["kept"] and same is model
    few, summary = adapt_batchnorm(model, field_x[:8], check_x, check_y)
    assert few is model and not summary["kept"] and "too few" in summary["reason"]


def _add(samples, i: int, label: str, kind: str = "expert") -> None:
    samples.add(
        {"id": f"{i:064x}", "kind": kind, "label": label, "confidence": 1.0, "engine_version": "v0001", "ext": ".jpg"},
        encode(leaf_image(700 + i)),
    )
    time.sleep(0.002)


def test_a_retrain_with_too_few_held_back_labels_publishes_nothing_and_keeps_them(tiny_store, tmp_path):
    from edge_agent.config import parse_config
    from engines.store import EngineStore
    from trainer.retrain import retrain
    from trainer.samples import SampleStore

    from .test_recheck import _open_gate

    store = EngineStore(shutil.copytree(tiny_store, tmp_path / "store"))
    classes = store.open().classes
    samples = SampleStore(tmp_path / "trainer")
    for i in range(8):
        _add(samples, i, classes[i % 2])  # four of each of two classes: one of each held back
    cfg = parse_config({"trainer": {**_open_gate(tmp_path), "field_check_every": 4}})
    result = retrain(cfg, store, samples, tmp_path / "strategy")
    assert result.published is None
    assert result.reason.startswith("field check set too small to judge: 2 of 6 photos")
    field = result.metrics["gate"]["field"]
    assert field["publish"] is False and field["field_photos"] == 2 and result.metrics["samples"]["field_check"] == 2
    assert result.metrics["samples"]["expert"] == 6  # the held-back two are never trained on
    assert list(result.metrics["memory"]["by_phase"])[:3] == ["opening the engines", "reading photos", "training"]
    assert {s.kind for s in samples.all()} == {"expert"} and len(samples.all()) == 8  # every label kept
    for i in range(8, 32):
        _add(samples, i, classes[i % 2])
    result = retrain(cfg, store, samples, tmp_path / "strategy")
    assert result.metrics["gate"]["field"]["field_photos"] == 8 and result.metrics["samples"]["expert"] == 24
    assert "field_candidate_top1" in result.metrics["gate"]["field"]
    assert result.published  # right on at least as many of the 8 held-back photos
    assert store.read_manifest(result.published)["metrics"]["gate"]["field"]["field_photos"] == 8
    memory = result.metrics["memory"]  # the retrain's own record; not the version's
    assert {"publishing", "keeping the strategy's memory"} <= set(memory["by_phase"]) and memory["peak_mb"] > 0
    assert "memory" not in store.read_manifest(result.published)["metrics"]
    chose_it = sorted(held_back(samples.all(), 4))
    assert store.read_manifest(result.published)["training"]["field_check_ids"] == chose_it
    assert result.metrics["gate"]["field"]["field_judged_on"] == "all"
    for i in range(32, 56):  # three more of each class held back: six photos that did not choose the version in service
        _add(samples, i, classes[i % 2])
    assert cfg.trainer.field_check_judges_on == "new"  # the shipped rule
    result = retrain(cfg, store, samples, tmp_path / "strategy")
    field = result.metrics["gate"]["field"]
    assert field["field_judged_on"] == "new" and field["field_photos"] == 6 and result.metrics["samples"]["field_check"] == 14
    samples.close()


def test_the_trainer_spends_no_retrain_on_a_candidate_the_field_check_could_not_judge(tmp_path):
    from edge_agent.config import parse_config
    from trainer.field_check import too_few_to_judge
    from trainer.service import TrainerService

    assert too_few_to_judge([_expert(i, "A", kind="pseudo") for i in range(50)], 4, 8) is None  # no expert labels: the lab decides
    assert too_few_to_judge([_expert(i, "A") for i in range(32)], 4, 8) is None
    assert too_few_to_judge([_expert(i, "A") for i in range(32)], 0, 8) is None  # field check turned off
    assert "holds 7 of the 8 photos" in too_few_to_judge([_expert(i, "A") for i in range(31)], 4, 8)

    svc = TrainerService(parse_config({"trainer": {"expert_threshold": 2}}), tmp_path)
    for i in range(23):
        svc.samples.add({"id": f"{i:064x}", "kind": "expert", "label": "A", "confidence": 1.0, "engine_version": "v1", "ext": ".jpg"}, b"x")
        time.sleep(0.001)
    assert not svc._due() and "holds 5 of the 6" in svc.status()["waiting_for_field_check"]  # the shipped minimum
    svc.samples.add({"id": f"{99:064x}", "kind": "expert", "label": "A", "confidence": 1.0, "engine_version": "v1", "ext": ".jpg"}, b"x")
    assert svc._due() and svc.status()["waiting_for_field_check"] is None
    svc.samples.close()


def test_judged_on_new_photos_a_candidate_is_not_held_to_the_score_of_the_photos_that_chose_the_version_in_service():
    from trainer.field_check import judging_photos
    from trainer.strategies.base import Generation

    ids = [f"{i:064x}" for i in range(18)]
    field = Generation(_photos(18), torch.zeros(18, dtype=torch.long), sample_ids=ids)
    current = Fixed([0] * 10 + [0, 0, 0, 0, 1, 1, 1, 1])  # right on all 10 photos that chose it, on 4 of the 8 since
    candidate = Fixed([0] * 6 + [1] * 4 + [0] * 7 + [1])  # 6 of those 10, 7 of the 8 new
    judges, on = judging_photos(field, ids[:10], "all", 6)
    assert on == "all" and len(judges) == 18
    d = field_gate(candidate, current, judges.x, judges.y, 40, 4, 6)
    assert not d.publish and (d.metrics["field_candidate_right"], d.metrics["field_current_right"]) == (13, 14)
    judges, on = judging_photos(field, ids[:10], "new", 6)
    assert on == "new" and judges.sample_ids == ids[10:]
    d = field_gate(candidate, current, judges.x, judges.y, 40, 4, 6)
    assert d.publish and (d.metrics["field_photos"], d.metrics["field_candidate_right"], d.metrics["field_current_right"]) == (8, 7, 4)
    worse_on_new = Fixed([0] * 10 + [0, 0, 0, 1, 1, 1, 1, 1])  # 3 of the 8 new: refused on them too
    assert not field_gate(worse_on_new, current, judges.x, judges.y, 40, 4, 6).publish


def test_the_field_check_judges_on_every_held_back_photo_until_enough_new_ones_have_arrived():
    from trainer.field_check import judging_photos, new_photos
    from trainer.strategies.base import Generation

    ids = [f"{i:064x}" for i in range(18)]
    field = Generation(_photos(18), torch.zeros(18, dtype=torch.long), sample_ids=ids)
    assert new_photos(ids, ids[:13], 6) is None  # 5 new: too few to judge on, all judge
    assert new_photos(ids, ids[:12], 6) == [False] * 12 + [True] * 6
    assert new_photos(ids, None, 6) is None and new_photos(ids, [], 6) is None  # a version that records none (v4000, older)
    assert new_photos(ids, ["f" * 64], 6) is None  # none of the photos that chose it is still held back: all are new
    assert judging_photos(field, ids[:13], "new", 6)[1] == "all" and len(judging_photos(field, ids[:13], "new", 6)[0]) == 18
