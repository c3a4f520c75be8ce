"""Several photos of one plant, one diagnosis: combining, the plant a photo belongs to, the API and page, one alert."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from edge_agent.alerts.config import AlertsSection, MqttSection
from edge_agent.alerts.worker import AlertWorker
from edge_agent.ledger_rows import ResultRow
from edge_agent.plants import combine, diagnose, plant_of
from edge_agent.results import ResultsDB

_n = iter(range(10**6))


def test_photos_sure_of_the_same_class_make_a_sure_plant_and_unsure_ones_alone_do_not():
    one = combine([([["A", 0.7], ["B", 0.2], ["C", 0.05]], "unsure")], 38)
    assert one.label == "A" and one.verdict == "unsure" and one.probability == pytest.approx(0.7, abs=0.01)
    leaning = [([["A", 0.7], ["B", 0.2], ["C", 0.05]], "unsure")] * 3
    three = combine(leaning, 38)  # the product is sure; no photo is on its own (the verdict's distance check)
    assert three.label == "A" and three.probability > 0.95 and three.verdict == "unsure" and "0 of 3" in three.reason
    sure = combine([([["A", 0.93], ["B", 0.05]], "confident")] * 2 + leaning[:1], 38)
    assert sure.verdict == "confident" and sure.probability > 0.99 and sure.agreeing == 3


def test_a_plant_whose_photos_disagree_is_unsure_and_says_so():
    d = combine(
        [([["A", 0.95], ["B", 0.03]], "confident"), ([["B", 0.96], ["A", 0.02]], "confident"), ([["A", 0.6], ["B", 0.3]], "unsure")], 38
    )
    assert d.verdict == "unsure" and "disagree" in d.reason and "B" in d.reason
    split = combine([([["A", 0.6]], "unsure"), ([["B", 0.6]], "unsure"), ([["C", 0.6]], "unsure")], 38)
    assert split.verdict == "unsure" and "1 of 3" in split.reason


def test_a_plant_mostly_unlike_anything_known_is_unknown_and_one_odd_photo_does_not_overturn_two():
    assert combine([([["A", 0.5]], "unknown"), ([["A", 0.5]], "unknown"), ([["A", 0.99]], "confident")], 38).verdict == "unknown"
    d = combine([([["A", 0.8], ["B", 0.1]], "unsure"), ([["A", 0.85], ["B", 0.1]], "unsure"), ([["B", 0.7], ["A", 0.2]], "unsure")], 38)
    assert d.label == "A" and d.agreeing == 2
    with pytest.raises(ValueError):
        combine([], 38)


def test_the_experts_labels_of_a_plants_photos_are_its_diagnosis_the_most_named_first():
    rows = [
        ResultRow(f"{i:064x}", f"p{i}", f"/inbox/t/{i}.jpg", "inbox", "A", 0.6, [["A", 0.6], ["B", 0.3]], "v1", {}, 0.0, "unsure")
        for i in range(4)
    ]
    model = diagnose(rows, 38)
    assert diagnose(rows, 38, expert={}) == model and model.expert == 0 and model.label == "A"
    one = diagnose(rows, 38, expert={rows[2].sha256: "C"})  # the expert's word over four photos leaning to A
    assert (one.label, one.verdict, one.probability, one.expert, one.agreeing) == ("C", "confident", 1.0, 1, 0)
    assert one.reason == "the expert labelled 1 of 4 photos: 1 C" and one.top_k == model.top_k  # the model's kept beside it
    two = diagnose(rows, 38, expert={rows[0].sha256: "B", rows[1].sha256: "A", rows[3].sha256: "A", "f" * 64: "B"})
    assert (two.label, two.expert, two.agreeing) == ("A", 3, 4) and two.probability == pytest.approx(2 / 3)
    assert two.reason == "the expert labelled 3 of 4 photos: 2 A, 1 B"  # a label of another plant's photo does not count
    assert two.as_dict()["expert"] == 3


def test_a_photo_belongs_to_the_plant_of_the_inbox_subfolder_it_arrived_in(tmp_path):
    inbox = tmp_path / "inbox"
    assert plant_of(inbox / "tree 12" / "a.jpg", inbox) == "tree 12"
    assert plant_of(inbox / "tree 12" / "deeper" / "a.jpg", inbox) == "tree 12"
    assert plant_of(inbox / "a.jpg", inbox) is None
    assert plant_of(tmp_path / "elsewhere" / "a.jpg", inbox) is None
    assert plant_of(None, inbox) is None


def test_a_phones_or_cameras_photo_folder_synced_into_the_inbox_is_no_plant_and_no_plant_is_given_its_name(state):
    from .test_api import remote
    from .web_helpers import _photos

    inbox = state / "inbox"
    for folder in ("DCIM", "Camera", "camera roll", "100APPLE", "101NIKON", "WhatsApp Images", "Screenshots"):
        assert plant_of(inbox / folder / "IMG_0001.jpg", inbox) is None, folder
        assert plant_of(inbox / folder / "2026" / "IMG_0001.jpg", inbox) is None, folder
    for folder in ("tree 12", "100trees", "row 3 camera", "099APPLE"):  # plants' names, however alike
        assert plant_of(inbox / folder / "IMG_0001.jpg", inbox) == folder
    c, auth = remote(state, "label")
    before = sorted(p.name for p in inbox.rglob("*"))
    r = c.post("/api/v1/classify", params={"wait": 0, "plant": "camera"}, content=_photos(8)[7].read_bytes(), headers=auth)
    assert r.status_code == 400 and "how a phone or camera names its photo folder" in r.json()["error"]
    assert sorted(p.name for p in inbox.rglob("*")) == before  # nothing stored
    renamed = c.post("/api/v1/plants/tree-1/rename", json={"to": "DCIM"}, headers=auth)
    assert renamed.status_code == 400 and "is not a plant's name: 'DCIM' is how a phone" in renamed.json()["error"]
    assert [p["plant"] for p in c.get("/api/v1/plants", headers=auth).json()["plants"]] == ["tree-2", "tree-1"]


def test_the_pipeline_records_the_plant_of_a_photo_from_an_inbox_subfolder(tmp_path, tiny_store):
    from edge_agent.config import PipelineSection
    from edge_agent.pipeline import Job
    from engines.loader import open_engine

    from .conftest import encode, leaf_image
    from .test_engines import ort_config
    from .test_pipeline import FixedEngine, make_pipeline

    inbox = tmp_path / "inbox"
    (inbox / "tree-1").mkdir(parents=True)
    files = [inbox / "tree-1" / "a.jpg", inbox / "b.jpg"]
    for i, f in enumerate(files):
        f.write_bytes(encode(leaf_image(40 + i)))
    with open_engine(tiny_store, ort_config()) as engine:
        p, db, *_ = make_pipeline(tmp_path, FixedEngine(engine), settings=PipelineSection(max_batch=2, max_wait_ms=0), inbox=inbox)
        try:
            for f in files:
                p.submit(Job("inbox", f))
            assert p.drain(30)
        finally:
            p.stop()
    plants = dict(db._query("SELECT path, plant FROM results"))
    assert plants == {str(files[0]): "tree-1", str(files[1]): None}
    assert len(db.plant_answers("tree-1")) == 1


def _plant_rows(
    db: ResultsDB, plant: str | None, label: str, p: float, n: int, verdict: str = "unsure", days_ago: float = 0, places: list | None = None
) -> None:
    rows = []
    when = time.time() - days_ago * 86400
    for i in range(n):
        sha = f"{next(_n):064x}"
        top_k = [[label, p], ["Apple___healthy" if label != "Apple___healthy" else "Apple___Apple_scab", round(1 - p - 0.01, 4)]]
        path = f"/inbox/{plant}/{sha[:8]}.jpg"
        lat, lon = places[i] if places else (None, None)
        rows.append(
            ResultRow(sha, sha[:16], path, "inbox", label, p, top_k, "v1", {}, when, verdict=verdict, plant=plant, lat=lat, lon=lon)
        )
    db.commit(rows)


#: An apple tree in an orchard, and places east of it, metres away (a degree of longitude is about 78 km at 45.5 N).
_TREE = (45.5, 9.2)


def _east(metres: float) -> tuple[float, float]:
    return (_TREE[0], _TREE[1] + metres / 78_000)


def test_a_folder_whose_photos_were_taken_far_apart_is_no_plant_and_one_stray_fix_does_not_make_it_so():
    def rows(places):
        top_k = [["Apple___Apple_scab", 0.95], ["Apple___healthy", 0.04]]
        return [
            ResultRow(
                f"{i:064x}",
                f"p{i}",
                f"/inbox/walk/{i}.jpg",
                "inbox",
                "Apple___Apple_scab",
                0.95,
                top_k,
                "v1",
                {},
                0.0,
                "confident",
                "walk",
                lat=lat,
                lon=lon,
            )
            for i, (lat, lon) in enumerate(place or (None, None) for place in places)
        ]

    tree = diagnose(rows([_east(0), _east(3), _east(-4), _east(2), _east(250)]), 38, limit=12)  # one fix 250 m off
    assert tree.verdict == "confident" and not tree.not_one and tree.place == pytest.approx(_east(2), abs=1e-6)
    assert tree.as_dict()["not_one_plant"] is None
    walk = diagnose(rows([_east(0), _east(3), _east(120), _east(240), _east(400)]), 38, limit=12, expert={f"{0:064x}": "Apple___healthy"})
    assert walk.verdict == "unsure" and walk.place is None and walk.expert == 0  # nor does one label speak for it
    assert walk.not_one == "4 of its 5 photos were taken more than 60 m from the middle of them (up to 280 m)"
    assert walk.reason.startswith(walk.not_one + ": not taken as one plant") and walk.as_dict()["not_one_plant"] == walk.not_one
    mixed = diagnose(rows([_east(0), None, _east(200), _east(400)]), 38, limit=12)
    assert mixed.not_one == "2 of its 3 photos with a position were taken more than 60 m from the middle of them (up to 200 m)"
    unknown = diagnose(rows([None, None, None]), 38, limit=12)
    assert not unknown.not_one and unknown.verdict == "confident"  # no places: a folder of few photos is a plant
    across = [(-17.0, 179.99995), (-17.0, -179.99995), (-17.0, 179.99998)]  # 5 to 11 m apart across the 180th meridian
    assert not diagnose(rows(across), 38, limit=12).not_one


def test_a_walk_round_the_farm_in_one_folder_alerts_photo_by_photo_and_labels_no_photo_as_a_plant(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(AlertsSection(quiet_period_s=0), MqttSection(), [], db.path, tmp_path, "orchard")
    _plant_rows(db, "tree 7", "Apple___Apple_scab", 0.95, 3, verdict="confident", places=[_east(0), _east(2), _east(-3)])
    _plant_rows(db, "Farm", "Apple___Apple_scab", 0.95, 3, verdict="confident", places=[_east(500), _east(700), _east(900)])
    w.scan()
    alerts = _alerts(tmp_path)
    assert [label for label, _ in alerts] == ["Apple___Apple_scab"] * 4  # the tree once, each of the walk's photos alone
    assert "Farm" in w._not_plants and "tree 7" not in w._not_plants
    w.stop()
    from edge_agent.review.queue import LabelError, label_plant

    with pytest.raises(
        LabelError,
        match=r"'Farm' is a folder whose newest visit is not one plant \(2 of its 3 photos were taken more than 60 m from the middle of them \(up to 200 m\)\)",
    ):
        label_plant(db, tmp_path / "queue", 1 << 30, ["Apple___Apple_scab", "Apple___healthy"], "Farm", "Apple___healthy")
    assert db.expert_labels() == {}
    db.close()


def _alerts(tmp_path) -> list[tuple[str, float]]:
    import sqlite3

    with sqlite3.connect(tmp_path / "alerts.sqlite") as con:
        return con.execute("SELECT label, confidence FROM alerts ORDER BY id").fetchall()


def test_a_plant_alerts_once_on_its_combined_diagnosis_however_many_photos_it_has(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(AlertsSection(quiet_period_s=0), MqttSection(), [], db.path, tmp_path, "orchard")
    _plant_rows(db, "tree-1", "Apple___Apple_scab", 0.7, 1)  # one unsure photo: no alert yet
    w.scan()
    assert _alerts(tmp_path) == []
    _plant_rows(db, "tree-1", "Apple___Apple_scab", 0.93, 2, verdict="confident")  # three photos together are sure
    _plant_rows(db, "tree-1", "Apple___Apple_scab", 0.95, 3, verdict="confident")
    w.scan()
    alerts = _alerts(tmp_path)
    assert len(alerts) == 1 and alerts[0][0] == "Apple___Apple_scab" and alerts[0][1] > 0.95
    _plant_rows(db, "tree-2", "Apple___Apple_scab", 0.93, 2, verdict="confident")  # another plant: its own alert
    w.scan()
    assert len(_alerts(tmp_path)) == 2
    w.stop()
    db.close()


def test_a_large_folders_photos_are_judged_from_a_few_photos_around_each_not_its_whole_season(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(AlertsSection(quiet_period_s=0), MqttSection(), [], db.path, tmp_path, "orchard", plant_max_photos=3)
    read = []
    results = w._results
    w._results = lambda sql, args=(): read.append((sql, rows := results(sql, args))) or rows
    now = time.time()
    rows = []
    for i in range(300):  # a synced folder of 300 photos taken a minute apart, copied in out of order
        sha = f"{next(_n):064x}"
        taken = now - 86400 + 60 * ((i * 7) % 300)
        top_k = [["Apple___Apple_scab", 0.95], ["Apple___healthy", 0.04]]
        rows.append(
            ResultRow(
                sha,
                sha[:16],
                f"/inbox/s/{sha[:8]}.jpg",
                "inbox",
                top_k[0][0],
                0.95,
                top_k,
                "v1",
                {},
                now,
                "confident",
                "phone sync",
                "",
                taken,
            )
        )
    db.commit(rows)
    w.scan()
    around = [len(r) for sql, r in read if "plant = ?" in sql]
    assert len(around) >= 300 and max(around) <= 4  # never the folder's every photo at each of its photos
    assert "phone sync" in w._not_plants  # a plant for its first three photos, then a folder of many
    w.stop()
    db.close()


def test_a_folder_of_more_photos_than_a_plant_has_alerts_photo_by_photo_and_the_page_says_why(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(AlertsSection(quiet_period_s=0), MqttSection(), [], db.path, tmp_path, "orchard", plant_max_photos=3)
    _plant_rows(db, "phone sync", "Apple___Apple_scab", 0.95, 3, verdict="confident")  # three photos: still a plant
    w.scan()
    assert [label for label, _ in _alerts(tmp_path)] == ["Apple___Apple_scab"]  # once for the plant
    _plant_rows(db, "phone sync", "Apple___Apple_scab", 0.95, 1, verdict="confident")  # the fourth: a synced camera folder
    _plant_rows(db, "phone sync", "Apple___Black_rot", 0.97, 2, verdict="confident")
    w.scan()
    alerts = _alerts(tmp_path)  # each photo past the third alone (as a plant: no more alert, the folder says scab)
    assert [label for label, _ in alerts] == ["Apple___Apple_scab"] * 2 + ["Apple___Black_rot"] * 2
    assert [c for _, c in alerts[1:]] == pytest.approx([0.95, 0.97, 0.97])
    w.stop()
    rows = [r for r in ResultsDB(db.path, readonly=True).results()]
    assert len(rows) == 6
    folder = [
        ResultRow(
            r["sha256"],
            r["photo_id"],
            r["path"],
            "inbox",
            r["label"],
            r["confidence"],
            r["top_k"],
            "v1",
            {},
            0.0,
            "confident",
            "phone sync",
        )
        for r in rows
    ]
    d = diagnose(folder, 38, limit=3, expert={folder[0].sha256: "Apple___healthy"})
    assert d.verdict == "unsure" and "plant_max_photos (3)" in d.reason and d.expert == 0  # nor does one label speak for it
    assert diagnose(folder[:3], 38, limit=3).verdict == "confident" and diagnose(folder, 38, limit=0).reason != d.reason
    db.close()


def test_the_plants_page_shows_a_folder_of_many_photos_as_no_plant_and_only_its_newest_photos(state, capsys):
    from edge_agent.web import plant_pages

    from .web_helpers import client

    db = ResultsDB(state / "results.sqlite")
    _plant_rows(db, "phone sync", "Apple___Apple_scab", 0.95, plant_pages.PLANT_CARDS + 2, verdict="confident")
    db.close()
    section = client(state).get("/plants").text.split('data-plant="phone sync"')[1].split("</section>")[0]
    assert "not taken as one plant" in section and "plant_max_photos (12)" in section
    assert "Not one plant" in section and "best guess" not in section  # its photos together mean nothing
    why = f"{plant_pages.PLANT_CARDS + 2} photos, more than [classify] plant_max_photos (12)"
    api = client(state).get("/api/v1/plants/phone%20sync").json()
    assert api["not_one_plant"] == why and api["visits"][0]["not_one_plant"] == why
    assert client(state).get("/api/v1/plants").json()["plants"][0]["not_one_plant"] == why
    from edge_agent.cli import main

    capsys.readouterr()
    assert main(["plants", "list", "--json", "--state-dir", str(state)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["not_one_plant"] == why
    assert section.count('class="card"') == plant_pages.PLANT_CARDS and "and 2 older photos" in section
    assert '<a href="/photos?plant=phone%20sync">all its photos</a>' in section


def test_a_plants_alert_says_why_from_its_photos_together(tmp_path):
    import json
    import sqlite3

    from edge_agent.alerts.config import WebhookSection

    db = ResultsDB(tmp_path / "results.sqlite")
    section = AlertsSection(link="http://farm.local:8080")
    w = AlertWorker(section, MqttSection(), [WebhookSection(url="http://127.0.0.1:9/")], db.path, tmp_path, "orchard")
    _plant_rows(db, "tree 1", "Apple___Apple_scab", 0.95, 3, verdict="confident")
    _plant_rows(db, None, "Apple___Black_rot", 0.97, 1, verdict="confident")  # a photo of no plant
    w.scan()  # its first photo is sure enough on its own: the plant alerts once, then no more for the class
    with sqlite3.connect(tmp_path / "alerts.sqlite") as con:
        tree, alone = [json.loads(p) for (p,) in con.execute("SELECT payload FROM outbox WHERE kind = 'alert' ORDER BY id")]
    assert tree["verdict"] == "confident" and tree["verdict_reason"] == "a plant of 1 photo: 1 of 1 photos are sure of it; together 95%"
    assert tree["plant_name"] == "tree 1" and tree["title"] == "Apple scab seen on orchard, plant tree 1"  # the tree to walk to
    assert (
        tree["message"].splitlines()[0].endswith("on orchard, plant tree 1")
        and tree["plant_url"] == "http://farm.local:8080/plants/tree%201"
    )
    assert tree["taken"] is None and alone["taken"] is None  # no EXIF: when classified is all that is known (time)
    assert alone["plant_name"] is None and alone["title"] == "Black rot seen on orchard" and "plant_url" not in alone
    w.stop()
    db.close()


@pytest.fixture
def state(tmp_path) -> Path:
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from .web_helpers import make_state

    root = make_state(tmp_path)
    db = ResultsDB(root / "results.sqlite")
    _plant_rows(db, "tree-1", "Apple___Apple_scab", 0.7, 1)
    _plant_rows(db, "tree-1", "Apple___Apple_scab", 0.93, 2, verdict="confident")
    _plant_rows(db, "tree-2", "Apple___Black_rot", 0.97, 1, verdict="confident")
    _plant_rows(db, "tree-2", "Apple___Cedar_apple_rust", 0.97, 1, verdict="confident")
    db.close()
    return root


def test_the_api_gives_each_plant_one_diagnosis_and_its_photos(state):
    from .web_helpers import client

    c = client(state)
    plants = c.get("/api/v1/plants").json()["plants"]
    assert [p["plant"] for p in plants] == ["tree-2", "tree-1"]  # the most recent first
    one = next(p for p in plants if p["plant"] == "tree-1")
    assert one["verdict"] == "confident" and one["label"] == "Apple___Apple_scab" and one["photos"] == 3 and one["results"] is None
    two = c.get("/api/v1/plants/tree-2").json()
    assert two["verdict"] == "unsure" and "disagree" in two["reason"] and len(two["results"]) == 2
    assert {r["plant"] for r in two["results"]} == {"tree-2"}
    missing = c.get("/api/v1/plants/tree-9")
    assert missing.status_code == 404 and missing.json()["status"] == 404


@pytest.mark.parametrize("plant", ["../escape", ".hidden", "a/b", "x" * 65, "tree\n1"])
def test_classify_refuses_a_plant_name_that_is_not_a_folder_name_and_stores_nothing(state, plant):
    from .test_api import remote
    from .web_helpers import _photos

    c, auth = remote(state, "label")
    before = sorted(p.name for p in (state / "inbox").rglob("*"))
    r = c.post("/api/v1/classify", params={"wait": 0, "plant": plant}, content=_photos(8)[7].read_bytes(), headers=auth)
    assert r.status_code == 400 and "plant" in r.json()["error"]
    assert sorted(p.name for p in (state / "inbox").rglob("*")) == before


def test_photos_classified_under_one_plant_name_go_to_its_inbox_folder(state):
    from .test_api import remote
    from .web_helpers import _photos

    c, auth = remote(state, "label")
    for photo in _photos(8)[6:8]:
        r = c.post("/api/v1/classify", params={"wait": 0, "plant": "tree 7"}, content=photo.read_bytes(), headers=auth)
        assert r.status_code == 202
    assert len(list((state / "inbox" / "tree 7").iterdir())) == 2


def test_a_plant_the_expert_labelled_shows_the_experts_label_on_its_page_in_the_api_and_on_the_photos_page(state):
    from .web_helpers import client

    c = client(state)
    tree2 = c.get("/api/v1/plants/tree-2").json()
    assert tree2["expert"] == 0 and tree2["verdict"] == "unsure"
    sha = tree2["results"][1]["sha256"]  # the photo the model was sure showed cedar apple rust
    db = ResultsDB(state / "results.sqlite")
    db.mark_expert(sha, "Apple___Black_rot", "")
    db.close()
    tree2 = c.get("/api/v1/plants/tree-2").json()
    assert (tree2["label"], tree2["verdict"], tree2["expert"]) == ("Apple___Black_rot", "confident", 1)
    assert tree2["reason"] == "the expert labelled 1 of 2 photos: 1 Black rot (Apple)"
    assert next(p for p in c.get("/api/v1/plants").json()["plants"] if p["plant"] == "tree-2")["expert"] == 1
    section = c.get("/plants").text.split('data-plant="tree-2"')[1].split("</section>")[0]
    assert "labelled by the expert" in section and "expert: Apple · Black rot" in section and "best guess" not in section
    assert c.get(f"/photo/{sha}").text.split('id="expert-label">')[1].startswith("Apple · Black rot")
    assert 'id="expert-label"' not in c.get(f"/photo/{tree2['results'][0]['sha256']}").text
    cards = {card.split('"')[0]: card for card in c.get("/photos").text.split('<li class="card" data-sha="')[1:]}
    assert "expert: Apple · Black rot" in cards[sha] and sum("expert:" in card for card in cards.values()) == 1
    assert [r["expert_label"] for r in c.get("/api/v1/plants/tree-2").json()["results"]] == [None, "Apple___Black_rot"]
    assert c.get(f"/api/v1/results/{sha}").json()["expert_label"] == "Apple___Black_rot"
    listed = {r["sha256"]: r["expert_label"] for r in c.get("/api/v1/results?size=50").json()["results"]}
    assert listed[sha] == "Apple___Black_rot" and sum(v is not None for v in listed.values()) == 1


def test_the_plants_page_shows_each_plant_its_verdict_and_its_photos(state):
    from .web_helpers import client

    page = client(state).get("/plants")
    assert page.status_code == 200
    assert 'data-plant="tree-1"' in page.text and 'data-plant="tree-2"' in page.text and "the photos disagree" in page.text
    time.sleep(0)


def test_a_plant_not_answered_confidently_shows_its_score_as_a_guess_not_in_the_colour_of_a_sure_answer(state):
    """Four photos the model calls "not a plant I know" at 97 %: the plant reads "Not a plant I know", and its combined
    100 % is not painted the green of a sure answer beside it (the two together read as a sure finding)."""
    from edge_agent.results import ResultsDB
    from edge_agent.state import StateLayout

    from .web_helpers import client

    db = ResultsDB(StateLayout(state).db)
    _plant_rows(db, "tree-9", "Apple___healthy", 0.97, 4, verdict="unknown")
    db.close()
    c = client(state)
    assert c.get("/api/v1/plants/tree-9").json()["verdict"] == "unknown"
    section = c.get("/plants/tree-9").text.split('data-plant="tree-9"')[1].split("</p>")[0]
    assert "Not a plant I know" in section and '<span class="conf ">100 %</span>' in section and "conf high" not in section


def test_each_plant_has_a_page_of_its_own_linked_from_the_plants_page_its_photos_and_the_review_page(state):
    import sqlite3

    from .web_helpers import client

    c = client(state)
    one = c.get("/plants/tree-1")
    assert one.status_code == 200 and '<h1><a href="/plants/tree-1">tree-1</a>' in one.text
    assert one.text.count('class="card"') == 3 and 'data-plant="tree-2"' not in one.text
    assert 'href="/plants/tree-2"' in c.get("/plants").text
    sha = c.get("/api/v1/plants/tree-1").json()["results"][0]["sha256"]
    assert 'id="plant-link" href="/plants/tree-1"' in c.get(f"/photo/{sha}").text
    with sqlite3.connect(state / "results.sqlite") as con:  # a question in the review pool about a photo of "tree 7"
        con.execute("UPDATE results SET plant = 'tree 7' WHERE photo_id IN ('p0', 'p1')")
        loose = con.execute("SELECT sha256 FROM results WHERE plant IS NULL").fetchone()[0]
    assert 'id="plant-link"' not in c.get(f"/photo/{loose}").text  # a photo of no plant names none
    caption = c.get("/review").text.split('id="arrival">')[1].split("</span>")[0]
    assert caption.startswith('plant <a href="/plants/tree%207" id="arrival-plant">tree 7</a>: ')
    seven = c.get("/plants/tree%207")
    assert seven.status_code == 200 and "<title>Plant tree 7" in seven.text and seven.text.count('class="card"') == 2


def test_a_plant_with_no_photos_is_a_page_that_says_what_a_plant_is(state):
    from .web_helpers import client

    missing = client(state).get("/plants/tree-9")
    assert missing.status_code == 404 and "No photos of a plant named &#39;tree-9&#39;" in missing.text
    assert "a folder in the inbox" in missing.text


def test_the_plants_page_lists_the_most_recent_plants_and_finds_the_others_by_name_as_the_api_does(state):
    from edge_agent.web import plant_pages

    from .web_helpers import client

    db = ResultsDB(state / "results.sqlite")
    for i in range(plant_pages.PLANTS_SHOWN + 3):
        _plant_rows(db, f"Row-{i:02d}", "Apple___Apple_scab", 0.95, 1, verdict="confident")
    db.close()
    c = client(state)
    page = c.get("/plants").text
    total = plant_pages.PLANTS_SHOWN + 5  # and tree-1, tree-2: the oldest, not listed
    assert page.count('<section class="plant"') == plant_pages.PLANTS_SHOWN and f"of {total} plants" in page
    assert f'<h1>Plants <span class="muted">({total})</span>' in page and 'data-plant="tree-1"' not in page
    found = c.get("/plants", params={"q": "TREE"}).text
    assert found.count('<section class="plant"') == 2 and 'data-plant="tree-1"' in found and 'id="plants-shown"' not in found
    assert [p["plant"] for p in c.get("/api/v1/plants", params={"q": "row-0"}).json()["plants"]] == [f"Row-0{i}" for i in range(9, -1, -1)]
    none = c.get("/plants", params={"q": "%"}).text  # no wildcard: the text as typed
    assert "No plant's name holds “%”" in none and '<section class="plant"' not in none
    assert c.get("/api/v1/plants", params={"q": "x" * 65}).status_code == 400


def test_photos_uploaded_under_a_plant_name_link_to_its_page_which_waits_for_them_until_they_are_classified(state):
    from .test_web import _upload
    from .web_helpers import _photos, client

    c = client(state)
    r = c.post(
        "/upload",
        data={"csrf": c.get("/upload").text.split('name="csrf" value="')[1].split('"')[0], "plant": "tree 8"},
        files=[("photos", (p.name, p.read_bytes(), "image/jpeg")) for p in _photos(8)[6:8]],
    )
    assert r.status_code == 201 and 'id="upload-plant-link"' in r.text and 'href="/plants/tree%208"' in r.text
    page = c.get("/plants/tree%208")
    assert page.status_code == 200 and 'http-equiv="refresh"' in page.text
    assert "2 photos of this plant wait in the inbox" in page.text
    alone = _upload(c, ("leaf.jpg", _photos(8)[5].read_bytes()))  # no plant: no plant to link to
    assert alone.status_code == 201 and 'id="upload-plant-link"' not in alone.text
    (state / "inbox" / "tree 9").mkdir()  # an empty folder is no plant yet
    assert c.get("/plants/tree%209").status_code == 404 and c.get("/plants/..hidden").status_code == 404


def test_the_photos_page_and_the_api_show_one_plants_photos_and_say_when_no_photo_matches(state):
    from .web_helpers import client

    c = client(state)
    page = c.get("/photos", params={"plant": "tree-1"}).text
    assert page.count('<li class="card"') == 3 and 'id="plant-filter"' in page and 'href="/plants/tree-1"' in page
    assert 'name="plant" value="tree-1"' in page  # the next filter keeps the plant
    every = c.get("/photos").text
    assert every.count('<li class="card"') == 11 and 'id="plant-filter"' not in every  # six photos of no plant, five of two
    assert every.count('class="small plant-link" href="/plants/tree-1">plant tree-1</a>') == 3  # each card names its plant
    assert every.count('class="small plant-link"') == 5
    assert {r["plant"] for r in c.get("/api/v1/results", params={"plant": "tree-2"}).json()["results"]} == {"tree-2"}
    assert c.get("/api/v1/results", params={"plant": "x" * 65}).status_code == 400
    none = c.get("/photos", params={"plant": "tree-9"}).text
    assert 'id="no-match"' in none and "No photos yet" not in none


def test_edge_agent_results_names_each_photos_plant_and_lists_one_plants_photos(state, capsys):
    import json

    from edge_agent.cli import main

    assert main(["results", "--state-dir", str(state), "--plant", "tree-1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.endswith("  plant: tree-1") for line in lines)
    assert main(["results", "--state-dir", str(state), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["plant"] or "" for r in rows) == [""] * 6 + ["tree-1"] * 3 + ["tree-2"] * 2
    assert main(["results", "--state-dir", str(state), "--plant", "tree-9"]) == 0 and capsys.readouterr().out == ""


def test_a_review_question_offers_the_class_the_expert_gave_the_plants_other_photos(state):
    import sqlite3

    from .web_helpers import client

    c = client(state)
    tree1 = c.get("/api/v1/plants/tree-1").json()["results"]
    with sqlite3.connect(state / "results.sqlite") as con:  # both questions are photos of tree-1 too
        con.execute("UPDATE results SET plant = 'tree-1' WHERE photo_id IN ('p0', 'p1')")
        classes = [json.loads(t)[1][0] for (t,) in con.execute("SELECT top_k FROM results WHERE photo_id = 'p0'")]
    db = ResultsDB(state / "results.sqlite")
    for r in tree1[:2]:
        db.mark_expert(r["sha256"], "Tomato___Late_blight", "")
    db.mark_expert(tree1[2]["sha256"], classes[0], "")  # a class the question's buttons already name
    db.close()
    form = c.get("/review").text.split('id="label-form"')[1].split("</form>")[0]
    extra = form.split('id="same-plant"')[1].split("</button>")[0]
    assert 'value="Tomato___Late_blight" data-key="4"' in form and "the expert's label of 2 other photos of this plant" in extra
    named = form.split(f'value="{classes[0]}"')[1].split("</button>")[0]
    assert "the expert's label of 1 other photo of this plant" in named
    with sqlite3.connect(state / "results.sqlite") as con:  # a photo of no plant: nothing offered
        con.execute("UPDATE results SET plant = NULL WHERE photo_id IN ('p0', 'p1')")
    assert "same-plant" not in c.get("/review").text


def test_the_plants_page_shows_the_plants_with_a_disease_or_the_unsure_ones_alone(state):
    from .web_helpers import client

    c = client(state)
    db = ResultsDB(state / "results.sqlite")
    _plant_rows(db, "tree-3", "Corn_(maize)___healthy", 0.97, 2, verdict="confident")  # sure it is healthy: neither view
    db.close()
    sick = c.get("/plants", params={"show": "sick"}).text  # tree-1: sure of scab; tree-2: its photos disagree
    assert [s.split('"')[0] for s in sick.split('data-plant="')[1:]] == ["tree-1"] and '<option value="sick" selected>' in sick
    unsure = c.get("/plants", params={"show": "unsure"}).text
    assert [s.split('"')[0] for s in unsure.split('data-plant="')[1:]] == ["tree-2"]
    every = c.get("/plants", params={"show": "nonsense"}).text  # not a view: every plant
    assert [s.split('"')[0] for s in every.split('data-plant="')[1:]] == ["tree-3", "tree-2", "tree-1"]
    none = c.get("/plants", params={"show": "sick", "q": "tree-3"}).text
    assert 'id="no-plants">No plant named with “tree-3” has a disease' in none
    db = ResultsDB(state / "results.sqlite")
    db.mark_expert(c.get("/api/v1/plants/tree-2").json()["results"][0]["sha256"], "Apple___Black_rot", "")
    db.close()
    assert 'data-plant="tree-2"' in c.get("/plants", params={"show": "sick"}).text  # labelled so by the expert
    assert [p["plant"] for p in c.get("/api/v1/plants", params={"show": "sick"}).json()["plants"]] == ["tree-2", "tree-1"]
    assert [p["plant"] for p in c.get("/api/v1/plants", params={"show": "sick", "limit": 1}).json()["plants"]] == ["tree-2"]
    assert c.get("/api/v1/plants", params={"show": "nonsense"}).status_code == 400


def test_review_list_says_what_the_expert_gave_the_plants_other_photos(state, capsys):
    import sqlite3

    from edge_agent.cli import main

    tree1 = [r.sha256 for r in _rows_of(state, "tree-1")]
    with sqlite3.connect(state / "results.sqlite") as con:
        con.execute("UPDATE results SET plant = 'tree-1' WHERE photo_id = 'p0'")
    db = ResultsDB(state / "results.sqlite")
    for sha in tree1[:2]:
        db.mark_expert(sha, "Tomato___Late_blight", "")
    db.close()
    assert main(["review", "list", "--state-dir", str(state)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "plant tree-1: " in lines["p0"] and "(the expert said Tomato___Late_blight of 2 other photos of this plant)" in lines["p0"]
    assert "the expert said" not in lines["p1"]  # a photo of no plant
    assert main(["review", "list", "--state-dir", str(state), "--json"]) == 0
    rows = {r["photo_id"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["p0"]["plant_labels"] == {"Tomato___Late_blight": 2} and rows["p1"]["plant_labels"] == {}
    from .web_helpers import client

    items = {it["photo_id"]: it for it in client(state).get("/api/v1/review").json()["items"]}
    assert items["p0"]["plant_labels"] == {"Tomato___Late_blight": 2} and items["p1"]["plant_labels"] == {}


def _rows_of(state, plant: str) -> list[ResultRow]:
    from edge_agent.web.queries import Reader

    return Reader(state / "results.sqlite").plant(plant)


def _tree5(tmp_path) -> tuple[Path, list[str]]:
    """A state directory whose photos p0-p3 are one plant, ``tree 5`` (p0, p1 in the review pool, p2, p3 kept in
    processed/), p3 labelled healthy by the expert already; their sha256s."""
    import sqlite3

    from .web_helpers import make_state, sha_of

    state = make_state(tmp_path)
    with sqlite3.connect(state / "results.sqlite") as con:
        con.execute("UPDATE results SET plant = 'tree 5' WHERE photo_id IN ('p0', 'p1', 'p2', 'p3')")
    shas = [sha_of(state, f"p{i}") for i in range(4)]
    db = ResultsDB(state / "results.sqlite")
    db.mark_expert(shas[3], "Apple___healthy", "")
    db.close()
    return state, shas


def _expert(state: Path) -> dict[str, str]:
    db = ResultsDB(state / "results.sqlite", readonly=True)
    try:
        return db.expert_labels()
    finally:
        db.close()


def _prune(state: Path, sha: str) -> None:
    """The kept copy of photo ``sha`` in processed/ deleted (as retention does)."""
    import hashlib

    [kept] = [f for f in (state / "processed").rglob("*.jpg") if hashlib.sha256(f.read_bytes()).hexdigest() == sha]
    kept.unlink()


def test_labelling_a_plant_labels_each_photo_the_expert_has_not_and_a_pruned_one_does_not_stop_the_others(tmp_path):
    from edge_agent.config import AppConfig
    from edge_agent.review.queue import LabelError, PhotoNotQueued, label_plant
    from edge_agent.state import resolve_store

    from .web_helpers import sha_of

    state, shas = _tree5(tmp_path)
    classes = resolve_store(AppConfig(), state).open(verify=False).classes
    _prune(state, shas[2])
    db = ResultsDB(state / "results.sqlite")
    q = state / "queue"
    try:
        with pytest.raises(LabelError, match="not a known class"):
            label_plant(db, q, 1 << 30, classes, "tree 5", "Apple scab")
        with pytest.raises(PhotoNotQueued, match="no photos of a plant named 'tree 9'"):
            label_plant(db, q, 1 << 30, classes, "tree 9", "Apple___Black_rot")
        with pytest.raises(LabelError, match=r"visit is not one plant \(4 photos, more than \[classify\] plant_max_photos \(3\)\)"):
            label_plant(db, q, 1 << 30, classes, "tree 5", "Apple___Black_rot", limit=3)
        with pytest.raises(LabelError, match="is not a photo of plant 'tree 5': nothing labelled"):
            label_plant(db, q, 1 << 30, classes, "tree 5", "Apple___Black_rot", photos=[shas[0], sha_of(state, "p5")])
        with pytest.raises(LabelError, match="no photo chosen"):
            label_plant(db, q, 1 << 30, classes, "tree 5", "Apple___Black_rot", photos=[])
        assert db.expert_labels() == {shas[3]: "Apple___healthy"}  # nothing labelled by a refusal
        done = label_plant(db, q, 1 << 30, classes, "tree 5", "Apple___Black_rot", limit=4)
        assert [e.sha256 for e in done.labelled] == shas[:2] and [sha for sha, _ in done.missed] == [shas[2]]
        assert "its file is no longer kept" in done.missed[0][1]
        assert {db.queue_entry(sha).kind for sha in shas[:2]} == {"expert"} and db.queue_entry(shas[2]) is None
        assert db.expert_labels() == {shas[0]: "Apple___Black_rot", shas[1]: "Apple___Black_rot", shas[3]: "Apple___healthy"}
        named = label_plant(db, q, 1 << 30, classes, "tree 5", "Apple___Apple_scab", photos=[shas[3]])  # named: labelled again
        assert [e.sha256 for e in named.labelled] == [shas[3]] and db.expert_labels()[shas[3]] == "Apple___Apple_scab"
        again = label_plant(db, q, 1 << 30, classes, "tree 5", "Apple___healthy")  # only the one left: still pruned
        assert again.labelled == [] and [sha for sha, _ in again.missed] == [shas[2]] and db.expert_labels()[shas[0]] == "Apple___Black_rot"
        db.mark_expert(shas[2], "Apple___Black_rot", "")
        with pytest.raises(LabelError, match="each photo of plant 'tree 5' is labelled by the expert already"):
            label_plant(db, q, 1 << 30, classes, "tree 5", "Apple___Black_rot")
    finally:
        db.close()


def test_a_plants_page_labels_the_ticked_photos_with_one_class_and_refuses_a_stray_photo_or_class_labelling_nothing(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from .web_helpers import client, csrf_of, sha_of

    state, shas = _tree5(tmp_path)
    c = client(state)
    page = c.get("/plants/tree%205").text
    form = page.split('id="plant-label"')[1].split("</form>")[0]
    assert 'action="/plants/tree%205/label"' in page and "The ticked photos are" in form
    ticked = {sha: f'name="photo" value="{sha}" checked' in form for sha in shas}
    assert ticked == {shas[0]: True, shas[1]: True, shas[2]: True, shas[3]: False}  # the expert's label is not overwritten
    url, token = "/plants/tree%205/label", csrf_of(c)
    stray = c.post(url, data={"csrf": token, "label": "Apple___Black_rot", "photo": [shas[0], sha_of(state, "p5")]})
    assert stray.status_code == 400 and "is not a photo of plant" in stray.text
    wrong = c.post(url, data={"csrf": token, "label": "Apple blackrot", "photo": shas[:3]})
    assert wrong.status_code == 400 and "not a known class" in wrong.text
    none = c.post(url, data={"csrf": token, "label": "Apple___Black_rot"})
    assert none.status_code == 400 and "no photo chosen" in none.text
    flood = c.post(url, data={"csrf": token, "label": "Apple___Black_rot", "photo": [shas[0]] * 200})  # more than a page holds
    assert flood.status_code == 400 and "Too many fields" in flood.text
    assert c.post(url, data={"label": "Apple___Black_rot", "photo": shas[:3]}).status_code == 403  # no CSRF token
    assert _expert(state) == {shas[3]: "Apple___healthy"}  # nothing labelled by any of them
    _prune(state, shas[2])
    r = c.post(url, data={"csrf": token, "label": "Apple___Black_rot", "photo": shas[:3]})
    assert r.status_code == 303 and r.headers["location"] == "/plants/tree%205?labelled=2&missed=1&as=Apple___Black_rot"
    shown = c.get(r.headers["location"]).text
    said = shown.split('id="plant-labelled">')[1].split("</p>")[0]
    assert said.startswith("Labelled 2 photos Apple · Black rot: they go to the trainer") and "1 could not be" in said
    assert shown.count("expert: Apple · Black rot") == 2 and "labelled by the expert" in shown
    assert _expert(state) == {shas[0]: "Apple___Black_rot", shas[1]: "Apple___Black_rot", shas[3]: "Apple___healthy"}


def test_the_api_and_review_label_plant_label_a_plants_photos_and_say_which_could_not_be(tmp_path, capsys):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from edge_agent.cli import main

    from .test_api import remote

    state, shas = _tree5(tmp_path)
    c, auth = remote(state, "label")
    url = "/api/v1/plants/tree%205/label"
    assert c.post(url, json={"label": "Apple___Black_rot"}, headers=remote(state, "read")[1]).status_code == 403
    assert c.post("/api/v1/plants/tree%209/label", json={"label": "Apple___Black_rot"}, headers=auth).status_code == 404
    bad = c.post(url, json={"label": "Apple___Black_rot", "photos": ["p0"]}, headers=auth)
    assert bad.status_code == 400 and "64 hex digits" in bad.json()["error"]
    many = c.post(url, json={"label": "Apple___Black_rot", "photos": [shas[0]] * 501}, headers=auth)
    assert many.status_code == 400 and "photos" in many.json()["error"]
    assert _expert(state) == {shas[3]: "Apple___healthy"}
    r = c.post(url, json={"label": "Apple___Black_rot", "photos": [shas[0]]}, headers=auth)
    assert r.status_code == 200
    assert r.json() == {
        "plant": "tree 5",
        "label": "Apple___Black_rot",
        "labelled": [{"photo_id": "p0", "sha256": shas[0], "label": "Apple___Black_rot"}],
        "not_labelled": [],
    }
    _prune(state, shas[2])
    assert main(["review", "label-plant", "tree 5", "Apple___Apple_scab", "--state-dir", str(state)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == ["p1: labelled Apple___Apple_scab by an expert; queued for training"]  # p0, p3: the expert's
    assert f"{shas[2][:16]}: not labelled: photo p2: its file is no longer kept" in err
    assert "-- 1 photo of plant tree 5 labelled Apple___Apple_scab, 1 not" in err
    assert main(["review", "label-plant", "tree 9", "Apple___Apple_scab", "--state-dir", str(state)]) == 2
    assert "no photos of a plant named 'tree 9'" in capsys.readouterr().err
    assert _expert(state) == {shas[0]: "Apple___Black_rot", shas[1]: "Apple___Apple_scab", shas[3]: "Apple___healthy"}


def test_a_plants_photos_hours_apart_are_visits_and_its_diagnosis_is_its_newest_visits():
    from edge_agent.plants import newest_visit, visits

    h = 3600.0
    assert visits([0, 60, 20 * h, 20 * h + 5, 45 * h], 12 * h) == [range(0, 2), range(2, 4), range(4, 5)]
    assert visits([0, 60, 20 * h], 0) == [range(0, 3)] and visits([], 12 * h) == []
    rows = []
    for i, (label, days) in enumerate([("Apple___healthy", 90)] * 3 + [("Apple___Apple_scab", 0)] * 2):
        top_k = [[label, 0.97], ["Apple___Black_rot", 0.02]]
        rows.append(ResultRow(f"{i:064x}", f"p{i}", "", "inbox", label, 0.97, top_k, "v1", {}, 1e9 - days * 86400 + i, "confident", "t"))
    assert [r.photo_id for r in newest_visit(rows, 12 * h)] == ["p3", "p4"]
    now = diagnose(rows, 38, gap_s=12 * h)  # May's healthy leaves do not outvote August's scab
    assert (now.label, now.verdict, now.photos, now.earlier) == ("Apple___Apple_scab", "confident", 2, 3)
    assert diagnose(rows, 38).verdict == "unsure"  # as one visit: the photos disagree
    said = diagnose(rows, 38, expert={rows[0].sha256: "Apple___healthy"}, gap_s=12 * h)  # May's label speaks for May only
    assert (said.label, said.expert) == ("Apple___Apple_scab", 0)


def test_a_plant_alerts_again_at_a_later_visit_and_a_tree_photographed_all_season_stays_a_plant(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(
        AlertsSection(quiet_period_s=0), MqttSection(), [], db.path, tmp_path, "orchard", plant_max_photos=3, visit_gap_s=12 * 3600
    )
    _plant_rows(db, "tree-1", "Apple___Apple_scab", 0.95, 3, verdict="confident", days_ago=60)
    w.scan()
    _plant_rows(db, "tree-1", "Apple___healthy", 0.97, 3, verdict="confident", days_ago=30)  # treated: healthy
    w.scan()
    _plant_rows(db, "tree-1", "Apple___Apple_scab", 0.95, 2, verdict="confident")  # the scab is back
    w.scan()
    assert [label for label, _ in _alerts(tmp_path)] == ["Apple___Apple_scab", "Apple___Apple_scab"]  # once a visit
    assert not (w._not_plants)  # 8 photos in all, never more than 3 in a visit: a plant throughout
    _plant_rows(db, "tree-1", "Apple___Apple_scab", 0.95, 1, verdict="confident")  # the same visit: no second alert
    w.scan()
    assert len(_alerts(tmp_path)) == 2
    w.stop()
    db.close()


def test_a_plants_page_diagnoses_its_newest_visit_lists_the_earlier_ones_and_ticks_only_the_newest(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from edge_agent.config import AppConfig
    from edge_agent.review.queue import label_plant
    from edge_agent.state import resolve_store

    from .web_helpers import client, make_state

    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    _plant_rows(db, "tree 8", "Apple___healthy", 0.97, 3, verdict="confident", days_ago=60)
    _plant_rows(db, "tree 8", "Apple___Apple_scab", 0.95, 2, verdict="confident")
    _plant_rows(db, "tree 9", "Apple___Apple_scab", 0.95, 2, verdict="confident")
    db.close()
    c = client(state)
    api = c.get("/api/v1/plants/tree%208").json()
    assert (api["label"], api["verdict"], api["photos"], api["visit_photos"]) == ("Apple___Apple_scab", "confident", 5, 2)
    assert [(v["photos"], v["label"]) for v in api["visits"]] == [(2, "Apple___Apple_scab"), (3, "Apple___healthy")]  # newest first
    assert api["visits"][1]["began"] < api["visits"][0]["began"] and c.get("/api/v1/plants").json()["plants"][0]["visits"] is None
    page = c.get("/plants/tree%208").text
    assert "diagnosed from the newest visit's 2" in page and page.count('class="card earlier"') == 3
    listed = c.get("/plants").text.split('data-plant="tree 8"')[1].split("</section>")[0]  # the list: the newest visit's
    assert listed.count('class="card"') == 2 and "earlier" not in listed.split("older")[0] and "and 3 older photos" in listed
    visits = page.split('id="visits"')[1].split("</table>")[0]
    assert visits.count("<tr>") == 2 and "Apple · healthy" in visits  # a header and the earlier visit
    ticked = page.split('id="plant-label"')[1].count(" checked>")
    assert ticked == 2  # only the newest visit's photos
    assert 'id="visits"' not in c.get("/plants/tree%209").text and "diagnosed from" not in c.get("/plants/tree%209").text  # one visit
    classes = resolve_store(AppConfig(), state).open(verify=False).classes
    db = ResultsDB(state / "results.sqlite")
    try:  # by default only the newest visit's photos are labelled (their files are not kept here: named, not labelled)
        done = label_plant(db, state / "queue", 1 << 30, classes, "tree 8", "Apple___Apple_scab", gap_s=12 * 3600)
    finally:
        db.close()
    assert len(done.missed) == 2 and not done.labelled
    assert [p["plant"] for p in c.get("/api/v1/plants?show=sick").json()["plants"]] == ["tree 9", "tree 8"]
    from edge_agent.ledger_rows import QueueEntry

    tree8 = [(r["sha256"], r["photo_id"]) for r in api["results"]]
    asked = state / "queue" / "review" / "asked.jpg"
    asked.write_bytes(b"a photo")
    db = ResultsDB(state / "results.sqlite")
    db.commit([], [QueueEntry(tree8[4][0], tree8[4][1], "review", "Apple___Apple_scab", 0.5, "v1", str(asked), 7)])  # asked now
    db.mark_expert(tree8[0][0], "Apple___healthy", "")  # May's
    db.mark_expert(tree8[3][0], "Apple___Apple_scab", "")  # this visit's
    db.close()
    items = {it["photo_id"]: it for it in c.get("/api/v1/review").json()["items"]}
    assert items[tree8[4][1]]["plant_labels"] == {"Apple___Apple_scab": 1}  # May's healthy label is not offered for August


def test_the_list_of_plants_reads_the_newest_visit_as_a_plants_whole_season_gives_it(tmp_path):
    """The list reads each plant's newest visit alone (a season of weekly visits is many times more rows); it must be
    the visit :func:`newest_visit` finds in all the plant's photos, with ties in time, taken times and gaps of 0."""
    import random

    from edge_agent.plants import newest_visit
    from edge_agent.web.queries import Reader

    rnd, db = random.Random(5), ResultsDB(tmp_path / "results.sqlite")
    base = time.time() - 90 * 86400
    for tree in range(8):
        rows, t = [], base
        for _ in range(rnd.randrange(1, 60)):
            t += rnd.choice([0, 0, 60, 600, 3 * 3600, 7 * 86400])  # photos at one second, minutes, hours and weeks apart
            sha = f"{next(_n):064x}"
            taken = t if rnd.random() < 0.5 else None  # EXIF time or none (then when classified)
            created = t if taken is None else t + rnd.randrange(0, 5000)
            rows.append(
                ResultRow(
                    sha, sha[:16], f"/{sha[:8]}.jpg", "inbox", "A", 0.9, [["A", 0.9]], "v1", {}, created, plant=f"tree{tree}", taken=taken
                )
            )
        rnd.shuffle(rows)  # stored in any order
        db.commit(rows)
    db.close()
    reader = Reader(tmp_path / "results.sqlite")
    for tree in range(8):
        every = reader.plant(f"tree{tree}")
        for gap_s in (0, 1, 600, 900, 3 * 3600, 12 * 3600):  # (a gap of exactly 600 s or 3 h is one visit)
            newest, photos = reader.newest_visits([f"tree{tree}"], gap_s)[f"tree{tree}"]
            assert [r.sha256 for r in newest] == [r.sha256 for r in newest_visit(every, gap_s)] and photos == len(every)
    both = reader.newest_visits(["tree1", "no such tree", "tree2"], 3600)  # several at once, one unknown
    assert set(both) == {"tree1", "tree2"} and [r.sha256 for r in both["tree2"][0]] == [
        r.sha256 for r in newest_visit(reader.plant("tree2"), 3600)
    ]


def test_the_review_page_after_a_label_points_to_the_photos_of_its_plants_visit_not_labelled_yet(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    import sqlite3

    from .web_helpers import client, csrf_of, make_state, sha_of

    state = make_state(tmp_path)
    with sqlite3.connect(state / "results.sqlite") as con:
        con.execute("UPDATE results SET plant = 'tree 6' WHERE photo_id IN ('p0', 'p1', 'p2')")
    c = client(state)
    r = c.post("/review/label", data={"csrf": csrf_of(c), "photo": sha_of(state, "p0"), "label": "Apple___Black_rot"})
    beside = c.get(r.headers["location"]).text.split('id="beside">')[1].split("</span>")[0]
    assert (
        beside
        == 'Its plant, <a href="/plants/tree%206">tree 6</a>, has 2 more photos of this visit not labelled: label them together on its page.'
    )
    for photo in ("p1", "p2"):
        r = c.post(f"/photo/{sha_of(state, photo)}/label", data={"csrf": csrf_of(c), "label": "Apple___Black_rot"})
    again = c.post("/review/label", data={"csrf": csrf_of(c), "photo": sha_of(state, "p0"), "label": "Apple___Black_rot"})
    assert 'id="done"' in (page := c.get(again.headers["location"]).text) and 'id="beside"' not in page  # none left
    with sqlite3.connect(state / "results.sqlite") as con:
        con.execute("UPDATE results SET plant = NULL")
    alone = c.post("/review/label", data={"csrf": csrf_of(c), "photo": sha_of(state, "p0"), "label": "Apple___healthy"})
    assert 'id="beside"' not in c.get(alone.headers["location"]).text  # a photo of no plant


def test_a_plant_name_typed_in_another_case_or_with_extra_spaces_is_the_same_plant(state):
    from .test_api import remote
    from .web_helpers import _photos, client, csrf_of

    (state / "inbox" / "Row 2").mkdir(parents=True)  # a folder the farmer made on the laptop, photos waiting in it
    c, auth = remote(state, "label")
    photo = _photos(8)[7].read_bytes()
    for typed in ("TREE-1", "  tree-1 ", "row  2", "Tree 7"):  # tree-1 is a plant already photographed
        assert c.post("/api/v1/classify", params={"wait": 0, "plant": typed}, content=photo, headers=auth).status_code == 202
    folders = sorted(p.name for p in (state / "inbox").iterdir() if p.is_dir())
    assert folders == ["Row 2", "Tree 7", "tree-1"]  # a new plant keeps the name as typed
    assert len(list((state / "inbox" / "tree-1").iterdir())) == 2 and len(list((state / "inbox" / "Row 2").iterdir())) == 1
    page = client(state)
    r = page.post("/upload", data={"csrf": csrf_of(page), "plant": "tree 7 "}, files={"photos": ("leaf.jpg", photo, "image/jpeg")})
    assert r.status_code == 201 and 'href="/plants/Tree%207"' in r.text  # the page links the plant it went to
    typed = page.get("/plants/TREE-1")  # its page, typed in another case
    assert typed.status_code == 303 and typed.headers["location"] == "/plants/tree-1"
    assert len(list((state / "inbox" / "Tree 7").iterdir())) == 2


def test_a_plant_named_wrong_is_renamed_or_merged_into_another_and_a_bad_name_changes_nothing(state):
    from .test_api import remote
    from .web_helpers import client, csrf_of

    c = client(state)
    page = c.get("/plants/tree-2").text
    assert 'action="/plants/tree-2/rename"' in page and "Rename this plant, or merge it into another" in page
    url, token = "/plants/tree-2/rename", csrf_of(c)
    for bad, said in (
        (".hidden", "is not a plant&#39;s name"),
        ("a/b", "is not a plant&#39;s name"),
        ("tree-2", "named &#39;tree-2&#39; already"),
    ):
        r = c.post(url, data={"csrf": token, "to": bad})
        assert r.status_code == 400 and said in r.text
    assert c.post(url, data={"to": "tree 12"}).status_code == 403  # no CSRF token
    assert c.post("/plants/tree-9/rename", data={"csrf": token, "to": "tree 12"}).status_code == 404
    assert [p["plant"] for p in c.get("/api/v1/plants").json()["plants"]] == ["tree-2", "tree-1"]  # nothing changed
    r = c.post(url, data={"csrf": token, "to": " tree 12 "})
    assert r.status_code == 303 and r.headers["location"] == "/plants/tree%2012?renamed=tree-2&folder="
    said = c.get(r.headers["location"]).text.split('id="renamed">')[1].split("</p>")[0]
    assert said == "The photos of tree-2 are now this plant's."  # no inbox folder of that name: nothing more to say
    assert c.get("/plants/tree-2").status_code == 404
    api, auth = remote(state, "label")
    merged = api.post("/api/v1/plants/tree-1/rename", json={"to": "tree 12"}, headers=auth)
    assert merged.status_code == 200
    assert merged.json() == {"old": "tree-1", "plant": "tree 12", "photos": 3, "merged": True, "folder": "", "note": ""}
    one = c.get("/api/v1/plants/tree%2012").json()
    assert one["photos"] == 5 and [p["plant"] for p in c.get("/api/v1/plants").json()["plants"]] == ["tree 12"]
    assert api.post("/api/v1/plants/tree-1/rename", json={"to": "x"}, headers=auth).status_code == 404
    assert api.post("/api/v1/plants/tree%2012/rename", json={"to": "x"}, headers=remote(state, "read")[1]).status_code == 403


def test_a_plants_empty_inbox_folder_is_renamed_with_it_or_removed_when_merged_and_the_page_says_so(state):
    from .test_api import remote
    from .web_helpers import client, csrf_of

    inbox = state / "inbox"
    (inbox / "tree-1").mkdir(parents=True)
    (inbox / "tree-2").mkdir()
    c = client(state)
    r = c.post("/plants/tree-2/rename", data={"csrf": csrf_of(c), "to": "tree 12"})
    assert r.status_code == 303 and r.headers["location"] == "/plants/tree%2012?renamed=tree-2&folder=renamed"
    said = c.get(r.headers["location"]).text.split('id="renamed">')[1].split("</p>")[0]
    assert "Its inbox folder tree-2/ is tree 12/ now: photos dropped in it are tree 12&#39;s." in said
    assert (inbox / "tree 12").is_dir() and not (inbox / "tree-2").exists()
    api, auth = remote(state, "label")
    merged = api.post("/api/v1/plants/tree%2012/rename", json={"to": "Tree-1"}, headers=auth).json()  # tree-1, in any case
    assert (merged["plant"], merged["merged"], merged["folder"]) == ("tree-1", True, "removed")
    assert merged["note"] == "Its inbox folder tree 12/ was empty and is removed: drop tree-1's photos in tree-1/."
    assert sorted(p.name for p in inbox.iterdir() if p.is_dir()) == ["tree-1"]
    alone = api.post("/api/v1/plants/tree-1/rename", json={"to": "row 1 tree 1"}, headers=auth).json()
    assert alone["folder"] == "renamed" and (inbox / "row 1 tree 1").is_dir()
    assert c.get("/plants/row%201%20tree%201?renamed=x&folder=nonsense").status_code == 200  # an unknown fate: no note


def test_the_upload_page_offers_the_plants_already_photographed_as_names(state):
    from .web_helpers import client

    offered = client(state).get("/upload").text.split('<datalist id="known-plants">')[1].split("</datalist>")[0]
    assert offered == '<option value="tree-2"><option value="tree-1">'  # the most recent first: a name picked, not typed again


def test_edge_agent_plants_lists_each_plants_diagnosis_and_renames_one(state, capsys):
    from edge_agent.cli import main

    assert main(["plants", "list", "--state-dir", str(state)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines] == ["tree-2", "tree-1"]
    assert lines[1].split("  ")[1:4] == ["confident", "Apple___Apple_scab", "3 of 3 photos (newest visit)"]
    assert main(["plants", "list", "--state-dir", str(state), "--show", "unsure", "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["plant"], row["verdict"], row["photos"], row["visit_photos"]) == ("tree-2", "unsure", 2, 2)
    assert main(["plants", "list", "--state-dir", str(state), "--name", "nothing"]) == 0
    assert capsys.readouterr().out == "no plants in that view\n"
    (state / "inbox" / "tree-2").mkdir(parents=True)
    (state / "inbox" / "tree-2" / "still copying.jpg").write_bytes(b"half a photo")
    assert main(["plants", "rename", "tree-2", "TREE-1", "--state-dir", str(state)]) == 0  # typed in capitals: tree-1
    out = capsys.readouterr().out
    assert "2 photos of plant tree-2 are plant tree-1's now (merged with the photos it had)" in out
    assert "Its inbox folder tree-2/ still holds files, so it is left as it is" in out
    assert (state / "inbox" / "tree-2" / "still copying.jpg").is_file()
    assert main(["plants", "rename", "tree-2", "tree 9", "--state-dir", str(state)]) == 2
    assert "no photos of a plant named 'tree-2'" in capsys.readouterr().err
    assert main(["plants", "rename", "tree-1", "../x", "--state-dir", str(state)]) == 2
    assert "is not a plant's name" in capsys.readouterr().err
    assert main(["plants", "list", "--state-dir", str(state), "--json"]) == 0
    assert [json.loads(line)["photos"] for line in capsys.readouterr().out.splitlines()] == [5]
