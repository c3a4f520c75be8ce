"""The pipeline and the folder source, in-process, with the tiny 3-class store."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edge_agent.classifier import Classifier
from edge_agent.config import parse_config
from edge_agent.labelqueue import Origin, PhotoSpool, QueueFull, SpoolItem
from edge_agent.pipeline import Job, LabelPolicy, Pipeline, PipelineSettings, move_out
from edge_agent.results import ResultsDB
from edge_agent.sources.folder import FolderSettings, FolderSource
from engines.loader import open_engine

from .conftest import encode, leaf_image


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


def make_pipeline(tmp_path, engine, policy=None, settings=None, quota=1 << 30, **kw):
    db = ResultsDB(tmp_path / "results.sqlite")
    spool = PhotoSpool(tmp_path / "queue", quota)
    done, retried = [], []
    p = Pipeline(
        Classifier(engine),
        db,
        spool,
        tmp_path,
        settings or PipelineSettings(max_batch=4, max_wait_ms=50),
        policy or LabelPolicy(),
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
    p, db, *_ = make_pipeline(tmp_path, fixed, settings=PipelineSettings(max_batch=4, max_wait_ms=200))
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
    assert reasons == {"empty.jpg.reason.json": "empty file (0 bytes)", "text.jpg.reason.json": "not a supported image (expected JPEG, PNG, BMP, WebP, TIFF or HEIC)"}
    assert (tmp_path / "quarantine" / "empty.jpg").exists()
    assert db.counts()["quarantined"] == 2 and not list(db.results())
    p.stop()


def test_pseudo_label_threshold_cap_and_review(tmp_path, engine):
    confidences = [0.99, 0.95, 0.91, 0.6, 0.3, 0.99, 0.99, 0.99, 0.2]
    fixed = FixedEngine(engine, confidence_for=lambda i: confidences[i])
    p, db, *_ = make_pipeline(tmp_path, fixed, policy=LabelPolicy(0.9, per_class_cap=2, review_threshold=0.5),
                              settings=PipelineSettings(max_batch=1, max_wait_ms=0))
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


def test_per_class_cap_stops_queuing(tmp_path, engine):
    fixed = FixedEngine(engine, confidence_for=lambda i: 0.99)
    p, db, *_ = make_pipeline(tmp_path, fixed, policy=LabelPolicy(0.9, per_class_cap=1), settings=PipelineSettings(max_batch=1, max_wait_ms=0))
    for path in drop(tmp_path / "inbox", 9):
        p.submit(Job("inbox", path))
        assert p.drain(30)
    assert len(db.queued("pseudo")) == 3  # one per class
    assert len(list(db.results())) == 9
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


def retried_paths(jobs):
    return [j.path for j in jobs]


def test_spool_full_disk_is_queue_full(tmp_path, monkeypatch):
    spool = PhotoSpool(tmp_path / "q", 1 << 20)

    def nospace(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", nospace)
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
    p, *_ = make_pipeline(tmp_path, FixedEngine(engine, block=gate), settings=PipelineSettings(max_batch=2, queue_size=2))
    paths = drop(tmp_path / "inbox", 20)
    accepted = sum(p.submit(Job("inbox", path), timeout=0.2) for path in paths)
    assert accepted < 20  # submit blocked: bounded, not buffering everything
    gate.set()
    assert p.drain(30)
    p.stop()


# ---- folder source --------------------------------------------------------------
class Collector:
    def __init__(self):
        self.items = []

    def __call__(self, arrival):
        self.items.append(arrival)

    def names(self):
        return sorted(a.path.name for a in self.items)


def run_source(inbox: Path, **settings) -> tuple[FolderSource, Collector]:
    c = Collector()
    s = FolderSource(inbox, FolderSettings(**{"settle_s": 0.3, "poll_s": 0.05, "rescan_interval_s": 1.0, **settings}), c)
    s.start()
    return s, c


def wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_folder_backlog_subfolders_and_ignored_files(tmp_path):
    inbox = tmp_path / "inbox"
    (inbox / "field_a").mkdir(parents=True)
    (inbox / "backlog.jpg").write_bytes(b"1")
    src, c = run_source(inbox)
    try:
        (inbox / "field_a" / "leaf.JPG").write_bytes(b"2")
        (inbox / "scan.tif").write_bytes(b"7")  # a scanner's TIFF is read like any photo
        (inbox / ".hidden.jpg").write_bytes(b"3")
        (inbox / "download.jpg.part").write_bytes(b"4")
        (inbox / "notes.txt").write_text("5")
        (inbox / ".cache").mkdir()
        (inbox / ".cache" / "x.jpg").write_bytes(b"6")
        assert wait_for(lambda: len(c.items) >= 3)
        time.sleep(1.5)  # one rescan later: nothing more
        assert c.names() == ["backlog.jpg", "leaf.JPG", "scan.tif"]
        assert src.unsupported == {".txt": 1}  # counted once, although rescanned; hidden and temporary files are not
    finally:
        src.stop()


def test_rsync_style_temp_then_rename(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    src, c = run_source(inbox)
    try:
        tmp = inbox / ".photo.jpg.Xy12Ab"
        tmp.write_bytes(b"partial")
        time.sleep(0.6)
        assert c.items == []
        tmp.rename(inbox / "photo.jpg")
        assert wait_for(lambda: c.names() == ["photo.jpg"])
    finally:
        src.stop()


def test_settle_pass_reports_when_to_look_again(tmp_path):
    """The source sleeps only until the next candidate is due, and not at all after a hand-over,
    so a burst flows into the pipeline without idle gaps of ``poll_s``."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    c = Collector()
    src = FolderSource(inbox, FolderSettings(settle_s=0.3, poll_s=5.0), c)
    (inbox / "a.jpg").write_bytes(b"1")
    src.notice(inbox / "a.jpg")
    first = src._settle()  # first look: size recorded, due one settle time later
    assert 0.25 <= first <= 0.3 and c.items == []
    time.sleep(0.1)
    assert 0.1 <= src._settle() <= 0.21  # still settling: due in what is left, not poll_s
    time.sleep(0.25)
    assert src._settle() == 0.0 and c.names() == ["a.jpg"]  # handed over: look again at once
    assert src._settle() == 5.0  # nothing pending: poll_s


def test_slow_writer_is_not_read_until_settled(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    src, c = run_source(inbox)
    try:
        path = inbox / "slow.jpg"
        with open(path, "wb") as f:
            for _ in range(8):
                f.write(b"x" * 1000)
                f.flush()
                time.sleep(0.15)
                assert c.items == []  # still growing
        assert wait_for(lambda: c.names() == ["slow.jpg"])
        assert path.stat().st_size == 8000
    finally:
        src.stop()


def test_symlink_out_of_inbox_is_refused(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"x")
    (inbox / "inside.jpg").write_bytes(b"y")
    src, c = run_source(inbox)
    try:
        (inbox / "evil.jpg").symlink_to(secret)
        (inbox / "ok_link.jpg").symlink_to(inbox / "inside.jpg")
        assert wait_for(lambda: len(c.items) == 3)
        by = {a.path.name: a.refused for a in c.items}
        assert "outside the inbox" in by["evil.jpg"]
        assert by["ok_link.jpg"] is None and by["inside.jpg"] is None
    finally:
        src.stop()


def test_rescan_catches_missed_events(tmp_path, monkeypatch):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    src, c = run_source(inbox)
    try:
        src._observer.stop()  # the OS drops every event from now on
        src._observer.join()
        (inbox / "missed.jpg").write_bytes(b"x")
        assert wait_for(lambda: c.names() == ["missed.jpg"], timeout=5)
    finally:
        src.stop()


def test_release_keep_does_not_offer_again(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jpg").write_bytes(b"x")
    src, c = run_source(inbox)
    try:
        assert wait_for(lambda: len(c.items) == 1)
        src.release(inbox / "a.jpg", keep=True)
        time.sleep(1.5)
        assert len(c.items) == 1
        (inbox / "a.jpg").write_bytes(b"changed content")
        assert wait_for(lambda: len(c.items) == 2)
    finally:
        src.stop()


@pytest.mark.parametrize("after", ["delete", "leave"])
def test_after_processing_delete_or_leave(tmp_path, engine, after):
    p, db, done, _ = make_pipeline(tmp_path, engine, settings=PipelineSettings(after=after))
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


def test_cap_holds_within_one_batch(tmp_path, engine):
    class OneClass(FixedEngine):
        def infer(self, batch):
            out = np.full((len(batch), 3), -10.0, np.float32)
            out[:, 0] = 10.0  # every photo: class 0 at ~1.0
            return out

    p, db, *_ = make_pipeline(tmp_path, OneClass(engine), policy=LabelPolicy(0.9, per_class_cap=2),
                              settings=PipelineSettings(max_batch=8, max_wait_ms=500))
    for path in drop(tmp_path / "inbox", 8):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    assert len(db.queued("pseudo")) == 2 and len(list(db.results())) == 8
    p.stop()


def test_folder_source_backs_off_a_second_after_an_error(tmp_path, monkeypatch):
    """A failing pass (e.g. the inbox vanished) is logged and retried once a second, not every poll."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    calls = []

    def broken(self):
        calls.append(time.monotonic())
        raise OSError("inbox vanished")

    monkeypatch.setattr(FolderSource, "_settle", broken)
    src, _ = run_source(inbox)  # poll_s 0.05
    try:
        time.sleep(1.5)
    finally:
        src.stop()
    assert 1 <= len(calls) <= 3, f"{len(calls)} failing passes in 1.5 s"


@pytest.mark.parametrize("after,linked", [("move", True), ("delete", True), ("leave", False)])
def test_queued_photo_is_hard_linked_only_when_the_daemon_owns_the_file(tmp_path, engine, after, linked):
    fixed = FixedEngine(engine, confidence_for=lambda i: 0.99)
    p, db, *_ = make_pipeline(tmp_path, fixed, settings=PipelineSettings(max_batch=1, max_wait_ms=0, after=after))
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

    p, *_ = make_pipeline(tmp_path, engine, settings=PipelineSettings(decode_workers=2))
    (tmp_path / "inbox").mkdir()
    source, _ = run_source(tmp_path / "inbox")
    try:
        assert {"decode-0", "decode-1", "infer", "sink", "source-folder", "watchdog"} <= kernel_names()
    finally:
        source.stop()
        p.stop()


def test_golden_photos_survive_a_restart_for_the_same_engine_only(tmp_path, engine):
    """The hot-swap agreement check has photos to compare on right after a restart (saved when idle and at stop)."""
    fixed = FixedEngine(engine, confidence_for=lambda i: 0.99)
    p, *_ = make_pipeline(tmp_path, fixed, settings=PipelineSettings(max_batch=2, max_wait_ms=0, idle_trim_s=0.2))
    for path in drop(tmp_path / "inbox", 5):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    wait_for(lambda: (tmp_path / "golden.npz").exists(), 5)  # written once the pipeline went idle
    before = p.golden()
    p.stop()
    assert len(before) == 5

    again, *_ = make_pipeline(tmp_path, FixedEngine(engine))
    after = again.golden()
    assert [c for _, c in after] == [c for _, c in before]
    assert all(np.allclose(a, b, atol=2e-3) and a.dtype == np.float32 for (a, _), (b, _) in zip(after, before))
    again.stop()

    class Newer(FixedEngine):
        engine_version = "v0099"

    other, *_ = make_pipeline(tmp_path, Newer(engine))
    assert other.golden() == []  # labelled by another engine: not evidence for this one
    other.stop()


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 not really a zip", None])
def test_damaged_golden_file_is_ignored(tmp_path, engine, content):
    f = tmp_path / "golden.npz"
    if content is None:  # a valid archive with the wrong shapes
        np.savez(f, x=np.zeros((2, 3, 8, 8), np.float16), y=np.zeros(2, np.int64), version=np.array("v0001"))
    else:
        f.write_bytes(content)
    p, *_ = make_pipeline(tmp_path, engine)
    assert p.golden() == [] and p.alive()
    p.stop()


def test_the_daemons_own_reads_and_moves_raise_no_folder_events(tmp_path):
    """Reading a photo and moving it out must not wake the folder source (each event is a dispatch and a stat)."""
    inbox, processed = tmp_path / "inbox", tmp_path / "processed"
    inbox.mkdir(), processed.mkdir()
    src, c = run_source(inbox, rescan_interval_s=60)
    calls = []
    real_notice = src.notice
    src.notice = lambda p: (calls.append(p.name), real_notice(p))
    try:
        photo = inbox / "leaf.jpg"
        photo.write_bytes(encode(leaf_image(1)))
        assert wait_for(lambda: c.names() == ["leaf.jpg"])
        time.sleep(0.3)
        before = len(calls)
        assert before >= 1  # the arrival itself was an event
        for _ in range(3):
            photo.read_bytes()
        move_out(photo, processed)
        time.sleep(1.0)  # longer than watchdog's half-second wait to pair a rename out
        assert calls[before:] == []
    finally:
        src.stop()


def test_move_out_picks_a_free_name_and_survives_a_crash_between_link_and_unlink(tmp_path):
    inbox, processed = tmp_path / "inbox", tmp_path / "processed"
    inbox.mkdir(), processed.mkdir()
    (processed / "leaf.jpg").write_bytes(b"an older photo of the same name")
    photo = inbox / "leaf.jpg"
    photo.write_bytes(b"new")
    assert move_out(photo, processed) == processed / "leaf-1.jpg"
    assert not photo.exists() and (processed / "leaf-1.jpg").read_bytes() == b"new"
    assert (processed / "leaf.jpg").read_bytes() == b"an older photo of the same name"
    again = inbox / "leaf.jpg"  # linked, then the power went: the same file under both names
    again.write_bytes(b"newer")
    os.link(again, processed / "leaf-2.jpg")
    assert move_out(again, processed) == processed / "leaf-2.jpg"
    assert not again.exists() and sorted(p.name for p in processed.iterdir()) == ["leaf-1.jpg", "leaf-2.jpg", "leaf.jpg"]


@pytest.mark.parametrize("err, how", [(errno.EPERM, "rename"), (errno.EXDEV, "copy")])
def test_move_out_without_hard_links_or_across_filesystems(tmp_path, monkeypatch, err, how):
    """FAT or fs.protected_hardlinks (EPERM): rename; the inbox on another filesystem (EXDEV): copy and delete."""
    import edge_agent.pipeline as pipeline_mod

    inbox, processed = tmp_path / "inbox", tmp_path / "processed"
    inbox.mkdir(), processed.mkdir()
    (processed / "leaf.jpg").write_bytes(b"taken")
    photo = inbox / "leaf.jpg"
    photo.write_bytes(b"photo")
    used = []

    def no_link(*a, **k):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(pipeline_mod.os, "link", no_link)
    real_rename, real_move = pipeline_mod.os.rename, pipeline_mod.shutil.move
    monkeypatch.setattr(pipeline_mod.os, "rename", lambda *a: (used.append("rename"), real_rename(*a))[1])
    monkeypatch.setattr(pipeline_mod.shutil, "move", lambda *a: (used.append("copy"), real_move(*a))[1])
    assert move_out(photo, processed) == processed / "leaf-1.jpg"
    assert used[0] == how and not photo.exists()  # (shutil.move itself tries a rename first) and (processed / "leaf-1.jpg").read_bytes() == b"photo"
