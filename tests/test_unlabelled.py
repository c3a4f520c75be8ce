"""Photos nobody labelled reach the trainer: the day's share chosen for coverage, a bounded pool that is fair between
devices and survives restarts, labels first."""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")

from edge_agent.config import HandoffSection  # noqa: E402
from edge_agent.handoff.transport import Link  # noqa: E402
from edge_agent.handoff.unlabelled import allowed_by, choose, start_of_day  # noqa: E402
from edge_agent.ledger_rows import QueueEntry, ResultRow  # noqa: E402
from edge_agent.results import ResultsDB  # noqa: E402
from edge_agent.spool import PhotoSpool, SpoolItem  # noqa: E402
from trainer.loop.unlabelled_pool import UnlabelledPool  # noqa: E402
from trainer.receiver import Receiver  # noqa: E402
from trainer.samples import SampleStore  # noqa: E402

from .conftest import encode as encode_img  # noqa: E402
from .conftest import leaf_image  # noqa: E402
from .daemon_helpers import wait_until  # noqa: E402
from .test_handoff import Wire, make_sender, queue_photos  # noqa: E402


@pytest.fixture
def endpoints(tmp_path):
    run = tmp_path / "run"
    return f"ipc://{run}/handoff.sock", f"ipc://{run}/engines.sock"


def _entry(i: int, label: str = "A") -> QueueEntry:
    return QueueEntry(f"{i:064x}", f"p{i}", "review", label, 0.5, "v1", f"/nowhere/{i}.jpg", 10, created=float(i))


def test_the_days_share_goes_round_robin_over_answers_and_no_answer_takes_more_than_a_quarter_while_others_wait():
    candidates = [(_entry(i, "A"), "unsure") for i in range(50)] + [(_entry(100 + i, "B"), "unsure") for i in range(3)]
    candidates += [(_entry(200 + i, "A"), "unknown") for i in range(2)]
    chosen = choose(candidates, {}, per_day=20)
    groups = [(e.label, v) for e, v in chosen]
    assert set(groups[:3]) == {("A", "unknown"), ("A", "unsure"), ("B", "unsure")}  # one of each answer first
    assert groups[:10].count(("A", "unsure")) == 5  # a quarter of 20 while the rare answers wait
    assert groups.count(("B", "unsure")) == 3 and groups.count(("A", "unknown")) == 2  # every rare answer is taken
    assert len(chosen) == 20  # then the commonest fills the rest of the day's share
    assert [e.photo_id for e, v in chosen if v == "unsure" and e.label == "A"] == [f"p{i}" for i in range(15)]  # in the order given


def test_the_days_share_counts_what_was_sent_today_and_is_paced_over_the_day():
    candidates = [(_entry(i, "A"), "unsure") for i in range(10)] + [(_entry(100 + i, "B"), "unsure") for i in range(10)]
    assert choose(candidates, {("A", "unsure"): 4, ("B", "unsure"): 4}, per_day=8) == []
    left = choose(candidates, {("A", "unsure"): 2}, per_day=8)
    assert [e.label for e, _ in left[:2]] == ["B", "B"] and len(left) == 6  # A has its quarter: B first, then the rest
    assert choose(candidates, {}, per_day=0) == []
    assert len(choose(candidates, {}, per_day=8, allowed=3)) == 3
    day = start_of_day(1_780_000_000.0)
    assert allowed_by(240, day) == 10 and allowed_by(240, day + 11 * 3600) == 120 and allowed_by(240, day + 86399) == 240


def test_with_nothing_else_waiting_one_answer_fills_the_days_share():
    only = [(_entry(i, "A"), "unsure") for i in range(10)]
    assert len(choose(only, {}, per_day=8)) == 8


def _header(i: int, device: str, label: str = "A", verdict: str = "unsure") -> dict:
    return {
        "id": f"{i:064x}",
        "kind": "unlabelled",
        "label": label,
        "verdict": verdict,
        "confidence": 0.5,
        "engine_version": "v1",
        "ext": ".jpg",
        "device": device,
    }


def test_a_full_pool_evicts_the_flooding_devices_commonest_oldest_photos_never_another_devices(tmp_path):
    pool = UnlabelledPool(tmp_path, max_photos=10, max_bytes=1 << 30)
    for i in range(4):
        assert pool.add(_header(i, "quiet", label="B"), b"q" * 100)
    pool.add(_header(50, "loud", label="rare", verdict="unknown"), b"r" * 100)
    for i in range(100, 200):  # a flood from one device
        pool.add(_header(i, "loud"), b"x" * 100)
    held = pool.photos()
    assert len(held) == 10 and pool.evicted == 95
    assert sum(p.device == "quiet" for p in held) == 4  # untouched by the flood
    assert any(p.label == "rare" for p in held)  # the flood evicts its commonest answer first
    assert sorted(int(p.id, 16) for p in held if p.label == "A") == list(range(195, 200))  # the newest of it stay
    assert len(list((tmp_path / "unlabelled").iterdir())) == 10  # evicted photos leave the disk too


def test_the_pool_is_bounded_by_disk_too(tmp_path):
    pool = UnlabelledPool(tmp_path, max_photos=1000, max_bytes=1000)
    for i in range(30):
        pool.add(_header(i, "d"), b"x" * 100)
    assert pool.summary()["bytes"] <= 1000 and pool.summary()["photos"] == 10


def test_a_pool_a_retrain_cannot_read_is_logged_and_read_as_empty_and_a_pool_not_made_yet_is_empty_in_silence(tmp_path):
    """A locked or damaged pool once read as empty in silence: the retrain's record said 0 pool photos, not why."""
    import sqlite3

    from structlog.testing import capture_logs

    from trainer.loop.unlabelled_pool import pool_photos

    pool = UnlabelledPool(tmp_path, max_photos=10, max_bytes=10_000)
    pool.add(_header(1, "d"), b"x" * 100)
    pool._db.close()  # the service stopped: the holder below needs the file to itself
    assert [p.device for p in pool_photos(tmp_path)] == ["d"]
    holder = sqlite3.connect(tmp_path / "unlabelled.sqlite", isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("DELETE FROM pool WHERE 0")  # a write: the lock is taken and kept
    with capture_logs() as logs:
        assert pool_photos(tmp_path, wait_s=0.2) == []
    holder.close()
    [said] = [e for e in logs if e["event"] == "unlabelled_pool_unreadable"]
    assert "unlabelled.sqlite" in said["file"] and "locked" in said["error"]
    empty = tmp_path / "empty"
    empty.mkdir()
    sqlite3.connect(empty / "unlabelled.sqlite").close()  # made, its table not yet
    with capture_logs() as logs:
        assert pool_photos(empty) == []
    assert not logs


def test_the_pool_survives_a_restart_and_sweeps_files_a_stop_left_without_a_row(tmp_path):
    pool = UnlabelledPool(tmp_path, max_photos=100, max_bytes=1 << 30)
    for i in range(5):
        pool.add(_header(i, "d"), b"x" * 100)
    pool.close()
    (tmp_path / "unlabelled" / ("f" * 64 + ".jpg")).write_bytes(b"half a photo")  # stopped between file and row
    again = UnlabelledPool(tmp_path, max_photos=100, max_bytes=1 << 30)
    assert [int(p.id, 16) for p in again.photos()] == list(range(5))
    assert sorted(p.name for p in (tmp_path / "unlabelled").iterdir()) == sorted(Path(p.file).name for p in again.photos())
    assert not again.add(_header(3, "d"), b"x" * 100)  # held already


def _review_photos(db: ResultsDB, spool: PhotoSpool, n: int, seed: int = 500) -> list[str]:
    """Classified photos in the review pool (the model said Tomato healthy, unsure)."""
    ids, rows, entries = [], [], []
    for i in range(n):
        data = encode_img(leaf_image(seed + i))
        sha = hashlib.sha256(data).hexdigest()
        [f] = spool.put_many([SpoolItem("review", sha, data)])
        rows.append(
            ResultRow(sha, sha[:16], None, "inbox", "Tomato___healthy", 0.6, [["Tomato___healthy", 0.6]], "v0001", {}, verdict="unsure")
        )
        entries.append(QueueEntry(sha, sha[:16], "review", "Tomato___healthy", 0.6, "v0001", str(f), len(data)))
        ids.append(sha)
    db.commit(rows, entries)
    return ids


@contextlib.contextmanager
def _trainer(tmp_path, endpoints, max_photos: int = 100):
    store = SampleStore(tmp_path / "trainer")
    pool = UnlabelledPool(tmp_path / "trainer", max_photos, 1 << 30)
    receiver = Receiver(store, HandoffSection(heartbeat_s=0.2), Link(*endpoints), pool=pool)
    receiver.start()
    try:
        yield store, pool, receiver
    finally:
        receiver.stop()
        pool.close()


def test_unlabelled_photos_reach_the_trainers_pool_after_the_labels_and_stay_in_the_review_pool(tmp_path, endpoints):
    sender, db, spool, _ = make_sender(tmp_path, endpoints, unlabelled_per_day=4 * 24)  # 4 allowed by any hour
    review = _review_photos(db, spool, 6)
    labels = queue_photos(db, spool, 3)
    with _trainer(tmp_path, endpoints) as (store, pool, receiver):
        sender.start()
        try:
            share = min(6, allowed_by(4 * 24))  # at least 4 by any hour
            wait_until(lambda: len(pool.photos()) == share, 20, "the day's unlabelled photos")
            assert {s.id for s in store.all()} == set(labels)  # the labels went, as labels
            assert store.counts()["new"] == 3  # unlabelled photos never count towards a retrain
            assert {p.id for p in pool.photos()} <= set(review)
            assert all(p.verdict == "unsure" and p.label == "Tomato___healthy" for p in pool.photos())
            assert all(hashlib.sha256(Path(p.file).read_bytes()).hexdigest() == p.id for p in pool.photos())
            assert len(db.review_pool()) == 6  # still there for the expert
            time.sleep(1.0)
            assert len(pool.photos()) == share and sender.counters["unlabelled_acked"] == share  # sent once each
        finally:
            sender.stop()
    assert receiver.counters["unlabelled"] == share


def test_photos_sent_on_a_later_day_by_a_clock_since_set_back_do_not_use_up_todays_share(tmp_path, endpoints):
    sender, db, spool, _ = make_sender(tmp_path, endpoints, unlabelled_per_day=4 * 24)
    review = _review_photos(db, spool, 6)
    for i in range(4 * 24):  # a whole day's share, stamped while the clock ran forty days ahead
        db._db.execute(
            "INSERT INTO unlabelled_sent (sha256, label, verdict, sent) VALUES (?, 'Tomato___healthy', 'unsure', ?)",
            (f"{10**6 + i:064x}", time.time() + 40 * 86400),
        )
    assert sum(db.unlabelled_sent_since(start_of_day()).values()) == 4 * 24  # counted with no day's end
    with _trainer(tmp_path, endpoints) as (_store, pool, _receiver):
        sender.start()
        try:
            share = min(6, allowed_by(4 * 24))
            wait_until(lambda: len(pool.photos()) == share, 20, "today's unlabelled photos")
            assert {p.id for p in pool.photos()} <= set(review)
        finally:
            sender.stop()


def test_a_photo_labelled_after_it_went_unlabelled_arrives_as_a_label_and_leaves_the_pool(tmp_path, endpoints):
    sender, db, spool, _ = make_sender(tmp_path, endpoints, unlabelled_per_day=10)
    [sha] = _review_photos(db, spool, 1)
    with _trainer(tmp_path, endpoints) as (store, pool, _):
        sender.start()
        try:
            wait_until(lambda: len(pool.photos()) == 1, 20, "the photo in the pool")
            entry = db.queue_entry(sha)
            moved = spool.move(Path(entry.file), "expert")
            db.mark_expert(sha, "Tomato___Early_blight", str(moved))
            wait_until(lambda: store.has(sha), 20, "the expert label")
            wait_until(lambda: not pool.photos(), 5, "the unlabelled copy gone")
            assert [s.kind for s in store.all()] == ["expert"]
        finally:
            sender.stop()


def test_a_trainer_that_keeps_no_unlabelled_photos_refuses_them_once_and_the_daemon_keeps_them_for_the_expert(tmp_path, endpoints):
    sender, db, spool, _ = make_sender(tmp_path, endpoints, unlabelled_per_day=3 * 24)
    _review_photos(db, spool, 3)
    with _trainer(tmp_path, endpoints, max_photos=0) as (_, pool, receiver):
        sender.start()
        try:
            wait_until(lambda: receiver.counters["refused"] == 3, 20, "three refusals")  # 3 allowed by any hour
            time.sleep(1.0)
            assert receiver.counters["refused"] == 3  # not offered again
            assert len(db.review_pool()) == 3 and not pool.photos()
            assert db.queued_for_delivery(10) == []
        finally:
            sender.stop()


def test_no_unlabelled_photo_goes_with_unlabelled_per_day_0(tmp_path, endpoints):
    sender, db, spool, _ = make_sender(tmp_path, endpoints, unlabelled_per_day=0)
    _review_photos(db, spool, 3)
    labels = queue_photos(db, spool, 2)
    with _trainer(tmp_path, endpoints) as (store, pool, _):
        sender.start()
        try:
            wait_until(lambda: {s.id for s in store.all()} == set(labels), 20, "the labels")
            time.sleep(0.8)
            assert not pool.photos() and sender.counters["unlabelled_sent"] == 0
        finally:
            sender.stop()


def test_an_unlabelled_photo_answered_twice_by_the_trainer_stays_in_the_experts_review_pool(tmp_path, endpoints):
    """A photo sent again before the trainer's answer came back (a slow link, a busy trainer) is answered twice: the
    second answer finds nothing in flight and must not take the photo out of the review pool as if a label was
    delivered or refused (before, a second ack deleted the photo and its row, a second refusal quarantined it)."""
    from edge_agent.handoff.protocol import encode

    sender, db, spool, _ = make_sender(tmp_path, endpoints, unlabelled_per_day=2 * 24)  # 2 allowed by any hour
    review = _review_photos(db, spool, 2)
    sent = Wire()  # what the sender puts on the wire

    for answer, t in (("ack", 0.0), ("refused", 10.0)):
        sender._deliver(sent, time.monotonic() + t)
        sha = sent[-1]["id"]
        assert sent[-1]["kind"] == "unlabelled" and sha in review
        sender._deliver(sent, time.monotonic() + t + 1)  # no answer yet: sent again
        assert sent[-1]["id"] == sha and len([h for h in sent if h["id"] == sha]) == 2
        header = {"id": sha} if answer == "ack" else {"id": sha, "reason": "this trainer keeps no unlabelled photos"}
        sender._handle(encode(answer, header))
        sender._handle(encode(answer, header))  # the answer to the second send
        entry = db.queue_entry(sha)
        assert entry is not None and entry.kind == "review" and Path(entry.file).is_file()
    assert {e.sha256 for e, *_ in db.review_pool()} == set(review)  # both still there for the expert
    assert db.counts()["quarantined"] == 0 and sender.counters["refused"] == 0


def test_a_photo_the_trainer_holds_labelled_is_acknowledged_unlabelled_but_not_kept_in_the_pool(tmp_path):
    """An unlabelled photo's resend that arrives after its expert label (labelled while the first send was in flight)
    is acknowledged and not kept: the label says more, and the pool would hold the photo twice (before, it was kept)."""
    from edge_agent.handoff.protocol import encode
    from edge_agent.handoff.sender import sample_header

    store = SampleStore(tmp_path / "trainer")
    pool = UnlabelledPool(tmp_path / "trainer", 100, 1 << 30)
    receiver = Receiver(store, HandoffSection(), Link("ipc://x", "ipc://y"), pool=pool)
    out = Wire(routed=True)  # what the receiver puts on the wire

    photo = encode_img(leaf_image(900))
    sha = hashlib.sha256(photo).hexdigest()
    label = sample_header(QueueEntry(sha, "p", "expert", "Tomato___Early_blight", 1.0, "v0001", "p.jpg", len(photo)), "p.jpg")
    receiver._handle(out, [b"peer", *encode("sample", label, photo)])
    receiver._handle(out, [b"peer", *encode("sample", label | {"kind": "unlabelled", "verdict": "unsure"}, photo)])
    assert [m.kind for m in out] == ["ack", "ack"] and store.has(sha)
    assert pool.photos() == [] and receiver.counters["unlabelled"] == 0


def test_a_withdrawn_pseudo_labels_photo_is_kept_as_its_answer_and_its_sample_file_goes_even_where_the_pool_keeps_none(tmp_path):
    store = SampleStore(tmp_path / "trainer")
    datas = [encode_img(leaf_image(i)) for i in range(2)]
    shas = [hashlib.sha256(d).hexdigest() for d in datas]
    for sha, data in zip(shas, datas):
        store.add({"id": sha, "kind": "pseudo", "label": "A", "confidence": 0.99, "engine_version": "v0001", "ext": ".png"}, data)
    pool = UnlabelledPool(tmp_path / "trainer", 10, 1 << 30)
    none = UnlabelledPool(tmp_path / "other", 0, 1 << 30)
    try:
        first, second = (store.withdraw(sha, "A", "v0001") for sha in shas)
        assert pool.keep_withdrawn(first) and not Path(first.file).exists()
        [kept] = pool.photos()
        assert (kept.id, kept.label, kept.verdict, kept.engine_version) == (shas[0], "A", "confident", "v0001")
        assert hashlib.sha256(Path(kept.file).read_bytes()).hexdigest() == shas[0]
        assert not none.keep_withdrawn(second) and not Path(second.file).exists() and none.photos() == []
    finally:
        pool.close()
        none.close()
        store.close()
