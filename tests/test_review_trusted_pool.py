"""A review-pool photo the engine in service answers sure in a class trust now covers becomes a pseudo-label while it
waits, as it would have on arrival; nothing else leaves the pool, and nothing the expert said is overwritten."""

from __future__ import annotations

import sqlite3
import time

import pytest

from edge_agent.config import LabelsSection
from edge_agent.labelling import LabelQueuer
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.pipeline import Job
from edge_agent.results import ResultsDB
from edge_agent.review.queue import label_photo
from edge_agent.review.trusted_pool import TrustedPool
from edge_agent.spool import PhotoSpool, SpoolItem

from .conftest import encode, leaf_image
from .daemon_helpers import wait_until
from .test_pipeline import FixedEngine, drop, make_pipeline
from .test_review_reanswer import CLASSES, NextEngine, classified, engine  # noqa: F401 (the fixture)

A, B, _ = CLASSES
#: Three right checks in a row earn a class trust (the Wilson rule at 0.7), so a test can earn it in a few labels.
#: Trust after three right checks, and no audits: which photos a class's answers fall on varies with the order a
#: pipeline answers them, and a photo drawn for an audit would stay a check (the leaf photo 4 is: tests/conftest.py).
QUICK = LabelsSection(trust_rule="wilson", trust_checks=3, trust_precision=0.7, pseudo_threshold=0.9, review_threshold=0.8, audit_share=0.0)


class _Ledger:
    """A ledger and queue where each photo is added with the answer it is queued with."""

    def __init__(self, tmp_path) -> None:
        self.root = tmp_path / "queue"
        self.db = ResultsDB(tmp_path / "results.sqlite")
        self.spool = PhotoSpool(self.root, 1 << 30)
        self.n = 0

    def add(self, label: str, confidence: float, version: str = "v0002", verdict: str = "confident") -> str:
        i, self.n = self.n, self.n + 1
        sha = f"{i:064x}"
        [f] = self.spool.put_many([SpoolItem("review", sha, encode(leaf_image(i)), ".jpg")])
        top_k = [[label, confidence], [B if label != B else A, 1 - confidence]]
        row = ResultRow(sha, f"p{i}", f"/in/{i}.jpg", "folder", label, confidence, top_k, version, {}, verdict=verdict)
        self.db.commit([row], [QueueEntry(sha, f"p{i}", "review", label, confidence, version, str(f), f.stat().st_size)])
        return sha

    def label(self, sha: str, label: str) -> None:
        label_photo(self.db, self.root, 1 << 30, CLASSES, sha, label)

    def checks(self, label: str, right: int, wrong: int = 0) -> None:
        """The expert labels ``right + wrong`` sure answers of ``label``: ``right`` of them with that class."""
        for k in range(right + wrong):
            self.label(self.add(label, 0.99), label if k < right else C)

    def kind(self, sha: str) -> str:
        return self.db._query("SELECT kind FROM label_queue WHERE sha256 = ?", (sha,))[0][0]


C = CLASSES[2]


def _trusted_pool(ledger: _Ledger, policy: LabelsSection = QUICK) -> TrustedPool:
    return TrustedPool(ledger.db, LabelQueuer(ledger.db, ledger.spool, policy))


def test_a_pool_photo_the_serving_engine_is_sure_of_in_a_trusted_class_becomes_a_pseudo_label_and_no_other_does(tmp_path):
    led = _Ledger(tmp_path)
    sure = led.add(A, 0.99)
    others = {
        "below trust_confidence": led.add(A, 0.95),
        "a class not trusted": led.add(B, 0.99),
        "an older engine's answer": led.add(A, 0.99, version="v0001"),
        "refused by the verdict": led.add(A, 0.99, verdict="unsure"),
    }
    led.checks(A, right=3)
    pool = _trusted_pool(led)
    made = pool.run("v0002")
    assert [e.sha256 for e in made] == [sure] and pool.made == 1
    assert led.kind(sure) == "pseudo"
    assert {why: led.kind(sha) for why, sha in others.items()} == dict.fromkeys(others, "review")
    delivered = {e.sha256: (e.kind, e.label) for e in led.db.queued_for_delivery(100)}
    assert delivered[sure] == ("pseudo", A)  # the trainer gets it as a pseudo-label, from where its file lies
    assert sure not in {e.sha256 for e, *_ in led.db.review_pool()}


def test_a_photo_answered_again_needs_reanswer_confidence_where_a_photo_answered_once_needs_only_trust_confidence(tmp_path):
    """Every swap is one more chance for a hard photo to cross the bar: the pool's second answers may be asked more."""
    from .test_review_reanswer import _answer

    led = _Ledger(tmp_path)
    once = led.add(A, 0.985)
    again = {p: led.add(A, 0.5, version="v0001", verdict="unsure") for p in (0.985, 0.995)}
    read = {e.sha256: e for e in led.db.answered_before("v0002", 10)}
    assert led.db.record_answers([(read[sha], _answer(A, p)) for p, sha in again.items()]) == 2
    led.checks(A, right=3)
    made = _trusted_pool(led, QUICK.model_copy(update={"reanswer_confidence": 0.99})).run("v0002")
    assert sorted(e.sha256 for e in made) == sorted([once, again[0.995]])
    assert led.kind(again[0.985]) == "review"  # waits: for a surer answer, or the expert
    assert [e.sha256 for e in _trusted_pool(led).run("v0002", answered=1)] == [again[0.985]]  # 0: the same bar as any photo


def test_nothing_leaves_the_pool_before_the_class_has_earned_trust_nor_where_the_expert_corrects_the_model(tmp_path):
    led = _Ledger(tmp_path)
    waiting = led.add(A, 0.99)
    led.checks(A, right=2)
    pool = _trusted_pool(led)
    assert pool.run("v0002") == []  # two right checks of three
    led.checks(A, right=2, wrong=2)  # four right, two wrong: the expert keeps correcting it
    assert pool.run("v0002") == [] and led.kind(waiting) == "review"


def test_the_pool_looks_again_only_when_the_version_the_trusted_classes_or_the_answers_change(tmp_path, monkeypatch):
    led = _Ledger(tmp_path)
    led.checks(A, right=3)
    pool = _trusted_pool(led)
    assert pool.run("v0002") == []
    read = []
    real = led.db.pool_sure
    monkeypatch.setattr(led.db, "pool_sure", lambda *a: read.append(a) or real(*a))
    pool.run("v0002")
    assert read == []  # nothing changed: the checks' stamp alone was read
    later = led.add(A, 0.99)  # (a photo answered again: the count of answers says so)
    assert [e.sha256 for e in pool.run("v0002", answered=1)] == [later] and len(read) == 1
    pool.run("v0003", answered=1)
    assert len(read) == 2


def test_the_pool_makes_no_more_pseudo_labels_of_a_class_than_its_share_of_the_versions(tmp_path):
    led = _Ledger(tmp_path)
    shas = [led.add(A, 0.99) for _ in range(3)]
    led.checks(A, right=3)
    pool = _trusted_pool(led, QUICK.model_copy(update={"per_class_cap": 2}))
    assert len(pool.run("v0002")) == 2
    assert sorted(led.kind(s) for s in shas) == ["pseudo", "pseudo", "review"]
    assert pool.labels._of("v0002")[A] == 2
    assert pool.run("v0002", answered=1) == []  # the class has its share


def _expert_labels_it(led: _Ledger, photo: str) -> tuple:
    led.label(photo, B)
    return ("expert", B)


def _answered_again_unsure(led: _Ledger, photo: str) -> tuple:
    from .test_review_reanswer import _answer

    led.db.record_answers([(led.db.queue_entry(photo), _answer(A, 0.6, "v0002", verdict="unsure"))])  # (a retry)
    return ("review", A)


@pytest.mark.parametrize("meanwhile", [_expert_labels_it, _answered_again_unsure])
def test_a_photo_changed_while_it_is_being_made_a_pseudo_label_keeps_what_changed_it(tmp_path, monkeypatch, meanwhile):
    led = _Ledger(tmp_path)
    photo = led.add(A, 0.99)
    led.checks(A, right=3)
    pool = _trusted_pool(led)
    real, left = led.db.make_pseudo, []

    def changed_first(entries):  # (the expert, or the engine answering the pool again, between the read and the write)
        left.append(meanwhile(led, photo))
        return real(entries)

    monkeypatch.setattr(led.db, "make_pseudo", changed_first)
    assert pool.run("v0002") == []
    assert led.db._query("SELECT kind, label FROM label_queue WHERE sha256 = ?", (photo,)) == left
    assert pool.labels._of("v0002").get(A, 0) == 0  # chosen, not made: it no longer counts


def test_the_queuer_makes_no_pseudo_label_of_a_class_the_checks_no_longer_trust(tmp_path):
    led = _Ledger(tmp_path)
    photo = led.add(A, 0.99)
    led.checks(A, right=3)
    queuer = LabelQueuer(led.db, led.spool, QUICK)
    [entry] = [e for e, *_ in led.db.review_pool() if e.sha256 == photo]
    assert queuer.to_pseudo([(entry, "confident")]) == [entry]
    queuer.not_made([entry])
    led.checks(A, right=0, wrong=1)  # (a wrong check between the pool's read and the queuer's look)
    assert queuer.to_pseudo([(entry, "confident")]) == []


def test_a_locked_ledger_makes_nothing_counts_nothing_and_is_looked_at_again(tmp_path, monkeypatch):
    led = _Ledger(tmp_path)
    photo = led.add(A, 0.99)
    led.checks(A, right=3)
    pool = _trusted_pool(led)

    def locked(entries):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(led.db, "make_pseudo", locked)
    with pytest.raises(sqlite3.OperationalError):
        pool.run("v0002")
    assert pool.labels._of("v0002").get(A, 0) == 0 and led.kind(photo) == "review"
    monkeypatch.undo()
    assert [e.sha256 for e in pool.run("v0002")] == [photo]


def test_with_every_class_trusted_any_confident_pool_photo_of_the_serving_version_becomes_a_pseudo_label(tmp_path):
    led = _Ledger(tmp_path)
    sure, unsure = led.add(B, 0.92), led.add(B, 0.85)
    pool = _trusted_pool(led, LabelsSection(trust_checks=0, pseudo_threshold=0.9, review_threshold=0.8))
    assert [e.sha256 for e in pool.run("v0002")] == [sure] and led.kind(unsure) == "review"


def test_once_the_expert_has_earned_a_class_trust_the_idle_pipeline_makes_its_waiting_checks_pseudo_labels(
    tmp_path,
    engine,  # noqa: F811
    monkeypatch,
):
    p, db, said = classified(tmp_path, NextEngine(engine, lambda i: 0.99), QUICK, 12, monkeypatch)
    pool = {}
    for e, *_ in db.review_pool():
        pool.setdefault(e.label, []).append(e.sha256)
    assert sorted(len(v) for v in pool.values()) == [4, 4, 4]  # sure of every photo, no class trusted: all checks
    label = sorted(pool)[0]
    for sha in pool[label][:3]:
        label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, sha, label)
    wait_until(lambda: db.queue_entry(pool[label][3]).kind == "pseudo", timeout=10)
    assert {db.queue_entry(s).kind for other in pool if other != label for s in pool[other]} == {"review"}
    assert p.counters["queued_pseudo"] == 1
    assert ("review_pool_made_pseudo_labels", {"photos": 1, "classes": [label], "engine_version": "v0002"}) in said
    p.stop()


def test_a_pipeline_whose_ledger_is_locked_says_so_once_and_keeps_classifying(tmp_path, engine, monkeypatch):  # noqa: F811
    p, db, *_ = make_pipeline(tmp_path, FixedEngine(engine, lambda i: 0.99), policy=QUICK)
    warned = []
    monkeypatch.setattr(p.log, "warning", lambda event, **kw: warned.append(event))

    def locked(*a, **kw):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(p.trusted_pool, "run", locked)
    wait_until(lambda: warned, timeout=10)
    for path in drop(tmp_path / "inbox", 3):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    wait_until(lambda: p.counters["processed"] == 3, timeout=10)
    time.sleep(2.5)  # (idle turns, each a second: each meets the lock again)
    assert warned.count("pool_pseudo_labels_failed") == 1
    p.stop()
