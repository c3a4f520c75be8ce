"""benchmarks.field_check_record: the field check's publications and what they did held out, from stored reports."""

from __future__ import annotations

import json

import pytest

from benchmarks.field_check_record import by_log_loss, by_margin, decisions, judged, main, summary


def _check(cand: int, cur: int, photos: int) -> dict:
    return {"field_candidate_right": cand, "field_current_right": cur, "field_photos": photos}


REPORT = {
    "days": [
        {"day": 1, "field": 0.10, "retrain": {"published": None, "skipped": True}},
        {"day": 2, "field": {"top1": 0.60}, "retrain": {"published": "v4001", "field_check": _check(5, 0, 6)}},
        {"day": 3, "field": 0.70, "retrain": {"published": "v4002", "field_check": _check(8, 7, 10)}},
        {
            "day": 4,
            "field": 0.70,
            "retrain": {
                "published": None,
                "field_check": _check(6, 8, 12),
                "judged": [{"candidate": 0.74, "in_service": 0.70, "passed": False, "photos": 12}],
            },
        },
        {
            "day": 5,
            "field": 0.68,
            "retrain": {
                "published": "v4003",
                "field_check": _check(11, 11, 14),
                "judged": [{"candidate": 0.68, "in_service": 0.70, "passed": True, "photos": 14}],
            },
        },
        {"day": 6, "field": 0.68, "retrain": {"published": "v4004", "field_check": {"publish": True, "field_photos": 0}}},
    ]
}


def test_each_publication_after_the_first_is_a_row_with_how_it_passed_and_the_held_out_change():
    rows = decisions(REPORT)
    assert [(r["day"], r["passed_on"], r["held_back"]) for r in rows] == [(3, "more", 10), (5, "tie", 14)]
    assert rows[0]["before"] == 0.60 and rows[0]["after"] == 0.70  # a field stored as a dict is read too
    assert rows[1]["before"] == 0.70 and rows[1]["after"] == 0.68  # from the version the refused day kept serving


def test_the_summary_counts_the_worse_publications_of_each_kind():
    s = summary(decisions(REPORT) * 2)
    assert s["more"]["published"] == 2 and s["more"]["worse"] == 0 and s["more"]["mean_change"] == pytest.approx(0.10)
    assert s["tie"]["worse"] == 2 and s["tie"]["worse_by_over_0.01"] == 2 and s["tie"]["worst_change"] == pytest.approx(-0.02)


def _printed(tmp_path, capsys, report: dict) -> str:
    """What the command prints over a results folder holding ``report`` as one seed's run."""
    run = tmp_path / "field-loop-x" / "device-fast" / "seed-1"
    run.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps(report))
    main([str(tmp_path)])
    return capsys.readouterr().out


def test_the_command_prints_a_row_per_kind_and_names_a_report_it_cannot_read(tmp_path, capsys):
    out = _printed(tmp_path, capsys, REPORT)
    assert "2 publications judged by the field check (a day that several runs share counted once), from 1 reports" in out
    assert "| more right | 1 | +10.0 +- 0.0 pts | 0 | 0 |" in out and "| a tie | 1 | -2.0 +- 0.0 pts | 1 | 1 | -2.0 pts | 14 |" in out
    run = tmp_path / "field-loop-x" / "device-fast" / "seed-1"
    (run / "report.json").write_text('{"days": [{"day": 1, "retrain": {"published": "v2", "field_check": {"field_ca')
    with pytest.raises(SystemExit, match="seed-1/report.json: not a field loop report"):
        main([str(tmp_path)])
    with pytest.raises(SystemExit, match="no <run>/<arm>/seed-<N>/report.json here"):
        main([str(tmp_path / "empty")])


def test_each_judged_candidate_refused_or_not_is_a_row_of_its_margin_and_a_day_two_runs_share_counts_once():
    rows = judged(REPORT, seed=1)
    assert [(r["day"], r["margin"], r["passed"]) for r in rows] == [(4, -2, False), (5, 0, True)]
    two_candidates = {"days": [{"day": 3, "retrain": {"field_check": _check(8, 7, 10), "judged": [{}, {}]}}]}
    assert judged(two_candidates) == []  # which of the two the check's figures belong to is unknown
    table = by_margin(rows + judged(REPORT, seed=1) + judged(REPORT, seed=2))
    assert table[-2] == {
        "candidates": 2,  # seed 1's day 4 once, seed 2's once
        "passed": 0,
        "better": 2,
        "worse": 0,
        "mean_change": pytest.approx(0.04),
        "lowest": pytest.approx(0.04),
        "highest": pytest.approx(0.04),
        "held_back_median": 12,
        "log_loss_recorded": 0,
        "log_loss_lower": 0,
    }
    assert table[0]["worse"] == 2 and table[0]["passed"] == 2
    assert list(by_margin([dict(rows[0], margin=-7)])) == [-3]  # a wide margin joins the table's last row


def test_the_command_also_prints_the_judged_candidates_by_margin(tmp_path, capsys):
    run = tmp_path / "field-loop-x" / "dated" / "device-fast" / "seed-1"  # a run stored a folder deeper is read too
    run.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps(REPORT))
    main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "2 candidates the check judged and the run scored held out (refused ones too)" in out
    assert "| -2 | 1 | 0 | 1 | 0 | +4.0 (+4.0, +4.0) pts | 12 | - |" in out


def test_where_the_trainer_recorded_log_loss_the_table_counts_the_candidates_lower_there():
    report = json.loads(json.dumps(REPORT))
    report["days"][3]["retrain"]["field_check"].update(field_candidate_log_loss=0.8, field_current_log_loss=0.9)
    report["days"][4]["retrain"]["field_check"].update(field_candidate_log_loss=1.1, field_current_log_loss=0.9)
    table = by_margin(judged(report, seed=1))
    assert (table[-2]["log_loss_lower"], table[-2]["log_loss_recorded"]) == (1, 1)
    assert (table[0]["log_loss_lower"], table[0]["log_loss_recorded"]) == (0, 1)
    for runs in ([REPORT, report], [report, REPORT]):  # a day two runs share: the run that recorded the log-loss counts
        table = by_margin([r for run in runs for r in judged(run, seed=1)])
        assert table[-2]["candidates"] == 1 and table[-2]["log_loss_recorded"] == 1


def test_the_log_loss_table_splits_the_recorded_candidates_by_both_readings_of_the_held_back_photos(tmp_path, capsys):
    report = json.loads(json.dumps(REPORT))
    report["days"][3]["retrain"]["field_check"].update(field_candidate_log_loss=0.8, field_current_log_loss=0.9)
    report["days"][4]["retrain"]["field_check"].update(field_candidate_log_loss=1.1, field_current_log_loss=0.9)
    table = by_log_loss(judged(report, seed=1) + judged(REPORT, seed=2))  # seed 2 recorded none: not in the table
    assert list(table) == [("tie", False), ("fewer", True)]
    assert table[("fewer", True)] == {"candidates": 1, "passed": 0, "better": 1, "worse": 0, "mean_change": 0.04}
    assert table[("tie", False)]["worse"] == 1 and table[("tie", False)]["passed"] == 1
    out = _printed(tmp_path, capsys, report)
    assert "2 of them with each side's log-loss on the held-back photos recorded" in out
    assert "| fewer | lower | 1 | 0 | 1 | 0 | +4.0 pts |" in out
