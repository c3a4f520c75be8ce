"""The ZeroMQ hand-off: acknowledged delivery, idempotent resends, heartbeats, garbage frames."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")

from edge_agent.config import HandoffSection  # noqa: E402
from edge_agent.handoff.protocol import MAGIC, ProtocolError, decode, encode  # noqa: E402
from edge_agent.handoff.sender import Sender, sample_header  # noqa: E402
from edge_agent.handoff.transport import Link, TransportError, client_socket  # noqa: E402
from edge_agent.ledger_rows import QueueEntry, ResultRow  # noqa: E402
from edge_agent.results import ResultsDB  # noqa: E402
from edge_agent.spool import PhotoSpool, SpoolItem  # noqa: E402
from trainer.receiver import Receiver  # noqa: E402
from trainer.samples import SampleStore  # noqa: E402

from .conftest import encode as encode_img  # noqa: E402
from .conftest import leaf_image  # noqa: E402
from .daemon_helpers import wait_until  # noqa: E402


def queue_photos(db: ResultsDB, spool: PhotoSpool, n: int, kind: str = "pseudo", seed: int = 100) -> list[str]:
    ids, entries = [], []
    for i in range(n):
        data = encode_img(leaf_image(seed + i))
        sha = hashlib.sha256(data).hexdigest()
        [f] = spool.put_many([SpoolItem(kind, sha, data)])
        entries.append(QueueEntry(sha, sha[:16], kind, "Tomato___healthy", 0.97, "v0001", str(f), len(data)))
        ids.append(sha)
    db.commit([], entries)
    return ids


@pytest.fixture
def endpoints(tmp_path):
    run = tmp_path / "run"
    return f"ipc://{run}/handoff.sock", f"ipc://{run}/engines.sock"


def make_sender(tmp_path, endpoints, curve=None, device="", **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    db = ResultsDB(tmp_path / "results.sqlite")
    spool = PhotoSpool(tmp_path / "queue", 1 << 30)
    announced = []
    sender = Sender(
        db,
        spool,
        HandoffSection(heartbeat_s=0.2, ack_timeout_s=0.5, **kw),
        Link(*endpoints, curve=curve),
        device=device,
        on_engine=announced.append,
    )
    return sender, db, spool, announced


class Wire(list):
    """A fake socket: the headers a sender puts on it; ``routed``: a receiver's ROUTER, the messages (peer dropped)."""

    def __init__(self, routed: bool = False) -> None:
        super().__init__()
        self.routed = routed

    def send_multipart(self, frames, flags=0):
        self.append(decode(frames[1:]) if self.routed else decode(frames).header)


@contextlib.contextmanager
def delivering(sender, tmp_path, endpoints, **settings):
    """A trainer-side receiver (its ``[handoff]`` section's ``settings``) and the sender running; yields the trainer's
    sample store."""
    store = SampleStore(tmp_path / "trainer")
    receiver = Receiver(store, HandoffSection(heartbeat_s=0.2, **settings), Link(*endpoints))
    receiver.start()
    sender.start()
    try:
        yield store
    finally:
        sender.stop()
        receiver.stop()


def assert_intact(store: SampleStore) -> None:
    for s in store.all():
        assert hashlib.sha256(Path(s.file).read_bytes()).hexdigest() == s.id


def test_protocol_rejects_garbage():
    good = encode(
        "sample", {"id": "a" * 64, "kind": "pseudo", "label": "x", "confidence": 0.95, "engine_version": "v1", "ext": ".jpg"}, b"jpeg"
    )
    assert decode(good).header["label"] == "x"
    bad = [
        [b"junk"],
        [b"NOPE", b"ack", b"{}"],
        [MAGIC, b"\xff\xfe", b"{}"],
        [MAGIC, b"launch", b"{}"],
        [MAGIC, b"ack", b"not json"],
        [MAGIC, b"ack", b"[1,2]"],
        [MAGIC, b"ack", b'{"id": "zz"}'],
        [MAGIC, b"ack", b'{"id": "' + b"a" * 64 + b'"}', b"payload"],
        good[:3],  # sample without photo
        [*good[:2], good[2].replace(b"pseudo", b"gossip"), good[3]],
        [*good[:2], good[2].replace(b"0.95", b"7.5"), good[3]],
        [*good[:2], good[2].replace(b'"ext":".jpg"', b'"ext":"/../../etc"'), good[3]],
    ]
    for frames in bad:
        with pytest.raises(ProtocolError):
            decode(frames)
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(good, max_payload=2)


SAMPLE = {"id": "a" * 64, "kind": "pseudo", "label": "x", "confidence": 0.95, "engine_version": "v1000", "ext": ".jpg"}

#: Frames that once took a peer down (red team, issue 22): numbers too big to parse, and numbers out of any range.
HOSTILE = [
    [MAGIC, b"heartbeat", b'{"role":"daemon","time":' + b"9" * 5000 + b"}"],
    [
        MAGIC,
        b"sample",
        b'{"id":"' + b"a" * 64 + b'","kind":"pseudo","label":"x","confidence":1' + b"0" * 400 + b',"engine_version":"v1000","ext":".jpg"}',
        b"jpeg",
    ],
    [MAGIC, b"heartbeat", b'{"role":"daemon","time":1e400}'],
    [MAGIC, b"heartbeat", b'{"role":"daemon","time":NaN}'],
    [MAGIC, b"heartbeat", b'{"role":"daemon","time":-Infinity}'],
    [MAGIC, b"heartbeat", b"[" * 10000 + b"]" * 10000],
    [MAGIC, b"heartbeat", b'{"role":"' + b"r" * 5000 + b'","time":1}'],
    [MAGIC, b"engine", b'{"version":"../../v0002"}'],
    [MAGIC, b"ack", b'{"id":' + b"1" * 64 + b"}"],
]


def test_numbers_too_big_to_parse_or_out_of_range_are_protocol_errors_not_crashes():
    for frames in HOSTILE:
        with pytest.raises(ProtocolError):
            decode(frames)
    header = decode(encode("sample", {**SAMPLE, "confidence": 1, "extra": "x" * 100}, b"jpeg")).header
    assert header["confidence"] == 1.0 and isinstance(header["confidence"], float)  # typed as declared
    assert "extra" not in header  # fields the kind does not name never reach a handler


def test_random_and_mutated_frames_only_ever_raise_protocol_errors():
    """A bounded fuzz of the parsers (the mutations of ``python -m benchmarks.fuzz``): valid frames with bytes flipped,
    cut, repeated or numbers swapped for huge ones, and random bytes. Anything but a message or a ProtocolError is a
    peer taken down."""
    import random

    from benchmarks.fuzz import mutate, seed_frames
    from edge_agent.transfer.protocol import decode as decode_transfer

    rng = random.Random(22)
    outcomes = {"parsed": 0, "refused": 0}
    pool = seed_frames()
    for n in range(12000):
        frames = mutate(rng.choice(pool), rng) if n % 10 else [os.urandom(rng.randrange(1, 40)) for _ in range(rng.randrange(1, 6))]
        for parse in (decode, decode_transfer):
            try:
                parse(frames)
                outcomes["parsed"] += 1
            except ProtocolError:
                outcomes["refused"] += 1
    assert outcomes["refused"] > 1000 and outcomes["parsed"] > 100  # both ways were exercised


@contextlib.contextmanager
def peer_of_receiver(tmp_path, endpoints, **settings):
    """A trainer-side receiver running and a DEALER connected to it; yields (receiver, its sample store, the socket)."""
    store = SampleStore(tmp_path / "trainer")
    receiver = Receiver(store, HandoffSection(**settings), Link(*endpoints))
    receiver.start()
    ctx = zmq.Context()
    sock = client_socket(ctx, zmq.DEALER, endpoints[0], None)
    try:
        wait_until(lambda: sock.poll(10, zmq.POLLOUT), 5, "connected")
        yield receiver, store, sock
    finally:
        sock.close(0)
        ctx.term()
        receiver.stop()


def test_hostile_frames_leave_the_receiver_answering(tmp_path, endpoints):
    with peer_of_receiver(tmp_path, endpoints) as (receiver, store, sock):
        for frames in HOSTILE:
            sock.send_multipart(frames)
        wait_until(lambda: receiver.counters["malformed"] == len(HOSTILE), 10, "hostile frames counted")
        sock.send_multipart(encode("heartbeat", {"role": "daemon", "time": time.time()}))
        assert sock.poll(5000) and decode(sock.recv_multipart()).kind == "heartbeat"
        assert receiver.alive() and not store.all()


def test_a_hostile_trainer_cannot_stop_the_daemons_sender(tmp_path, endpoints):
    """The same frames from the trainer's side of the socket: the daemon's sender counts them and stays healthy."""
    from edge_agent.handoff.transport import server_socket

    sender, db, spool, announced = make_sender(tmp_path, endpoints)
    ctx = zmq.Context()
    router = server_socket(ctx, zmq.ROUTER, endpoints[0], None)
    sender.start()
    try:
        assert router.poll(10_000), "the daemon's heartbeat"
        peer = router.recv_multipart()[0]
        for frames in HOSTILE:
            router.send_multipart([peer, *frames])
        wait_until(lambda: sender.counters["malformed"] >= len(HOSTILE), 10, "hostile frames counted")
        router.send_multipart([peer, *encode("engine", {"version": "v1001"})])
        wait_until(lambda: announced == ["v1001"], 10, "a real announcement still heard")
        assert sender.alive()
    finally:
        sender.stop()
        router.close(0)
        ctx.term()


def test_delivery_with_acks_removes_from_daemon_disk(tmp_path, endpoints):
    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    ids = queue_photos(db, spool, 20)
    with delivering(sender, tmp_path, endpoints) as store:
        wait_until(lambda: not db.queued_for_delivery(100), 20, "all acknowledged")
        assert {s.id for s in store.all()} == set(ids)
        assert sender.counters["acked"] == 20
        assert not list((tmp_path / "queue" / "pseudo").iterdir())  # left the daemon's disk
        assert_intact(store)
        assert sender.trainer_alive
        assert oct(os.stat(tmp_path / "run").st_mode & 0o777) == "0o700"


def test_queued_photo_changed_or_missing_on_disk_is_dropped_not_sent(tmp_path, endpoints):
    """A queued photo whose file no longer matches its hash (changed in place through a hard link) or is gone
    is never delivered under the wrong content; the rest still arrive."""
    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    ids = queue_photos(db, spool, 4)
    files = {q.sha256: Path(q.file) for q in db.queued("pseudo")}
    files[ids[0]].write_bytes(b"overwritten in place")
    files[ids[1]].unlink()
    with delivering(sender, tmp_path, endpoints) as store:
        wait_until(lambda: not db.queued_for_delivery(100), 20, "queue settled")
        assert {s.id for s in store.all()} == set(ids[2:])
        assert_intact(store)


def test_daemon_first_trainer_later_and_trainer_restart(tmp_path, endpoints):
    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    queue_photos(db, spool, 5)
    sender.start()
    try:
        time.sleep(1.0)
        assert not sender.trainer_alive and len(db.queued_for_delivery(100)) == 5  # nothing lost while alone
        store = SampleStore(tmp_path / "trainer")
        receiver = Receiver(store, HandoffSection(heartbeat_s=0.2), Link(*endpoints))
        receiver.start()
        wait_until(lambda: not db.queued_for_delivery(100), 20, "delivered once the trainer came")
        receiver.stop()  # the trainer goes away...
        wait_until(lambda: not sender.trainer_alive, 5, "trainer seen as silent")
        queue_photos(db, spool, 3, kind="expert", seed=500)
        receiver = Receiver(store, HandoffSection(heartbeat_s=0.2), Link(*endpoints))  # ...and restarts
        receiver.start()
        wait_until(lambda: not db.queued_for_delivery(100), 20, "delivered after restart")
        assert store.counts()["pseudo"] == 5 and store.counts()["expert"] == 3
        receiver.stop()
    finally:
        sender.stop()


def test_resend_is_stored_once(tmp_path):
    store = SampleStore(tmp_path / "trainer")
    header = {"id": "b" * 64, "kind": "pseudo", "label": "x", "confidence": 0.99, "engine_version": "v1", "ext": ".jpg"}
    assert store.add(header, b"photo") is True
    assert store.add(header, b"photo") is False
    assert len(store.all()) == 1


def test_an_expert_label_replaces_a_pseudo_label_or_an_earlier_label_of_the_photo_and_is_new_again(tmp_path):
    store = SampleStore(tmp_path / "trainer")
    header = {"id": "b" * 64, "kind": "pseudo", "label": "x", "confidence": 0.99, "engine_version": "v1", "ext": ".jpg"}
    assert store.add(header, b"photo") is True
    store.mark_used(store.all(), "v2")
    assert store.add({**header, "kind": "expert", "label": "y", "confidence": 1.0}, b"photo") is True
    (s,) = store.all()
    assert (s.kind, s.label, s.generation) == ("expert", "y", None)  # learnt from at the next retrain
    assert store.add({**header, "kind": "expert", "label": "y", "confidence": 1.0}, b"photo") is False  # a resend
    assert store.add(header, b"photo") is False and store.all()[0].label == "y"  # a pseudo-label never overrides the expert
    assert store.add({**header, "kind": "expert", "label": "z", "confidence": 1.0}, b"photo") is True
    assert [(s.kind, s.label) for s in store.all()] == [("expert", "z")] and store.counts()["expert"] == 1


def test_a_label_the_expert_puts_right_while_a_retrain_runs_stays_new_and_keeps_its_photo(tmp_path):
    """A retrain reads the labels, trains for minutes, then marks what it read as used, and first deletes old
    pseudo-labels it chose: a correction that arrives in between (the receiver's thread) is marked only where it is as
    read, so it stays new for the next retrain, and a pseudo-label chosen to go that became the expert's keeps its
    photo (before, the retrain marked the correction trained on, and deleted the photo of the expert's label)."""
    store = SampleStore(tmp_path / "trainer")
    header = {"id": "c" * 64, "kind": "pseudo", "label": "x", "confidence": 0.99, "engine_version": "v1", "ext": ".jpg"}
    store.add(header, b"photo")
    read = store.all()  # what the retrain read
    assert store.add({**header, "kind": "expert", "label": "y", "confidence": 1.0}, b"photo") is True  # arrives meanwhile
    store.mark_used(read, "v2")
    (s,) = store.all()
    assert (s.kind, s.label, s.generation) == ("expert", "y", None) and store.counts()["new_expert"] == 1

    for i in range(3):  # three pseudo-labels of x newer than the first: it is the one to go at 3 a class
        store.add({**header, "id": f"{i:064x}", "label": "x"}, b"photo")
    store.add({**header, "id": "d" * 64, "label": "x"}, b"old photo")
    store._db.execute("UPDATE samples SET received = 0 WHERE id = ?", ("d" * 64,))
    real = store._db

    class Labelled:  # the expert's label of the doomed photo lands between the retrain's choice and its delete
        def _hook(self, sql):
            if sql.startswith("DELETE FROM samples"):
                real.execute("UPDATE samples SET kind = 'expert', label = 'y', generation = NULL WHERE id = ?", ("d" * 64,))

        def execute(self, sql, *args):
            self._hook(sql)
            return real.execute(sql, *args)

        def executemany(self, sql, *args):
            self._hook(sql)
            return real.executemany(sql, *args)

    store._db = Labelled()
    assert store.drop_old_pseudo(3) == (0, 0)
    store._db = real
    kept = {s.id: s for s in store.all()}["d" * 64]
    assert (kept.kind, kept.label) == ("expert", "y") and Path(kept.file).read_bytes() == b"old photo"


def test_a_label_put_right_keeps_its_arrival_and_first_class_and_one_that_replaces_a_pseudo_label_arrives_now(tmp_path):
    import sqlite3

    store = SampleStore(tmp_path / "trainer")
    header = {"id": "c" * 64, "kind": "expert", "label": "x", "confidence": 1.0, "engine_version": "v1", "ext": ".jpg"}
    assert store.add(header, b"photo") is True
    (first,) = store.all()
    assert (first.first_label, first.arrived_as) == (None, "x")
    assert store.add({**header, "label": "y"}, b"photo") is True
    assert store.add({**header, "label": "z"}, b"photo") is True  # put right twice: the class it arrived as stays
    (s,) = store.all()
    assert (s.label, s.first_label, s.arrived_as, s.received) == ("z", "x", "x", first.received)
    pseudo = {**header, "id": "d" * 64, "kind": "pseudo"}
    assert store.add(pseudo, b"other") is True
    was = next(s for s in store.all() if s.id == "d" * 64).received
    time.sleep(0.01)
    assert store.add({**pseudo, "kind": "expert", "label": "y"}, b"other") is True
    now = next(s for s in store.all() if s.id == "d" * 64)
    assert (now.kind, now.first_label, now.arrived_as) == ("expert", "y", "y") and now.received > was  # the expert's label: now
    store.close()
    old = tmp_path / "old"  # a store written before the column: read, its labels as they arrived
    old.mkdir()
    with sqlite3.connect(old / "samples.sqlite") as con:
        con.execute(
            "CREATE TABLE samples (id TEXT PRIMARY KEY, kind TEXT NOT NULL, label TEXT NOT NULL, confidence REAL NOT NULL,"
            " engine_version TEXT NOT NULL, file TEXT NOT NULL, received REAL NOT NULL, generation TEXT)"
        )
        con.execute("INSERT INTO samples VALUES ('e', 'expert', 'x', 1.0, 'v1', '/s/e.jpg', 5.0, 'v2')")
    store = SampleStore(old)
    assert store.add({**header, "id": "e", "label": "y"}, b"") is True
    assert [(s.label, s.arrived_as, s.received) for s in store.all()] == [("y", "x", 5.0)]
    store.close()


def test_a_label_corrected_after_the_trainer_has_it_reaches_the_trainer_in_place_of_the_first(tmp_path, endpoints):
    from datetime import datetime

    from edge_agent.review.queue import label_photo

    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    data = encode_img(leaf_image(7))
    sha, created = hashlib.sha256(data).hexdigest(), time.time()
    kept = tmp_path / "processed" / datetime.fromtimestamp(created).strftime("%Y-%m-%d") / "leaf.jpg"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(data)  # where the daemon moved it; a sure answer, never in the review pool
    db.commit(
        [
            ResultRow(
                sha, "p7", str(tmp_path / "inbox" / "leaf.jpg"), "inbox", "Apple___healthy", 0.99, [], "v0001", {}, created, "confident"
            )
        ]
    )
    classes = ["Apple___healthy", "Apple___Black_rot", "Apple___Apple_scab"]
    with delivering(sender, tmp_path, endpoints) as store:
        label_photo(db, tmp_path / "queue", 1 << 30, classes, "p7", "Apple___Black_rot")  # the expert sees it is wrong
        wait_until(lambda: [(s.kind, s.label) for s in store.all()] == [("expert", "Apple___Black_rot")], 20, "the label")
        wait_until(lambda: not db.queued(), 10, "acknowledged")
        label_photo(db, tmp_path / "queue", 1 << 30, classes, "p7", "Apple___Apple_scab")  # a slip, put right
        wait_until(lambda: [(s.kind, s.label) for s in store.all()] == [("expert", "Apple___Apple_scab")], 20, "the correction")
    assert db.expert_labels() == {sha: "Apple___Apple_scab"} and kept.read_bytes() == data


def test_garbage_frames_do_not_crash_the_receiver(tmp_path, endpoints):
    with peer_of_receiver(tmp_path, endpoints, max_payload_mb=1) as (receiver, store, sock):
        for frames in ([b"\x00" * 10], [MAGIC, b"sample", b"{bad"], [MAGIC, b"ack", b"{}"], [os.urandom(64), os.urandom(64)]):
            sock.send_multipart(frames)
        big = encode(
            "sample",
            {"id": "c" * 64, "kind": "pseudo", "label": "x", "confidence": 0.99, "engine_version": "v1", "ext": ".jpg"},
            b"x" * (2 << 20),  # over [handoff] max_payload_mb
        )
        sock.send_multipart(big)
        wait_until(lambda: receiver.counters["malformed"] == 5, 5, "garbage counted")
        assert receiver.alive() and not store.all()
        sock.send_multipart(encode("heartbeat", {"role": "daemon", "time": time.time()}))
        assert sock.poll(2000) and decode(sock.recv_multipart()).kind == "heartbeat"  # still answering


def test_engine_announcement_reaches_the_daemon(tmp_path, endpoints):
    sender, db, spool, announced = make_sender(tmp_path, endpoints)
    receiver = Receiver(SampleStore(tmp_path / "trainer"), HandoffSection(), Link(*endpoints))
    receiver.start()
    sender.start()
    try:
        wait_until(lambda: sender.trainer_alive, 10, "connected")
        time.sleep(0.3)  # PUB/SUB joins late
        receiver.announce("v0002")
        wait_until(lambda: announced == ["v0002"], 10, "announcement")
    finally:
        sender.stop()
        receiver.stop()


def test_tcp_without_keys_is_refused():
    ctx = zmq.Context()
    try:
        with pytest.raises(TransportError, match="CURVE"):
            client_socket(ctx, zmq.DEALER, "tcp://127.0.0.1:5999", None)
    finally:
        ctx.term()


def test_a_key_whose_bytes_come_after_its_name_or_within_one_tick_of_the_folders_clock_is_still_taken(tmp_path, monkeypatch):
    """The trainer reads the authorized keys again when the folder's mtime changes; a key copied in by hand gets its
    bytes after its name (the mtime does not change again), and two changes within one tick of the filesystem's
    clock leave one mtime. Seen in the suite: a device refused for good after a copy raced the trainer's read."""
    import zmq
    import zmq.auth

    from edge_agent.handoff import transport

    folder = tmp_path / "authorized"
    folder.mkdir()
    certs = {n: Path(zmq.auth.create_certificates(tmp_path, n)[0]).read_bytes() for n in ("device-2", "device-3")}
    ctx = zmq.Context()
    auth = transport.Authenticator(ctx, str(folder))
    warned = []
    monkeypatch.setattr(auth, "log", type("L", (), {"warning": lambda self, event, **kw: warned.append(kw["file"])})())
    try:
        key = folder / "device-2.key"
        key.write_bytes(b"")  # `cp` under way: the name is there, the bytes not yet
        assert not auth.admits("device-2")
        stamp = folder.stat().st_mtime_ns
        key.write_bytes(certs["device-2"])
        assert folder.stat().st_mtime_ns == stamp  # nothing tells the trainer but reading again
        wait_until(lambda: auth.admits("device-2"), 3, "the key once whole")
        tmp = folder / ".device-3.key.tmp"  # `edge-trainer device add`: a whole key or none, by rename
        tmp.write_bytes(certs["device-3"])
        stamp = folder.stat().st_mtime_ns
        assert not auth.admits("device-3")  # read between the copy and the rename...
        os.replace(tmp, folder / "device-3.key")
        os.utime(folder, ns=(stamp, stamp))  # ...which fell in the same tick: the folder's mtime as it was
        wait_until(lambda: auth.admits("device-3"), 3, "the key renamed in the same tick")
        (folder / "garbage.key").write_bytes(b"not a certificate")
        for _ in range(4):
            auth.poll()
            time.sleep(0.3)
        assert warned == [str(key), str(folder / "garbage.key")]  # each unreadable file said once, not at every read
        assert auth.admits("device-2") and auth.admits("device-3")
    finally:
        auth.stop()
        ctx.term()


def test_a_refused_handshake_is_logged_once_a_minute_and_a_clock_set_back_does_not_silence_it(tmp_path, monkeypatch):
    import zmq

    from edge_agent.handoff import transport

    (tmp_path / "authorized").mkdir()
    ctx = zmq.Context()
    auth = transport.Authenticator(ctx, str(tmp_path / "authorized"))
    said = []
    monkeypatch.setattr(auth, "log", type("L", (), {"warning": lambda self, event, **kw: said.append(kw["refused_so_far"])})())
    clock = [1.8e9]
    monkeypatch.setattr(transport.time, "time", lambda: clock[0])
    try:
        for step in (0, 10, 61, -40 * 86400, 5):  # the third a minute on; the fourth after the clock was set back 40 days
            clock[0] += step
            auth._denied("10.0.0.9", "no such key")
        assert said == [1, 3, 4] and auth.refused["10.0.0.9"]["count"] == 5
    finally:
        auth.stop()
        ctx.term()


def test_tcp_with_curve_accepts_authorized_devices_refuses_strangers_and_follows_add_and_revoke(tmp_path):
    """One certificate per device (``edge-trainer device add``): an authorized device delivers; a stranger is
    refused, logged with its address on the trainer, and its own status says the handshake was refused; adding it
    lets it in and revoking a device shuts it out, without restarting the trainer."""
    import socket as pysocket
    import stat
    import subprocess
    import sys

    from edge_agent.handoff.transport import CurveKeys

    def trainer_cli(*argv):
        out = subprocess.run([sys.executable, "-m", "trainer", *argv], capture_output=True, text=True, cwd=Path(__file__).parents[1])
        return out

    keys = tmp_path / "keys"
    out = trainer_cli("keys", "--out", str(keys), "--state-dir", str(tmp_path / "state"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "state" / "trainer" / "signing.pub").read_text().strip() in out.stdout  # the key devices must trust
    first = (keys / "trainer" / "trainer.key_secret").read_bytes()
    again = trainer_cli("keys", "--out", str(keys), "--state-dir", str(tmp_path / "state"))
    assert again.returncode == 0 and "kept the trainer's certificate" in again.stdout
    assert (keys / "trainer" / "trainer.key_secret").read_bytes() == first  # never overwritten without --force
    assert trainer_cli("device", "add", "good", "--keys", str(keys)).returncode == 0
    dup = trainer_cli("device", "add", "good", "--keys", str(keys))
    assert dup.returncode == 2 and "--force" in dup.stderr
    for secret in (keys / "trainer" / "trainer.key_secret", keys / "devices" / "good" / "good.key_secret"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    with pysocket.socket() as s1, pysocket.socket() as s2:  # two free loopback ports
        s1.bind(("127.0.0.1", 0))
        s2.bind(("127.0.0.1", 0))
        p1, p2 = s1.getsockname()[1], s2.getsockname()[1]
    endpoints = (f"tcp://127.0.0.1:{p1}", f"tcp://127.0.0.1:{p2}")
    server_keys = CurveKeys(str(keys / "trainer" / "trainer.key_secret"), authorized_dir=str(keys / "authorized"))
    store = SampleStore(tmp_path / "trainer")
    receiver = Receiver(store, HandoffSection(heartbeat_s=0.2), Link(*endpoints, curve=server_keys))
    receiver.start()
    shutil.copytree(keys / "devices" / "good", tmp_path / "on-the-device")  # what the farmer copies to the device
    trainer_pub = str(tmp_path / "on-the-device" / "trainer.key")
    good = CurveKeys(str(tmp_path / "on-the-device" / "good.key_secret"), server_public=trainer_pub)
    (tmp_path / "stranger").mkdir()
    zmq.auth.create_certificates(tmp_path / "stranger", "stranger")
    bad = CurveKeys(str(tmp_path / "stranger" / "stranger.key_secret"), server_public=trainer_pub)
    stranger, sdb, sspool, _ = make_sender(tmp_path / "s", endpoints, curve=bad)
    queue_photos(sdb, sspool, 2, seed=900)
    sender, db, spool, _ = make_sender(tmp_path / "g", endpoints, curve=good)
    ids = queue_photos(db, spool, 4)
    stranger.start()
    sender.start()
    try:
        wait_until(lambda: not db.queued_for_delivery(100), 20, "authorized daemon delivered")
        assert {s.id for s in store.all()} == set(ids)
        wait_until(lambda: "handshake refused?" in (stranger.status().get("problem") or ""), 20, "the stranger's status says why")
        assert not stranger.trainer_alive and len(sdb.queued_for_delivery(100)) == 2  # refused: nothing accepted
        assert "handshake refused?" not in (sender.status().get("problem") or "")
        assert receiver.auth is not None and "127.0.0.1" in receiver.auth.refused  # the trainer knows who knocked
        # authorizing the stranger's key lets it in, no restart
        shutil.copy(tmp_path / "stranger" / "stranger.key", keys / "authorized" / "stranger.key")
        wait_until(lambda: not sdb.queued_for_delivery(100), 20, "the newly authorized device delivered")
        assert trainer_cli("device", "revoke", "good", "--keys", str(keys)).returncode == 0
        assert (keys / "revoked" / "good.key").is_file() and not (keys / "authorized" / "good.key").exists()
    finally:
        sender.stop()
        stranger.stop()
        receiver.stop()
    # a revoked device's next connection is refused
    n = len(ids)
    late, ldb, lspool, _ = make_sender(tmp_path / "g2", endpoints, curve=good)
    queue_photos(ldb, lspool, 1, seed=990)
    receiver = Receiver(store, HandoffSection(heartbeat_s=0.2), Link(*endpoints, curve=server_keys))
    receiver.start()
    late.start()
    try:
        wait_until(lambda: "handshake refused?" in (late.status().get("problem") or ""), 20, "the revoked device is refused")
        assert len(ldb.queued_for_delivery(100)) == 1 and len(list(store.all())) == n + 2
    finally:
        late.stop()
        receiver.stop()


def _farm_keys(tmp_path, *names):
    """The trainer's certificate and one per device, as ``edge-trainer keys`` / ``device add`` make them; two tcp endpoints."""
    import socket as pysocket

    from edge_agent.handoff.transport import CurveKeys
    from trainer.devices import add_device, make_trainer_keys

    keys = tmp_path / "keys"
    make_trainer_keys(keys)
    devices = {n: CurveKeys(str(add_device(keys, n).secret), server_public=str(keys / "trainer" / "trainer.key")) for n in names}
    ports = []
    for _ in range(2):
        with pysocket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    server = CurveKeys(str(keys / "trainer" / "trainer.key_secret"), authorized_dir=str(keys / "authorized"))
    return keys, server, devices, tuple(f"tcp://127.0.0.1:{p}" for p in ports)


def test_a_revoked_device_that_never_disconnects_is_cut_off_at_once_and_keeps_its_photos(tmp_path):
    """A stolen device stays connected: from the revoke on, none of its samples is taken (no restart, no new
    handshake needed), its own status says the trainer refuses it, its photos stay queued; other devices go on."""
    from trainer.devices import revoke_device

    keys, server_keys, dev, endpoints = _farm_keys(tmp_path, "stolen", "kept")
    store = SampleStore(tmp_path / "trainer")
    receiver = Receiver(store, HandoffSection(heartbeat_s=0.2), Link(*endpoints, curve=server_keys))
    stolen, sdb, sspool, _ = make_sender(tmp_path / "s", endpoints, curve=dev["stolen"])
    kept, kdb, kspool, _ = make_sender(tmp_path / "k", endpoints, curve=dev["kept"])
    before = queue_photos(sdb, sspool, 2, seed=300) + queue_photos(kdb, kspool, 2, seed=310)
    receiver.start()
    stolen.start()
    kept.start()
    try:
        wait_until(lambda: {s.id for s in store.all()} == set(before), 20, "both delivered")
        revoke_device(keys, "stolen")
        revoked_at = time.monotonic()
        after = []
        for i in range(6):  # it goes on sending for three seconds
            after += queue_photos(sdb, sspool, 1, seed=400 + i)
            time.sleep(0.5)
        wait_until(lambda: "handshake refused?" in (stolen.status().get("problem") or ""), 10, "the stolen device is told")
        assert not {s.id for s in store.all()} & set(after)  # nothing taken after the revoke
        assert {e.sha256 for e in sdb.queued_for_delivery(100)} >= set(after)  # and nothing lost on the device
        assert receiver.counters["revoked"] + receiver.auth.refused.get("127.0.0.1", {}).get("count", 0) > 0
        late = queue_photos(kdb, kspool, 1, seed=500)  # the device still enrolled reconnects and delivers
        wait_until(lambda: set(late) <= {s.id for s in store.all()}, 20, "the other device goes on")
        assert time.monotonic() - revoked_at < 30
    finally:
        stolen.stop()
        kept.stop()
        receiver.stop()


def test_a_device_cannot_send_in_another_devices_name_and_an_invented_name_is_its_own(tmp_path):
    """A sample is its key's: one in another enrolled device's name is refused (and kept aside on the sender);
    one in a name no device has is recorded under the key's name, so invented names make no new devices."""
    keys, server_keys, dev, endpoints = _farm_keys(tmp_path, "greenhouse", "thief")
    store = SampleStore(tmp_path / "trainer")
    receiver = Receiver(store, HandoffSection(heartbeat_s=0.2), Link(*endpoints, curve=server_keys))
    posing, pdb, pspool, _ = make_sender(tmp_path / "p", endpoints, curve=dev["thief"], device="greenhouse")
    inventing, idb, ispool, _ = make_sender(tmp_path / "i", endpoints, curve=dev["thief"], device="invented-77")
    posed = queue_photos(pdb, pspool, 2, seed=600)
    invented = queue_photos(idb, ispool, 2, seed=610)
    receiver.start()
    posing.start()
    inventing.start()
    try:
        wait_until(lambda: not idb.queued_for_delivery(100), 20, "the invented name's samples delivered")
        wait_until(lambda: receiver.counters["impersonations"] >= 2, 20, "the impersonation refused")
        wait_until(lambda: not pdb.queued_for_delivery(100), 20, "the refused photos leave the delivery queue")
    finally:
        posing.stop()
        inventing.stop()
        receiver.stop()
    ids = {s.id for s in store.all()}
    assert not ids & set(posed) and set(invented) <= ids
    assert set(receiver.by_device) == {"thief"}
    assert posing.counters["refused"] == 2


def test_a_label_the_trainer_cannot_take_is_refused_and_the_daemon_keeps_the_photo_aside(tmp_path, endpoints):
    """Pseudo-labels name one of the engine's classes; a new class comes only from an expert on a sender allowed to
    create one. The daemon moves a refused photo out of its delivery queue into ``refused/``, with the reason."""
    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    known = ["Tomato___healthy", "Apple___Apple_scab"]
    pseudo = queue_photos(db, spool, 2, "pseudo", seed=300)  # labelled Tomato___healthy: known
    strangers = []
    for i, (kind, label) in enumerate([("pseudo", "Made_up___class"), ("expert", "Made_up___class"), ("expert", "bad\x00name")]):
        data = encode_img(leaf_image(400 + i))
        sha = hashlib.sha256(data).hexdigest()
        db.commit(
            [], [QueueEntry(sha, sha[:16], kind, label, 1.0, "v1000", str(spool.put_many([SpoolItem(kind, sha, data)])[0]), len(data))]
        )
        strangers.append(sha)
    store = SampleStore(tmp_path / "trainer")
    receiver = Receiver(store, HandoffSection(heartbeat_s=0.2), Link(*endpoints), new_classes=False, classes=lambda: known)
    receiver.start()
    sender.start()
    try:
        wait_until(lambda: db.queue_length() == 0, 20, "every sample answered")
        assert sorted(s.id for s in store.all()) == sorted(pseudo)
        assert receiver.counters["refused"] == 3 and sender.counters["refused"] == 3 and receiver.alive() and sender.alive()
        rows = db._query("SELECT moved_to, reason, source FROM quarantine ORDER BY reason")
        assert len(rows) == 3 and {r[2] for r in rows} == {"trainer"}
        assert all(Path(r[0]).parent.name == "refused" and Path(r[0]).exists() for r in rows)  # nothing lost
        reasons = " | ".join(r[1] for r in rows)
        assert "must name one of the engine's 2 classes" in reasons and "fleet_new_classes" in reasons
    finally:
        sender.stop()
        receiver.stop()


def test_a_new_class_from_an_allowed_sender_is_taken_if_it_is_a_class_name():
    from edge_agent.names import class_name_problem

    receiver = Receiver(None, HandoffSection(), Link("ipc:///nowhere", "ipc:///nowhere2"), classes=lambda: ["A"])
    header = {
        "id": "d" * 64,
        "kind": "expert",
        "label": "Apple___powdery_mildew",
        "confidence": 1.0,
        "engine_version": "v1000",
        "ext": ".jpg",
    }
    assert receiver._refusal(header) is None
    assert receiver._refusal({**header, "kind": "pseudo"}).startswith("a pseudo-label must name")
    for bad, why in (
        ("a/b", "path separator"),
        (" padded", "spaces"),
        ("x" * 101, "100 characters"),
        ("tab\there", "control"),
        ("zero\u200bwidth", "invisible"),
    ):
        assert why in class_name_problem(bad) and why in receiver._refusal({**header, "label": bad})
    assert Receiver(None, HandoffSection(), Link("a", "b"))._refusal({**header, "kind": "pseudo"}) is None  # no engine: not checked


@pytest.mark.parametrize("name", ["greenhouse\n", "a/b", "../x", "\x1b]0;owned\x07", "-flag", "x" * 65, "", "ok\x00"])
def test_a_device_name_with_a_newline_a_path_or_an_escape_is_refused_everywhere_it_is_given(tmp_path, name):
    """``edge-trainer device add``, ``[handoff] name`` and the wire share one rule, matched in full (a trailing
    newline passes ``re.match(...$)``, not this)."""
    from edge_agent.config import ConfigError, load_config
    from edge_agent.names import device_name_problem
    from trainer.devices import add_device, make_trainer_keys

    assert device_name_problem(name) is not None
    make_trainer_keys(tmp_path / "keys")
    with pytest.raises(ValueError, match="not a device name|device name"):
        add_device(tmp_path / "keys", name)
    assert not any("\n" in p.name for p in (tmp_path / "keys").rglob("*"))
    if name:  # an empty [handoff] name means "the default"
        cfg = tmp_path / "edge.toml"
        cfg.write_text(f"[handoff]\nname = {json.dumps(name)}\n")
        with pytest.raises(ConfigError, match="handoff"):
            load_config(cfg)


def test_good_device_names_pass_the_rule():
    from edge_agent.names import device_name_problem

    for name in ("greenhouse", "orchard-2", "jetson.local", "pi_5", "0abc"):
        assert device_name_problem(name) is None


def test_a_new_socket_is_watched_even_when_the_address_pyzmq_would_name_after_its_descriptor_is_still_taken():
    """pyzmq names a monitor ``inproc://monitor.s-<fd>``; a socket made after a refused one can reuse the fd while
    libzmq still holds the old monitor's address, and the sender thread died of "Address already in use" (CI)."""
    import zmq

    from edge_agent.handoff.transport import HandshakeWatch

    ctx = zmq.Context()
    first = ctx.socket(zmq.DEALER)
    second = ctx.socket(zmq.DEALER)
    squatter = ctx.socket(zmq.PAIR)
    try:
        watch = HandshakeWatch(first, "tcp://127.0.0.1:9")
        squatter.bind(f"inproc://monitor.s-{second.FD}")  # what the closed socket's monitor still held
        watch.watch(second)
        watch.poll()
        assert watch.monitor is not None and not watch.monitor.closed
        watch.close()
    finally:
        for sock in (first, second, squatter):
            sock.close(0)
        ctx.term()


def _queued_pseudo(db: ResultsDB, spool: PhotoSpool, tmp_path: Path, n: int) -> tuple[str, Path]:
    """A sure answer ``p<n>`` (Apple___healthy) queued as a pseudo-label, as the daemon queues one: its sha256 and file."""
    data = encode_img(leaf_image(n))
    sha = hashlib.sha256(data).hexdigest()
    row = ResultRow(
        sha, f"p{n}", str(tmp_path / "inbox" / f"l{n}.jpg"), "inbox", "Apple___healthy", 0.99, [], "v0001", {}, time.time(), "confident"
    )
    db.commit([row])
    [copy] = spool.put_many([SpoolItem("pseudo", sha, data, ".jpg")])
    db.commit([], [QueueEntry(sha, f"p{n}", "pseudo", "Apple___healthy", 0.99, "v0001", str(copy), len(data))])
    return sha, copy


def test_a_pseudo_label_relabelled_by_the_expert_while_in_flight_is_sent_again_as_the_experts_never_dropped(tmp_path, endpoints):
    """The trainer's ack is for the label it was sent: the expert's label written meanwhile (the photo's file moved to
    the expert queue) is not acknowledged by it, and a resend carries the expert's label from the file where it is now
    (before, the ack deleted the expert's label, and a resend read the old path, found nothing and dropped it)."""
    from edge_agent.review.queue import label_photo

    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    sha, copy = _queued_pseudo(db, spool, tmp_path, 3)
    sent = Wire()  # what the sender puts on the wire

    sender._deliver(sent, time.monotonic())
    assert [(h["kind"], h["label"]) for h in sent] == [("pseudo", "Apple___healthy")]
    label_photo(db, tmp_path / "queue", 1 << 30, ["Apple___healthy", "Apple___Black_rot"], "p3", "Apple___Black_rot")
    assert not copy.exists()  # moved to the expert queue
    sender._handle(encode("ack", {"id": sha}))  # the trainer acknowledges the pseudo-label it was sent
    assert [(e.kind, e.label) for e in db.queued_for_delivery(10)] == [("expert", "Apple___Black_rot")]  # kept: not the label acked
    sender._deliver(sent, time.monotonic() + 1)
    assert [(h["kind"], h["label"]) for h in sent[1:]] == [("expert", "Apple___Black_rot")]
    label_photo(db, tmp_path / "queue", 1 << 30, ["Apple___healthy", "Apple___Black_rot"], "p3", "Apple___healthy")  # put right again
    sender._deliver(sent, time.monotonic() + 2)  # no ack yet: resent, as it is now
    assert [(h["kind"], h["label"]) for h in sent[2:]] == [("expert", "Apple___healthy")]
    sender._handle(encode("ack", {"id": sha}))  # the newest, acknowledged
    assert db.queued_for_delivery(10) == [] and db.expert_labels() == {sha: "Apple___healthy"}
    sha, copy = _queued_pseudo(db, spool, tmp_path, 4)  # a pseudo-label in flight, relabelled before any ack: its file moves
    sender._deliver(sent, time.monotonic() + 3)
    label_photo(db, tmp_path / "queue", 1 << 30, ["Apple___healthy", "Apple___Black_rot"], "p4", "Apple___Black_rot")
    assert not copy.exists()
    sender._deliver(sent, time.monotonic() + 5)  # resent from where the photo is now
    assert (sent[-1]["id"], sent[-1]["kind"], sent[-1]["label"]) == (sha, "expert", "Apple___Black_rot")
    assert [(e.kind, e.label) for e in db.queued_for_delivery(10)] == [("expert", "Apple___Black_rot")]


def test_the_ack_of_an_older_label_arriving_after_the_newer_was_sent_leaves_the_newer_queued_until_its_own_ack(tmp_path, endpoints):
    """The trainer names the label it acknowledges: a pseudo-label acked only after the expert's label of the photo was
    sent (the trainer slow, the link lossy) no longer counts as the expert's delivery; before, the row went with that
    ack, and a trainer that then failed to store the expert's label (its disk full) lost it."""
    from edge_agent.review.queue import label_photo

    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    sha, _copy = _queued_pseudo(db, spool, tmp_path, 5)
    sent = Wire()  # what the sender puts on the wire

    sender._deliver(sent, time.monotonic())
    label_photo(db, tmp_path / "queue", 1 << 30, ["Apple___healthy", "Apple___Black_rot"], "p5", "Apple___Black_rot")
    sender._deliver(sent, time.monotonic() + 1)  # no ack yet: resent, as it is now
    assert [(h["kind"], h["label"]) for h in sent] == [("pseudo", "Apple___healthy"), ("expert", "Apple___Black_rot")]
    sender._handle(encode("ack", {"id": sha, "kind": "pseudo", "label": "Apple___healthy"}))  # the first send's ack
    assert [(e.kind, e.label) for e in db.queued_for_delivery(10)] == [("expert", "Apple___Black_rot")]
    assert sender.counters["acked"] == 0
    sender._handle(encode("ack", {"id": sha, "kind": "expert", "label": "Apple___Black_rot"}))  # the expert's, stored
    assert db.queued_for_delivery(10) == [] and sender.counters["acked"] == 1


def test_a_refusal_of_an_older_label_keeps_the_label_the_expert_put_right_meanwhile_queued(tmp_path, endpoints):
    """A label the trainer refuses (a class it does not take) that the expert put right while it was in flight: the
    refusal is for the old class, so the photo is not set aside; the new label is sent next."""
    from edge_agent.review.queue import label_photo

    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    sha, _copy = _queued_pseudo(db, spool, tmp_path, 6)
    classes = ["Apple___healthy", "Apple___Black_rot", "Apple___Blotch"]
    label_photo(db, tmp_path / "queue", 1 << 30, classes, "p6", "Apple___Blotch")  # a class this trainer will refuse
    sent = Wire()  # what the sender puts on the wire

    sender._deliver(sent, time.monotonic())
    label_photo(db, tmp_path / "queue", 1 << 30, classes, "p6", "Apple___Black_rot")  # put right before the answer
    why = "new classes are taken from the trainer's own device only"
    sender._handle(encode("refused", {"id": sha, "reason": why, "kind": "expert", "label": "Apple___Blotch"}))
    assert [(e.kind, e.label) for e in db.queued_for_delivery(10)] == [("expert", "Apple___Black_rot")]
    assert db.counts()["quarantined"] == 0 and sender.counters["refused"] == 0
    sender._deliver(sent, time.monotonic() + 1)
    assert (sent[-1]["kind"], sent[-1]["label"]) == ("expert", "Apple___Black_rot")
    sender._handle(encode("refused", {"id": sha, "reason": why, "kind": "expert", "label": "Apple___Black_rot"}))
    assert db.queued_for_delivery(10) == [] and db.counts()["quarantined"] == 1  # refused as it is now: set aside


def test_the_trainer_names_the_label_it_acknowledges_or_refuses(tmp_path):
    """What the receiver answers carries the sample's kind and label, so the device deletes that label only."""
    receiver = Receiver(SampleStore(tmp_path / "trainer"), HandoffSection(), Link("ipc://x", "ipc://y"), classes=lambda: ["A"])
    out = Wire(routed=True)  # what the receiver puts on the wire

    photo = encode_img(leaf_image(7))
    sha = hashlib.sha256(photo).hexdigest()
    for label, answer in (("Tomato___healthy", "refused"), ("A", "ack")):  # a pseudo-label of no class it has; one of A
        header = sample_header(QueueEntry(sha, "p7", "pseudo", label, 0.97, "v0001", "p7.jpg", len(photo)), "p7.jpg")
        receiver._handle(out, [b"peer", *encode("sample", header, photo)])
        assert out[-1].kind == answer
        assert (out[-1].header["id"], out[-1].header["kind"], out[-1].header["label"]) == (sha, "pseudo", label)


def test_an_expert_relabelling_a_photo_the_instant_the_sender_reads_it_keeps_the_experts_label_and_its_file(
    tmp_path, endpoints, monkeypatch
):
    """The sender's check that the row is still the label answered (or still the file it could not read) and its delete
    are one transaction with the expert's relabelling from the page (another process): a relabel landing just after the
    sender read the row wins (before, the older's ack deleted the row and the expert's label with it, or the file of an
    expert's label put right, which keeps its path; and a row read before its photo moved to the expert folder was
    dropped as "photo missing")."""
    from edge_agent.review.queue import label_photo

    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    classes = ["Apple___healthy", "Apple___Black_rot", "Apple___Blotch"]
    sent = Wire()  # what the sender puts on the wire

    real_read = db.queue_entry
    for n, first in ((10, None), (11, "Apple___Blotch")):  # a pseudo-label in flight; an expert's label in flight
        sha, _copy = _queued_pseudo(db, spool, tmp_path, n)
        if first:
            label_photo(db, tmp_path / "queue", 1 << 30, classes, f"p{n}", first)
        sender._deliver(sent, time.monotonic())
        read = real_read(sha)
        monkeypatch.setattr(
            db,
            "queue_entry",
            lambda s, n=n: (real_read(s), label_photo(db, tmp_path / "queue", 1 << 30, classes, f"p{n}", "Apple___Black_rot"))[0],
        )
        sender._handle(encode("ack", {"id": sha, "kind": read.kind, "label": read.label}))
        monkeypatch.undo()
        queued = db.queue_entry(sha)
        assert queued is not None and (queued.kind, queued.label) == ("expert", "Apple___Black_rot") and Path(queued.file).is_file()
        assert sender.counters["acked"] == 0
        assert db.remove_queued_entry(queued)
    sha, copy = _queued_pseudo(db, spool, tmp_path, 12)  # read for sending, then its photo moved to the expert folder
    [entry] = db.queued_for_delivery(10)
    label_photo(db, tmp_path / "queue", 1 << 30, classes, "p12", "Apple___Black_rot")
    assert not sender._send_item(sent, sha, entry.file, entry=entry)
    queued = db.queue_entry(sha)
    assert queued is not None and (queued.kind, queued.label) == ("expert", "Apple___Black_rot") and Path(queued.file).is_file()


def test_a_trainer_that_cannot_store_labels_acks_none_and_says_so_to_devices_and_in_its_status(tmp_path, monkeypatch, capsys):
    """A full disk on the trainer: no label is acknowledged (the device keeps each and sends it again), the receiver
    says why and since when (the heartbeat's state the devices show: "labels not stored: disk full"; `edge-trainer
    status`), and the first label stored again clears it (before, only a counter no page showed went up)."""
    import errno
    import json
    import os

    from trainer.cli import main

    store = SampleStore(tmp_path / "trainer")
    receiver = Receiver(store, HandoffSection(), Link("ipc://x", "ipc://y"))
    out = Wire(routed=True)
    photo = encode_img(leaf_image(11))
    sha = hashlib.sha256(photo).hexdigest()
    header = sample_header(QueueEntry(sha, "p11", "expert", "Apple___healthy", 1.0, "v0001", "p.jpg", len(photo)), "p.jpg")
    real_add = SampleStore.add

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SampleStore, "add", full)
    receiver._handle(out, [b"peer", *encode("sample", header, photo)])
    assert out == [] and receiver.store_problem["full"] and receiver.counters["store_errors"] == 1
    assert receiver.problem_state == "labels not stored: disk full"  # what the trainer's heartbeat tells the devices
    (tmp_path / "trainer" / "status.json").write_text(
        json.dumps({"pid": os.getpid(), "updated": time.time(), "state": "idle", "samples": {}, "store_problem": receiver.store_problem})
    )
    assert main(["status", "--state-dir", str(tmp_path)]) == 0
    assert "LABELS NOT STORED since" in capsys.readouterr().out
    monkeypatch.setattr(SampleStore, "add", real_add)
    receiver._handle(out, [b"peer", *encode("sample", header, photo)])
    assert [m.kind for m in out] == ["ack"] and receiver.store_problem is None and store.has(sha)
    assert receiver.problem_state is None


def test_the_device_keeps_what_the_trainers_heartbeat_says_of_storing_its_labels(tmp_path, endpoints):
    """`stores_labels` on the trainer's heartbeat (false while its disk is full) reaches the device's status, which its
    alerts and pages read; a trainer from before, which sends none, is not taken as one that stores none."""
    sender, *_ = make_sender(tmp_path, endpoints)
    beat = {"role": "trainer", "time": time.time(), "state": "labels not stored: disk full", "stores_labels": False}
    sender._handle(encode("heartbeat", beat))
    assert sender.status()["trainer"]["stores_labels"] is False and sender.status()["trainer"]["state"].startswith("labels not")
    sender._handle(encode("heartbeat", {"role": "trainer", "time": time.time(), "state": "idle"}))
    assert "stores_labels" not in sender.status()["trainer"]
    sender._handle(
        encode("heartbeat", {"role": "trainer", "time": time.time(), "state": "waiting for room: disk full", "waits_for_room": True})
    )
    assert sender.status()["trainer"]["waits_for_room"] is True  # and a trainer with no room to retrain, its alerts


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # (it dies, as the health check expects)
def test_a_damaged_page_of_the_label_queue_stops_the_hand_off_and_is_told_to_the_ledger(tmp_path, endpoints, monkeypatch):
    """The hand-off reading a rotted page of the label queue died with a log line, and the daemon went on without it:
    now the ledger learns of the damage too (ResultsDB.damaged), so the daemon stops and its next start sets it aside."""
    import sqlite3

    sender, db, _, _ = make_sender(tmp_path, endpoints)

    def rotted(*a, **k):
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(db, "queued_for_delivery", rotted)
    sender.trainer_seen = time.monotonic() + 3600  # (a trainer heard: the queue is read)
    sender.start()
    wait_until(lambda: not sender.alive(), 10, "the hand-off to stop")
    assert db.damage_seen and "malformed" in db.damage_seen
    sender.stop()
    db.close()
