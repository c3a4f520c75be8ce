"""The held-back photos' replay (benchmarks.held_back_checks): a version's wrong sure answer of a class on a photo no
version trains on vetoes its pseudo-labels of that class, from the moment the photo was labelled."""

from __future__ import annotations

from benchmarks.held_back_checks import Made, by_day, kept, markdown

SCAB, RUST = "Apple___Apple_scab", "Apple___Cedar_apple_rust"
# v2 is sure a rust photo labelled at t=15 is scab; sure and right of a scab photo labelled at t=5
SURE = {"v2": [(5.0, SCAB, True, SCAB), (15.0, SCAB, False, RUST)], "v3": [(12.0, RUST, True, RUST)]}
PUBLISHED = {"v2": 10.0, "v3": 30.0}


def test_a_wrong_sure_answer_vetoes_the_versions_pseudo_labels_of_that_class_only_once_its_photo_was_labelled():
    early, late = Made(2, SCAB, "v2", 12.0, True), Made(3, SCAB, "v2", 20.0, False)
    assert kept(early, SURE, PUBLISHED, "before")  # the rust photo was labelled at 15, after it
    assert not kept(late, SURE, PUBLISHED, "before")


def test_the_published_veto_reads_only_what_was_labelled_before_the_version_first_answered():
    late = Made(3, SCAB, "v2", 20.0, False)
    assert kept(late, SURE, PUBLISHED, "published")  # labelled at 15, after v2 first answered at 10
    assert not kept(late, SURE, {"v2": 16.0}, "published")


def test_another_class_or_another_version_is_not_vetoed_by_that_mistake():
    assert kept(Made(3, RUST, "v2", 20.0, True), SURE, PUBLISHED, "before")
    assert kept(Made(3, SCAB, "v3", 40.0, True), SURE, PUBLISHED, "before")
    assert kept(Made(3, SCAB, "v9", 40.0, True), SURE, PUBLISHED, "published")  # a version never answered: nothing known


def test_the_day_table_counts_made_and_kept_per_day_and_the_markdown_shows_days_with_pseudo_labels_only():
    made = [Made(2, SCAB, "v2", 12.0, True), Made(3, SCAB, "v2", 20.0, False), Made(3, SCAB, "v2", 21.0, True)]
    days = by_day(made, SURE, PUBLISHED, 4)
    assert [d["made"] for d in days] == [0, 1, 2, 0]
    assert days[2]["right"] == 1 and days[2]["before"] == {"kept": 0, "right": 0} and days[2]["published"] == {"kept": 2, "right": 1}
    run = {
        "seed": 1,
        "days": days,
        "versions": [],
        "totals": {"made": 3, "right": 2, "held_back_photos": 3, "before": {"kept": 1, "right": 1}, "published": {"kept": 3, "right": 2}},
    }
    text = markdown([run], "cmd")
    assert "| 3 | 1 of 2 | - | 1 of 2 |" in text and "| 1 |" not in text and "`before` keeps 1, 1 right" in text


def test_the_delivered_pseudo_labels_are_the_ledgers_and_the_trainers_it_never_recorded_oldest_first(tmp_path):
    """A fast-mode run from before 2026-12-07 recorded no delivery in the ledger: its pseudo-labels are read from the
    trainer's store, which holds what was delivered (a withdrawn one is only in the ledger)."""
    import sqlite3

    from benchmarks.held_back_checks import _delivered

    ledger, samples = tmp_path / "results.sqlite", tmp_path / "samples.sqlite"
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE pseudo_sent (sha256 TEXT, label TEXT, engine_version TEXT, sent REAL, withdrawn REAL)")
        db.execute("INSERT INTO pseudo_sent VALUES ('a', 'scab', 'v2', 20.0, 30.0)")  # withdrawn from the trainer since
        db.execute("INSERT INTO pseudo_sent VALUES ('b', 'rust', 'v2', 21.0, NULL)")
    with sqlite3.connect(samples) as db:
        db.execute("CREATE TABLE samples (id TEXT, kind TEXT, label TEXT, engine_version TEXT, received REAL)")
        db.executemany(
            "INSERT INTO samples VALUES (?,?,?,?,?)",
            [("b", "pseudo", "rust", "v2", 21.5), ("c", "pseudo", "scab", "v1", 10.0), ("d", "expert", "scab", "", 5.0)],
        )
    assert _delivered(ledger, samples) == [("c", "scab", "v1", 10.0), ("a", "scab", "v2", 20.0), ("b", "rust", "v2", 21.0)]
