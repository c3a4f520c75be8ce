"""What each class is, for the farmer: the shipped notes cover every disease the shipped model knows, a farm's own
file replaces them key by key and is refused with the file, class and key named, and the Diseases pages, a photo's
page, the API and ``edge-agent classes`` show them."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from edge_agent.class_notes import MAX_NOTES_BYTES, NotesError, load_notes
from edge_agent.cli import main
from edge_agent.config import AppConfig, default_store_path
from edge_agent.ledger_rows import ResultRow
from edge_agent.names import is_disease
from edge_agent.results import ResultsDB
from edge_agent.state import StateLayout
from edge_agent.web.app import WebContext, create_app
from engines.store import EngineStore

from .web_helpers import LOCAL, make_state

SHIPPED_CLASSES = EngineStore(default_store_path()).open(verify=False).classes
DISEASES = [c for c in SHIPPED_CLASSES if is_disease(c)]


def _client(state: Path, notes: Path | str = "") -> TestClient:
    cfg = AppConfig()
    cfg = cfg.model_copy(update={"web": cfg.web.model_copy(update={"class_notes": str(notes)})})
    app = create_app(WebContext(cfg, StateLayout(state), state / "inbox", "127.0.0.1"))
    return TestClient(app, base_url="http://localhost", client=LOCAL, follow_redirects=False)


def _add(state: Path, label: str, verdict: str | None, n: int = 1, expert: str | None = None) -> list[str]:
    """``n`` results answered ``label`` with ``verdict``; the expert's label ``expert`` on each where given."""
    db = ResultsDB(state / "results.sqlite")
    shas = []
    for i in range(n):
        sha = f"{hash((label, verdict, expert, i)) & (1 << 64) - 1:016x}".rjust(64, "c")
        shas.append(sha)
        top = [[label, 0.9], [SHIPPED_CLASSES[0], 0.05]]
        db.commit([ResultRow(sha, sha[:16], f"/x/{sha[:8]}.jpg", "folder", label, 0.9, top, "v0001", {}, verdict=verdict)], [])
        if expert:
            db._db.execute("INSERT INTO expert_labels (sha256, label, labelled) VALUES (?, ?, ?)", (sha, expert, time.time()))
            db._db.commit()
    db.close()
    return shas


# ---- the shipped notes ------------------------------------------------------------
def test_every_disease_of_the_shipped_model_has_a_note_that_says_what_to_look_for_and_what_to_do():
    notes = load_notes()
    assert len(DISEASES) == 26
    for label in DISEASES:
        note = notes.get(label)
        assert note is not None, label
        assert note.cause and note.look_for and note.spread and note.act, label
        assert "extension service" in note.act or "plant protection service" in note.act or note.act.startswith("Pull"), label
        for other in note.looks_like:
            assert other in SHIPPED_CLASSES and other != label, (label, other)
        assert not note.source or note.source.startswith(("https://", "http://")), label
    assert notes.unknown_to(SHIPPED_CLASSES) == []  # no note names a class the model does not know (a misspelt key)
    assert notes.missing(SHIPPED_CLASSES) == []
    assert all(notes.get(c) is None for c in SHIPPED_CLASSES if not is_disease(c))


def test_a_class_that_cannot_wait_says_so_and_the_rest_do_not():
    notes = load_notes()
    urgent = {label for label in DISEASES if notes.get(label).urgency}
    assert urgent == {"Potato___Late_blight", "Tomato___Late_blight", "Orange___Haunglongbing_(Citrus_greening)"}


def test_a_class_reads_as_the_farmer_calls_it():
    notes = load_notes()
    assert notes.title("Corn_(maize)___Cercospora_leaf_spot Gray_leaf_spot") == "Gray leaf spot"
    assert notes.title("Apple___Apple_scab") == "Apple scab"
    assert notes.title("Apple___healthy") == "Healthy"
    assert notes.title("Coffee___Leaf_rust") == "Leaf rust"  # no note: the condition's part of its name


# ---- a farm's own file ---------------------------------------------------------------
def test_a_farms_file_replaces_the_shipped_notes_key_by_key_and_adds_its_own_classes(tmp_path):
    farm = tmp_path / "notes.toml"
    farm.write_text(
        '["Apple___Apple_scab"]\nname = "Schorf"\nact = "Laub im Herbst mulchen; fragen Sie Ihre Beratung."\n\n'
        '["Apple___Unknown_blotch"]\nlook_for = "Braune Flecken."\n',
        encoding="utf-8",
    )
    notes = load_notes(farm)
    scab = notes.get("Apple___Apple_scab")
    assert scab.title == "Schorf" and scab.act.startswith("Laub")
    assert scab.look_for == load_notes().get("Apple___Apple_scab").look_for  # the keys it does not give stay shipped
    assert notes.get("Apple___Unknown_blotch").look_for == "Braune Flecken."
    assert notes.unknown_to(SHIPPED_CLASSES) == ["Apple___Unknown_blotch"]
    assert notes.sources[-1] == farm


@pytest.mark.parametrize(
    "text, says",
    [
        ('["Apple___Apple_scab"\nact = "x"\n', "not TOML"),
        ('["Apple___Apple_scab"]\nadvice = "x"\n', '["Apple___Apple_scab"] advice: not a key of a class note'),
        ('["Apple___Apple_scab"]\nact = 3\n', '["Apple___Apple_scab"] act: must be text'),
        ('["Apple___Apple_scab"]\nact = "' + "x" * 2001 + '"\n', "act: must be text of at most 2000"),
        ('["Apple___Apple_scab"]\nlooks_like = "Apple___Black_rot"\n', "looks_like: must be a list of class names"),
        ('["Apple___Apple_scab"]\nsource = "javascript:alert(1)"\n', "source: must be a web address"),
        ('"Apple___Apple_scab" = "x"\n', "must be a table"),
        ('["a/b"]\nact = "x"\n', "is not a class name (holds a path separator)"),
    ],
)
def test_a_farms_file_that_cannot_be_used_is_refused_naming_the_file_class_and_key(tmp_path, text, says):
    farm = tmp_path / "notes.toml"
    farm.write_text(text, encoding="utf-8")
    with pytest.raises(NotesError) as exc:
        load_notes(farm)
    assert str(farm) in str(exc.value) and says in str(exc.value)


def test_a_missing_huge_or_binary_notes_file_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(NotesError, match=r"cannot read the class notes .*set \[web\] class_notes to"):
        load_notes(tmp_path / "nowhere.toml")
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (MAX_NOTES_BYTES + 1))
    with pytest.raises(NotesError, match="larger than"):
        load_notes(huge)
    binary = tmp_path / "photo.toml"
    binary.write_bytes(b"\xff\xd8\xff\xe0 not text")
    with pytest.raises(NotesError, match="not UTF-8"):
        load_notes(binary)


def test_the_page_does_not_start_on_a_notes_file_it_cannot_use(tmp_path):
    state = make_state(tmp_path)
    bad = tmp_path / "notes.toml"
    bad.write_text('["Apple___Apple_scab"]\nwhat = "x"\n', encoding="utf-8")
    with pytest.raises(NotesError, match="what: not a key"):
        _client(state, bad)


# ---- the Diseases pages -----------------------------------------------------------------
def test_the_diseases_page_lists_what_the_model_knows_crop_by_crop_with_the_seasons_photos(tmp_path):
    state = make_state(tmp_path)
    _add(state, "Tomato___Late_blight", "confident", 3)
    _add(state, "Tomato___Late_blight", "unsure", 1)
    c = _client(state)
    r = c.get("/classes")
    assert r.status_code == 200
    assert "26 diseases of 14 crops" in r.text
    assert r.text.count('class="crop"') == 14
    item = r.text.split('data-class="Tomato___Late_blight"')[1].split("</li>")[0]
    assert "urgent" in item and "4 photos" in item and "(3 sure)" in item
    assert 'href="/photos?label=Tomato___Late_blight"' in item
    assert '<a href="/classes" >Diseases</a>' in c.get("/photos").text  # in the menu


def test_a_class_page_says_what_to_look_for_how_it_spreads_what_to_do_and_where_its_photos_are(tmp_path):
    state = make_state(tmp_path)
    _add(state, "Tomato___Late_blight", "confident", 2)
    c = _client(state)
    r = c.get("/classes/Tomato___Late_blight")
    assert r.status_code == 200
    for part in ('id="urgency"', 'id="look-for"', 'id="cause"', 'id="spread"', 'id="act"', 'id="source"'):
        assert part in r.text, part
    assert 'href="/classes/Tomato___Early_blight">Early blight</a>' in r.text  # often confused with
    assert "2 photos the model answered as Late blight</a> (2 sure)" in r.text
    assert 'href="/map?label=Tomato___Late_blight"' in r.text
    assert "ask your extension service" in r.text
    # a name with spaces, commas and brackets, URL-encoded as the links write it
    label = "Corn_(maize)___Cercospora_leaf_spot Gray_leaf_spot"
    r = c.get("/classes/" + quote(label))
    assert r.status_code == 200 and "<h1>Gray leaf spot" in r.text


def test_a_look_alike_of_another_crop_is_named_with_its_crop(tmp_path):
    c = _client(make_state(tmp_path))
    r = c.get("/classes/" + quote("Pepper,_bell___Bacterial_spot"))
    assert f'href="/classes/{quote("Tomato___Bacterial_spot")}">Bacterial spot (Tomato)</a>' in r.text  # not its own name again
    r = c.get("/classes/Potato___Early_blight")
    assert 'href="/classes/Potato___Late_blight">Late blight</a>' in r.text  # the same crop: the name alone


def test_a_healthy_class_says_what_healthy_means_to_the_model_and_an_unknown_class_is_a_404(tmp_path):
    state = make_state(tmp_path)
    c = _client(state)
    r = c.get("/classes/Tomato___healthy")
    assert r.status_code == 200 and 'id="healthy"' in r.text and "can look healthy to it" in r.text
    assert 'href="/classes/Tomato___Late_blight"' in r.text  # the diseases of tomato it knows
    r = c.get("/classes/Tomato___Blossom_end_rot")
    assert r.status_code == 404 and "knows no class" in r.text


def test_a_class_the_expert_made_is_listed_and_asks_for_notes_until_a_farms_file_gives_them(tmp_path):
    state = make_state(tmp_path)
    _add(state, "Apple___Apple_scab", "unsure", 2, expert="Apple___Marssonina_blotch")
    c = _client(state)
    item = c.get("/classes").text.split('data-class="Apple___Marssonina_blotch"')[1].split("</li>")[0]
    assert "the model in service does not answer it yet" in item and "the expert named 2" in item
    assert 'id="no-note"' in c.get("/classes/Apple___Marssonina_blotch").text
    farm = tmp_path / "notes.toml"
    farm.write_text(
        '["Apple___Marssonina_blotch"]\nlook_for = "Dark green patches turning brown, leaves yellow early."\n', encoding="utf-8"
    )
    r = _client(state, farm).get("/classes/Apple___Marssonina_blotch")
    assert 'id="look-for"' in r.text and "leaves yellow early" in r.text and 'id="no-note"' not in r.text


def test_notes_on_a_class_the_model_does_not_know_are_pointed_out(tmp_path):
    state = make_state(tmp_path)
    farm = tmp_path / "notes.toml"
    farm.write_text('["Tomato___Late_Blight"]\nname = "Krautfäule"\n', encoding="utf-8")  # a capital B: no such class
    r = _client(state, farm).get("/classes")
    assert 'id="stray-notes"' in r.text and "Tomato___Late_Blight" in r.text.split('id="stray-notes"')[1]
    assert 'id="stray-notes"' not in _client(state).get("/classes").text


# ---- a photo's page ----------------------------------------------------------------------
def test_a_photos_page_says_what_to_look_for_to_confirm_its_answer(tmp_path):
    state = make_state(tmp_path)
    c = _client(state)
    (sure,) = _add(state, "Potato___Late_blight", "confident")
    (unsure,) = _add(state, "Grape___Black_rot", "unsure")
    (unknown,) = _add(state, "Apple___Apple_scab", "unknown")
    (healthy,) = _add(state, "Apple___healthy", "confident")
    (corrected,) = _add(state, "Apple___healthy", "confident", expert="Apple___Cedar_apple_rust")

    def about(sha: str) -> str:
        text = c.get(f"/photo/{sha}").text
        return text.split('id="about"')[1].split("</section>")[0] if 'id="about"' in text else ""

    page = about(sure)
    assert "About Late blight" in page and 'id="urgency"' in page and 'id="look-for"' in page and 'id="act"' in page
    assert 'id="spread"' not in page  # the class's page has the rest
    assert 'href="/classes/Potato___Late_blight"' in page
    assert "If it is Black rot: check the plant" in about(unsure)
    assert about(unknown) == ""  # a photo unlike any it knows: no disease to confirm
    assert about(healthy) == ""
    assert "About Cedar apple rust" in about(corrected) and "(the expert's label)" in about(corrected)
    assert 'href="/classes/Apple___healthy">Apple · healthy</a>' in c.get(f"/photo/{healthy}").text  # top classes link


# ---- the API and the command line ------------------------------------------------------
def test_the_api_gives_every_class_with_its_notes_and_one_class_by_its_encoded_name(tmp_path):
    state = make_state(tmp_path)
    _add(state, "Tomato___Late_blight", "confident", 2)
    c = _client(state)
    every = c.get("/api/v1/classes").json()["classes"]
    assert len(every) == len(SHIPPED_CLASSES)
    late = next(x for x in every if x["label"] == "Tomato___Late_blight")
    assert late["photos"] == 2 and late["sure"] == 2 and late["urgency"] and late["looks_like"] == ["Tomato___Early_blight"]
    one = c.get("/api/v1/classes/" + quote("Pepper,_bell___Bacterial_spot")).json()
    assert one["crop"] == "Pepper, bell" and one["look_for"] and one["known"]
    r = c.get("/api/v1/classes/Nothing")
    assert r.status_code == 404 and r.json()["status"] == 404


def test_edge_agent_classes_lists_them_and_prints_one_before_and_after_the_daemons_first_start(tmp_path, capsys):
    empty = tmp_path / "fresh"
    assert main(["classes", "--state-dir", str(empty)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(SHIPPED_CLASSES) and any("Potato: Late blight  URGENT  [Potato___Late_blight]" in x for x in lines)
    assert not empty.exists()  # reading made nothing
    assert main(["classes", "--state-dir", str(empty), "late blight"]) == 0
    out = capsys.readouterr().out
    assert out.count("Look for:") == 2 and "Late blight (Potato)" in out and "Late blight (Tomato)" in out
    assert main(["classes", "--state-dir", str(empty), "blight"]) == 2
    err = capsys.readouterr().err
    assert "knows no class 'blight'" in err and "Potato___Late_blight" in err
    state = make_state(tmp_path)
    _add(state, "Tomato___Late_blight", "confident", 2)
    assert main(["classes", "--state-dir", str(state), "--json", "Tomato___Late_blight"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["photos"] == 2 and row["title"] == "Late blight" and row["look_for"]


# ---- alerts ---------------------------------------------------------------------------------
def test_an_alert_tells_the_farmer_what_to_look_for_and_why_it_cannot_wait(tmp_path):
    from edge_agent.alerts.messages import alert_body
    from edge_agent.alerts.rules import Candidate

    notes = load_notes()

    def body(label: str, verdict: str) -> dict:
        c = Candidate(1, 1000.0, "greenhouse", label, 0.9, verdict, "p1", "ab" * 32, "" if verdict == "confident" else "too dark")
        return alert_body(c, "http://greenhouse.local:8080/", notes.get(label))

    sure = body("Tomato___Late_blight", "confident")
    assert sure["urgency"].startswith("Spreads through a field") and sure["look_for"].startswith("Pale to dark green")
    assert "\nUrgent: Spreads through a field in days" in sure["message"] and "\nLook for: Pale to dark green" in sure["message"]
    assert sure["class_url"] == "http://greenhouse.local:8080/classes/Tomato___Late_blight"
    unsure = body("Apple___Apple_scab", "unsure")
    assert "\nIf it is Apple scab, look for: Olive-green" in unsure["message"] and unsure["urgency"] == ""
    unknown = body("Apple___Apple_scab", "unknown")  # a photo unlike any it knows: nothing to look for
    assert unknown["look_for"] == "" and "look for" not in unknown["message"].lower()
    corn = body("Corn_(maize)___Cercospora_leaf_spot Gray_leaf_spot", "confident")
    assert corn["class_url"].endswith("/classes/Corn_%28maize%29___Cercospora_leaf_spot%20Gray_leaf_spot")
    healthy = body("Apple___healthy", "confident")
    assert healthy["look_for"] == "" and "\n" not in healthy["message"]


def test_the_daemons_alerts_carry_the_notes_and_a_notes_file_it_cannot_use_leaves_the_shipped_ones(tmp_path):
    from edge_agent.alerts.config import AlertsSection, MqttSection, WebhookSection
    from edge_agent.alerts.worker import AlertWorker
    from edge_agent.class_notes import notes_or_shipped

    class Log:
        said: list = []

        def warning(self, event, **kw):
            self.said.append((event, kw))

    bad = tmp_path / "notes.toml"
    bad.write_text('["Tomato___Late_blight"]\nact = 1\n', encoding="utf-8")
    log = Log()
    notes = notes_or_shipped(bad, None, log)
    assert notes.get("Tomato___Late_blight").act == load_notes().get("Tomato___Late_blight").act
    assert log.said[0][0] == "class_notes_unusable" and str(bad) in log.said[0][1]["error"]
    farm = tmp_path / "farm.toml"
    farm.write_text('["Tomato___Late_blight"]\nlook_for = "Braunfäule an Blatt und Frucht."\n', encoding="utf-8")
    db = ResultsDB(tmp_path / "results.sqlite")
    hook = WebhookSection(url="http://127.0.0.1:9/alerts")  # never sent here (the worker's thread is not started): queued
    w = AlertWorker(
        AlertsSection(quiet_period_s=0), MqttSection(), [hook], db.path, tmp_path, "greenhouse", notes=notes_or_shipped(farm, None, log)
    )
    try:
        _add(tmp_path, "Tomato___Late_blight", "confident")
        w.scan()
        con = sqlite3.connect(tmp_path / "alerts.sqlite")
        (payload,) = con.execute("SELECT payload FROM outbox WHERE kind = 'alert'").fetchone()
        con.close()
        sent = json.loads(payload)
        assert sent["look_for"] == "Braunfäule an Blatt und Frucht." and sent["urgency"]  # the farm's key, the shipped rest
        assert w._state["last_look_for"] == "Braunfäule an Blatt und Frucht."  # Home Assistant's Last diagnosis attribute
        _add(tmp_path, "Apple___Apple_scab", "unknown")
        w.scan()
        assert w._state["last_look_for"] == ""  # a photo unlike any it knows: nothing to look for
    finally:
        w.stop()
        db.close()


def test_a_plants_page_says_what_to_look_for_on_the_tree_for_its_diagnosis(tmp_path):
    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    for i in range(3):
        sha = f"{i:064x}"
        top = [["Apple___Black_rot", 0.97], ["Apple___Apple_scab", 0.02]]
        db.commit(
            [
                ResultRow(
                    sha,
                    sha[:16],
                    f"/x/tree/{i}.jpg",
                    "folder",
                    "Apple___Black_rot",
                    0.97,
                    top,
                    "v0001",
                    {},
                    verdict="confident",
                    plant="tree 7",
                )
            ],
            [],
        )
    db.close()
    c = _client(state)
    page = c.get("/plants/tree%207").text
    about = page.split('id="about"')[1].split("</section>")[0]
    assert "About Black rot" in about and "Frog-eye" in about
    assert 'class="class-link" href="/classes/Apple___Black_rot"' in c.get("/plants").text  # the diagnosis links its class


def test_the_review_page_tells_each_offered_class_by_its_first_sign(tmp_path):
    state = make_state(tmp_path)  # its review pool: photos the model hesitates on between its first three classes
    page = _client(state).get("/review").text
    hints = [h.split("</span>")[0] for h in page.split('<span class="hint small muted">')[1:]]
    notes = load_notes()
    assert hints and hints[0] == notes.get(SHIPPED_CLASSES[0]).hint.replace("'", "&#39;")
    assert notes.get("Corn_(maize)___Common_rust_").hint.endswith("(rub one: brown powder comes off on the finger)")
    assert (
        notes.get("Potato___Late_blight").hint
        == "Pale to dark green water-soaked patches, often at the leaf tips and edges, turning brown-black within days"
    )


def test_the_season_says_where_and_when_a_disease_was_found_by_a_sure_answer_or_the_experts_label(tmp_path, capsys):
    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    day = 86400.0
    may = time.mktime((2026, 5, 12, 10, 0, 0, 0, 0, -1))
    rows = [  # (label, verdict, plant, taken)
        ("Apple___Apple_scab", "confident", "tree 1", may),
        ("Apple___Apple_scab", "confident", "tree 1", may + day),
        ("Apple___Apple_scab", "confident", "tree 3", may + 20 * day),
        ("Apple___Apple_scab", "unsure", "tree 4", may + 30 * day),  # not sure: not found
        ("Apple___Apple_scab", "confident", "tree 5", may + 40 * day),  # the expert said black rot: not found
        ("Apple___healthy", "unsure", "tree 6", may + 25 * day),  # the expert said scab: found
    ]
    for i, (label, verdict, plant, taken) in enumerate(rows):
        sha = f"{i + 1:064x}"
        top = [[label, 0.97], ["Apple___Black_rot", 0.02]]
        db.commit(
            [ResultRow(sha, sha[:16], f"/x/{i}.jpg", "folder", label, 0.97, top, "v0001", {}, verdict=verdict, plant=plant, taken=taken)],
            [],
        )
    db._db.execute("INSERT INTO expert_labels (sha256, label, labelled) VALUES (?, 'Apple___Black_rot', 0)", (f"{5:064x}",))
    db._db.execute("INSERT INTO expert_labels (sha256, label, labelled) VALUES (?, 'Apple___Apple_scab', 0)", (f"{6:064x}",))
    db._db.commit()
    db.close()
    c = _client(state)
    scab = c.get("/api/v1/classes/Apple___Apple_scab").json()
    assert (scab["found"], scab["plants"]) == (4, 3)  # trees 1, 3 and 6
    assert scab["first"].startswith("2026-05-12") and scab["last"].startswith("2026-06-06")  # tree 6, 25 days on
    item = c.get("/classes").text.split('data-class="Apple___Apple_scab"')[1].split("</li>")[0]
    assert "found on 3 plants, 12 May 2026 to 06 Jun 2026" in item
    found = c.get("/classes/Apple___Apple_scab").text.split('id="found"')[1].split("</p>")[0]
    assert "on 4 photos of 3 plants, first photographed 12 May 2026, last 06 Jun 2026" in found
    assert [p.split('"')[0] for p in found.split('href="/plants/')[1:]] == ["tree%206", "tree%203", "tree%201"]  # newest first
    assert c.get("/api/v1/classes/Apple___Black_rot").json()["found"] == 1  # the expert's correction counts for its class
    assert main(["classes", "--state-dir", str(state), "Apple___Apple_scab"]) == 0
    assert "found on 4 photos of 3 plants, first photographed 2026-05-12, last 2026-06-06" in capsys.readouterr().out


# ---- the farm's notes written on the page -------------------------------------------------
def test_where_a_class_was_found_read_from_the_sure_answers_index_is_what_joining_every_result_gives(tmp_path):
    """The Diseases page reads the sure answers and the expert's labels apart (an index of the sure answers, not a
    season's every row); what it finds must be what joining every result with the expert's labels finds."""
    import random

    from edge_agent.web.queries import Reader

    rnd, db = random.Random(3), ResultsDB(tmp_path / "results.sqlite")
    classes, rows = ["A", "B", "C", "D"], []
    for i in range(3000):
        sha, label = f"{i:064x}", rnd.choice(classes)
        taken = 1.7e9 + rnd.randrange(10**7) if rnd.random() < 0.7 else None
        plant = rnd.choice([None, "tree 1", "tree 2", "tree 3", f"tree {i % 40}"])
        verdict = rnd.choice(["confident", "confident", "unsure", "unknown"])
        rows.append(
            ResultRow(
                sha,
                sha[:16],
                f"/x/{i}.jpg",
                "folder",
                label,
                0.9,
                [[label, 0.9]],
                "v1",
                {},
                1.7e9 + i,
                verdict=verdict,
                plant=plant,
                taken=taken,
            )
        )
    db.commit(rows)
    for row in rnd.sample(rows, 300):  # the expert: some agree, some correct a sure answer, some name an unsure one
        db.mark_expert(row.sha256, rnd.choice([row.label, *classes, "E"]), "")
    db.close()
    con = sqlite3.connect(tmp_path / "results.sqlite")
    found, w = "COALESCE(e.label, CASE WHEN r.verdict = 'confident' THEN r.label END)", "COALESCE(r.taken, r.created)"
    joined = "results r LEFT JOIN expert_labels e ON e.sha256 = r.sha256"
    expected = {
        c: (n, plants, first, last)
        for c, n, plants, first, last in con.execute(
            f"SELECT {found} AS c, COUNT(*), COUNT(DISTINCT r.plant), MIN({w}), MAX({w}) FROM {joined} WHERE {found} IS NOT NULL GROUP BY c"
        )
    }
    reader = Reader(tmp_path / "results.sqlite")
    season = reader.per_class()
    assert {c: (s.found, s.plants, s.first, s.last) for c, s in season.items() if s.found} == expected and "E" in expected
    for c in [*classes, "E"]:
        plants = con.execute(
            f"SELECT r.plant, MAX({w}) AS last FROM {joined} WHERE r.plant IS NOT NULL AND {found} = ? GROUP BY r.plant ORDER BY last DESC LIMIT 20",
            (c,),
        ).fetchall()
        assert reader.found_on(c) == [p for p, _ in plants]
    con.close()


def test_a_farms_notes_written_on_a_class_page_replace_the_shipped_keys_at_once_everywhere(tmp_path):
    from edge_agent.class_notes import PAGE_NOTES

    from .web_helpers import csrf_of

    state = make_state(tmp_path)
    (sure,) = _add(state, "Apple___Apple_scab", "confident")
    c = _client(state)
    page = c.get("/classes/Apple___Apple_scab").text
    form = page.split('id="notes-form"')[1].split("</form>")[0]
    assert 'placeholder="Rake up, shred or bury' in form and '<textarea name="act"' in form  # the shipped text, greyed
    token = csrf_of(c)
    act = 'Falllaub im Herbst "mulchen";\nSpritzfolge nach dem Warndienst — fragen Sie Ihre Beratung. 🍎'
    r = c.post("/classes/Apple___Apple_scab/notes", data={"csrf": token, "name": "Schorf", "act": act, "look_for": "  "})
    assert r.status_code == 303 and r.headers["location"] == "/classes/Apple___Apple_scab?saved=1"
    page = c.get(r.headers["location"]).text
    assert "<h1>Schorf" in page and 'id="notes-saved"' in page and "2 written here" in page
    assert page.split('id="act">')[1].split("</dd>")[0] == act.replace('"', "&#34;")  # quotes, a newline, an emoji kept
    assert "Olive-green to brown spots" in page.split('id="look-for">')[1]  # a key left empty: the shipped one
    about = c.get(f"/photo/{sure}").text.split('id="about"')[1].split("</section>")[0]
    assert "About Schorf" in about and "Falllaub im Herbst" in about  # the same process, no restart
    assert load_notes(page=state / PAGE_NOTES).get("Apple___Apple_scab").act == act  # a TOML file as a farm would write
    r = c.post("/classes/Apple___Apple_scab/notes", data={"csrf": token, "name": "", "act": ""})  # emptied: the entry goes
    assert r.status_code == 303 and "Apple___Apple_scab" not in (state / PAGE_NOTES).read_text(encoding="utf-8")
    assert "<h1>Apple scab" in c.get("/classes/Apple___Apple_scab").text


def test_notes_the_page_cannot_take_are_refused_and_the_file_is_left_as_it_was(tmp_path):
    from edge_agent.class_notes import PAGE_NOTES

    from .web_helpers import csrf_of

    state = make_state(tmp_path)
    c = _client(state)
    token = csrf_of(c)

    def post(label: str, **fields):
        return c.post(f"/classes/{quote(label)}/notes", data={"csrf": token, **fields})

    assert post("Apple___Apple_scab", act="ok").status_code == 303
    before = (state / PAGE_NOTES).read_bytes()
    assert post("Apple___Apple_scab", act="a\x1b[2Jb").status_code == 400  # a terminal escape
    assert post("Apple___Apple_scab", source="javascript:alert(1)").status_code == 400
    assert post("Apple___Apple_scab", act="x" * 2001).status_code == 400
    assert post("Apple___No_such", act="x").status_code == 404
    assert c.post("/classes/Apple___Apple_scab/notes", data={"act": "no token"}).status_code == 403
    assert (state / PAGE_NOTES).read_bytes() == before
    (state / PAGE_NOTES).write_text('["Apple___Apple_scab"]\nact = \n', encoding="utf-8")  # a hand edit gone wrong
    r = post("Apple___Black_rot", act="y")
    assert r.status_code == 400 and "fix or delete it by hand" in r.text
    assert (state / PAGE_NOTES).read_text(encoding="utf-8") == '["Apple___Apple_scab"]\nact = \n'  # never overwritten
    page = c.get("/classes/Apple___Apple_scab").text
    assert "<h1>Apple scab" in page and "fix or delete it by hand" in page.split('id="notes-problem"')[1]  # said; notes before stand
    health = c.get("/health").text  # where the one who runs the device looks
    assert "not TOML" in health.split('id="notes-problem"')[1].split("</p>")[0]
    (state / PAGE_NOTES).write_text('["Apple___Apple_scab"]\nact = "fixed"\n', encoding="utf-8")
    assert 'id="notes-problem"' not in c.get("/health").text  # fixed by hand: read again, the warning gone


def test_the_daemons_alerts_take_notes_written_on_the_page_without_a_restart(tmp_path):
    from edge_agent.alerts.config import AlertsSection, MqttSection, WebhookSection
    from edge_agent.alerts.worker import AlertWorker
    from edge_agent.class_notes import NotesSource
    from edge_agent.farm_notes import save_note

    db = ResultsDB(tmp_path / "results.sqlite")
    page = tmp_path / "class-notes.toml"
    hook = WebhookSection(url="http://127.0.0.1:9/alerts")  # never sent here: queued
    w = AlertWorker(AlertsSection(quiet_period_s=0), MqttSection(), [hook], db.path, tmp_path, "greenhouse", notes=NotesSource(None, page))
    try:
        _add(tmp_path, "Tomato___Late_blight", "confident")
        w.scan()
        save_note(page, "Tomato___Late_blight", {"look_for": "Braune Flecken mit weissem Rand."})
        _add(tmp_path, "Tomato___Late_blight", "confident", n=2)
        w.scan()
        con = sqlite3.connect(tmp_path / "alerts.sqlite")
        said = [json.loads(p)["look_for"] for (p,) in con.execute("SELECT payload FROM outbox WHERE kind = 'alert' ORDER BY id")]
        con.close()
        assert said[0].startswith("Pale to dark green") and said[-1] == "Braune Flecken mit weissem Rand."
    finally:
        w.stop()
        db.close()


def test_a_program_writes_a_farms_notes_and_labels_a_spot_through_the_api(tmp_path):
    from edge_agent.web.auth import Tokens

    state = make_state(tmp_path)
    token = Tokens(state / "web").new("label")
    reader_token = Tokens(state / "web").new("read")
    c = _client(state)
    auth = {"Authorization": f"Bearer {token}"}
    r = c.post("/api/v1/classes/Apple___Apple_scab/notes", json={"name": "Schorf", "act": "Laub mulchen."}, headers=auth)
    assert r.status_code == 200 and r.json()["title"] == "Schorf" and r.json()["act"] == "Laub mulchen."
    assert r.json()["look_for"].startswith("Olive-green")  # not given: the shipped one
    bad = c.post("/api/v1/classes/Apple___Apple_scab/notes", json={"source": "ftp://x"}, headers=auth)
    assert bad.status_code == 400 and "source: must be a web address" in bad.json()["error"]
    assert c.post("/api/v1/classes/Nope/notes", json={"act": "x"}, headers=auth).status_code == 404
    read_only = c.post("/api/v1/classes/Apple___Apple_scab/notes", json={"act": "x"}, headers={"Authorization": f"Bearer {reader_token}"})
    assert read_only.status_code in (401, 403)  # a token that may read may not write
    assert c.get("/api/v1/classes/Apple___Apple_scab").json()["act"] == "Laub mulchen."
    missing = c.post(f"/api/v1/results/{'a' * 64}/spot/label", json={"label": "Apple___Black_rot", "photos": ["a" * 64]}, headers=auth)
    assert missing.status_code == 404 and "to label together" in missing.json()["error"]


def test_notes_that_cannot_be_written_on_a_full_disk_say_so_and_leave_the_file_as_it_was(tmp_path, monkeypatch):
    import errno

    from edge_agent import farm_notes

    page = tmp_path / "class-notes.toml"
    farm_notes.save_note(page, "Apple___Apple_scab", {"act": "before"})
    before = page.read_bytes()

    def full(path, data, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(farm_notes, "atomic_write", full)
    with pytest.raises(NotesError, match="cannot be written \\(No space left on device\\): nothing was changed"):
        farm_notes.save_note(page, "Apple___Apple_scab", {"act": "after"})
    assert page.read_bytes() == before and list(tmp_path.iterdir()) == [page]


def test_a_photo_the_model_is_not_sure_of_names_its_other_likely_guesses_by_their_first_sign(tmp_path):
    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    top = [["Apple___Apple_scab", 0.55], ["Apple___Black_rot", 0.30], ["Apple___Cedar_apple_rust", 0.02]]
    for i, verdict in enumerate(("unsure", "confident")):
        sha = f"{i + 100:064x}"
        db.commit([ResultRow(sha, sha[:16], f"/x/{i}.jpg", "folder", "Apple___Apple_scab", 0.55, top, "v0001", {}, verdict=verdict)], [])
    db.close()
    c = _client(state)
    unsure = c.get(f"/photo/{100:064x}").text.split('id="about"')[1].split("</section>")[0]
    assert "If it is Apple scab: check the plant" in unsure
    assert unsure.count('class="small other-guess"') == 1  # black rot at 30 %; cedar apple rust at 2 % is not named
    assert "Or, if it is Black rot (Apple · Black rot): &#39;Frog-eye&#39; leaf spots" in unsure
    sure = c.get(f"/photo/{101:064x}").text.split('id="about"')[1].split("</section>")[0]
    assert "other-guess" not in sure


def test_a_note_that_only_names_a_class_adds_no_empty_section_to_a_photos_page(tmp_path):
    from edge_agent.farm_notes import save_note

    state = make_state(tmp_path)
    (healthy,) = _add(state, "Apple___healthy", "confident")
    save_note(state / "class-notes.toml", "Apple___healthy", {"name": "Gesund"})
    c = _client(state)
    assert 'id="about"' not in c.get(f"/photo/{healthy}").text
    assert "<h1>Gesund" in c.get("/classes/Apple___healthy").text  # the name serves where names are shown
