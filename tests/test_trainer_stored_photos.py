"""The trainer keeps every photo at the size training needs, whoever sent it: a photo larger than ``[handoff]
photo_side`` that a device sent as taken (one from before its hand-off reduced photos, or with ``photo_side = 0``) is
stored reduced, and photos stored larger before are reduced once, between retrains, keeping their ids and labels."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import cv2
import pytest
from structlog.testing import capture_logs

from edge_agent.capture import read_capture
from edge_agent.config import HandoffSection
from edge_agent.handoff.protocol import encode
from edge_agent.handoff.reduce import reduced
from edge_agent.handoff.transport import Link
from edge_agent.imageheader import read_header
from edge_agent.log import get_logger
from trainer.loop import stored_photos
from trainer.loop.stored_photos import DONE_KEY, StoredPhotos
from trainer.loop.unlabelled_pool import UnlabelledPool
from trainer.receiver import Receiver
from trainer.samples import SampleStore

from .test_handoff import Wire
from .test_handoff_reduce import _jpeg, _scene


@pytest.fixture(scope="module")
def phone_photo() -> bytes:
    """A 2400 x 1800 JPEG stored sideways with a position and a time in its EXIF, as a phone takes it."""
    return _jpeg(_scene(1800, 2400), orientation=6)


def _header(data: bytes, kind: str = "expert", label: str = "Apple___Apple_scab", ext: str = ".jpg") -> dict:
    sha = hashlib.sha256(data).hexdigest()
    return {"id": sha, "kind": kind, "label": label, "confidence": 1.0, "engine_version": "v0001", "ext": ext, "verdict": "unsure"}


def _receive(receiver: Receiver, header: dict, data: bytes) -> str:
    router = Wire(routed=True)
    receiver._handle(router, [b"peer", *encode("sample", header, data)])
    [answer] = router
    return answer.kind


@pytest.mark.parametrize("side", [1024, 0])
def test_a_phone_photo_a_device_sent_as_taken_is_stored_reduced_under_the_devices_id(tmp_path, phone_photo, side):
    store, pool = SampleStore(tmp_path), UnlabelledPool(tmp_path, 100, 1 << 30)
    receiver = Receiver(store, HandoffSection(photo_side=side), Link("ipc://unused", "ipc://unused2"), pool=pool)
    unlabelled = _jpeg(_scene(1800, 2400, seed=8))
    small = _jpeg(_scene(600, 800, seed=6))
    for data, kind in ((phone_photo, "expert"), (small, "expert"), (unlabelled, "unlabelled")):
        assert _receive(receiver, _header(data, kind), data) == "ack"
    got = {s.id: Path(s.file).read_bytes() for s in store.all()}
    [held] = pool.photos()
    assert got[_header(small)["id"]] == small  # no larger than the side: as sent
    big, other = got[_header(phone_photo)["id"]], Path(held.file).read_bytes()
    assert held.id == _header(unlabelled)["id"] and held.bytes == len(other)
    if side:
        assert big == reduced(phone_photo, side, keep_exif=True)[0] and len(big) < len(phone_photo) / 2
        assert read_capture(big, time.time()).place is not None  # what the device chose to send is kept
        assert min(read_header(big).width, read_header(big).height) == side
        assert other == reduced(unlabelled, side, keep_exif=True)[0]
    else:
        assert (big, other) == (phone_photo, unlabelled)  # photo_side = 0: as sent, byte for byte
    before = Path(store.all()[0].file).stat().st_mtime_ns
    assert _receive(receiver, _header(phone_photo, label="Apple___Black_rot"), phone_photo) == "ack"  # the expert put it right
    assert {s.label for s in store.all() if s.id == _header(phone_photo)["id"]} == {"Apple___Black_rot"}
    assert Path(store.all()[0].file).stat().st_mtime_ns == before  # stored already: not reduced again
    pool.close()


def test_a_photo_the_trainer_fails_to_reduce_is_stored_as_sent_and_acknowledged(tmp_path, phone_photo, monkeypatch):
    from trainer import receiver as receiver_module

    def broken(*a, **kw):
        raise ValueError("a decoder's bug")

    monkeypatch.setattr(receiver_module, "reduced", broken)
    store = SampleStore(tmp_path)
    receiver = Receiver(store, HandoffSection(), Link("ipc://unused", "ipc://unused2"))
    with capture_logs() as logs:
        assert _receive(receiver, _header(phone_photo), phone_photo) == "ack"
    [sample] = store.all()
    assert Path(sample.file).read_bytes() == phone_photo and receiver.store_problem is None
    assert [e["error"] for e in logs if e["event"] == "photo_not_reduced"] == ["ValueError: a decoder's bug"]


def test_damaged_phone_photos_are_each_stored_and_acknowledged_never_left_unstored(tmp_path, phone_photo):
    """Bytes flipped in the EXIF block or the picture, or the photo cut short: each is kept, reduced or as sent."""
    import random

    rng = random.Random(7)
    store = SampleStore(tmp_path)
    receiver = Receiver(store, HandoffSection(), Link("ipc://unused", "ipc://unused2"))
    for i in range(48):
        b = bytearray(phone_photo)
        if i % 3 == 0:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(2, 400)] = rng.randrange(256)
        elif i % 3 == 1:
            b = b[: rng.randrange(10, len(b))]
        else:
            for _ in range(rng.randint(1, 20)):
                b[rng.randrange(2, len(b))] = rng.randrange(256)
        assert _receive(receiver, _header(bytes(b)), bytes(b)) == "ack"
    assert len(store.all()) == 48 and receiver.counters["store_errors"] == 0 and receiver.store_problem is None
    sizes = [Path(s.file).stat().st_size for s in store.all()]
    assert min(sizes) < len(phone_photo) / 2  # most were still reduced


def _stored(tmp_path, phone_photo):
    """A label store and pool as a trainer from before left them: a phone JPEG, a phone PNG, a small photo and an
    undecodable one labelled; a phone photo in the pool."""
    store, pool = SampleStore(tmp_path), UnlabelledPool(tmp_path, 100, 1 << 30)
    png = cv2.imencode(".png", _scene(1500, 2000, seed=9))[1].tobytes()
    small, junk = _jpeg(_scene(600, 800, seed=6)), b"\xff\xd8\xff\xe0 half a photo"
    photos = {"jpeg": (phone_photo, ".jpg"), "png": (png, ".png"), "small": (small, ".jpg"), "junk": (junk, ".jpg")}
    for name, (data, ext) in photos.items():
        assert store.add(_header(data, "expert" if name != "small" else "pseudo", ext=ext), data)
    unlabelled = _jpeg(_scene(1800, 2400, seed=8))
    assert pool.add(_header(unlabelled, "unlabelled"), unlabelled)
    return store, pool, {**{k: v[0] for k, v in photos.items()}, "pool": unlabelled}


def test_photos_stored_larger_before_are_reduced_once_keeping_their_ids_and_labels(tmp_path, phone_photo):
    store, pool, sent = _stored(tmp_path, phone_photo)
    labels = {s.id: (s.kind, s.label) for s in store.all()}
    dirty = sorted(p.name for p in (tmp_path / "samples").iterdir())
    shrink = StoredPhotos(store, pool, 1024, get_logger("test"))
    shrink.step(budget_s=0.0)  # one photo a step at least: listed, not all done
    assert shrink.status()["left"] == 4 and not shrink.done
    while not shrink.done:
        shrink.step()
    assert shrink.status() is None and store.get_state(DONE_KEY) == "1024"
    rows = {s.id: s for s in store.all()}
    assert {i: (s.kind, s.label) for i, s in rows.items()} == labels  # ids and labels as they were
    for name in ("jpeg", "png"):
        row = rows[_header(sent[name])["id"]]
        data = Path(row.file).read_bytes()
        assert row.file.endswith(".jpg") and data == reduced(sent[name], 1024, keep_exif=True)[0]
    for name in ("small", "junk"):  # no larger, or not decodable: as they were
        assert Path(rows[_header(sent[name])["id"]].file).read_bytes() == sent[name]
    [held] = pool.photos()
    assert Path(held.file).read_bytes() == reduced(sent["pool"], 1024, keep_exif=True)[0] and held.bytes == Path(held.file).stat().st_size
    left = sorted(p.name for p in (tmp_path / "samples").iterdir())
    assert len(left) == len(dirty) and not any(n.endswith(".png") for n in left)  # the PNG replaced, nothing left over
    assert shrink.reduced == 3 and shrink.bytes_after < shrink.bytes_before / 4
    assert StoredPhotos(store, pool, 1024, get_logger("test")).done  # a restart does not check them again
    again = StoredPhotos(store, pool, 512, get_logger("test"))  # ...unless the side was made smaller
    assert not again.done
    again.step(budget_s=60)
    assert again.done and again.reduced == 4  # the three, and the small photo (800 x 600) now larger than the side
    pool.close()


def test_photo_side_0_reduces_nothing_stored(tmp_path, phone_photo):
    store, pool, sent = _stored(tmp_path, phone_photo)
    shrink = StoredPhotos(store, pool, 0, get_logger("test"))
    shrink.step(budget_s=60)
    assert shrink.done and shrink.reduced == 0 and store.get_state(DONE_KEY) is None
    assert sorted(Path(s.file).read_bytes() for s in store.all()) == sorted(sent[k] for k in ("jpeg", "png", "small", "junk"))
    pool.close()


def test_a_photo_deleted_or_evicted_during_the_pass_leaves_no_file_and_loses_none(tmp_path, phone_photo):
    store, pool, sent = _stored(tmp_path, phone_photo)
    shrink = StoredPhotos(store, pool, 1024, get_logger("test"))
    shrink.step(budget_s=0.0)  # listed, and the oldest (the phone JPEG) reduced
    assert shrink.reduced == 1
    rows = {s.id: s for s in store.all()}
    png = rows[_header(sent["png"])["id"]]
    store._db.execute("DELETE FROM samples WHERE id = ?", (png.id,))  # dropped meanwhile (as an old pseudo-label is)
    [held] = pool.photos()
    pool.discard(held.id)  # labelled meanwhile: it leaves the pool
    Path(rows[_header(sent["junk"])["id"]].file).unlink()  # a file gone under the pass
    while not shrink.done:
        shrink.step()
    assert not (tmp_path / "samples" / f"{png.id}.jpg").exists()  # no copy written for a row that is gone
    assert not list((tmp_path / "unlabelled").iterdir())
    assert shrink.reduced == 1 and {s.id for s in store.all()} == {_header(sent[k])["id"] for k in ("jpeg", "small", "junk")}
    # a row that moved to another file keeps it, and the copy is removed
    store2, pool2, sent2 = _stored(tmp_path / "b", phone_photo)
    row = next(s for s in store2.all() if s.id == _header(sent2["png"])["id"])
    assert not store2.replace_photo(row.id, "/elsewhere/old.png", b"copy", ".jpg")
    assert not (tmp_path / "b" / "samples" / f"{row.id}.jpg").exists() and Path(row.file).read_bytes() == sent2["png"]
    pool.close()
    pool2.close()


def test_a_full_disk_stops_the_pass_with_every_photo_kept_and_it_runs_again_later(tmp_path, phone_photo, monkeypatch, capsys):
    store, pool, sent = _stored(tmp_path, phone_photo)
    import engines.durable

    real = engines.durable.atomic_write

    def full(path, data, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(engines.durable, "atomic_write", full)
    shrink = StoredPhotos(store, pool, 1024, get_logger("test"))
    with capture_logs() as logs:
        shrink.step(budget_s=60)
    assert not shrink.done and store.get_state(DONE_KEY) is None
    paused = shrink.status()
    assert "No space left" in paused["paused"] and 590 <= paused["again_in_s"] <= 600  # what status says meanwhile
    from trainer.cli import main

    (tmp_path / "state" / "trainer").mkdir(parents=True)
    status = {"pid": os.getpid(), "updated": time.time(), "state": "idle", "reducing_photos": paused}
    (tmp_path / "state" / "trainer" / "status.json").write_text(json.dumps(status))
    main(["status", "--state-dir", str(tmp_path / "state")])
    said = capsys.readouterr().out
    assert "reducing stored photos to [handoff] photo_side: paused (OSError: [Errno 28] No space left on device" in said
    assert f"tried again in {paused['again_in_s']} s" in said
    [said] = [e for e in logs if e["event"] == "stored_photo_not_reduced"]
    assert "No space left" in said["error"] and said["next"] == "in 600 s" and said["log_level"] == "warning"
    assert sorted(Path(s.file).read_bytes() for s in store.all()) == sorted(sent[k] for k in ("jpeg", "png", "small", "junk"))
    assert not [p for p in (tmp_path / "samples").iterdir() if p.name.startswith(".tmp")]
    shrink.step(budget_s=60)
    assert shrink.reduced == 0  # not before the retry time
    monkeypatch.setattr(engines.durable, "atomic_write", real)
    monkeypatch.setattr(stored_photos, "_RETRY_S", 0.0)
    shrink._not_before = 0.0
    shrink.step(budget_s=60)
    assert shrink.done and shrink.reduced == 3
    pool.close()


def test_a_locked_database_stops_the_pass_and_a_photo_that_fails_alone_stays_as_it_is(tmp_path, phone_photo, monkeypatch):
    store, pool, sent = _stored(tmp_path, phone_photo)
    shrink = StoredPhotos(store, pool, 1024, get_logger("test"))
    real = SampleStore.replace_photo

    def locked(*a, **kw):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(SampleStore, "replace_photo", locked)
    with capture_logs() as logs:
        shrink.step(budget_s=60)  # (the service's loop would have died of it)
    assert not shrink.done and [e["next"] for e in logs if e["event"] == "stored_photo_not_reduced"] == ["in 600 s"]
    monkeypatch.setattr(SampleStore, "replace_photo", real)
    odd = _header(sent["png"])["id"]

    def fails_on_the_png(data, side, keep_exif=False):
        if hashlib.sha256(data).hexdigest() == odd:
            raise ValueError("a decoder's bug")
        return reduced(data, side, keep_exif)

    monkeypatch.setattr(stored_photos, "reduced", fails_on_the_png)
    shrink._not_before = 0.0
    with capture_logs() as logs:
        shrink.step(budget_s=60)
    assert shrink.done and shrink.reduced == 2  # the phone JPEG and the pool's photo
    assert [e["kept"] for e in logs if e["event"] == "stored_photo_not_reduced"] == ["as it is"]
    assert next(Path(s.file).read_bytes() for s in store.all() if s.id == odd) == sent["png"]
    pool.close()


def test_the_trainer_steps_the_pass_between_retrains_and_says_so_in_its_status(tmp_path, phone_photo, monkeypatch, capsys):
    """The service's loop runs the pass, never while a retrain runs (the loop runs one or the other), and its status
    says how far it is."""
    from edge_agent.config import parse_config
    from trainer import service
    from trainer.cli import main

    _stored(tmp_path / "trainer", phone_photo)[1].close()
    svc = service.TrainerService(parse_config({}), tmp_path)
    assert svc.status()["reducing_photos"] is None  # not begun
    svc.stored_photos.step(budget_s=0.0)
    assert svc.status()["reducing_photos"]["left"] == 4
    (tmp_path / "trainer" / "status.json").write_text(json.dumps({**svc.status(), "pid": os.getpid()}))
    main(["status", "--state-dir", str(tmp_path)])
    said = capsys.readouterr().out
    assert "reducing stored photos to [handoff] photo_side: 4 left to check, 1 reduced (" in said and "MiB freed so far" in said
    states, real_step = [], StoredPhotos.step

    def step(self, budget_s=0.5):
        states.append(svc.state)
        real_step(self, budget_s=0.0)

    def retrain():
        svc.state = "training"
        svc.state = "idle"

    monkeypatch.setattr(StoredPhotos, "step", step)
    monkeypatch.setattr(svc, "_start_now", lambda requested: True)  # a retrain every turn of the loop
    monkeypatch.setattr(svc, "_retrain_once", retrain)
    runner = threading.Thread(target=svc.run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while not svc.stored_photos.done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.stored_photos.done and svc.stored_photos.reduced == 3 and set(states) == {"idle"}
        assert svc.status()["reducing_photos"] is None and svc.samples.get_state(DONE_KEY) == "1024"
    finally:
        svc.request_stop()
        runner.join(10)
