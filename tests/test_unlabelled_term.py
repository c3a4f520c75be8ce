"""A retrain's unlabelled term: the teacher's threshold fitted on the field check, its answers taken only above it, and
the field check deciding whether the candidate trained with them is kept."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the trainer needs the 'train' extra")

from trainer.field_check import prefer  # noqa: E402
from trainer.loop.unlabelled_term import fit_threshold, teach  # noqa: E402

from .conftest import encode, leaf_image  # noqa: E402
from .test_field_check import Fixed, _add, _photos  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


def test_the_threshold_is_the_lowest_confidence_the_field_check_shows_right_often_enough():
    conf = np.array([0.99, 0.98, 0.90, 0.80, 0.60])
    right = np.array([True, True, False, True, False])
    assert fit_threshold(conf, right, precision=0.95, least=1) == 0.98
    assert fit_threshold(conf, right, precision=0.95, least=3) is None  # never 95 % right on three answers
    assert fit_threshold(conf, right, precision=0.6, least=3) == 0.6
    assert fit_threshold(np.array([0.9, 0.9, 0.5]), np.array([True, False, True]), precision=0.9, least=1) is None  # ties go together


def _symmetric(n: int) -> torch.Tensor:
    """Photos i = 0..n-1 that read i (:class:`Sure`'s index) mirrored as well."""
    x = _photos(n)
    x[:, 0, 0, -1] = x[:, 0, 0, 0]
    return x


class Sure(torch.nn.Module):
    """Answers ``answers[i]`` for photo i (its first pixel) with probability ``p``."""

    def __init__(self, answers: list[int], p: list[float], num_classes: int = 3):
        super().__init__()
        self.answers, self.p, self.num_classes = torch.tensor(answers), torch.tensor(p), num_classes

    def forward(self, x):
        i = x[:, 0, 0, 0].long()
        p = self.p[i]
        other = (1 - p) / (self.num_classes - 1)
        probs = torch.nn.functional.one_hot(self.answers[i], self.num_classes).float() * (p - other)[:, None] + other[:, None]
        return probs.log()


def test_the_teacher_labels_only_the_unlabelled_photos_above_the_confidence_fitted_on_the_field_check():
    # photos 0-7: the field check (truth 0,1,2,0,1,2,0,1); photos 8-13: unlabelled
    answers = [0, 1, 2, 0, 1, 2, 2, 2] + [0, 1, 2, 0, 1, 2]
    p = [0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.70, 0.65] + [0.99, 0.97, 0.80, 0.95, 0.50, 0.96]
    teacher = Sure(answers, p).eval()
    field_x, field_y = _photos(8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    x = _symmetric(14)[8:]
    term = teach(teacher, x, [f"u{i}" for i in range(6)], field_x, field_y, precision=0.95, should_stop=lambda: False)
    assert term.summary["threshold"] == pytest.approx(0.94, abs=1e-4)  # right from 0.94 up; 0.70 and 0.65 are wrong
    assert term.data.sample_ids == ["u0", "u1", "u3", "u5"] and term.data.y.tolist() == [0, 1, 0, 2]
    assert term.data.pseudo.all() and torch.allclose(term.data.weight, torch.tensor([0.99, 0.97, 0.95, 0.96]), atol=1e-4)


class Mirrored(Sure):
    """:class:`Sure`, but answering class 2 for a photo whose right half is darker than its left (a mirrored photo)."""

    def forward(self, x):
        out = super().forward(x)
        flipped = x[:, 0, 0, -1] < x[:, 0, 0, 0]
        out[flipped] = torch.tensor([0.005, 0.005, 0.99]).log()
        return out


def test_the_floor_raises_a_lower_fitted_threshold_and_a_photo_whose_mirror_image_gets_another_answer_is_not_taken():
    answers = [0, 1, 2, 0, 1, 2, 2, 2] + [0, 1, 2, 0, 1, 2]
    p = [0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.70, 0.65] + [0.999, 0.97, 0.80, 0.995, 0.50, 0.996]
    field_x, field_y = _symmetric(8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    x = _symmetric(14)[8:]
    term = teach(Sure(answers, p).eval(), x, [f"u{i}" for i in range(6)], field_x, field_y, precision=0.95, floor=0.99)
    assert term.summary["threshold_fitted"] == pytest.approx(0.94, abs=1e-4) and term.summary["threshold"] == 0.99
    assert term.data.sample_ids == ["u0", "u3", "u5"] and term.summary["mirror_disagreed"] == 0  # 0.97 and 0.95: under the floor
    x = x.clone()
    x[3, :, :, -1] = x[3, :, :, 0] + 1  # photo u3 reads another class when mirrored (its edge is lighter on the right)
    term = teach(Mirrored(answers, p).eval(), x, [f"u{i}" for i in range(6)], field_x, field_y, precision=0.95, floor=0.99)
    assert term.data.sample_ids == ["u0", "u5"] and term.summary["mirror_disagreed"] == 1 and term.summary["taken"] == 2


def test_a_teacher_not_right_often_enough_on_the_field_check_teaches_nothing():
    teacher = Sure([1] * 8 + [0] * 4, [0.99] * 12).eval()  # surely wrong on every field check photo
    term = teach(teacher, _photos(12)[8:], ["a", "b", "c", "d"], _photos(8), torch.zeros(8, dtype=torch.long), precision=0.95)
    assert term.data is None and "no confidence" in term.summary["reason"] and len(term.summary["field_most_confident"]) == 8
    none = teach(teacher, torch.zeros((0,)), [], _photos(8), torch.zeros(8, dtype=torch.long), precision=0.95)
    assert none.data is None and none.summary["reason"] == "no unlabelled photos"


def test_the_field_check_prefers_the_candidate_right_on_more_photos_or_as_many_surely_beyond_the_noise():
    y = torch.tensor([0, 1, 2, 0])
    good, bad = Fixed([0, 1, 2, 0]).eval(), Fixed([0, 1, 2, 1]).eval()
    assert prefer(good, bad, _photos(4), y)[0] and not prefer(bad, good, _photos(4), y)[0]
    surer, less_sure = Sure([0, 1, 2, 0], [0.99] * 4).eval(), Sure([0, 1, 2, 0], [0.6] * 4).eval()
    better, figures = prefer(surer, less_sure, _photos(4), y)  # all right; surer on every photo alike: no noise
    assert better and figures["field_top1_with"] == figures["field_top1_without"] == 1.0
    assert not prefer(less_sure, surer, _photos(4), y)[0]
    surer, less_sure = Sure([0, 1, 2, 1], [0.99] * 4).eval(), Sure([0, 1, 2, 1], [0.6] * 4).eval()
    better, figures = prefer(less_sure, surer, _photos(4), y)  # as many right; the surer one's one mistake costs more ...
    assert figures["field_log_loss_with"] < figures["field_log_loss_without"]
    assert not better and figures["field_log_loss_standard_error"] > figures["field_log_loss_without"] - figures["field_log_loss_with"]
    # ... but on one photo of four, against three where it costs less: within one standard error, so the first stays


def _pool(root, classes, n: int = 24):
    from trainer.loop.unlabelled_pool import UnlabelledPool

    pool = UnlabelledPool(root, 100, 1 << 30)
    for i in range(n):
        header = {"id": f"{5000 + i:064x}", "kind": "unlabelled", "label": classes[i % 2], "verdict": "unsure", "confidence": 0.6}
        pool.add({**header, "engine_version": "v0001", "ext": ".jpg", "device": "d"}, encode(leaf_image(900 + i)))
    pool.close()


def farm(tiny_store, tmp_path):
    """A copy of ``tiny_store`` and a trainer with 32 expert labels (8 held back for the field check) and 24 pool photos."""
    from engines.store import EngineStore
    from trainer.samples import SampleStore

    store = EngineStore(shutil.copytree(tiny_store, tmp_path / "store"))
    classes = store.open().classes
    samples = SampleStore(tmp_path / "trainer")
    for i in range(32):
        _add(samples, i, classes[i % 2])
    _pool(tmp_path / "trainer", classes)
    return store, samples


def test_a_retrain_refuses_the_candidate_trained_with_unlabelled_photos_where_the_field_check_prefers_the_first(
    tiny_store, tmp_path, monkeypatch
):
    field_prefers = False
    from edge_agent.config import parse_config
    from trainer import retrain as retrain_mod
    from trainer.loop import second_candidate

    from .test_recheck import _open_gate

    store, samples = farm(tiny_store, tmp_path)
    real_teach, trained = second_candidate.teach, []
    monkeypatch.setattr(
        second_candidate, "teach", lambda *a, **k: real_teach(*a[:5], 0.0, **{**k, "floor": 0.0})
    )  # the tiny model is unsure
    real_train = retrain_mod.train_generation
    for module in (retrain_mod, second_candidate):  # the first candidate, then the second
        monkeypatch.setattr(module, "train_generation", lambda *a, **k: trained.append(len(a[1])) or real_train(*a, **k))
    monkeypatch.setattr(second_candidate, "prefer", lambda *a: (field_prefers, {"field_top1_with": 0.5, "field_top1_without": 0.5}))
    trainer = {**_open_gate(tmp_path), "field_check_every": 4, "unlabelled_field_min": 8, "unlabelled_min_taken": 1}
    result = retrain_mod.retrain(parse_config({"trainer": trainer}), store, samples, tmp_path / "strategy")
    term = result.metrics["unlabelled"]
    assert term["pool_photos"] == 24 and term["taken"] > 0 and term["kept"] is field_prefers
    assert len(trained) == 2 and trained[1] == trained[0] + term["taken"]  # a second candidate, with the photos taken
    assert samples.counts()["expert"] == 32  # the pool is not the samples
    samples.close()


def test_no_second_candidate_is_trained_where_the_term_takes_fewer_photos_than_unlabelled_min_taken(tiny_store, tmp_path, monkeypatch):
    from edge_agent.config import parse_config
    from trainer import retrain as retrain_mod
    from trainer.loop import second_candidate

    from .test_recheck import _open_gate

    store, samples = farm(tiny_store, tmp_path)  # 24 pool photos
    real_teach, taught, trained = second_candidate.teach, [], []

    def teach(*a, **k):  # the tiny model is unsure: take every answer its mirror image agrees with
        taught.append(real_teach(*a[:5], 0.0, **{**k, "floor": 0.0}))
        return taught[-1]

    monkeypatch.setattr(second_candidate, "teach", teach)
    real_train = retrain_mod.train_generation
    for module in (retrain_mod, second_candidate):
        monkeypatch.setattr(module, "train_generation", lambda *a, **k: trained.append(len(a[1])) or real_train(*a, **k))
    monkeypatch.setattr(second_candidate, "prefer", lambda *a: pytest.fail("nothing to prefer: no second candidate"))
    trainer = {**_open_gate(tmp_path), "field_check_every": 4, "unlabelled_field_min": 8, "unlabelled_min_taken": 25}
    result = retrain_mod.retrain(parse_config({"trainer": trainer}), store, samples, tmp_path / "strategy")
    term = result.metrics["unlabelled"]
    assert taught and taught[0].data is not None and 0 < term["taken"] <= 24  # the term took photos ...
    assert term["kept"] is False and f"only {term['taken']} taken, fewer than the 25" in term["reason"]
    assert len(trained) == 1  # ... and only the first candidate was trained
    assert parse_config({}).trainer.unlabelled_min_taken == 16  # the default
    samples.close()


def test_with_unlabelled_epochs_the_second_candidate_trains_on_from_the_first_for_those_epochs_distilled_towards_the_start(
    tiny_store, tmp_path, monkeypatch
):
    from edge_agent.config import parse_config
    from trainer import retrain as retrain_mod
    from trainer.loop import second_candidate

    from .test_recheck import _open_gate

    store, samples = farm(tiny_store, tmp_path)
    real_teach, calls = second_candidate.teach, []
    monkeypatch.setattr(second_candidate, "teach", lambda *a, **k: real_teach(*a[:5], 0.0, **{**k, "floor": 0.0}))
    real_train = retrain_mod.train_generation

    def train(*a, **k):
        calls.append((a, k, real_train(*a, **k)))
        return calls[-1][2]

    for module in (retrain_mod, second_candidate):
        monkeypatch.setattr(module, "train_generation", train)
    monkeypatch.setattr(second_candidate, "prefer", lambda *a: (True, {"field_top1_with": 0.6, "field_top1_without": 0.5}))
    trainer = {**_open_gate(tmp_path), "field_check_every": 4, "unlabelled_field_min": 8, "unlabelled_min_taken": 1}
    cfg = parse_config({"trainer": {**trainer, "unlabelled_epochs": 2}})
    result = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")
    assert result.metrics["unlabelled"]["kept"] is True and len(calls) == 2
    (first_args, first_kw, (first, _)), (args, kw, _) = calls
    assert args[0] is first  # on from the first candidate, not again from the start
    on = args[3]
    assert (on.epochs, on.swa_epochs, on.ramp_epochs) == (2, 2, 0) and first_args[3] is cfg.trainer
    assert args[5] == 1.0 and kw["teacher"] is first_kw["teacher"]  # its own weights; the retrain's teacher
    assert len(args[1]) == len(first_args[1]) + result.metrics["unlabelled"]["taken"]
    assert parse_config({}).trainer.unlabelled_epochs == 4  # the default
    samples.close()


def test_the_unlabelled_term_waits_until_the_field_check_holds_enough_photos_to_judge_it(tiny_store, tmp_path, monkeypatch):
    from edge_agent.config import parse_config
    from trainer import retrain as retrain_mod
    from trainer.loop import second_candidate

    from .test_recheck import _open_gate

    store, samples = farm(tiny_store, tmp_path)  # 32 expert labels, every 4th held back: 8 field check photos
    trained, asked = [], []
    real_train = retrain_mod.train_generation
    monkeypatch.setattr(retrain_mod, "train_generation", lambda *a, **k: trained.append(len(a[1])) or real_train(*a, **k))
    monkeypatch.setattr(second_candidate, "teach", lambda *a, **k: asked.append(1))
    cfg = parse_config({"trainer": {**_open_gate(tmp_path), "field_check_every": 4}})
    assert cfg.trainer.unlabelled_field_min == 12  # the default this test is about
    result = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")
    term = result.metrics["unlabelled"]
    assert term["kept"] is False and term["field_photos"] == 8 and "8 of the 12 photos" in term["reason"]
    assert len(trained) == 1 and not asked  # one candidate; the pool was not read
    samples.close()


@pytest.mark.parametrize(
    "term, says",
    [
        ({"taken": 57, "kept": True}, "unlabelled photos in the last retrain: 57 taught it"),
        ({"taken": 90, "kept": False}, "none kept: the field check preferred the candidate without them"),
        (
            {"field_photos": 6, "kept": False, "reason": "the field check holds 6 of the 12 photos the unlabelled term waits for"},
            "none kept: the field check holds 6 of the 12 photos the unlabelled term waits for",
        ),
        (
            {"taken": 6, "kept": False, "reason": "only 6 taken, fewer than the 16 a second candidate waits for"},
            "none kept: only 6 taken, fewer than the 16 a second candidate waits for",
        ),
    ],
)
def test_trainer_status_says_whether_the_unlabelled_photos_taught_the_last_retrain_and_if_not_why(tmp_path, term, says):
    import json
    import subprocess
    import sys
    from pathlib import Path

    status = tmp_path / "trainer" / "status.json"
    status.parent.mkdir(parents=True)
    last = {"published": "v0002", "reason": "candidate is not worse", "samples": 40, "seconds": 1.0, "metrics": {"unlabelled": term}}
    status.write_text(json.dumps({"state": "idle", "samples": {"expert": 40}, "last_retrain": last}))
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "status", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == 0, out.stderr
    assert says in out.stdout


def test_the_threshold_replay_scores_each_rule_and_only_the_shipped_one_drops_a_sure_answer_its_mirror_image_contradicts():
    from benchmarks.term_threshold import rules, summary

    def logits(rows):  # (probability, class) per photo, three classes
        return np.log(np.array([[p if c == k else (1 - p) / 2 for k in range(3)] for p, c in rows]))

    check = logits([(0.999, 0), (0.98, 1), (0.96, 2), (0.5, 0)])  # right from 0.96 up; the 0.5 answer is wrong (truth 1)
    pool = logits([(0.995, 0), (0.995, 1), (0.97, 2), (0.5, 0)])
    mirror = logits([(0.995, 0), (0.995, 2), (0.97, 2), (0.5, 0)])  # photo 1 mirrored reads class 2
    chosen, t = rules(check, np.array([0, 1, 2, 1]), pool, mirror)
    assert chosen["fitted on the check set (before)"].tolist() == [True, True, True, False]
    assert chosen["fitted, never below 0.99"].tolist() == [True, True, False, False]
    assert chosen["fitted, never below 0.99, mirror agrees (shipped)"].tolist() == [True, False, False, False]
    assert t >= 1.0  # a temperature fitted on a check set is never allowed to sharpen the teacher
    table = summary(
        [{"seed": 1, "a rule": [4, 3], "a rule taking none": [0, 0]}, {"seed": 2, "a rule": [2, 2], "a rule taking none": [0, 0]}]
    )
    assert "| a rule | 6 | 5 | 0.833 | 1 of 2 | 0.750 |" in table and "| a rule taking none | 0 | | | | |" in table
