"""The review queue: ranked by what a label would teach, spread over classes, capped per day; labelling; pruning."""

from __future__ import annotations

import json
import time

import pytest

from edge_agent.config import LabelsSection
from edge_agent.results import QueueEntry, ResultRow, ResultsDB
from edge_agent.review.queue import LabelError, label_photo, left_today, prune_pool, to_ask
from edge_agent.review.rank import Candidate, margin, rank
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
