"""The labelled photos a retrain replays: ``[trainer] replay_per_epoch`` draws a few of each class every epoch, and a
photo that cannot be read is named."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the 'train' extra (torch) is not installed")

from edge_agent.config import ConfigError, load_config  # noqa: E402
from edge_agent.trainer_config import TrainerSection  # noqa: E402
from trainer import continual  # noqa: E402
from trainer.continual import epoch_rows, train_generation  # noqa: E402
from trainer.data import Sample  # noqa: E402
from trainer.labelled import LabelledSources, load_labelled  # noqa: E402
from trainer.models import build_model  # noqa: E402
from trainer.strategies.base import Generation, get_strategy  # noqa: E402


def _generation(replayed_per_class=6, classes=3, received=4) -> Generation:
    """``replayed_per_class`` replayed photos of each class, then ``received`` expert labels (class 0)."""
    n = replayed_per_class * classes
    y = torch.cat([torch.arange(classes).repeat_interleave(replayed_per_class), torch.zeros(received, dtype=torch.long)])
    x = torch.randn(len(y), 3, 128, 128, generator=torch.Generator().manual_seed(0)) * 0.3
    replayed = torch.cat([torch.ones(n, dtype=torch.bool), torch.zeros(received, dtype=torch.bool)])
    return Generation(x, y, replayed=replayed)


def test_without_the_option_an_epoch_takes_every_row_in_the_order_it_always_did():
    data = _generation()
    a = epoch_rows(data, 0, torch.Generator().manual_seed(3))
    assert torch.equal(a, torch.randperm(len(data), generator=torch.Generator().manual_seed(3)))


def test_an_epoch_takes_every_received_row_and_the_given_number_of_each_replayed_class_drawn_afresh():
    data = _generation(replayed_per_class=6, classes=3, received=4)
    gen = torch.Generator().manual_seed(0)
    seen: set[int] = set()
    for _ in range(6):
        rows = epoch_rows(data, 2, gen)
        assert len(rows) == 4 + 3 * 2 and len(set(rows.tolist())) == len(rows)
        assert set(range(18, 22)) <= set(rows.tolist())  # every expert label, every epoch
        replayed = rows[rows < 18]
        assert sorted(torch.bincount(data.y[replayed], minlength=3).tolist()) == [2, 2, 2]
        seen |= set(replayed.tolist())
    assert len(seen) > 6  # other photos on other epochs: the whole replay is seen over a retrain


def test_a_class_with_fewer_replayed_photos_than_drawn_gives_all_it_has():
    data = _generation(replayed_per_class=1, classes=3, received=2)
    rows = epoch_rows(data, 5, torch.Generator().manual_seed(0))
    assert sorted(rows.tolist()) == list(range(5))


def test_the_replayed_mark_survives_joining_and_subsetting_and_marks_only_the_labelled_photos_replayed(tmp_path):
    data = _generation(replayed_per_class=2, classes=2, received=3) + Generation(torch.zeros(1, 3, 128, 128), torch.tensor([1]))
    assert data.replayed.tolist() == [True] * 4 + [False] * 4
    keep = torch.tensor([False, True, False, False, True, True, False, True])
    assert data.subset(keep).replayed.tolist() == [True, False, False, False]
    from PIL import Image

    photo = tmp_path / "leaf.jpg"
    Image.new("RGB", (64, 48), (40, 120, 30)).save(photo)
    other = tmp_path / "other.jpg"
    Image.new("RGB", (64, 48), (90, 60, 30)).save(other)
    labelled = load_labelled(LabelledSources([Sample(photo, 0)], [Sample(other, 1)], "test"))
    assert labelled.train.replayed.tolist() == [True] and labelled.val.replayed.tolist() == [False]


@pytest.mark.both_cores
def test_a_retrain_drawing_from_the_replay_trains_each_epoch_on_the_drawn_rows_only(tmp_path, monkeypatch):
    seen = []

    class Counting(continual.Augment):
        def __call__(self, x, gen):
            seen.append(len(x))
            return super().__call__(x, gen)

    monkeypatch.setattr(continual, "Augment", Counting)
    planned = []
    schedule = continual.lr_schedule
    monkeypatch.setattr(continual, "lr_schedule", lambda total, swa=0: planned.append(total) or schedule(total, swa=swa))
    cfg = TrainerSection(epochs=3, batch_size=5, seed=0, swa_epochs=0, distill=0.0, replay_per_epoch=2)
    train_generation(build_model(3), _generation(6, 3, 4), get_strategy("finetune")(tmp_path), cfg, 5e-4)
    assert seen == [5, 5] * 3  # 4 expert labels + 2 of each of 3 classes an epoch, not 22 rows
    assert planned == [6]  # the learning rate's schedule spans the steps taken: 3 epochs of 2


def test_the_option_is_checked_where_the_file_is_read(tmp_path):
    assert TrainerSection().replay_per_epoch == 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer]\nreplay_per_epoch = -1\n")
    with pytest.raises(ConfigError, match="replay_per_epoch"):
        load_config(bad)


def test_a_labelled_photo_that_cannot_be_read_is_left_out_and_named_as_a_problem(tmp_path):
    from PIL import Image

    good = tmp_path / "leaf.jpg"
    Image.new("RGB", (64, 48), (40, 120, 30)).save(good)
    broken = tmp_path / "half.jpg"
    broken.write_bytes(good.read_bytes()[:200])  # half-copied
    sources = LabelledSources([Sample(good, 0), Sample(broken, 0)], [Sample(tmp_path / "gone.jpg", 1)], "test")
    labelled = load_labelled(sources)
    assert len(labelled.train) == 1 and len(labelled.val) == 0
    (problem,) = sources.problems
    assert problem.startswith("2 labelled photo(s) could not be read and were left out, e.g. ") and "half.jpg" in problem
    assert sources.describe()["problems"] == [problem]
