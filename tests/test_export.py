"""The results as a spreadsheet: the Photos page's CSV (its filters), `edge-agent results --csv`, no formula run."""

from __future__ import annotations

import csv
import io
import sqlite3
from pathlib import Path

import pytest

from edge_agent.export import CSV_COLUMNS, csv_lines, safe_cell
from edge_agent.ledger_rows import ResultRow
from edge_agent.results import ResultsDB


def _table(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_text_that_a_spreadsheet_would_run_as_a_formula_is_written_as_text():
    assert [safe_cell(v) for v in ("=1+1", "+cmd", "-2", "@SUM(A1)", "\tx", "leaf.jpg", None, 0.5)] == [
        "'=1+1",
        "'+cmd",
        "'-2",
        "'@SUM(A1)",
        "'\tx",
        "leaf.jpg",
        "",
        "0.5",
    ]
    assert "".join(csv_lines([])) == ",".join(CSV_COLUMNS) + "\r\n"  # no photo: the header alone


@pytest.fixture
def state(tmp_path) -> Path:
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from .web_helpers import make_state

    root = make_state(tmp_path)
    with sqlite3.connect(root / "results.sqlite") as con:
        con.execute("UPDATE results SET plant = 'tree 3' WHERE photo_id IN ('p1', 'p2')")
    db = ResultsDB(root / "results.sqlite")
    sha = f"{7:064x}"
    top_k = [["Apple___Apple_scab", 0.6], ["Apple___healthy", 0.3]]
    db.commit([ResultRow(sha, "p7", "/inbox/=HYPERLINK(evil).jpg", "inbox", "Apple___Apple_scab", 0.6, top_k, "v1", {}, verdict="unsure")])
    db.mark_expert(sha, "Apple___Black_rot", "")
    db.close()
    return root


def test_the_photos_page_downloads_every_photo_its_filters_match_as_a_csv_with_the_experts_labels(state):
    from .web_helpers import client

    c = client(state)
    r = c.get("/photos.csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert r.headers["content-disposition"].startswith('attachment; filename="edge-agent-photos-')
    rows = _table(r.text)
    assert [row["photo id"] for row in rows] == ["p7", "p5", "p4", "p3", "p2", "p1", "p0"]  # newest first, every page
    evil = rows[0]
    assert evil["photo"] == "'=HYPERLINK(evil).jpg" and evil["expert label"] == "Apple___Black_rot" and evil["verdict"] == "unsure"
    assert list(rows[0]) == list(CSV_COLUMNS)
    tree = _table(c.get("/photos.csv", params={"plant": "tree 3"}).text)
    assert [row["photo id"] for row in tree] == ["p2", "p1"] and {row["plant"] for row in tree} == {"tree 3"}
    assert _table(c.get("/photos.csv", params={"label": "Tomato___healthy"}).text) == []  # the header alone
    link = c.get("/photos", params={"plant": "tree 3"}).text.split('id="csv" href="')[1].split('"')[0]
    assert link == "/photos.csv?plant=tree+3"
    assert 'id="csv"' not in c.get("/photos", params={"label": "Tomato___healthy"}).text  # nothing to download
    assert c.get("/photos.csv", params={"from": "yesterday"}).status_code == 400


def test_the_export_reads_in_batches_from_the_newest_down_and_a_photo_classified_meanwhile_neither_repeats_nor_shifts_any(state):
    from edge_agent.web.queries import Filters, Reader

    seen = []
    for row in Reader(state / "results.sqlite").each(Filters(), batch=2):
        seen.append(row["photo_id"])
        if len(seen) == 3:  # the daemon classifies another photo meanwhile
            db = ResultsDB(state / "results.sqlite")
            db.commit([ResultRow(f"{8:064x}", "p8", None, "camera:gate", "Apple___healthy", 0.99, [], "v1", {})])
            db.close()
    assert seen == ["p7", "p5", "p4", "p3", "p2", "p1", "p0"]


def test_edge_agent_results_writes_the_same_csv_oldest_first(state, capsys):
    from edge_agent.cli import main

    assert main(["results", "--state-dir", str(state), "--csv"]) == 0
    rows = _table(capsys.readouterr().out)
    assert [row["photo id"] for row in rows] == ["p0", "p1", "p2", "p3", "p4", "p5", "p7"]
    assert rows[-1]["photo"] == "'=HYPERLINK(evil).jpg" and rows[-1]["expert label"] == "Apple___Black_rot"
    assert main(["results", "--state-dir", str(state), "--csv", "--plant", "tree 3"]) == 0
    assert [row["photo id"] for row in _table(capsys.readouterr().out)] == ["p1", "p2"]
    with pytest.raises(SystemExit) as both:
        main(["results", "--state-dir", str(state), "--csv", "--json"])
    assert both.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_the_plants_page_downloads_each_plants_season_visit_by_visit(state):
    import time

    from .web_helpers import client

    db = ResultsDB(state / "results.sqlite")
    rows = []
    for i, (label, days) in enumerate([("Apple___healthy", 60)] * 2 + [("Apple___Apple_scab", 0)] * 2):
        top_k = [[label, 0.97], ["Apple___Black_rot", 0.02]]
        created = time.time() - days * 86400 + i
        rows.append(ResultRow(f"{100 + i:064x}", f"t{i}", "", "inbox", label, 0.97, top_k, "v1", {}, created, "confident", "tree 8"))
    db.commit(rows)
    db.mark_expert(rows[0].sha256, "Apple___healthy", "")
    db.close()
    c = client(state)
    r = c.get("/plants.csv")
    assert r.status_code == 200 and r.headers["content-disposition"].startswith('attachment; filename="edge-agent-plants-')
    table = _table(r.text)
    assert [(v["plant"], v["photos"], v["diagnosis"], v["verdict"]) for v in table[:2]] == [
        ("tree 8", "2", "Apple___healthy", "confident"),  # May: the expert's word
        ("tree 8", "2", "Apple___Apple_scab", "confident"),  # August
    ]
    assert [(v["plant"], v["photos"]) for v in table[2:]] == [("tree 3", "2")]  # the most recently photographed plant first
    assert table[0]["labelled by the expert"] == "1" and table[0]["combined probability"] == ""
    assert float(table[1]["combined probability"]) > 0.9 and table[0]["visit began (local time)"] < table[1]["visit began (local time)"]
    assert [v["plant"] for v in _table(c.get("/plants.csv", params={"q": "TREE 3"}).text)] == ["tree 3"]
    assert 'id="csv" href="/plants.csv?q="' in c.get("/plants").text
    link = c.get("/plants/tree%208").text.split('id="plant-csv" href="')[1].split('"')[0]
    assert link == "/photos.csv?plant=tree%208" and len(_table(c.get(link).text)) == 4  # the plant's own photos
