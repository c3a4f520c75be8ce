"""A backup taken while the daemon and the trainer go on: whenever, during its snapshot, a store adds, removes or
replaces a photo, every row of the backup's databases names a photo the backup holds."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

import edge_agent.backup as backup_module
from edge_agent.backup import backup
from edge_agent.config import AppConfig
from edge_agent.restore import restore
from edge_agent.results import ResultsDB
from edge_agent.spool import PhotoSpool
from edge_agent.state import resolve_store

from .web_helpers import make_state

HEADER = {"ext": ".png", "confidence": 1.0, "engine_version": "v1"}


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (seed, 90, 40)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def season(tmp_path_factory) -> Path:
    """A state directory with the daemon's review pool, an expert's PNG label, a pseudo-label and an unlabelled photo
    on the trainer's side (and no engines)."""
    from trainer.loop.unlabelled_pool import UnlabelledPool
    from trainer.samples import SampleStore

    state = make_state(tmp_path_factory.mktemp("season"))
    classes = resolve_store(AppConfig(), state).open(verify=False).classes
    samples = SampleStore(state / "trainer")
    samples.add(HEADER | {"id": "a" * 64, "kind": "expert", "label": classes[0]}, _png(1))
    samples.add(HEADER | {"id": "b" * 64, "kind": "pseudo", "label": classes[0], "confidence": 0.99}, _png(2))
    samples.close()
    pool = UnlabelledPool(state / "trainer", 10, 1 << 20)
    pool.add(HEADER | {"id": "c" * 64, "kind": "unlabelled", "label": classes[1], "verdict": "unsure"}, _png(3))
    pool.close()
    shutil.rmtree(state / "engines")  # 107 MB this test needs none of
    return state


def _reduce(state: Path) -> None:
    """The trainer's stored-photo pass puts the expert's PNG as a JPEG."""
    from trainer.samples import SampleStore

    samples = SampleStore(state / "trainer")
    [label] = [s for s in samples.all() if s.kind == "expert"]
    out = io.BytesIO()
    Image.open(label.file).save(out, "JPEG")
    assert samples.replace_photo(label.id, label.file, out.getvalue(), ".jpg")
    samples.close()


def _drop(state: Path) -> None:
    """The trainer drops its pseudo-labels past the newest per class (one label added, the old one deleted)."""
    from trainer.samples import SampleStore

    samples = SampleStore(state / "trainer")
    label = next(s.label for s in samples.all())
    samples.add(HEADER | {"id": "d" * 64, "kind": "pseudo", "label": label, "confidence": 0.99}, _png(4))
    assert samples.drop_old_pseudo(1)[0] == 1
    samples.close()


def _discard(state: Path) -> None:
    """The unlabelled pool lets a photo go and takes a new one."""
    from trainer.loop.unlabelled_pool import UnlabelledPool

    pool = UnlabelledPool(state / "trainer", 10, 1 << 20)
    pool.discard("c" * 64)
    pool.add(HEADER | {"id": "e" * 64, "kind": "unlabelled", "label": "x", "verdict": "unsure"}, _png(5))
    pool.close()


def _send(state: Path) -> None:
    """The daemon hands a queued photo over (its row and its file removed) and queues a new one."""
    db = ResultsDB(state / "results.sqlite")
    db.relocate_queue(state / "queue")  # (the copy's rows name the season's files: the daemon's start points them here)
    entry = db.review_pool()[0][0]
    assert db.remove_queued_entry(entry, lambda: PhotoSpool(state / "queue", 1 << 30).remove(Path(entry.file)))
    db.close()


def _holds_every_photo_its_rows_name(archive: Path, where: Path) -> None:
    from trainer.loop.unlabelled_pool import UnlabelledPool
    from trainer.samples import SampleStore

    restore(archive, where)
    samples = SampleStore(where / "trainer").all()
    pool = UnlabelledPool(where / "trainer", 10, 1 << 20).photos()
    db = ResultsDB(where / "results.sqlite")
    db.relocate_queue(where / "queue")
    queued = db.queued_for_delivery(100) + [e for e, *_ in db.review_pool()]
    assert len(samples) >= 2 and pool and queued
    named = [s.file for s in samples] + [p.file for p in pool] + [e.file for e in queued]
    missing = [f for f in named if not (Path(f).is_file() and Path(f).is_relative_to(where))]
    assert not missing, f"rows name photos the backup lacks: {missing}"
    assert all(Image.open(f).size == (64, 48) for f in [s.file for s in samples] + [p.file for p in pool])


def _steps(state: Path, monkeypatch, at: int | None = None, change=None) -> list[str]:
    """Take a backup of ``state``, calling ``change(state)`` just before the snapshot's step ``at`` (a file linked or
    a database copied); returns the steps it took."""
    steps: list[str] = []
    link, copy = os.link, backup_module._sqlite_copy

    def step(name: str) -> None:
        if len(steps) == at:
            change(state)
        steps.append(name)

    def linking(src, dst, *a, **kw):
        step(f"link {src}")
        return link(src, dst, *a, **kw)

    def copying(src, dst):
        step(f"copy {src}")
        return copy(src, dst)

    monkeypatch.setattr(os, "link", linking)
    monkeypatch.setattr(backup_module, "_sqlite_copy", copying)
    backup(AppConfig(), state, state.parent / "farm.tar.gz")
    monkeypatch.undo()
    return steps


@pytest.mark.parametrize("change", [_reduce, _drop, _discard, _send], ids=["reduced", "dropped", "discarded", "sent"])
def test_every_row_of_a_backup_names_a_photo_it_holds_whenever_during_its_snapshot_a_store_changes_one(
    tmp_path, monkeypatch, season, change
):
    """A photo replaced by its reduced copy, a pseudo-label dropped, a pool photo let go or a queued photo sent while
    the backup lists, links and copies (at each step: each database's copy, each file's link) leaves
    the backup's rows naming photos it holds: a restore trains on and sends every one (before, a row could name a
    file the backup lacked, and the photo was lost)."""
    shutil.copytree(season, tmp_path / "dry" / "state")
    steps = _steps(tmp_path / "dry" / "state", monkeypatch)
    assert sum(s.startswith("copy") for s in steps) == 3 and sum(s.startswith("link") for s in steps) >= 5
    for at in range(len(steps)):  # results, samples and the unlabelled pool copied; the photos (and a key) linked
        state = tmp_path / str(at) / "state"
        shutil.copytree(season, state)
        _steps(state, monkeypatch, at, change)
        _holds_every_photo_its_rows_name(state.parent / "farm.tar.gz", tmp_path / str(at) / "restored")
