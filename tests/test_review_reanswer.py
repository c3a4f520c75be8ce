"""The review pool answered again by the engine in service after a swap (``[labels] reanswer_pool``): the expert is
asked by the serving model's answers, a check is read against them, and nothing the expert said is overwritten."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from edge_agent.classifier import Classifier, Prediction
from edge_agent.config import LabelsSection, PipelineSection, parse_config
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.pipeline import Job
from edge_agent.results import ResultsDB
from edge_agent.review.checks import check_windows
from edge_agent.review.queue import label_photo, prune_pool, to_ask
from edge_agent.review.reanswer import PoolAnswers
from edge_agent.spool import PhotoSpool, SpoolItem
from engines.loader import open_engine

from .conftest import encode, leaf_image
from .daemon_helpers import wait_until
from .test_pipeline import FixedEngine, drop, make_pipeline

CLASSES = ["Tomato___healthy", "Pepper,_bell___healthy", "Orange___Haunglongbing_(Citrus_greening)"]
UNSURE = LabelsSection(trust_checks=0, pseudo_threshold=0.9, review_threshold=0.8)


@pytest.fixture
def engine(tiny_store):
    with open_engine(tiny_store, parse_config({}).engine) as e:
        yield e


class NextEngine(FixedEngine):
    """The same engine published as the next version."""

    engine_version = "v0002"


def _answer(label: str, p: float, version: str = "v0002", verdict: str = "confident") -> Prediction:
    other = [c for c in CLASSES if c != label]
    top_k = [(label, p), (other[0], (1 - p) / 2), (other[1], (1 - p) / 2)]
    return Prediction(label, p, top_k, version, verdict=verdict, distances=np.array([1.0, 4.0, 9.0], np.float32))


def _pool(tmp_path, n: int) -> tuple[ResultsDB, PhotoSpool, list[str]]:
    """A ledger whose review pool holds ``n`` real photos v0001 was unsure of (confidence 0.5)."""
    db = ResultsDB(tmp_path / "results.sqlite")
    spool = PhotoSpool(tmp_path / "queue", 1 << 30)
    ids, rows, entries = [], [], []
    for i in range(n):
        sha = f"{i:064x}"
        [f] = spool.put_many([SpoolItem("review", sha, encode(leaf_image(i)), ".jpg")])
        top_k = [[CLASSES[i % 3], 0.5], [CLASSES[(i + 1) % 3], 0.3]]
        rows.append(ResultRow(sha, f"p{i}", f"/in/{i}.jpg", "folder", CLASSES[i % 3], 0.5, top_k, "v0001", {}, verdict="unsure"))
        entries.append(QueueEntry(sha, f"p{i}", "review", CLASSES[i % 3], 0.5, "v0001", str(f), f.stat().st_size))
        ids.append(sha)
    db.commit(rows, entries)
    return db, spool, ids


def classified(tmp_path, engine, policy: LabelsSection, n: int, monkeypatch) -> tuple:
    """A pipeline over ``engine`` that has classified ``n`` photos, and the journal's info lines it says from now on."""
    p, db, *_ = make_pipeline(tmp_path, engine, policy=policy)
    said: list[tuple] = []
    monkeypatch.setattr(p.log, "info", lambda event, **kw: said.append((event, kw)))
    for path in drop(tmp_path / "inbox", n):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    return p, db, said


def test_after_a_swap_the_pool_is_answered_again_by_the_engine_in_service_while_the_arrival_answers_stay_recorded(
    tmp_path, engine, monkeypatch
):
    untrusted = UNSURE.model_copy(update={"trust_checks": 23})  # (no class trusted: sure answers stay checks)
    p, db, said = classified(tmp_path, FixedEngine(engine, lambda i: 0.5), untrusted, 6, monkeypatch)
    pool = {e.sha256: (top_k, verdict) for e, top_k, verdict, _ in db.review_pool()}
    assert len(pool) == 6 and all(top_k[0][1] == pytest.approx(0.5, abs=1e-3) for top_k, _ in pool.values())
    sure = {0: 0.99, 1: 0.99, 2: 0.99, 3: 0.6, 4: 0.6, 5: 0.6}
    wait_until(lambda: not p.pool_answers.due("v0001"), timeout=10)  # (the pool looked at, as a daemon's start does)
    p.swap_classifier(Classifier(NextEngine(engine, lambda i: sure[i % 6])))
    wait_until(lambda: not db.answered_before("v0002", 10), timeout=20)
    after = db.review_pool()
    assert {e.engine_version for e, *_ in after} == {"v0002"}
    assert sorted(round(top_k[0][1], 2) for _, top_k, _, _ in after) == [0.6, 0.6, 0.6, 0.99, 0.99, 0.99]
    assert sorted(v for *_, v, _ in after) == ["confident"] * 3 + ["unsure"] * 3
    assert sorted(round(e.confidence, 2) for e, *_ in after) == [0.6, 0.6, 0.6, 0.99, 0.99, 0.99]
    asked = [(it.check, round(it.top_k[0][1], 2)) for it in to_ask(db, 0, UNSURE, everything=True)]
    assert asked == [(True, 0.99), (False, 0.6)] * 3  # what the serving model is sure of: checks; the rest by its margins
    assert {it.as_json()["engine_version"] for it in to_ask(db, 0, UNSURE, everything=True)} == {"v0002"}  # (the API says whose)
    assert {r["engine_version"] for r in db.results()} == {"v0001"}  # what was answered when each photo arrived stays
    assert all(r["confidence"] == pytest.approx(0.5, abs=1e-3) for r in db.results())
    assert p.pool_answers.answered == 6
    wait_until(lambda: ("review_pool_answered_again", {"photos": 6, "engine_version": "v0002"}) in said, timeout=5)
    p.stop()


def test_with_reanswer_pool_off_the_pool_keeps_the_answers_it_arrived_with(tmp_path, engine):
    policy = UNSURE.model_copy(update={"reanswer_pool": False})
    p, db, *_ = make_pipeline(tmp_path, FixedEngine(engine, lambda i: 0.5), policy=policy)
    for path in drop(tmp_path / "inbox", 4):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    p.swap_classifier(Classifier(NextEngine(engine, lambda i: 0.99)))
    time.sleep(1.5)  # (idle_trim_s: the swap is applied, the pool is not answered)
    assert p.pool_answers is None and {e.engine_version for e, *_ in db.review_pool()} == {"v0001"}
    p.stop()


def test_new_photos_are_classified_while_a_large_pool_is_answered_again(tmp_path, engine):
    p, db, *_ = make_pipeline(
        tmp_path, FixedEngine(engine, lambda i: 0.5), policy=UNSURE, settings=PipelineSection(max_batch=2, max_wait_ms=5)
    )
    for path in drop(tmp_path / "inbox", 40):
        p.submit(Job("inbox", path))
    assert p.drain(60)
    p.swap_classifier(Classifier(NextEngine(engine, lambda i: 0.5)))
    wait_until(lambda: p.pool_answers.answered > 0, timeout=20)
    t0 = time.monotonic()
    for path in drop(tmp_path / "inbox2", 3, start=100):
        p.submit(Job("inbox", path))
    assert p.drain(30)
    assert time.monotonic() - t0 < 10
    assert len(list(db.results())) == 43
    wait_until(lambda: not db.answered_before("v0002", 50), timeout=30)
    p.stop()


def test_a_photo_the_expert_labels_while_it_is_answered_again_keeps_the_experts_label(tmp_path):
    db, _, ids = _pool(tmp_path, 3)
    read = db.answered_before("v0002", 10)
    assert {e.sha256 for e in read} == set(ids)
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, ids[0], CLASSES[0])  # (the class v0001 answered)
    assert db.record_answers([(e, _answer(CLASSES[1], 0.99)) for e in read]) == 2
    row = db._query("SELECT kind, label, confidence, engine_version FROM label_queue WHERE sha256 = ?", (ids[0],))[0]
    assert row == ("expert", CLASSES[0], 1.0, "v0001")
    assert db._query("SELECT COUNT(*) FROM pool_answers WHERE sha256 = ?", (ids[0],)) == [(0,)]
    assert db.answered_before("v0002", 10) == []  # the others are v0002's; the labelled one left the pool


def test_a_check_is_the_serving_models_answer_read_against_the_experts_label(tmp_path):
    db, _, ids = _pool(tmp_path, 2)
    policy = LabelsSection()
    db.record_answers([(e, _answer(CLASSES[0], 0.995)) for e in db.answered_before("v0002", 10)])
    assert [it.check for it in to_ask(db, 0, policy, everything=True)] == [True, True]  # sure now: checks of Tomato
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, ids[0], CLASSES[0])
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, ids[1], CLASSES[2])
    checks = db.expert_checks()
    assert sorted(c[:6] for c in checks) == sorted(
        [(CLASSES[0], "confident", CLASSES[0], 0.995, ids[0], "v0002"), (CLASSES[0], "confident", CLASSES[2], 0.995, ids[1], "v0002")]
    )
    assert sorted(check_windows(checks, policy)[CLASSES[0]]) == [False, True]  # one right, one wrong: as the expert said


def test_a_pool_photo_whose_file_is_gone_or_corrupt_keeps_its_answer_and_is_not_tried_again(tmp_path, engine):
    db, spool, ids = _pool(tmp_path, 4)
    files = dict(db._query("SELECT sha256, file FROM label_queue"))
    Path(files[ids[0]]).unlink()
    Path(files[ids[1]]).write_bytes(b"\xff\xd8 not a jpeg")
    answers = PoolAnswers(db, batch=8)
    clf = Classifier(NextEngine(engine, lambda i: 0.7))
    assert answers.run(clf) == 2
    assert answers.unreadable == {ids[0], ids[1]}
    assert answers.due("v0002")  # (the two kept their answers: asked again, they are skipped)
    assert answers.run(clf) == 0 and not answers.due("v0002")
    versions = dict(db._query("SELECT sha256, engine_version FROM label_queue"))
    assert [versions[s] for s in ids] == ["v0001", "v0001", "v0002", "v0002"]
    assert answers.due("v0003")  # a swap: due at once


def test_a_ledger_that_cannot_be_read_now_waits_a_minute_and_a_swap_makes_the_pool_due_again(tmp_path, engine, monkeypatch):
    db, _, _ = _pool(tmp_path, 2)
    answers = PoolAnswers(db, batch=8)

    def locked(*a, **k):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(db, "answered_before", locked)
    with pytest.raises(sqlite3.OperationalError):
        answers.run(Classifier(NextEngine(engine)))
    assert not answers.due("v0002") and answers.due("v0003")


def test_a_pipeline_whose_ledger_is_locked_says_so_once_a_version_and_keeps_classifying(tmp_path, engine, monkeypatch):
    def locked(*a, **k):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(ResultsDB, "answered_before", locked)
    p, db, *_ = make_pipeline(tmp_path, FixedEngine(engine, lambda i: 0.5), policy=UNSURE)
    warned = []
    monkeypatch.setattr(p.log, "warning", lambda event, **kw: warned.append(event))
    p.swap_classifier(Classifier(NextEngine(engine, lambda i: 0.5)))
    wait_until(lambda: p.classifier.engine.engine_version == "v0002" and not p.pool_answers.due("v0002"), timeout=10)
    assert "pool_answers_failed" in warned  # a swap: tried at once, and said
    warned.clear()
    for path in drop(tmp_path / "inbox", 3):
        p.submit(Job("inbox", path))
    assert p.drain(30) and len(list(db.results())) == 3
    time.sleep(0.5)
    assert warned == []  # then a minute's wait, photos classified meanwhile
    p.stop()


def test_what_was_kept_of_a_photo_that_left_the_pool_unlabelled_is_forgotten_and_a_labelled_ones_stays(tmp_path):
    db, spool, ids = _pool(tmp_path, 4)
    db.record_answers([(e, _answer(CLASSES[1], 0.6, verdict="unsure")) for e in db.answered_before("v0002", 10)])
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, ids[3], CLASSES[1])
    assert prune_pool(db, spool, keep=1, policy=LabelsSection()) == 2
    prune_pool(db, spool, keep=1, policy=LabelsSection())  # (what the pass before dropped is forgotten at the next)
    assert db._query("SELECT COUNT(*) FROM pool_answers")[0][0] == 2  # the one kept, and the labelled one
    assert db._query("SELECT COUNT(*) FROM pool_distances")[0][0] == 2


def test_a_ledger_from_before_the_answers_were_kept_reads_the_arrival_answers_and_is_upgraded_when_opened_to_write(tmp_path):
    path = tmp_path / "results.sqlite"
    db, _, ids = _pool(tmp_path, 2)
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, ids[0], CLASSES[0])
    db.close()
    con = sqlite3.connect(path)
    con.execute("DROP TABLE pool_answers")
    con.commit()
    con.close()
    old = ResultsDB(path, readonly=True)
    assert [(e.sha256, top_k[0][1], v) for e, top_k, v, _ in old.review_pool()] == [(ids[1], 0.5, "unsure")]
    assert [c[:6] for c in old.expert_checks()] == [(CLASSES[0], "unsure", CLASSES[0], 0.5, ids[0], "v0001")]
    assert len(old.unlabelled_candidates(10)) == 1
    old.close()
    db = ResultsDB(path)
    assert db._query("SELECT COUNT(*) FROM pool_answers") == [(0,)]


def test_each_new_version_answers_the_whole_pool_whatever_the_version_before_waits_for(tmp_path, engine):
    db, _, ids = _pool(tmp_path, 5)

    class Third(FixedEngine):
        engine_version = "v0003"

    answers = PoolAnswers(db, batch=2)
    for clf in (Classifier(NextEngine(engine, lambda i: 0.7)), Classifier(Third(engine, lambda i: 0.7))):
        version = clf.engine.engine_version
        while answers.due(version):
            answers.run(clf)
        assert db.answered_before(version, 10) == [], version
    assert answers.answered == 10
