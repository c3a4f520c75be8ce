"""The typical order (``[labels] ask_order = "typical"``): the photo most typical of each group no label covers yet,
the largest group first, from the distances kept beside the review pool."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.config import LabelsSection
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.results import ResultsDB
from edge_agent.review import typical as typical_module
from edge_agent.review.queue import label_photo, prune_pool, to_ask
from edge_agent.review.typical import MAX_CLUSTERS, rows_of, typical, typical_ids
from edge_agent.spool import PhotoSpool, SpoolItem

CLASSES = ["Apple___Apple_scab", "Apple___Black_rot", "Apple___healthy"]


def _blobs(sizes, width=8, seed=0, spread=0.5):
    """Points in one blob per size (around 10 x a unit vector each), and each point's blob."""
    rng = np.random.default_rng(seed)
    centres = np.eye(width)[: len(sizes)] * 10
    x = np.concatenate([c + rng.normal(0, spread, (n, width)) for c, n in zip(centres, sizes)])
    return x, np.repeat(np.arange(len(sizes)), sizes)


def test_the_typical_rule_takes_from_each_cluster_the_photo_at_its_dense_centre_largest_cluster_first():
    x, blob = _blobs([40, 25, 10])
    x[5] = np.eye(8)[0] * 10 + 3.0  # an outlier of the first blob: never the typical one
    picks = typical(x, 3, seed=1)
    assert [int(blob[i]) for i in picks] == [0, 1, 2]  # one from each, the largest first
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    for i in picks:
        members = np.flatnonzero(blob == blob[i])
        d = np.linalg.norm(unit[members] - unit[members].mean(0), axis=1)
        assert d[list(members).index(i)] <= np.quantile(d, 0.25)  # near its cluster's middle, not at an edge
    assert 5 not in picks


def test_a_cluster_holding_a_labelled_photo_is_not_asked_about_again():
    x, blob = _blobs([40, 25, 10])
    labelled = np.zeros(len(x), bool)
    labelled[3] = True  # one photo of the largest blob has its label
    picks = typical(x, 4, seed=1, labelled=labelled)
    assert 0 not in {int(blob[i]) for i in picks} and {int(blob[i]) for i in picks} >= {1, 2}
    assert int(blob[picks[0]]) == 1  # the largest uncovered first
    assert not labelled[picks].any()


def test_rows_that_are_all_alike_give_one_pick_and_no_error():
    assert typical(np.ones((12, 5)), 6, seed=0) == [typical(np.ones((12, 5)), 6, seed=0)[0]]
    assert typical(np.zeros((0, 5)), 3, seed=0) == [] and typical(np.ones((4, 5)), 0, seed=0) == []


def test_an_overflowed_distance_reads_as_the_farthest_and_the_rest_as_their_square_roots():
    d = np.array([[4.0, 9.0, np.inf], [np.nan, 16.0, -1e-6]], np.float32)
    assert rows_of(d).tolist() == [[2.0, 3.0, 4.0], [4.0, 4.0, 0.0]]
    assert np.isfinite(rows_of(np.full((2, 3), np.inf))).all()


def test_photos_without_distances_or_with_another_engines_classes_are_left_to_the_margins_order():
    x, _ = _blobs([6, 6], width=4)
    described = [(f"u{i}", (x[i] ** 2).astype(np.float32), False) for i in range(12)]
    described.append(("other", np.ones(7, np.float32), False))  # an engine of 7 classes
    picked = typical_ids([f"u{i}" for i in range(12)] + ["other", "none"], described, new=2)
    assert len(picked) == 2 and "other" not in picked and "none" not in picked
    assert {int(p[1:]) // 6 for p in picked} == {0, 1}  # one from each group
    assert typical_ids(["none"], described, new=2) == []


def test_the_clusters_are_as_many_as_the_labels_plus_the_round_never_more_than_the_cap_nor_the_photos(monkeypatch):
    seen = []

    def kmeans(x, k, seed):
        seen.append(k)
        return np.arange(len(x)) % k

    monkeypatch.setattr("edge_agent.review.typical.kmeans", kmeans)
    rows = [(f"u{i:03d}", np.full(3, float(i), np.float32), False) for i in range(20)]
    labelled = [(f"l{i:03d}", np.full(3, float(i), np.float32), True) for i in range(300)]
    unsure = [sha for sha, _, _ in rows]
    for new in (4, 0):
        typical_ids(unsure, rows + labelled[:7], new=new)
    typical_ids(unsure, rows + labelled, new=4)
    typical_ids(unsure[:3], rows[:3] + labelled[:2], new=10)
    assert seen == [7 + 4, 7 + 10, MAX_CLUSTERS, 5]


def test_labelling_a_photo_leaves_the_clusters_as_they_were_and_covers_its_own(monkeypatch):
    x, blob = _blobs([30, 20, 12, 8], width=6)
    described = [(f"{i:03d}", (x[i] ** 2).astype(np.float32), False) for i in range(len(x))]
    seen = []
    real = typical_module.kmeans
    monkeypatch.setattr(typical_module, "_last", None)
    monkeypatch.setattr(typical_module, "kmeans", lambda *a: seen.append(a[1]) or real(*a))
    first = typical_ids([sha for sha, _, _ in described], described, new=4)
    assert len(first) == 4 and len(seen) == 1
    asked = first[0]
    after = [(sha, d, sha == asked) for sha, d, _ in described]
    again = typical_ids([sha for sha, _, labelled in after if not labelled], after, new=3)
    assert again == first[1:] and len(seen) == 1  # the same clusters (not computed again), the labelled one covered
    grown = described + [("999", (x[0] ** 2).astype(np.float32), False)]
    typical_ids([sha for sha, _, _ in grown], grown, new=4)
    assert len(seen) == 2  # a new photo: clustered again


def _pool(tmp_path, groups, engine="v4000"):
    """A ledger whose review pool holds, per group, photos whose distances lie near one of three class-like points
    (the last group's photos the least sure), as the daemon's commit keeps them."""
    db = ResultsDB(tmp_path / "results.sqlite")
    spool = PhotoSpool(tmp_path / "queue", 1 << 30)
    rng = np.random.default_rng(0)
    results, entries, kept, n = [], [], {}, 0
    for g, size in enumerate(groups):
        centre = np.full(len(CLASSES), 400.0)
        centre[g % len(CLASSES)] = 25.0 + 100 * (g // len(CLASSES))
        for i in range(size):
            sha = f"{n:064x}"
            p1 = 0.5 + 0.01 * i + 0.1 * (len(groups) - 1 - g)  # the last group least sure, and within one the first
            top_k = [[CLASSES[g % 3], p1], [CLASSES[(g + 1) % 3], 1 - p1]]
            [f] = spool.put_many([SpoolItem("review", sha, b"jpeg", ".jpg")])
            results.append(ResultRow(sha, f"p{n}", f"/in/{n}.jpg", "folder", top_k[0][0], p1, top_k, engine, {}))
            entries.append(QueueEntry(sha, f"p{n}", "review", top_k[0][0], p1, engine, str(f), 4))
            kept[sha] = (engine, np.abs(centre + rng.normal(0, 4, len(CLASSES))).astype(np.float32).tobytes())
            n += 1
    db.commit(results, entries, kept)
    return db, spool


def test_the_expert_is_asked_the_largest_groups_typical_photo_first_and_then_a_group_no_label_covers(tmp_path):
    db, _ = _pool(tmp_path, [12, 8, 5])
    group = {f"{n:064x}": g for g, (a, b) in enumerate([(0, 12), (12, 20), (20, 25)]) for n in range(a, b)}
    typical_order = LabelsSection(ask_order="typical")
    asked = to_ask(db, 3, typical_order)
    assert [group[it.entry.sha256] for it in asked] == [0, 1, 2]  # one photo of each group, the largest first
    by_margin = to_ask(db, 3, LabelsSection())
    assert [group[it.entry.sha256] for it in by_margin] == [2, 2, 1]  # (the margin's order: the least sure group)
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, asked[0].entry.sha256, CLASSES[0])
    again = to_ask(db, 3, typical_order, everything=True)
    assert [group[it.entry.sha256] for it in again[:2]] == [1, 2]  # the labelled group is covered: not asked first
    assert asked[0].entry.sha256 not in {it.entry.sha256 for it in again}
    assert len(again) == 24  # the rest of the pool follows, by margin


def test_the_distances_are_kept_for_the_pool_and_its_labels_and_forgotten_when_a_photo_leaves_it_unlabelled(tmp_path):
    db, spool = _pool(tmp_path, [6, 4])
    ids = [f"{n:064x}" for n in range(10)]
    assert sorted(sha for sha, _, _ in db.pool_distances()) == ids
    assert all(len(d) == 3 and d.dtype == np.float32 for _, d, _ in db.pool_distances())
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, ids[0], CLASSES[0])
    assert {sha for sha, _, labelled in db.pool_distances() if labelled} == {ids[0]}
    assert prune_pool(db, spool, keep=5, policy=LabelsSection()) == 4
    prune_pool(db, spool, keep=5, policy=LabelsSection())  # (the distances of those the pass before dropped)
    kept = {sha for sha, _, _ in db.pool_distances()}
    assert len(kept) == 6 and ids[0] in kept  # the five kept, and the labelled one
    assert db._query("SELECT COUNT(*) FROM pool_distances")[0][0] == 6


def test_only_photos_that_join_the_review_pool_keep_their_distances(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    d = np.ones(3, np.float32).tobytes()
    rows = [ResultRow(s, s[:8], None, "folder", CLASSES[0], 0.99, [], "v1", {}) for s in ("a" * 64, "b" * 64, "c" * 64)]
    entries = [
        QueueEntry("a" * 64, "a", "pseudo", CLASSES[0], 0.99, "v1", "/q/a", 1),
        QueueEntry("b" * 64, "b", "review", CLASSES[0], 0.5, "v1", "/q/b", 1),
    ]
    db.commit(rows, entries, {"a" * 64: ("v1", d), "b" * 64: ("v1", d), "c" * 64: ("v1", d)})
    assert [sha for sha, _, _ in db.pool_distances()] == ["b" * 64]
    db.commit([], [QueueEntry("b" * 64, "b", "review", CLASSES[0], 0.5, "v2", "/q/b2", 1)], {"b" * 64: ("v2", d)})
    assert db._query("SELECT engine_version FROM pool_distances")[0][0] == "v1"  # a photo queued again keeps its first


def test_a_ledger_from_before_the_distances_were_kept_reads_none_and_is_upgraded_when_opened_to_write(tmp_path):
    import sqlite3

    path = tmp_path / "results.sqlite"
    ResultsDB(path).close()
    con = sqlite3.connect(path)
    con.execute("DROP TABLE pool_distances")
    con.commit()
    con.close()
    assert ResultsDB(path, readonly=True).pool_distances() == []
    db = ResultsDB(path)
    assert db.pool_distances() == [] and db._query("SELECT COUNT(*) FROM pool_distances") == [(0,)]


def test_the_typical_order_with_no_distances_kept_is_the_margins(tmp_path):
    db, _ = _pool(tmp_path, [5, 5])
    db._db.execute("DELETE FROM pool_distances")
    assert [it.entry.sha256 for it in to_ask(db, 0, LabelsSection(ask_order="typical"))] == [
        it.entry.sha256 for it in to_ask(db, 0, LabelsSection())
    ]


@pytest.mark.parametrize("order", ["margin", "draw", "typical"])
def test_a_spent_budget_asks_nothing_whatever_the_order(tmp_path, order):
    db, _ = _pool(tmp_path, [3])
    label_photo(db, tmp_path / "queue", 1 << 30, CLASSES, f"{0:064x}", CLASSES[0])
    assert to_ask(db, 1, LabelsSection(ask_order=order)) == []
    assert len(to_ask(db, 1, LabelsSection(ask_order=order), everything=True)) == 2
