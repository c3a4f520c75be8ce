"""Pseudo-labels taken back when the expert finds a sure answer of their class by their engine wrong."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time

import pytest

zmq = pytest.importorskip("zmq")

from edge_agent.config import HandoffSection, LabelsSection  # noqa: E402
from edge_agent.handoff.protocol import ProtocolError, decode, encode  # noqa: E402
from edge_agent.handoff.transport import Link  # noqa: E402
from edge_agent.ledger_rows import QueueEntry, ResultRow  # noqa: E402
from edge_agent.results import ResultsDB  # noqa: E402
from edge_agent.review.checks import class_trust  # noqa: E402
from edge_agent.review.withdraw import Withdrawals  # noqa: E402
from edge_agent.spool import PhotoSpool, SpoolItem  # noqa: E402
from trainer.loop.unlabelled_pool import UnlabelledPool  # noqa: E402
from trainer.receiver import Receiver  # noqa: E402
from trainer.samples import SampleStore  # noqa: E402

from .conftest import encode as encode_img  # noqa: E402
from .conftest import leaf_image  # noqa: E402
from .daemon_helpers import wait_until  # noqa: E402
from .test_handoff import Wire, endpoints, make_sender  # noqa: E402, F401
from .test_review_reanswer import engine  # noqa: E402, F401 (the fixture)
from .test_trust import _photo  # noqa: E402

_seed = iter(range(5000, 10**6))


def _trusted(db: ResultsDB, label: str = "A") -> None:
    """``label`` trusted: 23 right checks in a row of v0001's answers (the defaults' sequential test), delivered."""
    for _ in range(23):
        _photo(db, label, expert=label)
    for entry in db.queued("expert"):
        db.remove_queued_entry(entry, delivered=True)
    assert class_trust(db, LabelsSection())[label].trusted


def _check(db: ResultsDB, said: str = "A", expert: str = "B", version: str = "v0002") -> str:
    """A sure answer of ``said`` by ``version`` the expert labelled ``expert`` (by default a wrong check of v0002's,
    the engine a swap brought after v0001's checks earned the class trust); its label delivered."""
    sha = _photo(db, said, expert=expert)
    with db._lock:
        db._db.execute("UPDATE results SET engine_version = ? WHERE sha256 = ?", (version, sha))
    for entry in db.queued("expert"):
        db.remove_queued_entry(entry, delivered=True)
    return sha


def _pseudo(db: ResultsDB, spool: PhotoSpool, label: str = "A", version: str = "v0002") -> QueueEntry:
    """A sure answer of ``label`` by ``version`` queued as a pseudo-label, as the daemon queues one (a real photo)."""
    data = encode_img(leaf_image(next(_seed)))
    sha = hashlib.sha256(data).hexdigest()
    [f] = spool.put_many([SpoolItem("pseudo", sha, data)])
    entry = QueueEntry(sha, sha[:16], "pseudo", label, 0.995, version, str(f), len(data))
    db.commit([ResultRow(sha, sha[:16], None, "inbox", label, 0.995, [[label, 0.995]], version, {}, verdict="confident")], [entry])
    return entry


def _delivered(db: ResultsDB, spool: PhotoSpool, label: str = "A", version: str = "v0002") -> QueueEntry:
    """A pseudo-label the trainer acknowledged (its row gone from the queue, recorded as delivered)."""
    entry = _pseudo(db, spool, label, version)
    assert db.remove_queued_entry(entry, delivered=True)
    return entry


def _kinds(db: ResultsDB) -> dict[str, str]:
    return {e.sha256: e.kind for e in db.queued()}


@pytest.fixture
def ledger(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    yield db, PhotoSpool(tmp_path / "queue", 1 << 28)
    db.close()


def test_a_wrong_check_returns_that_engines_queued_pseudo_labels_of_the_class_to_the_review_pool(ledger):
    db, spool = ledger
    _trusted(db)  # by v0001's checks; then a swap to v0002
    swapped = [_pseudo(db, spool, "A", "v0002") for _ in range(3)]
    parent = _pseudo(db, spool, "A", "v0001")
    other = _pseudo(db, spool, "B", "v0002")
    step = Withdrawals(db, LabelsSection())
    assert step.run() is not None and step.run() is None  # the first look reads the labels; nothing new since
    assert {_kinds(db)[e.sha256] for e in [*swapped, parent, other]} == {"pseudo"}
    _check(db)  # an audit of v0002's: the model sure it was A, the expert says B
    done = step.run()
    assert (done.found, done.pooled, done.marked) == ((("A", "v0002"),), 3, 0)
    kinds = _kinds(db)
    assert [kinds[e.sha256] for e in swapped] == ["review"] * 3  # checks again: the class is not trusted now
    assert kinds[parent.sha256] == "pseudo" and kinds[other.sha256] == "pseudo"  # another engine's, another class's
    assert {q.sha256: q.file for q in db.queued()}[swapped[0].sha256] == swapped[0].file  # its file where it was
    assert step.run() is None


def test_the_engine_whose_checks_earned_the_trust_keeps_its_pseudo_labels_until_its_own_checks_turn_against_it(ledger):
    db, spool = ledger
    _trusted(db)  # 23 right checks of v0001's answers
    kept = _pseudo(db, spool, "A", "v0001")
    step = Withdrawals(db, LabelsSection())
    step.run()
    _check(db, version="v0001")  # one wrong in 24: what an engine right 97 % of the time does once in 33
    assert not class_trust(db, LabelsSection())["A"].trusted  # the trust goes, as the test says
    assert step.run().found == () and _kinds(db)[kept.sha256] == "pseudo"  # what it made on it stands
    _check(db, version="v0001")  # two wrong in 25: more like an engine right 85 % of the time
    assert step.run().found == (("A", "v0001"),) and _kinds(db)[kept.sha256] == "review"


def test_a_wrong_check_marks_the_delivered_ones_to_withdraw_and_spares_those_made_after_it(ledger):
    db, spool = ledger
    _trusted(db)
    sent = [_delivered(db, spool) for _ in range(4)]
    step = Withdrawals(db, LabelsSection())
    step.run()
    assert db.withdrawals_due(10) == []
    _check(db)
    assert step.run().marked == 4
    assert sorted(db.withdrawals_due(10)) == sorted((e.sha256, "A", "v0002") for e in sent)
    assert db.withdrawals_due(2) == db.withdrawals_due(10)[:2]
    later = _delivered(db, spool)  # made once the class earned trust again, after the wrong check
    _check(db, expert="A")  # a new label: the step reads again
    assert step.run().found == ()
    assert later.sha256 not in {sha for sha, *_ in db.withdrawals_due(10)}
    assert db.confirm_withdrawn(sent[0].sha256) and not db.confirm_withdrawn(sent[0].sha256)
    assert not db.confirm_withdrawn(later.sha256)  # never withdrawn: nothing to confirm
    assert db.withdrawn_counts() == {"A": (4, 1)}


def test_a_check_labelled_before_a_restart_is_read_at_the_next_start_and_only_once(ledger):
    db, spool = ledger
    _trusted(db)
    queued = _pseudo(db, spool)
    Withdrawals(db, LabelsSection()).run()
    _check(db)  # the daemon stopped before its idle step read it
    again = Withdrawals(db, LabelsSection())  # the next start
    assert again.run().found == (("A", "v0002"),) and _kinds(db)[queued.sha256] == "review"
    assert Withdrawals(db, LabelsSection()).run() is None  # read once: a third start has nothing new to read


def test_a_ledger_from_before_withdrawals_takes_nothing_back_for_the_wrong_checks_it_already_held(tmp_path):
    path = tmp_path / "results.sqlite"
    db = ResultsDB(path)
    spool = PhotoSpool(tmp_path / "queue", 1 << 28)
    _check(db)  # a wrong check from before the upgrade
    queued = _pseudo(db, spool)
    db.close()
    con = sqlite3.connect(path)
    con.execute("DROP TABLE withdraw_seen")
    con.commit()
    con.close()
    db = ResultsDB(path)  # upgraded: the labels it held count as read
    assert Withdrawals(db, LabelsSection()).run() is None
    assert _kinds(db)[queued.sha256] == "pseudo"
    _check(db)  # a new one does
    assert Withdrawals(db, LabelsSection()).run().found == (("A", "v0002"),) and _kinds(db)[queued.sha256] == "review"
    db.close()


def test_a_class_the_rule_keeps_trusted_after_a_wrong_check_keeps_its_pseudo_labels_and_no_test_withdraws_nothing(ledger):
    db, spool = ledger
    policy = LabelsSection(trust_rule="wilson", trust_precision=0.9)  # one wrong check in thirty leaves it trusted
    for _ in range(40):
        _photo(db, "A", expert="A")  # v0001's answers
    queued = _pseudo(db, spool)
    step = Withdrawals(db, policy)
    step.run()
    _check(db)  # v0002's first check, wrong
    assert class_trust(db, policy)["A"].trusted and step.run().found == () and _kinds(db)[queued.sha256] == "pseudo"
    _check(db)  # a second wrong check in the window: now the trust goes, and the pseudo-labels with it
    assert not class_trust(db, policy)["A"].trusted
    assert Withdrawals(db, LabelsSection(trust_checks=0)).run() is None  # (every class trusted, no test: nothing read)
    assert step.run().found == (("A", "v0002"),) and _kinds(db)[queued.sha256] == "review"


def test_withdraw_messages_are_checked_like_any_other():
    sha = "a" * 64
    ok = decode(encode("withdraw", {"id": sha, "label": "A", "engine_version": "v0001"}))
    assert ok.header == {"id": sha, "label": "A", "engine_version": "v0001"}
    assert decode(encode("withdrawn", {"id": sha, "label": "A"})).kind == "withdrawn"
    for header in (
        {"id": "xyz", "label": "A", "engine_version": "v0001"},
        {"id": sha, "label": "A" * 201, "engine_version": "v0001"},
        {"id": sha, "label": "A"},
        {"id": sha, "label": 7, "engine_version": "v0001"},
        {"id": sha, "label": "A", "engine_version": "v" * 33},
    ):
        with pytest.raises(ProtocolError):
            decode(encode("withdraw", header))
    with pytest.raises(ProtocolError):
        decode([*encode("withdraw", {"id": sha, "label": "A", "engine_version": "v0001"}), b"a photo"])  # carries none
    with pytest.raises(ProtocolError):
        decode(encode("heartbeat", {"role": "trainer", "time": 1.0, "withdraws": "yes"}))


def test_the_sender_withdraws_only_from_a_trainer_that_takes_withdrawals_and_again_until_it_answers(tmp_path, endpoints):  # noqa: F811
    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    _trusted(db)
    sent = [_delivered(db, spool) for _ in range(3)]
    _check(db)
    Withdrawals(db, LabelsSection()).run()
    wire = Wire()
    now = time.monotonic()
    sender._deliver_withdrawals(wire, now)
    assert wire == []  # a trainer from before: its heartbeat says nothing of withdrawals, kept until one does
    sender._handle(encode("heartbeat", {"role": "trainer", "time": time.time(), "withdraws": True}))
    sender._deliver_withdrawals(wire, now)
    assert sorted(h["id"] for h in wire) == sorted(e.sha256 for e in sent) and {h["engine_version"] for h in wire} == {"v0002"}
    sender._handle(encode("withdrawn", {"id": sent[0].sha256, "label": "A"}))
    sender._deliver_withdrawals(wire, now + 0.1)  # too soon to look again
    assert len(wire) == 3
    sender._deliver_withdrawals(wire, now + 10)  # unanswered: sent again; the answered one is not
    assert sorted(h["id"] for h in wire[3:]) == sorted(e.sha256 for e in sent[1:])
    sender._deliver_withdrawals(wire, now + 10.6)  # looked at again, but a second try waits twice as long
    assert len(wire) == 5
    for e in sent[1:]:
        sender._handle(encode("withdrawn", {"id": e.sha256, "label": "A"}))
    more = _delivered(db, spool)
    _check(db)
    Withdrawals(db, LabelsSection()).run()
    sender._deliver_withdrawals(wire, now + 10.7)  # the window answered whole: the next looked for at once
    assert [h["id"] for h in wire[5:]] == [more.sha256]
    assert db.withdrawn_counts() == {"A": (4, 3)} and sender.counters["withdrawn"] == 3


def test_a_pseudo_label_taken_back_while_in_flight_is_withdrawn_once_the_trainer_acknowledges_it(tmp_path, endpoints):  # noqa: F811
    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    _trusted(db)
    step = Withdrawals(db, LabelsSection())
    step.run()
    entry = _pseudo(db, spool)
    wire = Wire()
    sender._deliver(wire, time.monotonic())
    assert [(h["id"], h["kind"]) for h in wire] == [(entry.sha256, "pseudo")]
    _check(db)
    assert step.run().pooled == 1  # back in the review pool while the trainer stores it
    sender._handle(encode("ack", {"id": entry.sha256, "kind": "pseudo", "label": "A"}))
    assert _kinds(db)[entry.sha256] == "review"  # still a check for the expert
    assert db.withdrawals_due(10) == [(entry.sha256, "A", "v0002")]  # and taken back from the trainer
    lost = _pseudo(db, spool)  # another in flight, taken back, its ack lost: not resent as a label, withdrawn all the same
    sender._deliver(wire, time.monotonic())
    _check(db)
    step.run()
    sender._deliver(wire, time.monotonic() + 60)
    assert [h["kind"] for h in wire if h["id"] == lost.sha256 and h["kind"] != "unlabelled"] == ["pseudo"]  # sent once
    assert sender._inflight.get(lost.sha256) is None or sender._inflight[lost.sha256].verdict is not None
    assert _kinds(db)[lost.sha256] == "review" and (lost.sha256, "A", "v0002") in db.withdrawals_due(10)


def test_a_trainer_drops_the_withdrawn_pseudo_labels_keeps_their_photos_unlabelled_and_an_expert_label_since(tmp_path, endpoints):  # noqa: F811
    sender, db, spool, _ = make_sender(tmp_path, endpoints)
    _trusted(db)
    Withdrawals(db, LabelsSection()).run()
    entries = [_pseudo(db, spool) for _ in range(4)] + [_pseudo(db, spool, "A", "v0001")]
    store = SampleStore(tmp_path / "trainer")
    pool = UnlabelledPool(tmp_path / "trainer", 100, 1 << 30)
    receiver = Receiver(store, HandoffSection(heartbeat_s=0.2), Link(*endpoints), pool=pool)
    receiver.start()
    sender.start()
    try:
        wait_until(lambda: not db.queued_for_delivery(10), 20, "delivered")
        assert {s.id for s in store.all()} == {e.sha256 for e in entries}
        store.add({"id": entries[0].sha256, "kind": "expert", "label": "A", "confidence": 1.0, "engine_version": "v0002"}, b"")
        _check(db)
        Withdrawals(db, LabelsSection()).run()
        wait_until(lambda: db.withdrawn_counts() == {"A": (4, 4)}, 20, "every withdrawal confirmed")
    finally:
        sender.stop()
        receiver.stop()
    kept = {s.id: (s.kind, s.engine_version) for s in store.all()}
    assert kept == {entries[0].sha256: ("expert", "v0002"), entries[4].sha256: ("pseudo", "v0001")}
    assert {p.id for p in pool.photos()} == {e.sha256 for e in entries[1:4]}  # kept as photos nobody labelled
    assert all(p.verdict == "confident" and p.label == "A" for p in pool.photos())
    for p in pool.photos():
        assert hashlib.sha256(open(p.file, "rb").read()).hexdigest() == p.id
    assert not [f for f in (tmp_path / "trainer" / "samples").iterdir() if f.stem in {e.sha256 for e in entries[1:4]}]
    assert store.get_state("pseudo_withdrawn") == "3" and receiver.counters["withdrawn"] == 3
    pool.close()


def test_a_trainer_that_cannot_write_answers_no_withdrawal_and_one_without_a_pool_deletes_the_photo(tmp_path, monkeypatch):
    store = SampleStore(tmp_path / "trainer")
    data = encode_img(leaf_image(3))
    sha = hashlib.sha256(data).hexdigest()
    store.add({"id": sha, "kind": "pseudo", "label": "A", "confidence": 0.99, "engine_version": "v0001", "ext": ".png"}, data)
    receiver = Receiver(store, HandoffSection(), Link("ipc:///nowhere/a", "ipc:///nowhere/b"))
    wire = Wire(routed=True)
    ask = {"id": sha, "label": "A", "engine_version": "v0001"}

    def full(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "withdraw", full)
    receiver._withdraw(wire, b"peer", ask)
    assert wire == [] and receiver.counters["store_errors"] == 1  # no answer: the device asks again
    monkeypatch.undo()
    receiver._withdraw(wire, b"peer", {**ask, "engine_version": "v0002"})  # not that pseudo-label: left, answered
    assert [m.kind for m in wire] == ["withdrawn"] and store.has(sha)
    receiver._withdraw(wire, b"peer", ask)
    assert not store.has(sha) and not list((tmp_path / "trainer" / "samples").iterdir())  # no pool: the photo goes
    assert [(m.kind, m.header["id"]) for m in wire[1:]] == [("withdrawn", sha)]


def test_over_curve_a_device_withdraws_only_the_pseudo_labels_it_delivered(tmp_path):
    store = SampleStore(tmp_path / "trainer")
    data = encode_img(leaf_image(4))
    sha = hashlib.sha256(data).hexdigest()
    header = {"id": sha, "kind": "pseudo", "label": "A", "confidence": 0.99, "engine_version": "v0002", "ext": ".png"}
    store.add(header | {"device": "orchard-1"}, data)
    receiver = Receiver(store, HandoffSection(), Link("ipc:///nowhere/a", "ipc:///nowhere/b"))
    wire = Wire(routed=True)
    ask = {"id": sha, "label": "A", "engine_version": "v0002"}
    receiver._withdraw(wire, b"peer", ask, who="orchard-2")  # another device's key: answered, nothing withdrawn
    assert [m.kind for m in wire] == ["withdrawn"] and store.has(sha)
    receiver._withdraw(wire, b"peer", ask, who="orchard-1")
    assert not store.has(sha)
    store.add(header, data)  # on the trainer's own socket (no keys) the local daemon withdraws what it names
    assert store.withdraw(sha, "A", "v0002") is not None


def test_status_and_the_trust_page_say_how_many_pseudo_labels_were_withdrawn_and_whether_the_trainer_took_them_back(tmp_path, capsys):
    from edge_agent.cli import main
    from edge_agent.state import StateLayout

    from .web_helpers import client

    layout = StateLayout(tmp_path / "state")
    layout.create()
    db = ResultsDB(layout.db)
    spool = PhotoSpool(tmp_path / "queue", 1 << 28)
    db.close()
    assert main(["status", "--state-dir", str(layout.root)]) == 0
    assert "withdrawn:" not in capsys.readouterr().out
    db = ResultsDB(layout.db)
    _trusted(db, "Apple___Black_rot")
    sent = [_delivered(db, spool, "Apple___Black_rot") for _ in range(2)]
    _check(db, "Apple___Black_rot", "Apple___Scab")
    Withdrawals(db, LabelsSection()).run()
    db.confirm_withdrawn(sent[0].sha256)
    db.close()
    assert main(["status", "--state-dir", str(layout.root)]) == 0
    out = capsys.readouterr().out
    assert "withdrawn: 2 of Apple___Black_rot (a sure answer of the class by their engine found wrong); 1 not yet taken back" in out
    assert main(["status", "--state-dir", str(layout.root), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["withdrawn_pseudo_labels"]
    assert said == {"Apple___Black_rot": {"withdrawn": 2, "confirmed": 1}}
    page = client(layout.root).get("/trust").text
    assert "2 delivered pseudo-labels withdrawn (a sure answer found wrong), 1 not yet taken back by the trainer" in page


def test_the_idle_pipeline_takes_back_what_a_wrong_check_finds_and_says_so_in_the_journal(tmp_path, engine, monkeypatch):  # noqa: F811
    from edge_agent.review.queue import label_photo

    from .test_review_reanswer import CLASSES, NextEngine, classified
    from .test_review_trusted_pool import QUICK

    policy = QUICK.model_copy(update={"trust_against": 0.5})  # (below QUICK's 0.7: a wrong check outweighs 1.5 right)
    p, db, _ = classified(tmp_path, NextEngine(engine, lambda i: 0.99), policy, 18, monkeypatch)
    warned: list[tuple] = []
    monkeypatch.setattr(p.log, "warning", lambda event, **kw: warned.append((event, kw)))
    pool: dict[str, list[str]] = {}
    for e, *_ in db.review_pool():
        pool.setdefault(e.label, []).append(e.sha256)
    label = sorted(pool)[0]
    other = next(c for c in CLASSES if c != label)
    for sha in pool[label][:3]:  # three right checks earn the class trust (QUICK): its three other photos become pseudo-labels
        label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, sha, label)
    wait_until(lambda: all(db.queue_entry(s).kind == "pseudo" for s in pool[label][3:]), timeout=10)
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, pool[label][3], other)  # one of them, found wrong: trust lost
    time.sleep(2.5)  # (idle turns, each a second)
    assert [db.queue_entry(s).kind for s in pool[label][4:]] == ["pseudo", "pseudo"]  # three right, one wrong: they stand
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, pool[label][4], other)  # a second: the engine's checks turn
    wait_until(lambda: db.queue_entry(pool[label][5]).kind == "review", timeout=10)
    [(event, said)] = [w for w in warned if w[0] == "pseudo_labels_withdrawn"]
    assert (said["found_wrong"], said["returned_to_review"], said["to_withdraw_from_trainer"]) == ([f"{label} by v0002"], 1, 0)
    p.stop()
