"""A retrain starts only where the disk has room for its version, says what it waits for, and a retrain that failed
on a full disk waits for room, not for new samples."""

from __future__ import annotations

import errno
import shutil

from edge_agent.config import parse_config
from trainer import _child, service
from trainer.loop.room import MARGIN, RoomWatch, room_needed

_SAMPLE = {"kind": "expert", "label": "x", "confidence": 1.0, "engine_version": "v0001", "ext": ".jpg"}


def _service(tmp_path, free: list[int]):
    svc = service.TrainerService(parse_config({"trainer": {"retrain_threshold": 1, "field_check_every": 0}}), tmp_path)
    svc.room._free = lambda _root: free[0]
    svc.samples.add({"id": "a" * 64, **_SAMPLE}, b"x")
    return svc


def test_room_needed_is_the_version_in_service_where_it_is_built_and_where_it_is_published_and_a_margin(tmp_path):
    """Built in the temporary folder, then published into the store: twice the version on one disk, once on each of two."""
    import os
    from pathlib import Path

    import pytest

    svc = _service(tmp_path, [0])
    folder = svc.store.root / svc.store.current()
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    (tmp_path / "tmp").mkdir()
    assert size > 1 << 20 and room_needed(svc.store, tmp_path / "tmp") == {svc.store.root: 2 * size + MARGIN}
    other = Path("/dev/shm")  # a RAM disk: another disk than the test's folder
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        svc.samples.close()
        pytest.skip("no second disk here")
    assert room_needed(svc.store, other) == {svc.store.root: size + MARGIN, other: size + MARGIN}
    room = RoomWatch(svc.store, svc.log, free=lambda p: (10 << 30) if p == svc.store.root else 1 << 20, temp=other)
    assert room.check().startswith("the disk of /dev/shm (where a retrain builds its version) is full: a retrain writes about")
    svc.samples.close()


def test_a_retrain_due_on_a_full_disk_waits_for_room_says_so_and_starts_once_there_is_room(tmp_path):
    free = [1 << 20]
    svc = _service(tmp_path, free)
    assert not svc._start_now(False) and not svc._start_now(True)  # due, even asked for: no room for its version
    why = svc.status()["waiting_for_room"]
    assert why.startswith("the disk is full: a retrain writes about ") and "1 MiB is free" in why and "the labels wait" in why
    said = svc._describe()  # what each device's status shows of its trainer, and its alerts read
    assert said["state"] == "waiting for room: disk full" and said["waits_for_room"] is True
    free[0] = 10 << 30
    assert svc._start_now(False) and svc.status()["waiting_for_room"] is None
    assert svc._describe()["state"] == "idle" and svc._describe()["waits_for_room"] is False
    svc.samples.close()


def test_the_wait_for_room_is_logged_once_when_it_starts_and_once_when_it_ends(tmp_path):
    said = []

    class Log:
        def warning(self, event, **kw):
            said.append(event)

        def info(self, event, **kw):
            said.append(event)

    svc = _service(tmp_path, [0])
    free = [1 << 20]
    room = RoomWatch(svc.store, Log(), free=lambda _root: free[0])
    for f in (1 << 20, 2 << 20, 3 << 20, 10 << 30, 11 << 30, 1 << 20):
        free[0] = f
        room.check()
    assert said == ["retrain_waits_for_room", "retrain_room_again", "retrain_waits_for_room"]
    svc.samples.close()


def test_a_retrain_that_failed_on_a_full_disk_waits_for_twice_the_room_not_for_new_samples(tmp_path, monkeypatch):
    """The same samples are retrained once there is room (a failure for another reason waits for new ones: they
    might be its cause); the room asked after such a failure is twice what it started with, then as before."""
    free = [10 << 30]
    svc = _service(tmp_path, free)
    [need] = room_needed(svc.store).values()  # (one disk here: the store's and the temporary folder's)

    def full(*a, **k):
        raise _child.RetrainDiskFull("OSError(28, 'No space left on device')")

    monkeypatch.setattr(service, "retrain_in_child", full)
    assert svc._start_now(False)
    svc._retrain_once()
    assert svc.last.reason.startswith("failed: the disk is full") and svc._due()  # not held for new samples
    free[0] = need + (need >> 1)  # what it started with, and more: not enough after a failure
    assert not svc._start_now(False) and svc.status()["waiting_for_room"]
    free[0] = 2 * need
    assert svc._start_now(False)
    monkeypatch.setattr(service, "retrain_in_child", lambda *a, **k: service.RetrainResult(None, "refused", {}, 1, 1.0))
    svc._retrain_once()
    free[0] = need
    assert svc._start_now(False)  # back to a version's room once a retrain ran to its end
    svc.samples.close()


def test_a_retrains_failure_is_for_want_of_room_by_its_code_or_by_a_disk_left_nearly_full(tmp_path, monkeypatch):
    """torch and ONNX say a full disk in words alone (PytorchStreamWriter failed writing file): a disk left with less
    than the margin free counts as the cause; another failure on a disk with room does not."""
    assert _child._for_want_of_room(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    words = RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/7")
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(_child.shutil, "disk_usage", lambda _p: usage._replace(free=1 << 20))
    assert _child._for_want_of_room(words, tmp_path)
    monkeypatch.setattr(_child.shutil, "disk_usage", lambda _p: usage._replace(free=10 << 30))
    assert not _child._for_want_of_room(words, tmp_path) and not _child._for_want_of_room(MemoryError(), tmp_path)
