"""The JSON API and /metrics: each endpoint, the roles (401/403), CSRF, the OpenAPI document, and bad input."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from edge_agent.config import AppConfig  # noqa: E402
from edge_agent.ledger_rows import ResultRow  # noqa: E402
from edge_agent.results import ResultsDB  # noqa: E402
from edge_agent.state import resolve_store  # noqa: E402
from edge_agent.web.api.openapi import document, reference  # noqa: E402
from edge_agent.web.auth import Tokens  # noqa: E402

from .conftest import sqlite_full_error  # noqa: E402
from .daemon_helpers import SHIPPED, SHIPPED_NEXT  # noqa: E402
from .web_helpers import REMOTE, _photos, _second_version, app_for, client, csrf_of, make_state, sha_of  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def state(tmp_path) -> Path:
    """A state directory as the daemon leaves it: 6 results, 2 in the review pool, the shipped store."""
    return make_state(tmp_path)


def remote(state: Path, role: str) -> tuple[TestClient, dict]:
    token = Tokens(state / "web").new(role)
    return TestClient(app_for(state), base_url="http://localhost", client=REMOTE, follow_redirects=False), {
        "Authorization": f"Bearer {token}"
    }


# ---- reading --------------------------------------------------------------------
def test_results_are_paged_newest_first_and_filtered_by_class_and_verdict(state):
    c = client(state)
    r = c.get("/api/v1/results?size=4")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["total"] == 6 and len(body["results"]) == 4 and body["results"][0]["photo_id"] == "p5"
    assert c.get("/api/v1/results?size=4&page=1").json()["results"][-1]["photo_id"] == "p0"
    label = body["results"][0]["label"]
    only = c.get("/api/v1/results", params={"label": label}).json()
    assert only["total"] >= 1 and {x["label"] for x in only["results"]} == {label}
    assert c.get("/api/v1/results?verdict=confident").json()["total"] == 0  # the fixture's rows predate verdicts


@pytest.mark.parametrize("query", ["page=-1", "size=100000", "page=99999999999999999999999", "from=yesterday", "verdict=maybe", "size=1e9"])
def test_a_bad_parameter_is_answered_400_in_json_with_the_reason(state, query):
    r = client(state).get(f"/api/v1/results?{query}")
    assert r.status_code == 400 and r.json()["status"] == 400 and r.json()["error"]


def test_one_photos_result_by_sha256_and_404_for_an_unknown_or_malformed_one(state):
    c = client(state)
    sha = sha_of(state, "p3")
    r = c.get(f"/api/v1/results/{sha}")
    assert r.status_code == 200 and r.json()["sha256"] == sha and r.json()["page"] == f"/photo/{sha}"
    assert c.get(f"/api/v1/results/{'0' * 64}").status_code == 404
    assert c.get("/api/v1/results/../../etc/passwd").status_code == 404
    assert c.get("/api/v1/nothing-here").json()["status"] == 404


def test_review_engines_health_fleet_and_alerts_answer_on_a_fresh_state_directory(tmp_path):
    root = tmp_path / "fresh"
    c = client(root)
    assert c.get("/api/v1/review").json()["items"] == []
    engines = c.get("/api/v1/engines").json()
    assert engines["current"] == SHIPPED and engines["versions"][0]["manifest"]["classes"]
    health = c.get("/api/v1/health").json()
    assert health["daemon"]["running"] is False and "temperature_c" in health["board"]
    assert c.get("/api/v1/fleet").json() == {"trainer_running": False, "devices": [], "rollout": None, "handshakes_refused": []}
    assert c.get("/api/v1/alerts").json() == {"alerts": []}
    assert c.get("/api/v1/results").json()["total"] == 0


def test_the_alerts_endpoint_lists_the_ledger_newest_first(state):
    from edge_agent.alerts.outbox import Outbox
    from edge_agent.alerts.rules import Candidate

    box = Outbox(state / "alerts.sqlite", 1 << 20)
    for i, label in enumerate(["Tomato___Late_blight", "Apple___Apple_scab"]):
        box.record(Candidate(i + 1, time.time(), "dev", label, 0.97, "confident", f"p{i}", "a" * 64), [], i + 1)
    box.close()
    alerts = client(state).get("/api/v1/alerts?limit=1").json()["alerts"]
    assert [a["label"] for a in alerts] == ["Apple___Apple_scab"]


def test_the_health_page_says_which_alerts_were_not_sure(state):
    from edge_agent.alerts.outbox import Outbox
    from edge_agent.alerts.rules import Candidate

    box = Outbox(state / "alerts.sqlite", 1 << 20)
    box.record(Candidate(1, time.time(), "dev", "Tomato___Late_blight", 0.97, "confident", "p0", "a" * 64), [], 1)
    box.record(Candidate(2, time.time(), "dev", "Apple___Apple_scab", 0.99, "unsure", "p1", "b" * 64), [], 2)
    box.close()
    tile = client(state).get("/health").text.split('id="alerts"')[1].split("</div>")[0]
    first, second = tile.split("<br>")[:2]
    assert "possibly" in first and "Apple scab" in first and "(not sure)" in first
    assert "Late blight" in second and "possibly" not in second and "not sure" not in second


def test_the_review_queue_names_each_photos_file_and_source_in_the_api_and_on_the_page(state):
    c = client(state)
    items = c.get("/api/v1/review").json()["items"]
    names = {it["name"] for it in items}
    assert len(items) == 2 and all(it["source"] == "folder" and it["plant"] is None and it["classified"] for it in items)
    assert all(name and name.endswith(".jpg") for name in names)
    caption = c.get("/review").text.split('id="arrival">')[1].split("</span>")[0]
    assert caption.split(", ")[0] in names  # the file name it arrived under, then when it was classified


# ---- labelling and rollback: roles and CSRF -------------------------------------
def test_a_label_token_labels_through_the_api_into_the_trainers_queue(state):
    c, auth = remote(state, "label")
    sha = sha_of(state, "p0")
    r = c.post(f"/api/v1/review/{sha}/label", json={"label": "Apple___healthy"}, headers=auth)
    assert r.status_code == 200 and r.json() == {"photo_id": "p0", "sha256": sha, "label": "Apple___healthy"}
    assert ResultsDB(state / "results.sqlite", readonly=True).queue_entry(sha).kind == "expert"
    assert c.post(f"/api/v1/review/{'0' * 64}/label", json={"label": "Apple___healthy"}, headers=auth).status_code == 404
    r = c.post(f"/api/v1/review/{sha_of(state, 'p1')}/label", json={"label": "Banana___x"}, headers=auth)
    assert r.status_code == 400 and "not a known class" in r.json()["error"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a database error carries its code from Python 3.11")
def test_a_label_the_full_disk_cannot_take_is_said_as_a_full_disk_on_the_api_and_the_page(state, monkeypatch):
    """A write the disk cannot take is a 507 saying the disk is full and nothing was written (it was a 500, "the device
    could not answer this request"), on the API and the page; the photo stays in the review pool, its file where its
    row says (it had been moved to the expert queue's folder first: the pool then showed a photo it could not find)."""
    full = sqlite_full_error()
    assert full.sqlite_errorcode == sqlite3.SQLITE_FULL

    def mark_expert(self, *a, **k):
        raise full

    monkeypatch.setattr(ResultsDB, "mark_expert", mark_expert)
    sha = sha_of(state, "p0")
    c, auth = remote(state, "label")
    r = c.post(f"/api/v1/review/{sha}/label", json={"label": "Apple___healthy"}, headers=auth)
    assert r.status_code == 507 and r.json()["error"].startswith("the device's disk is full: nothing was written")
    page = client(state)
    r = page.post("/review/label", data={"csrf": csrf_of(page), "photo": sha, "label": "Apple___healthy", "i": "0"})
    assert r.status_code == 507 and "disk is full: nothing was written" in r.text and "<html" in r.text.lower()
    entry = ResultsDB(state / "results.sqlite", readonly=True).queue_entry(sha)
    assert entry.kind == "review" and Path(entry.file).is_file()  # its photo where its row says (it had gone to expert/)


def test_a_database_error_without_a_code_as_python_3_10_raises_is_a_full_disk_only_where_the_disk_is_nearly_full(state, monkeypatch):
    """JetPack 6's Python (3.10) gives a database error no code: the page then asks the disk. Under 4 MiB free it is a
    full disk (507); with room, the device's own failure (500), never a full disk it is not."""
    from collections import namedtuple

    from edge_agent import storage_errors

    def mark_expert(self, *a, **k):
        raise sqlite3.OperationalError("database or disk is full")  # made by hand: no sqlite_errorcode, as on 3.10

    monkeypatch.setattr(ResultsDB, "mark_expert", mark_expert)
    usage = namedtuple("usage", "total used free")
    sha = sha_of(state, "p0")
    c, auth = remote(state, "label")
    for free, status in ((1 << 20, 507), (1 << 30, 500)):
        monkeypatch.setattr(storage_errors.shutil, "disk_usage", lambda _where, free=free: usage(1 << 34, (1 << 34) - free, free))
        r = c.post(f"/api/v1/review/{sha}/label", json={"label": "Apple___healthy"}, headers=auth)
        assert r.status_code == status, (free, r.text)
    assert ResultsDB(state / "results.sqlite", readonly=True).queue_entry(sha).kind == "review"


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'{"label": 5}', b'{"label": "' + b"x" * 10 + b'", "new_class": "maybe"}'])
def test_a_garbage_label_body_is_answered_400_and_labels_nothing(state, body):
    c, auth = remote(state, "admin")
    sha = sha_of(state, "p0")
    r = c.post(f"/api/v1/review/{sha}/label", content=body, headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]
    assert ResultsDB(state / "results.sqlite", readonly=True).queue_entry(sha).kind == "review"


@pytest.mark.parametrize(
    "label, why",
    [("Apple\x00scab", "control"), ("x" * 5000, "longer than 100"), ("a/b", "path separator"), ("Apple\u200bscab", "invisible")],
)
def test_a_new_class_named_with_a_nul_a_slash_or_five_thousand_characters_is_refused_and_labels_nothing(state, label, why):
    """The class-name rule the trainer applies is applied where the label is given: API, page and command line."""
    c, auth = remote(state, "admin")
    sha = sha_of(state, "p0")
    r = c.post(f"/api/v1/review/{sha}/label", json={"label": label, "new_class": True}, headers=auth)
    assert r.status_code == 400 and why in r.json()["error"] and len(r.text) < 1000
    page = client(state)
    r = page.post("/review/label", data={"csrf": csrf_of(page), "photo": sha, "label": label, "new_class": "1"})
    assert r.status_code == 400 and why in r.text
    assert ResultsDB(state / "results.sqlite", readonly=True).queue_entry(sha).kind == "review"


def test_every_api_error_is_json_multipart_refusals_size_caps_and_unknown_routes_included(state):
    c, auth = remote(state, "admin")
    photo = _photos(1)[0].read_bytes()
    two = [("photo", ("a.jpg", photo, "image/jpeg")), ("photo", ("b.jpg", photo, "image/jpeg"))]
    answers = {
        "two files": c.post("/api/v1/classify?wait=0", files=two, headers=auth),
        "no photo field": c.post("/api/v1/classify?wait=0", files=[("other", ("a.jpg", photo, "image/jpeg"))], headers=auth),
        "broken multipart": c.post(
            "/api/v1/classify?wait=0", content=b"--x\r\nnonsense", headers={**auth, "Content-Type": "multipart/form-data; boundary=x"}
        ),
        "over the body cap": c.post(f"/api/v1/review/{'0' * 64}/label", content=b"{" + b" " * (2 << 20) + b"}", headers=auth),
        "no such route": c.get("/api/v1/nothing", headers=auth),
        "wrong method": c.delete("/api/v1/results", headers=auth),
    }
    for what, r in answers.items():
        assert r.status_code >= 400 and r.headers["content-type"].startswith("application/json"), (what, r.status_code, r.text[:200])
        assert r.json()["status"] == r.status_code and r.json()["error"], what
    assert answers["two files"].status_code == 400 and "Too many files" in answers["two files"].json()["error"]
    assert answers["over the body cap"].status_code == 413


def test_large_bodies_arriving_together_wait_for_a_place_and_past_the_wait_are_told_to_retry(state):
    """However many large uploads arrive at once, only ``slots`` are held in memory; the rest wait, then get a 503."""
    import asyncio

    from edge_agent.web._limits import BodyLimit

    inside, release = 0, asyncio.Event()
    most = 0

    async def app(scope, receive, send):
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        while (await receive()).get("more_body"):
            pass
        await release.wait()
        inside -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limit = BodyLimit(app, default=1 << 20, paths={"/api/v1/classify": 64 << 20}, large=8 << 20, slots=2, wait_s=0.5)

    async def one(length: int) -> int:
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"x" * 1024, "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/api/v1/classify", "headers": [(b"content-length", str(length).encode())]}
        await limit(scope, receive, send)
        return sent[0]["status"]

    async def main():
        large = [asyncio.create_task(one(40 << 20)) for _ in range(5)]
        small = [asyncio.create_task(one(100_000)) for _ in range(3)]
        await asyncio.sleep(0.8)  # the three large ones beyond the two places waited 0.5 s
        release.set()
        return await asyncio.gather(*large), await asyncio.gather(*small)

    large, small = asyncio.run(main())
    assert sorted(large) == [200, 200, 503, 503, 503] and small == [200, 200, 200]
    assert most == 2 + 3 and limit.counters == {"waited": 3, "refused": 3}  # the two large and the three small at once


def test_a_read_only_token_can_read_but_cannot_label_roll_back_or_classify(state):
    _second_version(state)
    c, auth = remote(state, "read")
    assert c.get("/api/v1/results", headers=auth).status_code == 200
    assert c.get("/metrics", headers=auth).status_code == 200
    sha = sha_of(state, "p0")
    r = c.post(f"/api/v1/review/{sha}/label", json={"label": "Apple___healthy"}, headers=auth)
    assert r.status_code == 403 and "--role label" in r.json()["error"]
    assert c.post("/api/v1/engines/rollback", json={"to": SHIPPED}, headers=auth).status_code == 403
    assert c.post("/api/v1/classify", content=_photos(1)[0].read_bytes(), headers=auth).status_code == 403
    assert ResultsDB(state / "results.sqlite", readonly=True).queue_entry(sha).kind == "review"
    assert resolve_store(AppConfig(), state).current() == SHIPPED_NEXT
    assert not list((state / "inbox").glob("*")) if (state / "inbox").exists() else True


def test_a_read_only_token_cannot_label_or_roll_back_on_the_page_either(state):
    _second_version(state)
    token = Tokens(state / "web").new("read")
    c = TestClient(app_for(state), base_url="http://localhost", client=REMOTE, follow_redirects=False)
    c.get(f"/?token={token}")
    csrf = csrf_of(c)
    r = c.post("/review/label", data={"csrf": csrf, "photo": sha_of(state, "p0"), "label": "Apple___healthy"})
    assert r.status_code == 403 and "--role label" in r.text
    assert c.post("/engines/rollback", data={"csrf": csrf, "to": SHIPPED, "confirm": "yes"}).status_code == 403
    assert resolve_store(AppConfig(), state).current() == SHIPPED_NEXT


def test_a_label_token_cannot_roll_back_and_an_admin_token_can(state):
    _second_version(state)
    c, label = remote(state, "label")
    assert c.post("/api/v1/engines/rollback", json={"to": SHIPPED}, headers=label).status_code == 403
    _, admin = remote(state, "admin")
    assert c.post("/api/v1/engines/rollback", json={"to": "v0099"}, headers=admin).status_code == 404
    r = c.post("/api/v1/engines/rollback", json={"to": SHIPPED}, headers=admin)
    assert r.status_code == 200 and r.json()["current"] == SHIPPED and r.json()["pin"]["version"] == SHIPPED


def test_without_a_token_or_with_a_wrong_one_the_api_answers_401_in_json(state):
    Tokens(state / "web").new("admin")
    c = TestClient(app_for(state), base_url="http://localhost", client=REMOTE)
    for r in (c.get("/api/v1/results"), c.get("/api/v1/results", headers={"Authorization": "Bearer wrong"}), c.get("/metrics")):
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert c.get("/api/v1/results").json()["status"] == 401
    # a wrong Bearer token is refused on loopback too, where no token is needed at all
    local = client(state)
    assert local.get("/api/v1/results").status_code == 200
    assert local.get("/api/v1/results", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_a_browser_post_to_the_api_needs_its_pages_csrf_token(state):
    c = client(state)  # loopback, no token: a browser on the device, which another site's page could drive
    sha = sha_of(state, "p0")
    c.get("/photos")  # the session cookie
    assert c.post(f"/api/v1/review/{sha}/label", json={"label": "Apple___healthy"}).status_code == 403
    r = c.post(f"/api/v1/review/{sha}/label", json={"label": "Apple___healthy"}, headers={"X-CSRF-Token": csrf_of(c)})
    assert r.status_code == 200


# ---- classify -------------------------------------------------------------------
def _fake_daemon(state: Path, stop: threading.Event) -> threading.Thread:
    """Answers photos that reach the inbox the way the daemon records them (the real one is tested in test_daemon)."""

    def run():
        seen = set()
        while not stop.is_set():
            for f in (state / "inbox").glob("upload-*"):
                if f.name in seen:
                    continue
                seen.add(f.name)
                sha = hashlib.sha256(f.read_bytes()).hexdigest()
                db = ResultsDB(state / "results.sqlite")
                db.commit(
                    [
                        ResultRow(
                            sha,
                            f"u{len(seen)}",
                            str(f),
                            "folder",
                            "Apple___healthy",
                            0.9,
                            [["Apple___healthy", 0.9]],
                            "v1",
                            {"total": 3.0},
                            verdict="confident",
                        )
                    ],
                    [],
                )
                db.close()
            time.sleep(0.05)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_classify_puts_the_photo_in_the_inbox_and_waits_for_its_result(state):
    stop = threading.Event()
    _fake_daemon(state, stop)
    try:
        c, auth = remote(state, "label")
        data = _photos(8)[7].read_bytes()
        r = c.post("/api/v1/classify?wait=10&name=leaf.jpg", content=data, headers={**auth, "Content-Type": "image/jpeg"})
        assert r.status_code == 200 and r.json()["sha256"] == hashlib.sha256(data).hexdigest() and r.json()["verdict"] == "confident"
        other = _photos(9)[8]
        r = c.post("/api/v1/classify", files={"photo": (other.name, other.read_bytes(), "image/jpeg")}, headers=auth)
        assert r.status_code == 200
    finally:
        stop.set()


def test_classify_without_a_daemon_answers_202_with_where_the_result_will_be(state):
    c, auth = remote(state, "label")
    r = c.post("/api/v1/classify?wait=0", content=_photos(8)[7].read_bytes(), headers=auth)
    assert r.status_code == 202
    body = r.json()
    assert body["status"] == "pending" and body["daemon_running"] is False and body["result"].endswith(body["sha256"])
    assert (state / "inbox" / body["stored_as"]).is_file()


@pytest.mark.parametrize("data,status", [(b"", 400), (b"not an image at all", 415), (b"\xff\xd8\xff" + b"\x00" * 50, 415)])
def test_classify_refuses_what_is_not_a_photo_and_stores_nothing(state, data, status):
    c, auth = remote(state, "label")
    r = c.post("/api/v1/classify?wait=0", content=data, headers=auth)
    assert r.status_code == status and r.json()["error"]
    assert not (state / "inbox").exists() or not [p for p in (state / "inbox").iterdir() if p.name.startswith("upload-")]


def test_classify_refuses_a_photo_over_the_size_cap_with_413(state):
    c, auth = remote(state, "label")
    big = _photos(1)[0].read_bytes()
    t = TestClient(app_for(state, max_file_bytes=len(big) - 1), base_url="http://localhost", client=REMOTE)
    assert t.post("/api/v1/classify?wait=0", content=big, headers=auth).status_code == 413


def test_a_photo_the_daemon_quarantines_is_answered_422_with_its_reason(state):
    c, auth = remote(state, "label")
    data = _photos(8)[7].read_bytes()
    stop = threading.Event()

    def quarantine():
        while not stop.is_set():
            for f in (state / "inbox").glob("upload-*"):
                db = ResultsDB(state / "results.sqlite")
                db.add_quarantine(str(f), None, "decode failed: truncated", "folder")
                db.close()
                return
            time.sleep(0.05)

    threading.Thread(target=quarantine, daemon=True).start()
    try:
        r = c.post("/api/v1/classify?wait=10", content=data, headers=auth)
        assert r.status_code == 422 and "truncated" in r.json()["error"]
    finally:
        stop.set()


# ---- the document ---------------------------------------------------------------
def test_every_api_route_is_in_the_openapi_document_with_its_role(state):
    app = app_for(state)
    doc = client(state).get("/api/v1/openapi.json").json()
    assert doc == json.loads(json.dumps(document()))
    served = {
        (m.lower(), r.path) for r in app.routes if r.path.startswith("/api/v1/") and "{rest" not in r.path for m in r.methods - {"HEAD"}
    }
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert served == documented
    for ops in doc["paths"].values():
        for op in ops.values():
            assert op["x-role"] in ("read", "label", "admin")
            for resp in op["responses"].values():
                ref = resp.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
                assert ref is None or ref.rsplit("/", 1)[-1] in doc["components"]["schemas"], ref


def test_the_openapi_document_is_valid_openapi_3_1():
    validator = pytest.importorskip("openapi_spec_validator", reason="openapi-spec-validator is not installed")
    validator.validate(document())


def test_the_readme_api_reference_is_the_one_generated_from_the_document():
    readme = (REPO / "README.md").read_text()
    assert reference() in readme, "README's API reference is stale: python -m edge_agent.web.api, paste into README"


# ---- metrics --------------------------------------------------------------------
def _status(state: Path, **changes) -> None:
    import os

    from edge_agent.latency import LatencyHistograms

    hist = LatencyHistograms()
    hist.observe({"total": 120.0, "infer": 7.0, "preprocess": 3.0})
    hist.observe({"total": 40000.0, "infer": 8.0})
    status = {
        "pid": os.getpid(),
        "updated": time.time(),
        "engine": {"engine_version": "v0002", "type": "onnxruntime", "precision": "int8"},
        "counters": {"processed": 6, "quarantined": 1},
        "in_flight": 2,
        "queue_depths": {"decode": 1, "infer": 0, "sink": 0},
        "spool": {"bytes": 100, "quota_bytes": 1000},
        "hotswap": {"swaps": 1, "refused": {"v0003": "bad signature", "v0004": "failed the golden check"}},
        "latency_ms": hist.as_dict(),
        "alerts": {
            "pending": {"mqtt": 3},
            "sent:mqtt": 5,
            "failed:webhook-1": 2,
            "dropped": 0,
            "destinations": {"mqtt": {}, "webhook-1": {}},
        },
        "board": {"temperature_c": {"cpu-thermal": 51.5, 'odd"zone': 40.0}, "power_w": 7.25},
        "trust": {"trusted": ["Apple___Black_rot", "Tomato___healthy"], "withdrawals": 1, "last_withdrawal": None},
    }
    status.update(changes)
    (state / "status.json").write_text(json.dumps(status))


def test_metrics_parse_as_prometheus_text_and_carry_what_the_services_report(state):
    _status(state)
    r = client(state).get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert sum(v for (n, _), v in samples.items() if n == "edge_agent_photos_total") == 6
    assert samples[("edge_agent_daemon_up", ())] == 1
    assert samples[("edge_agent_queue_depth", (("stage", "decode"),))] == 1
    assert samples[("edge_agent_engine_refused_versions", ())] == 2
    assert samples[("edge_agent_alerts_sent_total", (("destination", "mqtt"),))] == 5
    assert samples[("edge_agent_alerts_failed_total", (("destination", "webhook-1"),))] == 2
    assert samples[("edge_agent_alerts_pending", (("destination", "mqtt"),))] == 3
    assert samples[("edge_agent_temperature_celsius", (("zone", "cpu-thermal"),))] == 51.5
    assert samples[("edge_agent_temperature_celsius", (("zone", 'odd"zone'),))] == 40.0
    assert samples[("edge_agent_power_watts", ())] == 7.25
    assert families["edge_agent_latency_seconds"].type == "histogram"
    assert samples[("edge_agent_latency_seconds_bucket", (("le", "0.25"), ("stage", "total")))] == 1
    assert samples[("edge_agent_latency_seconds_bucket", (("le", "+Inf"), ("stage", "total")))] == 2
    assert samples[("edge_agent_latency_seconds_count", (("stage", "preprocess"),))] == 1
    assert samples[("edge_agent_label_queue", (("kind", "review"),))] == 2
    assert samples[("edge_agent_class_trusted", (("label", "Apple___Black_rot"),))] == 1
    assert len([n for n, _ in samples if n == "edge_agent_class_trusted"]) == 2 and samples[("edge_agent_withdrawals_total", ())] == 1


def test_metrics_list_no_trusted_class_before_the_daemon_has_read_the_checks(state):
    _status(state, trust={"trusted": None, "withdrawals": 0, "last_withdrawal": None})
    text = client(state).get("/metrics").text
    assert "edge_agent_class_trusted" not in text and "edge_agent_withdrawals_total 0" in text


def test_metrics_of_a_fresh_state_directory_say_nothing_runs(tmp_path):
    text = client(tmp_path / "fresh").get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["edge_agent_daemon_up"].samples[0].value == 0
    assert families["edge_agent_trainer_up"].samples[0].value == 0


def test_a_half_written_status_file_gives_metrics_without_the_daemons_part(state):
    (state / "status.json").write_text('{"pid": 1, "counters": {"proc')
    r = client(state).get("/metrics")
    assert r.status_code == 200
    assert {f.name for f in text_string_to_metric_families(r.text)} >= {"edge_agent_daemon_up", "edge_agent_photos"}


def test_every_metric_served_is_listed_in_the_readme(state):
    _status(state)
    text = client(state).get("/metrics").text
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    readme = (REPO / "README.md").read_text()
    assert len(names) > 15 and not [n for n in names if f"`{n}" not in readme]


def test_every_api_example_in_the_readme_names_a_documented_path_with_ids_of_the_documented_format():
    """The README's ids look like real ones (a photo id is 16 hex digits), checked against the OpenAPI document."""
    import re

    doc = document()
    readme = (REPO / "README.md").read_text()
    examples = re.findall(r"https?://[^\s/]+(/api/v1/[^\s\"'?\\]*)", readme)
    assert len(examples) >= 4
    for path in examples:
        matched = False
        for template, ops in doc["paths"].items():
            rx = "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template) + "$"
            m = re.match(rx, path)
            if not m:
                continue
            params = {p["name"]: p for op in ops.values() for p in op.get("parameters", []) if p["in"] == "path"}
            for name, value in m.groupdict().items():
                pattern = params[name]["schema"].get("pattern")
                assert pattern and re.match(pattern, value), f"README example {path}: {name}={value!r} is not {pattern}"
            matched = True
        assert matched, f"README example {path} is not a documented path"


def test_the_readme_says_which_metric_families_are_always_served_and_a_fresh_device_serves_exactly_those(tmp_path):
    """A dashboard built from the README knows which families can be absent (no daemon, no trainer, no sensor)."""
    import re

    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| metric | what | served |") :].split("\n\n")[0].splitlines()[2:]
    always = {n for row in table if row.rstrip().endswith("| always |") for n in re.findall(r"`(edge_agent_\w+)", row.split("|")[1])}
    marked = {n for row in table for n in re.findall(r"`(edge_agent_\w+)", row.split("|")[1])}
    fresh = client(tmp_path / "fresh").get("/metrics").text
    served = {line.split()[2] for line in fresh.splitlines() if line.startswith("# TYPE ")}
    assert served == always, (served, always)
    assert len(marked) > len(always) + 10


def test_health_says_what_the_next_version_waits_for_at_the_top(state):
    import os

    from edge_agent.state import write_status

    (state / "trainer").mkdir(exist_ok=True)
    nxt = {"sentence": "22 more expert labels, at least 9 of Cedar apple rust (Apple)", "waiting_for": "field_check", "by_class": {}}
    write_status(state / "trainer" / "status.json", {"pid": os.getpid(), "updated": time.time(), "state": "idle", "next_publish": nxt})
    body = client(state).get("/api/v1/health").json()
    assert body["next_publish"]["sentence"].startswith("22 more expert labels") and body["retention"] is None
