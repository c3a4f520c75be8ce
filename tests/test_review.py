"""The review queue: ranked by what a label would teach, spread over classes, capped per day; labelling; pruning."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from edge_agent.config import LabelsSection
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.results import ResultsDB
from edge_agent.review.queue import LabelError, label_photo, left_today, prune_pool, to_ask
from edge_agent.review.rank import Candidate, draw, margin, rank
from edge_agent.spool import PhotoSpool, SpoolItem


def test_margin():
    assert margin([["a", 0.5], ["b", 0.4], ["c", 0.1]]) == pytest.approx(0.1)
    assert margin([["a", 0.8]]) == pytest.approx(0.6)
    assert margin([]) == 1.0


def test_rank_prefers_small_margins_and_spreads_over_classes():
    cands = [Candidate(f"a{i}", [["A", 0.50 + i * 0.001], ["B", 0.49 - i * 0.001]]) for i in range(5)]
    cands += [Candidate("c0", [["C", 0.6], ["A", 0.3]]), Candidate("d0", [["D", 0.9], ["A", 0.05]])]
    order = [c.id for c in rank(cands)]
    assert order[0] == "a0"  # smallest margin first
    assert order.index("c0") < order.index("a3")  # a second class before the fourth photo of the first
    assert order[-1] == "d0" or order.index("d0") > order.index("c0")
    assert [c.id for c in rank(cands, limit=2)] == order[:2]


def test_rank_puts_near_duplicates_last():
    same = [["A", 0.5], ["B", 0.45], ["C", 0.05]]
    cands = [Candidate(f"dup{i}", same) for i in range(10)] + [Candidate("other", [["A", 0.7], ["C", 0.2], ["B", 0.1]])]
    order = [c.id for c in rank(cands)]
    assert order[:2] == ["dup0", "other"]  # ten identical photos are not all asked about first


def _rank_step_by_step(candidates, limit=None, class_penalty=0.15, duplicate_l1=0.02, key=None):
    """The module's rule as written, one pass over the whole pool a step (the reference the fast ranking must equal);
    ``key`` stands for the margin (``order = "draw"``: the photo's draw)."""
    from edge_agent.review.rank import _distance

    key = key or (lambda c: margin(c.top_k))
    pool = sorted(((key(c), c) for c in candidates), key=lambda mc: (mc[0], mc[1].id))
    want = len(pool) if limit is None else min(limit, len(pool))
    chosen, per_class, duplicates = [], {}, []
    while pool and len(chosen) < want:
        best = min(range(len(pool)), key=lambda i: (pool[i][0] + class_penalty * per_class.get(pool[i][1].label, 0), pool[i][1].id))
        c = pool.pop(best)[1]
        if any(o.label == c.label and _distance(o.top_k, c.top_k) <= duplicate_l1 for o in chosen):
            duplicates.append(c)
            continue
        chosen.append(c)
        per_class[c.label] = per_class.get(c.label, 0) + 1
    return (chosen + duplicates)[:want]


def test_the_ranking_takes_the_same_photos_in_the_same_order_as_the_rule_taken_step_by_step():
    import random

    rng = random.Random(5)
    labels = [f"C{i}" for i in range(6)]
    for _ in range(1500):
        cands = []
        for i in range(rng.randint(0, 30)):
            names = rng.sample(labels, rng.randint(0, 3))
            probs = sorted((round(rng.choice([rng.random(), 0.5, 0.51, 0.49]), 3) for _ in names), reverse=True)
            if cands and rng.random() < 0.3:  # a near-duplicate of an earlier photo
                base = rng.choice(cands).top_k
                names, probs = [n for n, _ in base], [round(p + rng.uniform(-0.01, 0.01), 3) for _, p in base]
            cands.append(Candidate(f"id{rng.randint(0, 99):02d}{i}", list(zip(names, probs))))
        limit, penalty, l1 = rng.choice([None, 1, 3, 10]), rng.choice([0.15, 0.0, 0.3]), rng.choice([0.02, 0.0, 0.1])
        assert [c.id for c in rank(cands, limit, penalty, l1)] == [c.id for c in _rank_step_by_step(cands, limit, penalty, l1)]
        spread = rank(cands, limit, penalty, l1, order="draw")
        assert [c.id for c in spread] == [c.id for c in _rank_step_by_step(cands, limit, penalty, l1, key=lambda c: draw(c.id))]
    many = [Candidate(f"{i:05d}", [[f"C{i % 38}", 0.5 + i % 97 / 300], ["x", 0.3]]) for i in range(600)]
    assert [c.id for c in rank(many)] == [c.id for c in _rank_step_by_step(many)]


def test_the_draw_order_asks_the_pool_at_random_the_same_at_every_call_whatever_the_margins():
    import random

    cands = [Candidate(f"{i:064x}", [["A", 0.2 + i * 0.025], ["B", 0.05]]) for i in range(30)]  # no two near-duplicates
    least_sure = [c.id for c in rank(cands)]
    assert least_sure == [c.id for c in cands]  # one class: the margin's order
    drawn = [c.id for c in rank(cands, order="draw")]
    assert drawn == sorted(least_sure, key=draw) != least_sure  # one class: the draw's order, not the margin's
    shuffled = random.Random(1).sample(cands, len(cands))
    assert [c.id for c in rank(shuffled, order="draw")] == drawn  # the same order however the pool is read
    assert sum(least_sure.index(i) < 15 for i in drawn[:10]) < 9  # the first 10 are not the least sure
    assert all(0 <= draw(c.id) < 1 for c in cands) and len({draw(c.id) for c in cands}) == 30
    two = cands + [Candidate(f"c{i}", [["C", 0.2 + i * 0.025], ["A", 0.05]]) for i in range(30)]
    first = [c.label for c in rank(two, limit=20, order="draw")]
    assert 6 <= first.count("C") <= 14  # spread over the classes as by margin
    drawn = [c.id for c in rank(two, class_penalty=0.0, order="draw")]
    assert drawn == sorted((c.id for c in two), key=draw)  # no spreading: the draw alone
    with pytest.raises(ValueError, match="order must be one of"):
        rank(cands, order="random")


def test_the_experts_unsure_photos_come_in_the_configured_order_and_a_mistyped_order_is_refused(tmp_path):
    from pydantic import ValidationError

    db, _ = _db_with_pool(tmp_path, 8)
    by_margin = [i.entry.sha256 for i in to_ask(db, policy=LabelsSection(), per_day=0)]
    spread = [i.entry.sha256 for i in to_ask(db, policy=LabelsSection(ask_order="draw"), per_day=0)]
    assert by_margin == [f"{i:064x}" for i in range(8)] and spread == sorted(by_margin, key=draw) != by_margin
    with pytest.raises(ValidationError, match="ask_order"):
        LabelsSection(ask_order="random")


def _db_with_pool(tmp_path, n: int) -> tuple[ResultsDB, PhotoSpool]:
    db = ResultsDB(tmp_path / "results.sqlite")
    spool = PhotoSpool(tmp_path / "queue", 1 << 30)
    results, entries = [], []
    for i in range(n):
        sha = f"{i:064x}"
        p1 = 0.4 + i * 0.04
        top_k = [["Apple___healthy", p1], ["Tomato___healthy", 1 - p1 - 0.01]]
        [f] = spool.put_many([SpoolItem("review", sha, b"jpeg", ".jpg")])
        results.append(ResultRow(sha, f"p{i}", f"/in/{i}.jpg", "folder", top_k[0][0], p1, top_k, "v0001", {}))
        entries.append(QueueEntry(sha, f"p{i}", "review", top_k[0][0], p1, "v0001", str(f), 4))
    db.commit(results, entries)
    return db, spool


def test_budget_per_day_and_labelling(tmp_path):
    db, _ = _db_with_pool(tmp_path, 6)
    classes = ["Apple___healthy", "Tomato___healthy"]
    assert [i.entry.photo_id for i in to_ask(db, policy=LabelsSection(), per_day=3)] == ["p0", "p1", "p2"]
    assert len(to_ask(db, policy=LabelsSection(), per_day=0)) == 6  # no budget
    label_photo(db, tmp_path / "queue", 1 << 30, classes, "p0", "Tomato___healthy")
    assert left_today(db, 3) == 2
    assert [i.entry.photo_id for i in to_ask(db, policy=LabelsSection(), per_day=3)] == ["p1", "p2"]
    assert len(to_ask(db, policy=LabelsSection(), per_day=3, everything=True)) == 5
    entry = db.queue_entry(f"{0:064x}")
    assert entry.kind == "expert" and entry.label == "Tomato___healthy" and (tmp_path / "queue/expert").exists()
    with pytest.raises(LabelError, match="no photo"):
        label_photo(db, tmp_path / "queue", 1 << 30, classes, "nope", "Apple___healthy")
    with pytest.raises(LabelError, match="not a known class") as refused:
        label_photo(db, tmp_path / "queue", 1 << 30, classes, "p1", "Wheat___rust")
    assert "Did you mean" not in str(refused.value) and "Known: Apple___healthy, Tomato___healthy." in str(refused.value)
    with pytest.raises(LabelError, match="empty"):
        label_photo(db, tmp_path / "queue", 1 << 30, classes, "p1", "  ")
    label_photo(db, tmp_path / "queue", 1 << 30, classes, "p1", "Wheat___rust", new_class=True)
    assert db.queue_entry(f"{1:064x}").label == "Wheat___rust"
    assert left_today(db, 3) == 1


def test_labels_stamped_on_a_later_day_by_a_clock_since_set_back_do_not_spend_todays_budget(tmp_path):
    db, _ = _db_with_pool(tmp_path, 6)
    for i, days in enumerate((0, 40, 41)):  # one today; two while the clock ran weeks ahead
        db._db.execute(
            "INSERT INTO expert_labels (sha256, label, labelled) VALUES (?, 'Apple___healthy', ?)",
            (f"{i:064x}", time.time() + days * 86400),
        )
    assert left_today(db, 3) == 2
    assert len(to_ask(db, policy=LabelsSection(), per_day=3)) == 2
    assert db.expert_labels_since(time.time() - 60) == 3  # counted without the day's end, as before


def test_prune_drops_the_least_informative(tmp_path):
    db, spool = _db_with_pool(tmp_path, 6)
    assert prune_pool(db, spool, keep=4, policy=LabelsSection()) == 2
    kept = {i.entry.photo_id for i in to_ask(db, policy=LabelsSection(), per_day=0)}
    assert kept == {"p0", "p1", "p2", "p3"}  # p4, p5 had the largest margins
    assert len(list((tmp_path / "queue/review").iterdir())) == 4
    assert prune_pool(db, spool, keep=4, policy=LabelsSection()) == 0


def test_a_pool_photo_whose_copy_is_gone_is_dropped_at_the_second_pass_that_finds_it_gone(tmp_path):
    """A salvage that could not read a review photo restored its row without it: the page asked the expert about a
    photo it showed as a broken image. The first pass that finds it gone leaves it (a photo being labelled this
    instant has its copy moved before its row changes); the next drops it."""
    from edge_agent.review.queue import drop_lost

    db, _ = _db_with_pool(tmp_path, 4)
    gone = db.queue_entry(f"{2:064x}")
    Path(gone.file).unlink()
    dropped, missing = drop_lost(db, tmp_path / "queue", LabelsSection(), set())
    assert dropped == [] and missing == {gone.sha256}
    dropped, missing = drop_lost(db, tmp_path / "queue", LabelsSection(), missing)
    assert dropped == [gone.photo_id] and {i.entry.photo_id for i in to_ask(db, policy=LabelsSection(), per_day=0)} == {"p0", "p1", "p3"}
    assert drop_lost(db, tmp_path / "queue", LabelsSection(), missing) == ([], set())


def test_a_pool_photo_the_expert_labels_while_the_pool_is_pruned_keeps_its_label(tmp_path, monkeypatch):
    """Pruning reads the pool, then deletes: a photo chosen to go that the expert labels in between (from the page, as
    the daemon prunes) stays, with the expert's label and its file (before, its row went by sha256, label and all)."""
    from edge_agent.review import queue as review_queue

    db, spool = _db_with_pool(tmp_path, 6)
    real = review_queue._alternate

    def chosen_then_labelled(checks, unsure):  # p5 is among the least informative, chosen to go: then labelled
        order = real(checks, unsure)
        label_photo(db, tmp_path / "queue", 1 << 30, ["Apple___healthy", "Tomato___healthy"], "p5", "Tomato___healthy")
        return order

    monkeypatch.setattr(review_queue, "_alternate", chosen_then_labelled)
    assert prune_pool(db, spool, keep=4, policy=LabelsSection()) == 1  # p4 alone
    [labelled] = db.queued_for_delivery(10)
    assert (labelled.photo_id, labelled.kind, labelled.label) == ("p5", "expert", "Tomato___healthy") and Path(labelled.file).is_file()
    assert {q.photo_id for q in db.queued()} == {"p0", "p1", "p2", "p3", "p5"}


def test_cli_review_list_best_first(tmp_path, capsys):
    from edge_agent.cli import main

    db, _ = _db_with_pool(tmp_path / "state", 4)
    db.close()
    assert main(["review", "list", "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["photo_id"] for r in rows] == ["p0", "p1", "p2", "p3"]
    assert rows[0]["margin"] < rows[1]["margin"] and len(rows[0]["top_k"]) == 2
    assert main(["review", "label", "--state-dir", str(tmp_path / "state"), "p9", "Apple___healthy"]) == 2
    assert "no photo 'p9'" in capsys.readouterr().err


def test_a_photo_is_labelled_by_the_file_name_review_list_shows_and_a_name_two_photos_had_asks_for_its_id(tmp_path, capsys):
    """`review list` shows each photo's file name: a farmer labels by it (it said "no photo"), and a name two photos
    had (IMG_0001.jpg from two phones) is refused with what to give instead, never labelling the wrong one."""
    from edge_agent.cli import main

    state = tmp_path / "state"
    db, spool = _db_with_pool(state, 3)
    sha = f"{99:064x}"
    [f] = spool.put_many([SpoolItem("review", sha, b"jpeg", ".jpg")])
    top_k = [["Apple___healthy", 0.5], ["Tomato___healthy", 0.4]]
    db.commit(
        [ResultRow(sha, "p99", "/in/phone2/1.jpg", "folder", "Apple___healthy", 0.5, top_k, "v0001", {})],
        [QueueEntry(sha, "p99", "review", "Apple___healthy", 0.5, "v0001", str(f), 4)],
    )
    db.close()
    label = ["review", "label", "--state-dir", str(state)]
    assert main([*label, "0.jpg", "Tomato___healthy"]) == 0
    assert "p0: labelled Tomato___healthy by an expert" in capsys.readouterr().out
    assert main([*label, "1.jpg", "Tomato___healthy"]) == 2
    assert "more than one photo is named '1.jpg': give its id" in capsys.readouterr().err
    assert main([*label, "in/0.jpg", "Tomato___healthy"]) == 2  # a part of a path is no name: only the whole path
    assert main([*label, "7.jpg", "Tomato___healthy"]) == 2 and "no photo '7.jpg'" in capsys.readouterr().err
    db = ResultsDB(state / "results.sqlite")
    assert db.expert_labels() == {f"{0:064x}": "Tomato___healthy"}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a database error carries its code from Python 3.11")
def test_a_label_the_full_disk_cannot_take_is_said_as_a_full_disk_not_a_damaged_database(tmp_path, capsys, monkeypatch):
    """`review label` on a full disk says the disk is full, in one line (it said the results database was unreadable
    and would be set aside); the photo stays in the review pool with its file where its row says."""
    from edge_agent.cli import main

    from .conftest import sqlite_full_error

    state = tmp_path / "state"
    db, _ = _db_with_pool(state, 2)
    db.close()
    full = sqlite_full_error()

    def mark_expert(self, *a, **k):
        raise full

    monkeypatch.setattr(ResultsDB, "mark_expert", mark_expert)
    assert main(["review", "label", "--state-dir", str(state), "p0", "Tomato___healthy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edge-agent: the disk is full") and "unreadable" not in err and len(err.splitlines()) == 1
    entry = ResultsDB(state / "results.sqlite", readonly=True).queue_entry(f"{0:064x}")
    assert entry.kind == "review" and Path(entry.file).is_file()


def test_a_codeless_database_error_as_python_3_10_raises_is_a_full_disk_without_state_dir_too(tmp_path, capsys, monkeypatch):
    """JetPack 6's Python gives a database error no code, so the disk of the state directory is asked: a command given
    no --state-dir (the default ./edge-state, as a farmer runs it) asks the same disk, and a full one is said as full
    (it said the results database was unreadable and would be set aside)."""
    import shutil

    from edge_agent import storage_errors
    from edge_agent.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    db, _ = _db_with_pool(tmp_path / "edge-state", 2)
    db.close()
    asked = []

    def mark_expert(self, *a, **k):
        raise sqlite3.OperationalError("database or disk is full")  # no sqlite_errorcode, as on 3.10

    def disk_usage(where):
        asked.append(Path(where).resolve())
        return shutil._ntuple_diskusage(1 << 34, (1 << 34) - (1 << 20), 1 << 20)  # 1 MiB free

    monkeypatch.setattr(ResultsDB, "mark_expert", mark_expert)
    monkeypatch.setattr(storage_errors.shutil, "disk_usage", disk_usage)
    assert main(["review", "label", "p0", "Tomato___healthy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edge-agent: the disk is full") and "unreadable" not in err, err
    assert asked == [(tmp_path / "edge-state").resolve()]


def test_each_question_says_where_its_photo_came_from_its_plant_file_name_or_camera(tmp_path, capsys):
    from edge_agent.cli import main

    state = tmp_path / "state"
    db = ResultsDB(state / "results.sqlite")
    spool = PhotoSpool(state / "queue", 1 << 30)
    arrivals = {  # photo id -> (path, source, plant): from a plant's folder, straight in the inbox, a camera's frame
        "p0": (str(state / "inbox/tree 12/IMG_0001.jpg"), "inbox", "tree 12"),
        "p1": (str(state / "inbox/leaf.jpg"), "inbox", None),
        "p2": (None, "camera:greenhouse", None),
        "p3": (str(state / "inbox/gone.jpg"), "inbox", None),  # its result row is pruned below
    }
    results, entries = [], []
    for i, (pid, (path, source, plant)) in enumerate(arrivals.items()):
        sha = f"{i:064x}"
        top_k = [["Apple___healthy", 0.4 + i * 0.1], ["Tomato___healthy", 0.3]]
        [f] = spool.put_many([SpoolItem("review", sha, b"jpeg", ".jpg")])
        results.append(ResultRow(sha, pid, path, source, "Apple___healthy", top_k[0][1], top_k, "v0001", {}, 1.8e9, "unsure", plant))
        entries.append(QueueEntry(sha, pid, "review", "Apple___healthy", top_k[0][1], "v0001", str(f), 4))
    db.commit(results, entries)
    db._db.execute("DELETE FROM results WHERE photo_id = 'p3'")
    db.close()
    assert main(["review", "list", "--state-dir", str(state)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "  plant tree 12: IMG_0001.jpg  " in lines["p0"] and "  leaf.jpg  " in lines["p1"]
    assert "  camera:greenhouse  " in lines["p2"] and str(state / "queue/review") in lines["p3"]
    assert main(["review", "list", "--state-dir", str(state), "--json"]) == 0
    rows = {r["photo_id"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert (rows["p0"]["name"], rows["p0"]["source"], rows["p0"]["plant"]) == ("IMG_0001.jpg", "inbox", "tree 12")
    assert rows["p0"]["classified"].startswith("2027-01-15T08:00:00")
    assert (rows["p2"]["name"], rows["p2"]["source"]) == (None, "camera:greenhouse")
    assert (rows["p3"]["name"], rows["p3"]["source"], rows["p3"]["classified"]) == (None, None, None)


@pytest.mark.parametrize(
    "typed, meant",
    [
        ("apple scab", ["Apple___Apple_scab"]),
        ("Tomato___Late_Blight", ["Tomato___Late_blight"]),
        ("late blight", ["Potato___Late_blight", "Tomato___Late_blight"]),
        ("corn rust", ["Corn_(maize)___Common_rust_"]),
        ("appel scab", ["Apple___Apple_scab"]),
        ("gray leaf spot", ["Corn_(maize)___Cercospora_leaf_spot Gray_leaf_spot"]),
    ],
)
def test_a_mistyped_class_is_refused_with_the_class_it_most_likely_means(tmp_path, typed, meant):
    db, _ = _db_with_pool(tmp_path, 1)
    classes = [
        "Apple___Apple_scab",
        "Apple___healthy",
        "Corn_(maize)___Cercospora_leaf_spot Gray_leaf_spot",
        "Corn_(maize)___Common_rust_",
        "Potato___Late_blight",
        "Tomato___Late_blight",
    ]
    with pytest.raises(LabelError, match="not a known class") as refused:
        label_photo(db, tmp_path / "queue", 1 << 30, classes, "p0", typed)
    assert f"Did you mean {' or '.join(map(repr, meant))}? Pass --new-class" in str(refused.value) and "Known:" not in str(refused.value)
    assert db.queue_entry(f"{0:064x}").kind == "review"  # nothing labelled


def test_a_photo_in_no_queue_is_labelled_from_the_copy_kept_of_it_and_one_no_longer_kept_is_refused_with_why(tmp_path):
    import hashlib
    from datetime import datetime

    from edge_agent.review.queue import PhotoNotQueued

    state = tmp_path / "state"
    db = ResultsDB(state / "results.sqlite")
    classes = ["Apple___healthy", "Apple___Black_rot"]
    created = time.time()
    day = state / "processed" / datetime.fromtimestamp(created).strftime("%Y-%m-%d")
    day.mkdir(parents=True)
    rows = []
    for i in range(3):
        data = f"photo {i}".encode() * 100
        (day / f"leaf-{i}.jpg").write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        rows.append(
            ResultRow(
                sha, f"p{i}", str(state / "inbox" / f"leaf-{i}.jpg"), "inbox", "Apple___healthy", 0.99, [], "v1", {}, created, "confident"
            )
        )
    db.commit(rows)
    entry = label_photo(db, state / "queue", 1 << 30, classes, "p0", "Apple___Black_rot")  # a sure answer, never asked about
    queued = db.queue_entry(rows[0].sha256)
    assert (queued.kind, queued.label) == ("expert", "Apple___Black_rot") and entry.photo_id == "p0"
    assert (state / "queue" / "expert").is_dir() and open(queued.file, "rb").read() == (day / "leaf-0.jpg").read_bytes()
    assert db.expert_labels() == {rows[0].sha256: "Apple___Black_rot"}
    (day / "leaf-1.jpg").unlink()  # pruned
    with pytest.raises(PhotoNotQueued, match="p1: its file is no longer kept"):
        label_photo(db, state / "queue", 1 << 30, classes, "p1", "Apple___Black_rot")
    (day / "leaf-2.jpg").write_bytes(b"another photo under its name")
    with pytest.raises(PhotoNotQueued, match="p2: its file is no longer kept"):
        label_photo(db, state / "queue", 1 << 30, classes, "p2", "Apple___Black_rot")
    assert db.expert_labels() == {rows[0].sha256: "Apple___Black_rot"} and len(db.queued()) == 1  # nothing else changed


def test_a_photo_queued_again_never_waits_for_the_daemons_sender_with_the_models_answer_as_the_experts_label(tmp_path, monkeypatch):
    """The daemon's sender delivers whatever the label queue holds, from its own thread or process: the moment a photo
    in no queue is queued again, it must already carry the expert's label (it carried the model's answer until the
    label was written a moment later: a sender reading in between taught the trainer the very answer corrected)."""
    import hashlib
    from datetime import datetime

    from edge_agent.review import queue as review_queue

    state = tmp_path / "state"
    db = ResultsDB(state / "results.sqlite")
    created = time.time()
    day = state / "processed" / datetime.fromtimestamp(created).strftime("%Y-%m-%d")
    day.mkdir(parents=True)
    data = b"a leaf the model was sure of" * 100
    (day / "leaf.jpg").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    db.commit(
        [ResultRow(sha, "p0", str(state / "inbox" / "leaf.jpg"), "inbox", "Apple___healthy", 0.99, [], "v1", {}, created, "confident")]
    )
    seen = []
    real_move = review_queue.PhotoSpool.move

    def move(spool, src, kind):  # what a sender reading the queue now would deliver
        seen.extend((e.kind, e.label) for e in db.queued_for_delivery(10))
        return real_move(spool, src, kind)

    monkeypatch.setattr(review_queue.PhotoSpool, "move", move)
    label_photo(db, state / "queue", 1 << 30, ["Apple___healthy", "Apple___Black_rot"], "p0", "Apple___Black_rot")
    assert seen == [("expert", "Apple___Black_rot")]
    assert [(e.kind, e.label) for e in db.queued_for_delivery(10)] == [("expert", "Apple___Black_rot")]


def _pseudo_queued_with_kept_copy(state: Path, n: int):
    """A sure answer ``p<n>`` queued as a pseudo-label, its inbox photo kept under ``processed/``: its queue entry."""
    import hashlib
    from datetime import datetime

    db = ResultsDB(state / "results.sqlite")
    created = time.time()
    day = state / "processed" / datetime.fromtimestamp(created).strftime("%Y-%m-%d")
    day.mkdir(parents=True, exist_ok=True)
    data = f"leaf {n} the model was sure of".encode() * 100
    (day / f"leaf{n}.jpg").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    [copy] = PhotoSpool(state / "queue", 1 << 30).put_many([SpoolItem("pseudo", sha, data)])
    entry = QueueEntry(sha, f"p{n}", "pseudo", "Apple___healthy", 0.99, "v1", str(copy), len(data))
    row = ResultRow(
        sha, f"p{n}", str(state / "inbox" / f"leaf{n}.jpg"), "inbox", "Apple___healthy", 0.99, [], "v1", {}, created, "confident"
    )
    db.commit([row], [entry])
    return db, entry


def test_a_label_given_the_instant_the_daemon_delivers_the_photos_older_label_is_queued_again_never_lost(tmp_path, monkeypatch):
    """The daemon's sender may delete a pseudo-label's row and copy (the trainer acknowledged it) at any instant of the
    expert's labelling of the photo, from another process: the expert's label is queued again, from the copy just moved
    to the expert folder or the one the state directory keeps (before, it was written to no row and never reached the
    trainer, which kept the model's answer)."""
    state = tmp_path / "state"
    classes = ["Apple___healthy", "Apple___Black_rot"]
    spool = PhotoSpool(state / "queue", 1 << 30)
    for n, when in ((1, "before the move"), (2, "after the move")):
        db, entry = _pseudo_queued_with_kept_copy(state, n)

        def deliver(db=db, entry=entry):  # what the sender does on the trainer's ack of the pseudo-label it read
            assert db.remove_queued_entry(entry, lambda: spool.remove(Path(entry.file)))

        if when == "before the move":
            real_find = db.find_queued
            monkeypatch.setattr(db, "find_queued", lambda ref, real_find=real_find: (real_find(ref), deliver())[0])
        else:
            real_mark = db.mark_expert
            monkeypatch.setattr(db, "mark_expert", lambda *a, real_mark=real_mark: (deliver(), real_mark(*a))[1])
        label_photo(db, state / "queue", 1 << 30, classes, f"p{n}", "Apple___Black_rot")
        monkeypatch.undo()
        [queued] = db.queued_for_delivery(10)
        assert (queued.sha256, queued.kind, queued.label) == (entry.sha256, "expert", "Apple___Black_rot"), when
        assert Path(queued.file).parent.name == "expert" and Path(queued.file).is_file(), when
        assert db.expert_labels() == {entry.sha256: "Apple___Black_rot"}, when
        assert sorted(p.name for p in (state / "queue" / "expert").iterdir()) == [Path(queued.file).name], when
        assert db.remove_queued_entry(queued, lambda queued=queued: spool.remove(Path(queued.file)))
        db._db.execute("DELETE FROM expert_labels")


def test_the_photo_page_labels_any_photo_kept_and_the_review_page_links_the_photo_it_labelled(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from .web_helpers import client, csrf_of, make_state

    state = make_state(tmp_path)
    c = client(state)
    db = ResultsDB(state / "results.sqlite")
    queued = {q.sha256 for q in db.queued()}
    sure = next(r["sha256"] for r in db.results() if r["sha256"] not in queued)  # not in the review pool
    db.close()
    page = c.get(f"/photo/{sure}").text
    assert 'id="relabel"' in page and "Wrong answer? The right class" in page
    r = c.post(f"/photo/{sure}/label", data={"csrf": csrf_of(c), "label": "Apple___Black_rot"})
    assert r.status_code == 303 and r.headers["location"] == f"/photo/{sure}?labelled=1"
    shown = c.get(r.headers["location"]).text
    assert 'id="labelled">Labelled Apple · Black rot' in shown and "Not Apple · Black rot?" in shown
    bad = c.post(f"/photo/{sure}/label", data={"csrf": csrf_of(c), "label": "Wheat___rust"})
    assert bad.status_code == 400 and "not a known class" in bad.text
    new = c.post(f"/photo/{sure}/label", data={"csrf": csrf_of(c), "label": "Wheat___rust", "new_class": "1"})
    assert new.status_code == 303 and "Labelled Wheat · rust" in c.get(new.headers["location"]).text
    assert c.post(f"/photo/{sure}/label", data={"label": "Apple___healthy"}).status_code == 403  # no CSRF token
    pool = next(iter(queued))
    done = c.post("/review/label", data={"csrf": csrf_of(c), "photo": pool, "label": "Apple___healthy"})
    said = c.get(done.headers["location"]).text.split('id="done"')[1].split("</p>")[0]
    assert f'<a href="/photo/{pool}">' in said and "a slip is put right on its page" in said


def test_prune_keeps_as_many_of_the_most_informative_photos_as_the_pools_bytes_allow(tmp_path):
    db, spool = _db_with_pool(tmp_path, 6)  # 4 bytes a photo
    assert prune_pool(db, spool, keep=10, policy=LabelsSection(), max_bytes=14) == 3
    assert {i.entry.photo_id for i in to_ask(db, policy=LabelsSection(), per_day=0)} == {"p0", "p1", "p2"}
    assert prune_pool(db, spool, keep=10, policy=LabelsSection(), max_bytes=12) == 0  # 12 bytes held: within
    assert prune_pool(db, spool, keep=2, policy=LabelsSection(), max_bytes=12) == 1  # the count binds first
    assert LabelsSection(max_spool_mb=2048).review_pool_bytes == 1 << 30


def test_a_review_pool_of_phone_photos_leaves_the_queue_room_for_new_photos(tmp_path):
    """Phone photos fill the label queue's quota (2 GiB: about 550 photos of 3.5 MB) long before the pool's 2,000:
    the pool held its oldest photos for ever and queued no new one. Now it keeps at most half the quota, the most
    informative first, and is pruned within seconds while the quota turns photos away."""
    import cv2

    from .daemon_helpers import DaemonProc, db_rows, wait_until
    from .test_handoff_reduce import _scene

    d = DaemonProc(
        tmp_path / "state", {"labels": {"max_spool_mb": 1, "trust_checks": LabelsSection().trust_checks}, "handoff": {"enabled": False}}
    ).start()
    try:
        d.wait_ready()
        photos = [cv2.imencode(".jpg", _scene(600, 800, seed=s), [cv2.IMWRITE_JPEG_QUALITY, 97])[1].tobytes() for s in range(10)]
        assert all(150_000 < len(p) < 400_000 for p in photos)

        def pool() -> list[tuple[str, int]]:
            return db_rows(d.state, "SELECT sha256, bytes FROM label_queue WHERE kind = 'review'")

        for i, data in enumerate(photos[:6]):  # more than the 1 MiB quota: some are turned away
            (d.inbox / f"first{i}.jpg").write_bytes(data)
        wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] == 6, 60, "six results")
        wait_until(lambda: 0 < sum(b for _, b in pool()) <= 1 << 19, 30, "the pool within half the quota")
        for i, data in enumerate(photos[6:]):
            (d.inbox / f"later{i}.jpg").write_bytes(data)
        later = {hashlib.sha256(p).hexdigest() for p in photos[6:]}
        wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] == 10, 60, "ten results")
        wait_until(lambda: later & {sha for sha, _ in pool()}, 30, "a later photo in the pool")
        assert sum(b for _, b in pool()) <= 1 << 20
        assert any(e.get("event") == "review_pool_pruned" for e in d.events())
    except BaseException:  # a failure leaves no daemon running after the test
        d.kill()
        raise
    assert d.terminate() == 0
