"""The pipeline's stages and sink, in-process, with the tiny 3-class store (the label policy, the golden set and the
inbox files have unit tests of their own)."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edge_agent.classifier import Classifier
from edge_agent.config import InboxSection, LabelsSection, PipelineSection, parse_config
from edge_agent.pipeline import Job, Pipeline
from edge_agent.results import ResultsDB
from edge_agent.sources.folder import FolderSource
from edge_agent.spool import Origin, PhotoSpool, QueueFull, SpoolItem
from engines.loader import open_engine

from .conftest import encode, leaf_image
from .daemon_helpers import wait_until


class FixedEngine:
    """Wraps a real engine, overriding the logits so confidence is chosen by the test."""

    def __init__(self, engine, confidence_for=None, block: threading.Event | None = None):
        self._e = engine
        self.confidence_for = confidence_for or (lambda i: 0.99)
        self.block = block
        self.batches: list[int] = []
        self.n = 0

    def __getattr__(self, name):
        return getattr(self._e, name)

    def infer(self, batch):
        if self.block is not None:
            self.block.wait()
        self.batches.append(len(batch))
        out = np.zeros((len(batch), 3), np.float32)
        for row in out:
            c = self.confidence_for(self.n)
            self.n += 1
            # logits giving softmax c on class (n % 3)
            k = (self.n - 1) % 3
            other = (1 - c) / 2
            row[:] = np.log(max(other, 1e-9))
            row[k] = np.log(c)
        return out


@pytest.fixture
def engine(tiny_store):
    cfg = parse_config({}).engine
    with open_engine(tiny_store, cfg) as e:
        yield e


def make_pipeline(tmp_path, engine, policy=None, settings=None, quota=1 << 30, after="move", **kw):
    db = ResultsDB(tmp_path / "results.sqlite")
    spool = PhotoSpool(tmp_path / "queue", quota)
    done, retried = [], []
    p = Pipeline(
        Classifier(engine),
        db,
        spool,
        tmp_path,
        settings or PipelineSection(max_batch=4, max_wait_ms=50),
        policy or LabelsSection(trust_checks=0),
        after,
        on_done=done.append,
        on_retry=retried.append,
        **kw,
    )
    p.start()
    return p, db, done, retried


def drop(folder: Path, n: int, start: int = 0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(start, start + n):
        p = folder / f"leaf_{i:04d}.jpg"
        p.write_bytes(encode(leaf_image(i)))
        paths.append(p)
    return paths


def test_results_and_files_moved(tmp_path, engine):
    p, db, done, _ = make_pipeline(tmp_path, engine)
    paths = drop(tmp_path / "inbox", 10)
    for path in paths:
        p.submit(Job("inbox", path))
    assert p.drain(30)
    rows = list(db.results())
    assert len(rows) == 10 and len({r["sha256"] for r in rows}) == 10
    assert all(r["engine_version"] == "v0001" and "total" in r["timings_ms"] for r in rows)
    assert not any(path.exists() for path in paths)
    assert len(list((tmp_path / "processed").rglob("*.jpg"))) == 10
    assert len(done) == 10
    p.stop()


def test_micro_batching_respects_max_batch(tmp_path, engine):
    fixed = FixedEngine(engine)
    p, db, *_ = make_pipeline(tmp_path, fixed, settings=PipelineSection(max_batch=4, max_wait_ms=200))
    for path in drop(tmp_path / "inbox", 12):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    assert max(fixed.batches) <= 4 and sum(fixed.batches) == 12
    assert len(fixed.batches) < 12  # batching happened
    p.stop()


def test_duplicate_content_gives_one_result(tmp_path, engine):
    p, db, *_ = make_pipeline(tmp_path, engine)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    data = encode(leaf_image(1))
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        (inbox / name).write_bytes(data)
        p.submit(Job("inbox", inbox / name))
    assert p.drain(30)
    assert len(list(db.results())) == 1
    assert p.counters["duplicates"] == 2 and p.counters["processed"] == 1
    p.stop()


def test_bad_photos_are_quarantined_with_reason(tmp_path, engine):
    p, db, *_ = make_pipeline(tmp_path, engine)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "empty.jpg").write_bytes(b"")
    (inbox / "text.jpg").write_text("hello")
    for name in ("empty.jpg", "text.jpg"):
        p.submit(Job("inbox", inbox / name))
    assert p.drain(30)
    import json

    reasons = {f.name: json.loads(f.read_text())["reason"] for f in (tmp_path / "quarantine").glob("*.reason.json")}
    assert reasons == {
        "empty.jpg.reason.json": "empty file (0 bytes)",
        "text.jpg.reason.json": "not a supported image (expected JPEG, PNG, BMP, WebP, TIFF or HEIC)",
    }
    assert (tmp_path / "quarantine" / "empty.jpg").exists()
    assert db.counts()["quarantined"] == 2 and not list(db.results())
    p.stop()


def test_pseudo_label_threshold_cap_and_review(tmp_path, engine):
    confidences = [0.99, 0.95, 0.91, 0.6, 0.3, 0.99, 0.99, 0.99, 0.2]
    fixed = FixedEngine(engine, confidence_for=lambda i: confidences[i])
    p, db, *_ = make_pipeline(
        tmp_path,
        fixed,
        policy=LabelsSection(pseudo_threshold=0.9, per_class_cap=2, review_threshold=0.5, trust_checks=0),
        settings=PipelineSection(max_batch=1, max_wait_ms=0),
    )
    for path in drop(tmp_path / "inbox", len(confidences)):
        p.submit(Job("inbox", path))
        assert p.drain(30)  # one at a time, so classes follow the order
    pseudo = db.queued("pseudo")
    review = db.queued("review")
    # class k = i % 3; >= 0.9 at i=0(k0),1(k1),2(k2),5(k2),6(k0),7(k1): caps of 2 per class allow all six
    assert len(pseudo) == 6
    assert {q.confidence >= 0.9 for q in pseudo} == {True}
    assert len(review) == 2 and all(q.confidence < 0.5 for q in review)
    for q in pseudo + review:
        assert Path(q.file).read_bytes()[:3] == b"\xff\xd8\xff"
    p.stop()


def test_queue_quota_full_keeps_predicting(tmp_path, engine):
    fixed = FixedEngine(engine, confidence_for=lambda i: 0.99)
    p, db, *_ = make_pipeline(tmp_path, fixed, quota=12_000)
    for path in drop(tmp_path / "inbox", 8):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    assert len(list(db.results())) == 8
    assert 0 < len(db.queued("pseudo")) < 8
    assert p.queue_full and p.counters["queue_full_skips"] > 0
    p.stop()


def test_disk_full_on_commit_loses_nothing(tmp_path, engine, monkeypatch):
    p, db, done, retried = make_pipeline(tmp_path, engine)
    real = db.commit
    calls = {"n": 0}

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(db, "commit", failing)
    paths = drop(tmp_path / "inbox", 3)
    for path in paths:
        p.submit(Job("inbox", path))
    assert p.drain(30)
    assert retried and all(path.exists() for path in retried_paths(retried))  # kept in the inbox for a retry
    assert p.counters["sink_errors"] == 1 and "No space" in p.last_errors[-1]["error"]
    for job in list(retried):  # the source retries them
        p.submit(Job("inbox", job.path))
    assert p.drain(30)
    assert len(list(db.results())) == 3
    p.stop()


def test_on_a_read_only_card_the_sink_keeps_the_photos_says_why_and_waits_a_minute_not_a_second(tmp_path, engine, monkeypatch):
    """A card that fails remounts itself read-only: every commit fails, and the stages classified the inbox again every
    second for nothing (on a Pi, all its cores, and a log line a second)."""
    import sqlite3

    from structlog.testing import capture_logs

    import edge_agent.pipeline as pipeline
    import edge_agent.storage_errors as storage_errors

    monkeypatch.setattr(storage_errors, "read_only_disk", lambda path: path == tmp_path)
    monkeypatch.setattr(pipeline, "READ_ONLY_WAIT_S", 3.0)
    p, db, done, retried = make_pipeline(tmp_path, engine)
    tried = []

    def refused(*a, **k):
        tried.append(time.monotonic())
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(db, "commit", refused)
    with capture_logs() as logs:
        for path in drop(tmp_path / "inbox", 2):
            p.submit(Job("inbox", path))
        wait_until(lambda: len(tried) == 1 and len(retried) == 2, 30, "the first batch refused")
        for job in list(retried):  # the source offers them again at once
            p.submit(Job("inbox", job.path))
        wait_until(lambda: len(tried) == 2, 30, "the second try")
    assert tried[1] - tried[0] >= 2.9  # (1 s before)
    assert all(path.exists() for path in retried_paths(retried)) and not list(db.results())
    failed = [e for e in logs if e["event"] == "sink_failed"]
    assert failed and "disk is mounted read-only" in failed[0]["problem"]
    p.stop()


@pytest.mark.parametrize("where", ["commit", "exactly-once check"])
def test_a_damaged_ledger_stops_the_stages_keeps_the_photos_and_is_read_whole_at_the_next_start(tmp_path, engine, monkeypatch, where):
    """A page of the ledger a card rotted (SQLite: "database disk image is malformed") failed every commit: the sink
    tried again every second, the stages classified the inbox again and again, and no photo was ever recorded; met by
    the exactly-once check, it put every photo in quarantine as "internal error while decoding". Now the pipeline says
    so once, keeps the photos in the inbox, tries nothing more, and the ledger forgets its clean close (the daemon then
    stops, and its next start reads the ledger whole and sets it aside)."""
    import sqlite3

    from structlog.testing import capture_logs

    from edge_agent._ledger_file import CLOSED

    p, db, done, retried = make_pipeline(tmp_path, engine)
    closed = tmp_path / f"results.sqlite{CLOSED}"
    closed.write_text("[1, 2, 3]")  # as a clean close leaves it
    tried = []

    def rotted(*a, **k):
        tried.append(1)
        raise sqlite3.DatabaseError("database disk image is malformed")  # (Python 3.10's form: the bare class, no code)

    monkeypatch.setattr(db, "commit" if where == "commit" else "has", rotted)
    with capture_logs() as logs:
        photos = drop(tmp_path / "inbox", 3)
        for path in photos:
            p.submit(Job("inbox", path))
        assert p.drain(30)
        for job in list(retried):  # the source offers them again
            p.submit(Job("inbox", job.path))
        assert p.drain(30)
    assert p.ledger_damaged and "malformed" in p.ledger_damaged and not done
    assert len(tried) <= 3 and all(path.exists() for path in photos)  # (once a batch or photo at most, then nothing)
    assert not list((tmp_path / "quarantine").glob("*")) and not closed.exists()
    assert [e["event"] for e in logs].count("ledger_damaged") == 1
    p.stop()
    db.close()
    assert not closed.exists()  # a close after damage records no clean close


def retried_paths(jobs):
    return [j.path for j in jobs]


def test_spool_full_disk_is_queue_full(tmp_path, monkeypatch):
    spool = PhotoSpool(tmp_path / "q", 1 << 20)

    def nospace(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    import edge_agent.spool as spool_mod

    monkeypatch.setattr(spool_mod, "sync_filesystem", nospace)
    with pytest.raises(QueueFull, match="disk full"):
        spool.put_many([SpoolItem("pseudo", "ab" * 32, b"x" * 100)])
    assert spool.used_bytes == 0 and not list((tmp_path / "q" / "pseudo").iterdir())


def test_inference_failure_retries_photos(tmp_path, engine):
    class Broken(FixedEngine):
        def infer(self, batch):
            raise RuntimeError("GPU fell off the bus")

    p, db, done, retried = make_pipeline(tmp_path, Broken(engine))
    for path in drop(tmp_path / "inbox", 2):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    assert len(retried) == 2 and not done and p.alive()
    assert "GPU fell off the bus" in p.last_errors[-1]["error"]
    p.stop()


def test_back_pressure_bounds_the_queues(tmp_path, engine):
    gate = threading.Event()
    p, *_ = make_pipeline(tmp_path, FixedEngine(engine, block=gate), settings=PipelineSection(max_batch=2, queue_size=2))
    paths = drop(tmp_path / "inbox", 20)
    accepted = sum(p.submit(Job("inbox", path), timeout=0.2) for path in paths)
    assert accepted < 20  # submit blocked: bounded, not buffering everything
    gate.set()
    assert p.drain(30)
    p.stop()


@pytest.mark.parametrize("after", ["delete", "leave"])
def test_after_processing_delete_or_leave(tmp_path, engine, after):
    p, db, done, _ = make_pipeline(tmp_path, engine, settings=None, after=after)
    paths = drop(tmp_path / "inbox", 3)
    for path in paths:
        p.submit(Job("inbox", path))
    assert p.drain(30)
    assert len(list(db.results())) == 3
    assert all(path.exists() for path in paths) == (after == "leave")
    assert not (tmp_path / "processed").exists() or not list((tmp_path / "processed").rglob("*.jpg"))
    # seen again (a restart, or the next rescan): recognised by the ledger, no second result
    if after == "leave":
        for path in paths:
            p.submit(Job("inbox", path))
        assert p.drain(30)
        assert len(list(db.results())) == 3 and p.counters["duplicates"] == 3
    p.stop()


def test_processed_folder_removed_while_running(tmp_path, engine):
    """Someone deletes processed/ (or today's folder) under a running daemon: the next photos recreate it, and a
    photo whose move failed is moved when it is seen again, with no second result."""
    import shutil

    p, db, done, _ = make_pipeline(tmp_path, engine)
    first = drop(tmp_path / "inbox", 2)
    for path in first:
        p.submit(Job("inbox", path))
    assert p.drain(30) and len(list((tmp_path / "processed").rglob("*.jpg"))) == 2
    shutil.rmtree(tmp_path / "processed")
    (tmp_path / "processed").write_text("not a folder")  # the move of the next photo fails
    stuck = drop(tmp_path / "inbox", 1, start=2)
    p.submit(Job("inbox", stuck[0]))
    assert p.drain(30) and stuck[0].exists() and "could not move" in p.last_errors[-1]["error"]
    (tmp_path / "processed").unlink()
    later = drop(tmp_path / "inbox", 2, start=3)
    for path in stuck + later:  # the stuck one comes back through the rescan
        p.submit(Job("inbox", path))
    assert p.drain(30)
    assert not any(path.exists() for path in stuck + later)
    assert len(list((tmp_path / "processed").rglob("*.jpg"))) == 3
    assert len(list(db.results())) == 5 and p.counters["duplicates"] == 1
    p.stop()


@pytest.mark.parametrize("after,linked", [("move", True), ("delete", True), ("leave", False)])
def test_queued_photo_is_hard_linked_only_when_the_daemon_owns_the_file(tmp_path, engine, after, linked):
    fixed = FixedEngine(engine, confidence_for=lambda i: 0.99)
    p, db, *_ = make_pipeline(tmp_path, fixed, settings=PipelineSection(max_batch=1, max_wait_ms=0), after=after)
    (path,) = drop(tmp_path / "inbox", 1)
    ino, data = path.stat().st_ino, path.read_bytes()
    p.submit(Job("inbox", path))
    assert p.drain(30)
    (q,) = db.queued("pseudo")
    st = os.stat(q.file)
    assert (st.st_ino == ino) == linked
    assert Path(q.file).read_bytes() == data
    assert st.st_nlink == (2 if after == "move" else 1)  # move: processed/ and the queue share one copy
    p.stop()


def test_spool_writes_the_bytes_read_when_the_file_changed_since(tmp_path):
    spool = PhotoSpool(tmp_path / "q", 1 << 20)
    photo = tmp_path / "a.jpg"
    photo.write_bytes(b"old bytes")
    st = os.lstat(photo)
    origin = Origin(photo, st.st_ino, st.st_mtime_ns)
    photo.write_bytes(b"new bytes")  # rewritten in place after the read
    os.utime(photo, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (f,) = spool.put_many([SpoolItem("pseudo", "ab" * 32, b"old bytes", ".jpg", origin)])
    assert f.read_bytes() == b"old bytes" and f.stat().st_ino != st.st_ino
    gone = Origin(tmp_path / "vanished.jpg", 1, 1)  # the origin vanished: the bytes are written
    (g,) = spool.put_many([SpoolItem("review", "cd" * 32, b"kept", ".jpg", gone)])
    assert g.read_bytes() == b"kept"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a second filesystem (/dev/shm)")
def test_spool_copies_a_photo_from_another_filesystem(tmp_path):
    """An inbox on a USB stick or a network share: no hard link across filesystems, the bytes are written."""
    import tempfile

    spool = PhotoSpool(tmp_path / "q", 1 << 20)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        photo = Path(other) / "a.jpg"
        photo.write_bytes(b"jpeg bytes")
        if os.stat(other).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm is on the same filesystem here")
        st = os.lstat(photo)
        (f,) = spool.put_many([SpoolItem("pseudo", "ef" * 32, b"jpeg bytes", ".jpg", Origin(photo, st.st_ino, st.st_mtime_ns))])
        assert f.read_bytes() == b"jpeg bytes" and os.stat(f).st_dev != st.st_dev


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="kernel thread names are read from /proc (Linux)")
def test_stage_threads_carry_their_names_in_the_kernel(tmp_path, engine):
    """``top -H`` on a Jetson shows which stage eats the CPU; the daemon benchmark's CPU breakdown relies on it."""

    def kernel_names() -> set[str]:
        return {Path(f"/proc/self/task/{tid}/comm").read_text().strip() for tid in os.listdir("/proc/self/task")}

    p, *_ = make_pipeline(tmp_path, engine, settings=PipelineSection(decode_workers=2))
    (tmp_path / "inbox").mkdir()
    source = FolderSource(tmp_path / "inbox", InboxSection(), lambda arrival: None)
    source.start()
    try:
        assert {"decode-0", "decode-1", "infer", "sink", "source-folder", "watchdog"} <= kernel_names()
    finally:
        source.stop()
        p.stop()


def test_memory_the_start_up_used_is_handed_back_once_idle_before_any_photo(tmp_path, engine):
    """Loading and warming the engine leave arena and heap behind: the first idle spell trims them, photos or not."""

    class Counting(FixedEngine):
        trims = 0

        def trim(self):
            Counting.trims += 1

    p, *_ = make_pipeline(tmp_path, Counting(engine), settings=PipelineSection(idle_trim_s=0.1))
    try:
        wait_until(lambda: Counting.trims == 1, 5, "a trim after start-up")
        time.sleep(0.3)
        assert Counting.trims == 1, "trimmed again with nothing done since"
    finally:
        p.stop()


def test_golden_photos_survive_a_restart_for_the_same_engine_only(tmp_path, engine):
    """The hot-swap agreement check has photos to compare on right after a restart (saved when idle and at stop)."""
    fixed = FixedEngine(engine, confidence_for=lambda i: 0.99)
    p, *_ = make_pipeline(tmp_path, fixed, settings=PipelineSection(max_batch=2, max_wait_ms=0, idle_trim_s=0.2))
    for path in drop(tmp_path / "inbox", 5):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    wait_until(lambda: (tmp_path / "golden.npz").exists(), 5, "golden.npz written")  # written once the pipeline went idle
    before = p.golden.photos()
    p.stop()
    assert len(before) == 5

    again, *_ = make_pipeline(tmp_path, FixedEngine(engine))
    after = again.golden.photos()
    assert [c for _, c in after] == [c for _, c in before]
    assert all(np.allclose(a, b, atol=2e-3) and a.dtype == np.float32 for (a, _), (b, _) in zip(after, before))
    again.stop()

    class Newer(FixedEngine):
        engine_version = "v0099"

    other, *_ = make_pipeline(tmp_path, Newer(engine))
    assert other.golden.photos() == []  # labelled by another engine: not evidence for this one
    other.stop()


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 not really a zip", None])
def test_damaged_golden_file_is_ignored(tmp_path, engine, content):
    f = tmp_path / "golden.npz"
    if content is None:  # a valid archive with the wrong shapes
        np.savez(f, x=np.zeros((2, 3, 8, 8), np.float16), y=np.zeros(2, np.int64), version=np.array("v0001"))
    else:
        f.write_bytes(content)
    p, *_ = make_pipeline(tmp_path, engine)
    assert p.golden.photos() == [] and p.alive()
    p.stop()


def test_a_photo_that_cannot_leave_a_read_only_inbox_says_how_to_open_it(tmp_path, engine, monkeypatch):
    """The hardened systemd unit leaves an inbox outside the state directory read-only unless install-systemd opened
    it: the photo's result is kept, it stays, and the error says what to run."""
    import errno

    p, db, _, _ = make_pipeline(tmp_path, engine)
    monkeypatch.setattr(p.files, "finish", lambda path: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only file system", str(path))))
    [photo] = drop(tmp_path / "inbox", 1)
    p.submit(Job("inbox", photo))
    assert p.drain(30) and photo.exists() and len(list(db.results())) == 1
    assert "run sudo edge-agent install-systemd again to open [inbox] path" in p.last_errors[-1]["error"]
    p.stop()
