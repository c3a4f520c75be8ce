"""benchmarks.pseudo_sources: a loop's pseudo-labels split by whether their photo was answered again, and how sure."""

import json
import sqlite3

import pytest

from benchmarks.pseudo_sources import Made, bands, by_day, made, main, markdown


def test_the_bands_count_each_source_apart_and_those_under_the_bar_or_of_unknown_confidence_on_rows_of_their_own():
    got = [
        Made(1, False, 0.985, True),
        Made(1, True, 0.985, False),
        Made(1, True, 0.985, True),
        Made(2, True, 0.999, True),
        Made(2, True, None, False),
    ]
    rows = bands(got, [0.98, 0.99])
    assert rows[0] == {"band": "0.98 to 0.99", "answered once": {"made": 1, "right": 1}, "answered again": {"made": 2, "right": 1}}
    assert rows[1] == {"band": "0.99 and up", "answered once": {"made": 0, "right": 0}, "answered again": {"made": 1, "right": 1}}
    assert rows[2] == {"band": "not known", "answered once": {"made": 0, "right": 0}, "answered again": {"made": 1, "right": 0}}
    older = bands([Made(1, False, 0.93, False)], [0.98, 0.99])  # a ledger from before the bar: counted, not dropped
    assert older[0] == {"band": "under 0.98", "answered once": {"made": 1, "right": 0}, "answered again": {"made": 0, "right": 0}}
    assert [r["band"] for r in older] == ["under 0.98", "0.98 to 0.99", "0.99 and up"]


def test_a_bar_asked_of_photos_answered_again_keeps_every_photo_answered_once_whatever_its_confidence():
    got = [Made(1, False, 0.981, False), Made(1, True, 0.985, False), Made(1, True, 0.995, True), Made(3, True, None, True)]
    rows = by_day(got, [0.99], 3)
    assert rows[0] == {"day": 1, "made": 3, "right": 1, "bars": {"0.99": {"kept": 2, "right": 1}}}
    assert rows[1]["made"] == 0 and rows[2]["bars"]["0.99"] == {"kept": 0, "right": 0}  # not known: not kept
    text = markdown([{"name": "run", "made": 4, "right": 2, "bands": bands(got, [0.98, 0.99]), "days": rows}], "cmd")
    assert "| 1 | 1 of 3 (33.3%) | 1 of 2 (50.0%) |" in text and "| 2 |" not in text


def _run(tmp_path, photos):
    """A kept run of one day: the report, and a ledger whose pseudo_sent, results and pool_answers tell the story."""
    field = tmp_path / "data" / "field" / "orchard"
    for cls in ("A", "B"):
        (field / cls).mkdir(parents=True)
        for i in range(8):
            (field / cls / f"{i}.jpg").write_bytes(f"{cls}{i}".encode())
    seed_dir = tmp_path / "run" / "seed-1"
    (seed_dir / "state").mkdir(parents=True)
    settings = {"data": str(tmp_path / "data"), "field": "field/orchard", "seed": 1, "test_fraction": 0.25, "day_size": 100}
    (seed_dir / "report.json").write_text(json.dumps({"settings": settings, "classes": ["A", "B"], "days": [{}]}))
    with sqlite3.connect(seed_dir / "state" / "results.sqlite") as db:
        db.execute("CREATE TABLE results (sha256 TEXT, engine_version TEXT, confidence REAL, created REAL)")
        db.execute("CREATE TABLE pool_answers (sha256 TEXT, engine_version TEXT, confidence REAL)")
        db.execute("CREATE TABLE pseudo_sent (sha256 TEXT, label TEXT, engine_version TEXT, sent REAL, withdrawn REAL)")
        for sha, label, maker, first, again in photos(field):
            db.execute("INSERT INTO results VALUES (?,?,?,?)", (sha, first[0], first[1], 1.0))
            if again:
                db.execute("INSERT INTO pool_answers VALUES (?,?,?)", (sha, again[0], again[1]))
            db.execute("INSERT INTO pseudo_sent VALUES (?,?,?,?,NULL)", (sha, label, maker, 2.0))
    return tmp_path / "run"


def test_the_ledger_says_which_photos_were_answered_again_by_the_version_that_made_them_and_the_truth_is_their_folder(tmp_path):
    import hashlib

    from benchmarks.field_loop import split_field

    def photos(field):
        _, stream = split_field(field, ["A", "B"], 1, 0.25)
        sha = [hashlib.sha256(open(p, "rb").read()).hexdigest() for p, _ in stream[:3]]
        truth = ["AB"[y] for _, y in stream[:3]]
        return [
            (sha[0], truth[0], "v2", ("v2", 0.99), None),  # arrived sure: answered once, right
            (sha[1], "AB"[truth[1] == "A"], "v3", ("v1", 0.5), ("v3", 0.985)),  # answered again by its maker, wrong
            (sha[2], truth[2], "v3", ("v3", 0.982), ("v2", 0.7)),  # the pool's answer is an older version's
            ("f" * 64, "A", "v3", ("v3", 0.99), None),  # not a photo of the stream
        ]

    run = _run(tmp_path, photos)
    _, got = made(run / "seed-1")
    assert sorted(got, key=lambda m: m.confidence) == [Made(1, False, 0.982, True), Made(1, True, 0.985, False), Made(1, False, 0.99, True)]
    assert main([str(run), "--bars", "0.99", "--out", str(tmp_path / "out.md")]) == 0
    text = (tmp_path / "out.md").read_text()
    assert "| 0.98 to 0.99 | 1 of 1 (100.0%) | 0 of 1 (0.0%) |" in text and "| 1 | 2 of 3 (66.7%) | 2 of 2 (100.0%) |" in text


def test_one_seed_for_several_folders_or_one_each_and_anything_else_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c"), "--seeds", "1", "2"])
