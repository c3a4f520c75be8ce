"""Alerts: the rules, the quiet period, the outbox on disk (quota, backoff, restarts) and signed webhooks."""

from __future__ import annotations

import hashlib
import hmac
import json
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edge_agent.alerts.config import AlertsSection, MqttSection, WebhookSection
from edge_agent.alerts.messages import alert_body
from edge_agent.alerts.outbox import DeliveryError, Outbox
from edge_agent.alerts.rules import AlertRules, Candidate, is_disease
from edge_agent.alerts.webhook import Webhook, signature
from edge_agent.alerts.worker import AlertWorker
from edge_agent.config import ConfigError, parse_config
from edge_agent.ledger_rows import ResultRow
from edge_agent.names import describe_class
from edge_agent.results import ResultsDB

from .conftest import rot_pages

NO_MQTT = MqttSection()
_n = iter(range(10**6))


def _result(db: ResultsDB, label: str, p: float = 0.97, verdict: str = "confident", created: float | None = None) -> str:
    sha = f"{next(_n):064x}"
    db.commit(
        [ResultRow(sha, sha[:16], None, "inbox", label, p, [[label, p]], "v1000", {}, created=created or time.time(), verdict=verdict)]
    )
    return sha


def _cand(label: str, created: float = 1000.0, verdict: str = "confident", p: float = 0.9) -> Candidate:
    return Candidate(1, created, "greenhouse", label, p, verdict, "abcd", "ab" * 32)


class _Receiver:
    """A local HTTP server that answers with the statuses it is given, in turn, and keeps what it received."""

    def __init__(self, statuses=(200,)) -> None:
        self.statuses, self.got = list(statuses), []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append((dict(self.headers), body))
                code = outer.statuses.pop(0) if len(outer.statuses) > 1 else outer.statuses[0]
                self.send_response(code)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = _Receiver()
    yield r
    r.close()


# ---- rules -----------------------------------------------------------------------------
def test_any_disease_means_every_class_not_named_healthy():
    assert is_disease("Tomato___Late_blight") and not is_disease("Tomato___healthy") and not is_disease("Apple___healthy")
    rules = AlertRules(AlertsSection())
    assert rules.wants(_cand("Tomato___Late_blight"))
    assert not rules.wants(_cand("Tomato___healthy"))


def test_by_default_only_a_confident_answer_raises_an_alert():
    rules = AlertRules(AlertsSection())
    assert not rules.wants(_cand("Tomato___Late_blight", verdict="unsure"))
    assert not rules.wants(_cand("Tomato___Late_blight", verdict="unknown"))


def test_named_classes_and_a_minimum_confidence_narrow_the_rule():
    rules = AlertRules(AlertsSection(classes=["Tomato___Late_blight"], min_confidence=0.8, verdicts=["confident", "unsure"]))
    assert rules.wants(_cand("Tomato___Late_blight", verdict="unsure", p=0.85))
    assert not rules.wants(_cand("Tomato___Late_blight", p=0.7))
    assert not rules.wants(_cand("Potato___Late_blight"))
    assert not AlertRules(AlertsSection(enabled=False)).wants(_cand("Tomato___Late_blight"))


def test_the_quiet_period_holds_the_same_class_for_an_hour():
    rules = AlertRules(AlertsSection())
    assert not rules.quiet(_cand("X___y", created=5000), None)
    assert rules.quiet(_cand("X___y", created=5000), 5000 - 3599)
    assert not rules.quiet(_cand("X___y", created=5000), 5000 - 3600)


def test_an_alert_stamped_after_the_photo_by_a_clock_since_set_back_silences_nothing():
    """A board whose clock ran months ahead, then was corrected: its last alert looks to come from the future."""
    rules = AlertRules(AlertsSection())
    assert not rules.quiet(_cand("X___y", created=5000), 5000 + 90 * 86400)
    assert not rules.quiet(_cand("X___y", created=5000), 5001)


def test_a_bad_digest_time_or_webhook_url_is_refused_with_the_key_named():
    with pytest.raises(ConfigError, match=r"alerts.digest_at: must be HH:MM"):
        parse_config({"alerts": {"digest_at": "25:00"}})
    with pytest.raises(ConfigError, match=r"webhooks.0.url: must start with http"):
        parse_config({"webhooks": [{"url": "ftp://x"}]})
    with pytest.raises(ConfigError, match=r"mqtt.prefix"):
        parse_config({"mqtt": {"prefix": "farm/#"}})


def test_an_alert_says_in_words_what_was_seen_and_links_the_photo():
    assert describe_class("Corn_(maize)___Cercospora_leaf_spot Gray_leaf_spot") == ("Corn (maize)", "Cercospora leaf spot Gray leaf spot")
    body = alert_body(_cand("Tomato___Late_blight"), "http://greenhouse.local:8080/")
    assert body["title"] == "Late blight seen on greenhouse" and "90% sure" in body["message"]
    assert body["url"] == "http://greenhouse.local:8080/photo/" + "ab" * 32 and body["event_type"] == "disease"


def test_an_answer_that_is_not_sure_is_never_worded_as_a_finding():
    sure = alert_body(_cand("Apple___Apple_scab", verdict="confident", p=1.0))
    assert sure["title"] == "Apple scab seen on greenhouse" and sure["priority"] == 8
    unsure = alert_body(
        Candidate(1, 1000.0, "greenhouse", "Apple___Apple_scab", 0.9998, "unsure", "abcd", "ab" * 32, "further from the training photos")
    )
    assert unsure["title"] == "Possibly Apple scab on greenhouse" and "seen" not in unsure["title"]
    assert "not sure: further from the training photos" in unsure["message"] and "100% sure" not in unsure["message"]
    assert unsure["verdict_reason"] == "further from the training photos" and unsure["priority"] < 8
    unknown = alert_body(Candidate(1, 1000.0, "greenhouse", "Apple___Apple_scab", 0.6, "unknown", "abcd", "ab" * 32, "too dark"))
    assert unknown["title"] == "A photo unlike any the model knows on greenhouse"
    assert unknown["message"].startswith("Not a plant or disease the model knows: too dark (best guess Apple scab on Apple)")


def test_an_alert_on_a_not_sure_answer_carries_the_photos_reason_and_a_lower_ntfy_priority(tmp_path, receiver):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, [receiver.url], verdicts=["confident", "unsure"])
    sha = f"{next(_n):064x}"
    row = ResultRow(sha, sha[:16], None, "inbox", "Tomato___Late_blight", 0.99, [["Tomato___Late_blight", 0.99]], "v1", {})
    row.verdict, row.verdict_reason = "unsure", "the photo is too dark"
    db.commit([row])
    _result(db, "Potato___Early_blight")
    assert w.scan() == 2
    w.deliver()
    bodies = [json.loads(b) for _, b in receiver.got]
    assert [(b["label"], b["verdict"], b["verdict_reason"]) for b in bodies] == [
        ("Tomato___Late_blight", "unsure", "the photo is too dark"),
        ("Potato___Early_blight", "confident", ""),
    ]
    assert bodies[0]["title"] == "Possibly Late blight on greenhouse"
    w.stop()
    db.close()
    box = Outbox(tmp_path / "ntfy.sqlite", 1 << 20)
    box.put([("webhook:0", "alert", receiver.url, json.dumps(b).encode(), 1, False) for b in bodies])
    receiver.got.clear()
    Webhook(WebhookSection(url=receiver.url, format="ntfy"), 0).send(box.due("webhook:0"))
    assert [h["Priority"] for h, _ in receiver.got] == ["default", "high"]
    box.close()


def test_an_alert_worker_reads_a_ledger_from_before_reasons_were_kept(tmp_path, receiver):
    import sqlite3

    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, [receiver.url])
    db.close()
    with sqlite3.connect(tmp_path / "results.sqlite") as con:  # as a daemon before 2026-12 left it
        con.execute("ALTER TABLE results DROP COLUMN verdict_reason")
    with sqlite3.connect(tmp_path / "results.sqlite") as con:
        con.execute(
            "INSERT INTO results (sha256, photo_id, source, label, confidence, top_k, engine_version, timings, created, verdict)"
            " VALUES (?,?,?,?,?,?,?,?,?,?)",
            ("cd" * 32, "cdcd", "inbox", "Tomato___Late_blight", 0.97, "[]", "v1", "{}", time.time(), "confident"),
        )
    assert w.scan() == 1
    w.deliver()
    assert [json.loads(b)["verdict_reason"] for _, b in receiver.got] == [""]
    w.stop()


def test_the_last_diagnosis_home_assistant_shows_is_as_sure_as_the_answer(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path)
    said = []
    for verdict in ("confident", "unsure", "unknown"):
        _result(db, "Tomato___Late_blight", verdict=verdict)
        w.scan()
        said.append(json.loads(w._retained_state()[0][1])["last_diagnosis"])
    assert said == ["Late blight (Tomato)", "not sure: Late blight (Tomato)?", "not a plant it knows (best guess Late blight (Tomato))"]
    w.stop()
    db.close()


def test_the_digest_counts_as_seen_only_the_answers_that_may_alert_and_the_doubtful_apart(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, digest_at="00:00")
    for _ in range(2):
        _result(db, "Apple___Apple_scab")
    for _ in range(5):
        _result(db, "Apple___Apple_scab", verdict="unsure")
    for _ in range(3):
        _result(db, "Apple___Black_rot", verdict="unknown")
    _result(db, "Apple___healthy")
    body = w.digest_due(time.time())
    assert body["photos"] == 11 and body["by_class"]["Apple___Apple_scab"] == 7
    assert body["by_verdict"] == {"confident": 3, "unsure": 5, "unknown": 3}
    assert body["message"] == "Apple scab (Apple): 2; 5 not sure and 3 unlike any plant known (ask an expert: the Review page)"
    w.stop()
    db.close()


def test_the_digest_marks_a_disease_that_cannot_wait(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, digest_at="00:00")
    _result(db, "Potato___Late_blight")
    _result(db, "Apple___Apple_scab")
    body = w.digest_due(time.time())
    assert body["message"].startswith("Late blight (Potato): 1 (urgent); Apple scab (Apple): 1") or body["message"].startswith(
        "Apple scab (Apple): 1; Late blight (Potato): 1 (urgent)"
    ), body["message"]
    assert "Apple scab (Apple): 1 (urgent)" not in body["message"]
    w.stop()
    db.close()


# ---- the outbox --------------------------------------------------------------------------
def test_the_outbox_keeps_messages_across_a_restart_until_delivered(tmp_path):
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    box.put([("webhook:0", "alert", "u", b"{}", 1, False)] * 3, cursor=7)
    box.close()
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    due = box.due("webhook:0")
    assert len(due) == 3 and box.get("cursor") == "7"
    box.delivered([m.id for m in due[:2]], "webhook:0")
    assert len(box.due("webhook:0")) == 1 and box.counts()["sent:webhook:0"] == 2
    box.close()


def test_a_failed_delivery_waits_twice_as_long_each_time_up_to_the_cap(tmp_path):
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20, retry_max_s=5)
    box.put([("mqtt", "alert", "t", b"x", 1, False)])
    waits = []
    for _ in range(5):
        (m,) = box.due("mqtt", now=time.time() + 3600)
        waits.append(round(box.failed([m.id], "mqtt", "down")))
    assert waits == [1, 2, 4, 5, 5]
    assert box.due("mqtt") == [] and box.counts()["failed:mqtt"] == 5


def test_alerts_that_failed_while_the_clock_ran_ahead_are_due_once_it_is_set_back_and_no_wait_passes_the_cap(tmp_path):
    import sqlite3

    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20, retry_max_s=300)
    box.put([("mqtt", "alert", "t", b"ahead", 1, False), ("mqtt", "alert", "t", b"waiting", 1, False)])
    box.close()
    with sqlite3.connect(tmp_path / "alerts.sqlite") as con:  # failed at a time forty days ahead of the clock now
        con.execute("UPDATE outbox SET next_try = ? WHERE payload = ?", (time.time() + 40 * 86400, b"ahead"))
        con.execute("UPDATE outbox SET next_try = ? WHERE payload = ?", (time.time() + 200, b"waiting"))  # a fair backoff
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20, retry_max_s=300)
    (m,) = box.due("mqtt")
    assert m.payload == b"ahead"
    assert box.failed([m.id], "mqtt", "down") <= 300  # not the forty days the other's stamp would say
    box.close()


def test_past_the_quota_results_go_before_alerts_and_the_drop_is_counted(tmp_path):
    box = Outbox(tmp_path / "alerts.sqlite", quota_bytes=1 << 20)
    k = 250 << 10
    box.put([("mqtt", "alert", "a", b"A" * k, 1, False), ("mqtt", "result", "r", b"R" * k, 0, False)])
    box.put([("mqtt", "alert", "a", b"B" * k, 1, False), ("mqtt", "alert", "a", b"C" * k, 1, False)])
    kept = [m.payload[:1] for m in box.due("mqtt")]
    assert kept == [b"A", b"B", b"C"] and box.counts()["dropped"] == 1
    box.put([("mqtt", "alert", "a", b"D" * k, 1, False)])  # only alerts left: the oldest goes
    assert [m.payload[:1] for m in box.due("mqtt")] == [b"B", b"C", b"D"] and box.counts()["dropped"] == 2


def test_the_outbox_takes_no_more_disk_than_its_quota_however_much_passes_through_it(tmp_path):
    """Counted on disk, its log included (the red team found 6 MB on disk for a 1 MiB quota)."""
    quota = 1 << 20
    box = Outbox(tmp_path / "alerts.sqlite", quota_bytes=quota)
    most = 0
    for i in range(200):  # 200 rounds of 30 KiB: six times the quota through it, half delivered as it goes
        box.put([("webhook:0", "alert", "u", bytes([i % 250]) * (30 << 10), 1, False)])
        if i % 2:
            box.delivered([m.id for m in box.due("webhook:0", limit=1)], "webhook:0")
        most = max(most, box.disk_bytes())
    assert most <= quota * 1.25, most
    assert box.counts()["dropped"] > 0 and box.counts()["disk_bytes"] <= quota * 1.25


def test_a_corrupt_outbox_is_kept_aside_and_a_new_one_started_so_the_daemon_starts(tmp_path):
    (tmp_path / "alerts.sqlite").write_bytes(b"this is not a database" * 100)
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("alerts.sqlite.corrupt-")]
    assert len(aside) == 1 and aside[0] in box.recovered and "alerts.sqlite was unreadable" in box.recovered
    box.put([("webhook:0", "alert", "u", b"{}", 1, False)])
    assert len(box.due("webhook:0")) == 1 and box.counts()["recovered"] == box.recovered


def test_an_outbox_with_a_rotted_page_is_set_aside_at_the_start_and_when_a_round_meets_it(tmp_path):
    """Its header whole, a page rotted in place: the start opened it (only the first page was read) and every round of
    the worker and every courier then failed on it until the daemon was restarted, which opened it the same way: no
    alert went out again. Now the start reads it whole (at most queue_mb, milliseconds), and a round that meets such
    a page sets it aside and starts a new one, its cursor at the ledger's end."""
    import sqlite3

    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    box.put([("webhook:0", "alert", "u", b"{}" * 2000, 1, False) for _ in range(20)])
    box.close()
    rot_pages(tmp_path / "alerts.sqlite", "outbox")
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)  # the start
    assert box.recovered and "unreadable (integrity check" in box.recovered and box.due("webhook:0") == []
    box.put([("webhook:0", "alert", "u", b"{}" * 2000, 1, False) for _ in range(20)])
    rot_pages(tmp_path / "alerts.sqlite", "outbox")  # while it runs
    malformed = sqlite3.DatabaseError("database disk image is malformed")
    assert not box.renew_if_damaged(sqlite3.OperationalError("database is locked"))  # not damage: kept
    assert box.renew_if_damaged(malformed) and "found damaged" in box.recovered
    assert len([f for f in tmp_path.glob("alerts.sqlite.corrupt-*") if not f.name.endswith(("-wal", "-shm"))]) == 2
    box.put([("webhook:0", "alert", "u", b"{}", 1, False)])
    assert len(box.due("webhook:0")) == 1
    assert not box.renew_if_damaged(malformed)  # a damaged page elsewhere (the ledger's): this outbox is whole, kept
    box.close()


def test_the_alert_worker_meeting_a_rotted_outbox_starts_a_new_one_at_the_ledgers_end(tmp_path):
    """A round that fails on a damaged page of the outbox: a new outbox, its cursor where the ledger ends (its results
    before then raise no alert twice or late), said in the log."""
    import sqlite3

    from structlog.testing import capture_logs

    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path)
    w.outbox.put([("webhook:0", "alert", "u", b"{}" * 2000, 1, False) for _ in range(20)])
    for _ in range(3):
        _result(db, "Apple___Apple_scab")
    w.outbox.set("cursor", "0")
    w.outbox._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # (its pages in the file, as most of the time)
    rot_pages(tmp_path / "alerts.sqlite", "outbox")
    with capture_logs() as logs:
        w.renew_if_damaged(sqlite3.DatabaseError("database disk image is malformed"))
    assert [e["event"] for e in logs] == ["alerts_outbox_recovered"]
    assert w.outbox.get("cursor") == str(db.last_result_id()) and w.outbox.due("webhook:0") == []
    w.outbox.close()
    db.close()


# ---- webhooks ------------------------------------------------------------------------------
def test_a_webhook_posts_the_json_signed_with_the_shared_secret(tmp_path, receiver):
    (tmp_path / "secret").write_text("s3cret\n")
    hook = Webhook(WebhookSection(url=receiver.url, secret_file=str(tmp_path / "secret")), 0)
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    body = json.dumps({"title": "t", "message": "m"}).encode()
    box.put([("webhook:0", "alert", receiver.url, body, 1, False)])
    assert hook.send(box.due("webhook:0")) != []
    headers, got = receiver.got[0]
    assert got == body and headers["Content-Type"] == "application/json"
    expected = hmac.new(b"s3cret", headers["X-Edge-Agent-Timestamp"].encode() + b"." + body, hashlib.sha256).hexdigest()
    assert headers["X-Edge-Agent-Signature"] == "sha256=" + expected == signature(b"s3cret", headers["X-Edge-Agent-Timestamp"], body)


def test_an_ntfy_webhook_sends_the_message_as_text_with_a_title(tmp_path, receiver):
    hook = Webhook(WebhookSection(url=receiver.url, format="ntfy"), 0)
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    box.put(
        [
            (
                "webhook:0",
                "alert",
                receiver.url,
                json.dumps({"title": "Late blight seen on shed", "message": "Late blight on Tomato"}).encode(),
                1,
                False,
            )
        ]
    )
    hook.send(box.due("webhook:0"))
    headers, got = receiver.got[0]
    assert got == b"Late blight on Tomato" and headers["Title"] == "Late blight seen on shed" and headers["Priority"] == "high"


def test_a_webhook_that_answers_500_or_is_not_there_keeps_the_message(tmp_path):
    down = _Receiver([500])
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    box.put([("webhook:0", "alert", down.url, b"{}", 1, False)])
    with pytest.raises(DeliveryError, match="HTTP 500"):
        Webhook(WebhookSection(url=down.url), 0).send(box.due("webhook:0"))
    down.close()
    with pytest.raises(DeliveryError, match="127.0.0.1"):
        Webhook(WebhookSection(url=down.url, timeout_s=2), 0).send(box.due("webhook:0"))
    assert len(box.due("webhook:0")) == 1


@pytest.mark.parametrize("mode", ["hang", "garbage", "drip", "drip fast", "cut", "redirect", "refuse"])
def test_an_endpoint_that_hangs_drips_answers_garbage_or_redirects_fails_in_its_deadline_and_keeps_the_message(tmp_path, mode):
    """Never delivered, never fatal: a DeliveryError within ``timeout_s`` (however slowly it drips: its status line
    whole before the deadline included) saying what happened; a 302 is not a delivery (a POST is not followed)."""
    from tests.bad_endpoints import BadEndpoint

    bad = BadEndpoint(mode.split()[0], drip_s=0.02 if mode == "drip fast" else 0.5)
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    box.put([("webhook:0", "alert", bad.url, b"{}", 1, False)])
    hook = Webhook(WebhookSection(url=bad.url, timeout_s=1.5), 0)
    started = time.monotonic()
    try:
        with pytest.raises(DeliveryError) as caught:
            hook.send(box.due("webhook:0"))
    finally:
        bad.close()
    assert time.monotonic() - started < 4.0, mode
    why = str(caught.value)
    assert (
        bad.url.rsplit("/", 1)[0] + "/..." in why
        and "/hook" not in why
        and {"hang": "within 1.5 s", "drip": "within 1.5 s", "drip fast": "within 1.5 s", "redirect": "302"}.get(mode, "") in why
    )
    assert len(box.due("webhook:0")) == 1 and hook.last_error == why


def test_a_batch_that_fails_halfway_marks_the_first_delivered_and_only_the_rest_for_a_retry(tmp_path):
    from tests.bad_endpoints import BadEndpoint

    db = ResultsDB(tmp_path / "results.sqlite")
    r = BadEndpoint("ok")
    w = _worker(tmp_path, db.path, [r.url])
    w.outbox.put([("webhook:0", "alert", r.url, b'{"n": %d}' % i, 1, False) for i in range(3)])
    real = w.webhooks[0][0]._post
    calls = []

    def second_fails(body, headers):
        calls.append(body)
        if len(calls) == 2:
            raise DeliveryError("down for one")
        real(body, headers)

    w.webhooks[0][0]._post = second_fails
    w.deliver()
    assert [b for _, b in r.got] == [b'{"n": 0}'] and len(w.outbox.due("webhook:0", now=time.time() + 3600)) == 2
    assert w.outbox.counts()["sent:webhook:0"] == 1
    r.close()
    w.stop()
    db.close()


@pytest.mark.parametrize("mode", ["hang", "garbage", "drip", "cut", "redirect"])
def test_one_broken_webhook_holds_back_no_other_destination_and_its_backlog_goes_once_it_is_fixed(tmp_path, mode):
    """The running worker: two webhooks, one broken. Every alert reaches the good one within a second while the bad
    one hangs, drips or answers garbage; the worker stays alive; once the bad one is fixed it gets its backlog."""
    from tests.bad_endpoints import BadEndpoint

    db = ResultsDB(tmp_path / "results.sqlite")
    good, bad = BadEndpoint("ok"), BadEndpoint(mode)
    hooks = [WebhookSection(url=bad.url, timeout_s=3), WebhookSection(url=good.url, timeout_s=3)]
    w = AlertWorker(AlertsSection(quiet_period_s=0, retry_max_s=1), NO_MQTT, hooks, db.path, tmp_path, "greenhouse")
    w.poll_s = 0.05
    w.start()
    try:
        lags = []
        for i in range(6):
            raised = time.time()
            _result(db, f"Tomato___Disease_{i}")
            deadline = time.time() + 5
            while len(good.got) <= i and time.time() < deadline:
                time.sleep(0.02)
            assert len(good.got) == i + 1, f"alert {i} did not reach the good endpoint while the bad one was {mode}"
            lags.append(good.got[i][0] - raised)
        assert max(lags) < 1.0, lags
        assert w.alive() and all(t.is_alive() for t in w._couriers)
        deadline = time.time() + 5  # a hung POST fails at its deadline (3 s)
        while not w.status()["destinations"]["webhook:0"]["error"] and time.time() < deadline:
            time.sleep(0.05)
        assert "webhook:0" in w.outbox.counts()["pending"] and w.status()["destinations"]["webhook:0"]["error"]
        bad.mode = "ok"  # fixed
        deadline = time.time() + 15
        # The endpoint keeps a body before it answers 200: the outbox clears a moment after the last one arrives.
        while (len(bad.got) < 6 or "webhook:0" in w.outbox.counts()["pending"]) and time.time() < deadline:
            time.sleep(0.05)
        assert len(bad.got) == 6 and "webhook:0" not in w.outbox.counts()["pending"], (len(bad.got), w.outbox.counts())
    finally:
        w.stop()
        good.close()
        bad.close()
        db.close()


def test_a_missing_secret_file_is_named_at_start(tmp_path):
    with pytest.raises(DeliveryError, match="secret_file .*nope"):
        Webhook(WebhookSection(url="http://127.0.0.1:9/x", secret_file=str(tmp_path / "nope")), 0)


def test_a_results_ledger_locked_past_the_wait_keeps_the_crops_the_expert_labelled_and_asks_again(tmp_path):
    """A locked ledger once read as "no expert labels": for a minute every crop alerted, the farm's crops forgotten."""
    import sqlite3

    db = ResultsDB(tmp_path / "results.sqlite")
    db._db.execute("INSERT INTO expert_labels (sha256, label, labelled) VALUES (?, ?, ?)", ("ab" * 32, "Apple___healthy", time.time()))
    db.close()
    w = _worker(tmp_path, tmp_path / "results.sqlite")
    w.wait_s = 0.2
    w._labelled_crops()
    assert w.rules.labelled_crops == {"Apple"}
    w._con.close()  # the holder below needs the file to itself
    w._con, w._crops_read = None, 0.0
    holder = sqlite3.connect(tmp_path / "results.sqlite", isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("DELETE FROM expert_labels WHERE 0")  # a write: the lock is taken and kept
    w._labelled_crops()
    assert w.rules.labelled_crops == {"Apple"} and w._crops_read == 0.0  # kept, and read again at the next scan
    holder.close()
    w._con.close()
    w._con = None
    w._labelled_crops()
    assert w.rules.labelled_crops == {"Apple"} and w._crops_read > 0
    w.outbox.close()


# ---- the worker ------------------------------------------------------------------------------
def _worker(tmp_path, db_path, hooks=(), **alerts) -> AlertWorker:
    return AlertWorker(AlertsSection(**alerts), NO_MQTT, [WebhookSection(url=u) for u in hooks], db_path, tmp_path, "greenhouse")


def test_one_alert_per_class_within_the_quiet_period_and_none_for_history(tmp_path, receiver):
    db = ResultsDB(tmp_path / "results.sqlite")
    _result(db, "Tomato___Late_blight")  # before the first start: history
    w = _worker(tmp_path, db.path, [receiver.url])
    for _ in range(3):
        _result(db, "Tomato___Late_blight")
    _result(db, "Tomato___healthy")
    _result(db, "Potato___Early_blight", verdict="unsure")
    _result(db, "Potato___Early_blight")
    assert w.scan() == 6
    w.deliver()
    labels = [json.loads(b)["label"] for _, b in receiver.got]
    assert labels == ["Tomato___Late_blight", "Potato___Early_blight"]
    _result(db, "Tomato___Late_blight", created=time.time() + 3601)  # after the quiet period
    w.scan()
    w.deliver()
    assert len(receiver.got) == 3
    w.stop()
    db.close()


def test_a_result_classified_before_the_worker_first_started_but_after_the_daemon_did_still_alerts(tmp_path, receiver):
    """The daemon starts its alert worker after READY=1, while the inbox is already being classified."""
    db = ResultsDB(tmp_path / "results.sqlite")
    _result(db, "Tomato___healthy")  # before the daemon started: history
    started_after = db.last_result_id()
    _result(db, "Tomato___Late_blight")  # classified between READY=1 and the worker's start
    w = AlertWorker(
        AlertsSection(), NO_MQTT, [WebhookSection(url=receiver.url)], db.path, tmp_path, "greenhouse", start_after=started_after
    )
    assert w.scan() == 1
    w.deliver()
    assert [json.loads(b)["label"] for _, b in receiver.got] == ["Tomato___Late_blight"]
    w.stop()
    db.close()


def test_a_restart_neither_misses_a_result_nor_alerts_twice(tmp_path, receiver):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, [receiver.url])
    _result(db, "Tomato___Late_blight")
    w.scan()
    w.stop()  # stopped before delivering
    _result(db, "Apple___Apple_scab")  # arrives while the alert thread is down
    _result(db, "Tomato___Late_blight")  # same class: still quiet after the restart
    w = _worker(tmp_path, db.path, [receiver.url])
    w.scan()
    w.deliver()
    assert sorted(json.loads(b)["label"] for _, b in receiver.got) == ["Apple___Apple_scab", "Tomato___Late_blight"]
    w.stop()
    db.close()


def test_a_dead_endpoint_queues_the_alert_and_delivers_it_when_back(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    r = _Receiver([503, 503, 200])
    w = _worker(tmp_path, db.path, [r.url])
    _result(db, "Tomato___Late_blight")
    w.scan()
    for _ in range(3):
        w._next_try.clear()
        w.outbox._db.execute("UPDATE outbox SET next_try = 0")
        w.deliver()
    assert len(r.got) == 3 and w.outbox.counts()["pending"] == {} and w.outbox.counts()["failed:webhook:0"] == 2
    r.close()
    w.stop()
    db.close()


def test_a_burst_of_results_publishes_at_most_results_per_s_on_mqtt_and_every_alert(tmp_path, receiver):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, [receiver.url])
    live = []

    class _Mqtt:
        def live(self, topic, payload, retain=False):
            live.append(topic)

    w.mqtt, w.results_per_s = _Mqtt(), 5
    for i in range(30):
        _result(db, ["Tomato___Late_blight", "Apple___Apple_scab", "Tomato___healthy"][i % 3])
    assert w.scan() == 30
    assert 5 <= len(live) <= 10  # one second's budget (two if the scan straddled a second)
    w.deliver()
    assert sorted(json.loads(b)["label"] for _, b in receiver.got) == ["Apple___Apple_scab", "Tomato___Late_blight"]
    w.stop()
    db.close()


class _Flaky:
    """A destination that fails until its peer "reconnects" (``connects`` goes up, as MqttLink's does)."""

    name = "flaky"

    def __init__(self) -> None:
        self.connects, self.up, self.sent = 0, False, []

    def send(self, messages):
        if not self.up:
            raise DeliveryError("peer down")
        self.sent += [m.id for m in messages]
        return [m.id for m in messages]

    def close(self) -> None:
        pass


def test_a_peer_that_reconnects_gets_the_queued_alerts_at_once_not_after_the_backoff(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path)
    flaky = _Flaky()
    w.destinations = [flaky]
    _result(db, "Tomato___Late_blight")
    w.scan()
    w.outbox.put([("flaky", "alert", "t", b"x", 1, False)])
    for _ in range(5):  # five failures: the next try is ~32 s away
        w._next_try.pop("flaky", None)
        w.deliver()
    w.deliver()
    assert flaky.sent == [] and w.outbox.counts()["pending"]["flaky"] == 1
    flaky.up, flaky.connects = True, 1
    w.deliver()
    assert len(flaky.sent) == 1 and "flaky" not in w.outbox.counts()["pending"]
    w.stop()
    db.close()


def test_engine_swaps_refusals_and_health_changes_become_events(tmp_path, receiver):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(AlertsSection(), NO_MQTT, [WebhookSection(url=receiver.url, events=["engine", "health"])], db.path, tmp_path, "shed")
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}}
    w.observe(st)
    w.observe(
        st | {"engine": {"engine_version": "v1001"}, "hotswap": {"refused": {"v1002": "signature does not verify"}}, "healthy": False}
    )
    w.deliver()
    events = [(h["X-Edge-Agent-Event"], json.loads(b)["event"]) for h, b in receiver.got]
    assert events == [("engine", "swapped"), ("engine", "refused"), ("health", "unhealthy")]
    w.stop()
    db.close()


def test_a_card_a_backup_found_failing_is_sent_once_as_a_health_event(tmp_path, receiver):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(AlertsSection(), NO_MQTT, [WebhookSection(url=receiver.url, events=["health"])], db.path, tmp_path, "shed")
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}, "backup": {"failed": None}}
    found = {"time": time.time(), "files": ["golden.npz"]}
    w.observe(st)
    w.observe(st | {"backup": {"failed": None, "card_suspect": found}})
    w.observe(st | {"backup": {"failed": None, "card_suspect": found}})  # still said by status: not sent again
    w.deliver()
    got = [json.loads(b) for _, b in receiver.got]
    assert [(b["event"], b["files"]) for b in got] == [("card_failing", ["golden.npz"])]
    assert "put a new card in soon" in got[0]["message"]
    w.stop()
    db.close()


def test_engine_and_health_events_say_what_happened_on_a_phone(tmp_path, receiver):
    """An ntfy notification shows a title and the message: an event with neither arrived blank."""
    db = ResultsDB(tmp_path / "results.sqlite")
    hook = WebhookSection(url=receiver.url, format="ntfy", events=["engine", "health"])
    w = AlertWorker(AlertsSection(), NO_MQTT, [hook], db.path, tmp_path, "shed")
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}}
    w.observe(st)
    errors = [{"error": "camera 0 stopped answering"}]
    w.observe(
        st
        | {
            "engine": {"engine_version": "v1001"},
            "hotswap": {"refused": {"v1002": "signature does not verify"}},
            "healthy": False,
            "last_errors": errors,
        }
    )
    w.observe(st | {"engine": {"engine_version": "v1001"}, "hotswap": {"refused": {"v1002": "signature does not verify"}}})
    w.deliver()
    got = [(h["Title"], b.decode()) for h, b in receiver.got]
    assert got == [
        ("edge-agent shed: now serving v1001", "swapped from v1000 to v1001"),
        ("edge-agent shed: refused engine v1002", "signature does not verify"),
        ("edge-agent shed: unhealthy", "camera 0 stopped answering"),
        ("edge-agent shed: healthy again", "every part runs"),
    ]
    w.stop()
    db.close()


def test_the_daily_digest_goes_once_a_day_after_its_hour(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, digest_at="07:30")
    _result(db, "Tomato___Late_blight")
    _result(db, "Tomato___healthy")
    import datetime as dt

    today = dt.date.today()
    before = dt.datetime.combine(today, dt.time(7, 29)).timestamp()
    after = dt.datetime.combine(today, dt.time(7, 31)).timestamp()
    assert w.digest_due(before) is None
    body = w.digest_due(after)
    assert body["photos"] >= 0 and body["event_type"] == "digest"
    w.outbox.set("digest_day", today.isoformat())
    assert w.digest_due(after) is None
    w.stop()
    db.close()


def test_an_ntfy_alert_opens_the_photo_when_tapped(tmp_path, receiver):
    hook = Webhook(WebhookSection(url=receiver.url, format="ntfy"), 0)
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    body = alert_body(_cand("Tomato___Late_blight"), "http://greenhouse.local:8080")
    box.put([("webhook:0", "alert", receiver.url, json.dumps(body).encode(), 1, False)])
    hook.send(box.due("webhook:0"))
    headers, _ = receiver.got[0]
    assert headers["Click"] == "http://greenhouse.local:8080/photo/" + "ab" * 32
    assert "Actions" not in headers  # no position: no map button


def test_an_ntfy_alert_with_a_position_has_a_map_button_that_opens_the_phones_map_app_there(tmp_path, receiver):
    from dataclasses import replace

    hook = Webhook(WebhookSection(url=receiver.url, format="ntfy"), 0)
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    body = alert_body(replace(_cand("Apple___Apple_scab"), place=(47.397812, -8.547231)), "http://greenhouse.local:8080")
    box.put([("webhook:0", "alert", receiver.url, json.dumps(body).encode(), 1, False)])
    hook.send(box.due("webhook:0"))
    headers, _ = receiver.got[0]
    assert json.loads(headers["Actions"]) == [{"action": "view", "label": "Map", "url": "geo:47.397812,-8.547231"}]
    assert headers["Click"].endswith("/photo/" + "ab" * 32)  # a tap still opens the photo


def test_a_sure_alert_of_a_disease_that_cannot_wait_breaks_through_and_offers_what_to_do(tmp_path, receiver):
    from dataclasses import replace

    from edge_agent.class_notes import load_notes

    notes = load_notes()
    hook = Webhook(WebhookSection(url=receiver.url, format="ntfy"), 0)
    box = Outbox(tmp_path / "alerts.sqlite", 1 << 20)
    page = "http://greenhouse.local:8080"
    late = alert_body(replace(_cand("Tomato___Late_blight"), place=(47.4, 8.5)), page, notes.get("Tomato___Late_blight"))
    scab = alert_body(_cand("Apple___Apple_scab"), page, notes.get("Apple___Apple_scab"))
    maybe = alert_body(replace(_cand("Tomato___Late_blight"), verdict="unsure"), page, notes.get("Tomato___Late_blight"))
    assert (late["priority"], scab["priority"], maybe["priority"]) == (10, 8, 5)  # Gotify's scale, in the JSON
    box.put([("webhook:0", "alert", receiver.url, json.dumps(b).encode(), i, False) for i, b in enumerate((late, scab, maybe), 1)])
    hook.send(box.due("webhook:0"))
    assert [h["Priority"] for h, _ in receiver.got] == ["urgent", "high", "default"]
    first = receiver.got[0][0]
    assert json.loads(first["Actions"]) == [
        {"action": "view", "label": "Map", "url": "geo:47.400000,8.500000"},
        {"action": "view", "label": "What to do", "url": page + "/classes/Tomato___Late_blight"},
    ]
    assert "Look for: Pale to dark green" in receiver.got[0][1].decode()  # the notification's text says how to check


def test_alerts_raised_before_a_destination_existed_are_not_sent_to_it_and_later_ones_are(tmp_path, receiver):
    """As Frigate and Home Assistant notify: of what happens from now on. Earlier alerts stay in the ledger, the
    API and the Health page; a destination added later does not get a flood of stale ones."""
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path)  # no destination yet
    _result(db, "Tomato___Late_blight")
    w.scan()
    w.stop()
    w = _worker(tmp_path, db.path, [receiver.url])  # a webhook configured, the daemon restarted
    w.scan()
    w.deliver()
    assert receiver.got == [] and len(w.outbox.alerts()) == 1
    _result(db, "Apple___Apple_scab")
    w.scan()
    w.deliver()
    assert [json.loads(b)["label"] for _, b in receiver.got] == ["Apple___Apple_scab"]
    w.stop()
    db.close()


def _states_sent(w: AlertWorker) -> list[dict]:
    """The retained states ``w`` publishes from here on (a result goes out live on a topic of its own, not kept)."""
    sent: list[dict] = []

    class _Mqtt:
        def live(self, topic, payload, retain=False):
            if topic == w.topics.state:
                sent.append(json.loads(payload))

    w.mqtt = _Mqtt()
    return sent


def test_the_retained_state_is_published_when_it_changes_and_otherwise_once_a_minute(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path)
    sent = _states_sent(w)
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}}
    for _ in range(10):  # the daemon's status every 2 s, nothing new
        w.observe(st)
    assert len(sent) == 1
    _result(db, "Tomato___healthy", verdict="unsure")
    w.scan()
    w.observe(st)
    assert len(sent) == 2 and sent[-1]["photos_today"] == 1
    w.state_heartbeat_s = 0.0  # a minute later
    w.observe(st)
    assert len(sent) == 3
    w.stop()
    db.close()


def test_an_answer_naming_a_crop_the_farm_does_not_grow_raises_no_alert_once_its_crops_are_known():
    rules = AlertRules(AlertsSection(), crops=["Apple"])
    assert rules.wants(_cand("Apple___Apple_scab")) and not rules.wants(_cand("Strawberry___Leaf_scorch"))
    assert rules.other_crop == 1
    unknown = AlertRules(AlertsSection())  # nothing configured, nothing labelled yet: every crop alerts
    assert unknown.wants(_cand("Strawberry___Leaf_scorch"))
    unknown.labelled_crops = {"Apple", "Corn_(maize)"}
    assert not unknown.wants(_cand("Strawberry___Leaf_scorch")) and unknown.wants(_cand("Corn_(maize)___Common_rust_"))
    assert AlertRules(AlertsSection(grown_crops_only=False), crops=["Apple"]).wants(_cand("Strawberry___Leaf_scorch"))


def test_the_crops_an_expert_labels_become_the_farms_crops_for_alerts(tmp_path, receiver):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, [receiver.url])
    db._db.execute("INSERT INTO expert_labels (sha256, label, labelled) VALUES (?, ?, ?)", ("ab" * 32, "Apple___healthy", time.time()))
    _result(db, "Strawberry___Leaf_scorch", p=1.0)
    _result(db, "Apple___Apple_scab")
    w.scan()
    w.deliver()
    assert [json.loads(b)["label"] for _, b in receiver.got] == ["Apple___Apple_scab"]
    assert w.status()["crops"] == ["Apple"] and w.status()["skipped_other_crop"] == 1
    w.stop()
    db.close()


def test_the_digest_names_the_plants_with_a_disease_the_experts_label_first(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, digest_at="00:00")

    def photo(plant: str, label: str, p: float, verdict: str) -> str:
        sha = f"{next(_n):064x}"
        top_k = [[label, p], ["Apple___healthy" if label != "Apple___healthy" else "Apple___Black_rot", round(1 - p, 4)]]
        db.commit(
            [ResultRow(sha, sha[:16], None, "inbox", label, p, top_k, "v1000", {}, created=time.time(), verdict=verdict, plant=plant)]
        )
        return sha

    for _ in range(3):
        photo("tree 1", "Apple___Apple_scab", 0.95, "confident")  # sure of scab together
        photo("tree 2", "Apple___healthy", 0.95, "confident")  # healthy: no finding
    labelled = [photo("tree 3", "Apple___healthy", 0.6, "unsure") for _ in range(2)]
    db.mark_expert(labelled[0], "Apple___Black_rot", "")  # the model unsure, the expert says black rot
    photo("tree 4", "Apple___Cedar_apple_rust", 0.6, "unsure")  # unsure, no expert yet: a tree to show the expert
    body = w.digest_due(time.time() + 1)
    assert body["plants"] == {"tree 1": "Apple___Apple_scab", "tree 3": "Apple___Black_rot"} and body["plants_unsure"] == ["tree 4"]
    assert "; plants with a disease: tree 1 (Apple scab (Apple)), tree 3 (Black rot (Apple)); " in body["message"]
    assert body["message"].endswith("plants the model is not sure of: tree 4 (ask an expert: the Plants page); learning: 1 expert label")
    w.stop()
    db.close()


def test_home_assistant_is_told_when_the_last_backup_was_taken(tmp_path):
    from edge_agent.alerts.homeassistant import SENSORS

    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path)
    sent = _states_sent(w)
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}}
    w.observe(st)
    assert sent[-1]["last_backup"] is None  # Home Assistant shows it unknown
    (tmp_path / "last-backup.json").write_text(json.dumps({"time": 1764806400.0, "path": "/media/usb/b.tar.gz", "bytes": 1, "files": 1}))
    w.observe(st)
    assert sent[-1]["last_backup"] == "2025-12-04T00:00:00+00:00"  # a change is published at once
    assert SENSORS["last_backup"][2]["device_class"] == "timestamp"
    w.stop()
    db.close()


def test_a_class_that_earns_or_loses_trust_and_pseudo_labels_taken_back_are_engine_events_said_once(tmp_path, receiver):
    db = ResultsDB(tmp_path / "results.sqlite")
    hook = WebhookSection(url=receiver.url, format="ntfy", events=["engine"])
    w = AlertWorker(AlertsSection(), NO_MQTT, [hook], db.path, tmp_path, "shed")
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}}
    rot = "Apple___Black_rot"
    w.observe(st | {"trust": {"trusted": None, "withdrawals": 0, "last_withdrawal": None}})  # the checks not read yet
    w.observe(st | {"trust": {"trusted": [rot], "withdrawals": 0, "last_withdrawal": None}})  # the first read: no news
    w.observe(st | {"trust": {"trusted": [], "withdrawals": 0, "last_withdrawal": None}})
    taken = {"found": [[rot, "v1000"]], "returned_to_review": 2, "to_withdraw_from_trainer": 107}
    w.observe(st | {"trust": {"trusted": [], "withdrawals": 1, "last_withdrawal": taken}})
    w.observe(st | {"trust": {"trusted": [], "withdrawals": 1, "last_withdrawal": taken}})  # said once
    w.observe(st | {"trust": {"trusted": [rot], "withdrawals": 1, "last_withdrawal": taken}})
    w.deliver()
    got = [(h["Title"], b.decode()) for h, b in receiver.got]
    assert got == [
        (
            "edge-agent shed: stopped learning from Black rot (Apple) on its own",
            "the expert found a sure answer of it wrong: its sure answers go to the expert again until right checks earn the trust back",
        ),
        (
            "edge-agent shed: took back 109 pseudo-labels (Black rot (Apple) by v1000)",
            "the expert found that engine's sure answers of it wrong: 2 back in the review queue, 107 withdrawn from the trainer",
        ),
        (
            "edge-agent shed: learns from Black rot (Apple) on its own",
            "the expert's checks show its sure answers of it right: they become pseudo-labels (a few still checked)",
        ),
    ]
    w.stop()
    db.close()


def test_home_assistant_shows_what_the_device_learns_from_on_its_own_what_waits_for_the_expert_and_takes_each_engine_event(tmp_path):
    from edge_agent.alerts.homeassistant import ENGINE_EVENTS, discovery
    from edge_agent.alerts.messages import status_events
    from edge_agent.ledger_rows import QueueEntry

    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path)
    sent = _states_sent(w)
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}}
    w.observe(st | {"trust": {"trusted": None, "withdrawals": 0, "last_withdrawal": None}})
    assert sent[-1]["learns_on_its_own"] is None and sent[-1]["learns_on_its_own_classes"] is None  # unknown, not 0
    w.observe(st | {"trust": {"trusted": ["Apple___Black_rot", "Apple___Apple_scab"], "withdrawals": 0, "last_withdrawal": None}})
    assert sent[-1]["learns_on_its_own"] == 2  # a change is published at once
    assert sent[-1]["learns_on_its_own_classes"] == ["Black rot (Apple)", "Apple scab (Apple)"]
    assert sent[-1]["review_waiting"] == 0 and sent[-1]["queue_depth"] == 0
    for i, kind in enumerate(("review", "review", "pseudo")):
        sha = _result(db, "Apple___Black_rot")
        db.commit([], [QueueEntry(sha, sha[:16], kind, "Apple___Black_rot", 0.99, "v1000", f"q{i}.jpg", 10, time.time())])
    w.observe(st | {"trust": {"trusted": ["Apple___Black_rot"], "withdrawals": 0, "last_withdrawal": None}})
    assert sent[-1]["review_waiting"] == 2 and sent[-1]["queue_depth"] == 3  # what the expert is asked about, of all queued
    assert sent[-1]["next_version_labels"] is None and sent[-1]["next_version_waits_for"] is None  # no trainer here: unknown
    nxt = {"sentence": "3 more expert labels of any class before ...", "waiting_for": "field_check", "expert_labels_needed": 3}
    w.observe(st | {"next_publish": nxt})
    assert sent[-1]["next_version_labels"] == 3 and sent[-1]["next_version_waits_for"] == nxt["sentence"]
    w.stop()
    db.close()
    entities = {t.split("/")[-2]: json.loads(p) for t, p, _ in discovery(MqttSection(host="x"), "shed", "0.1.0")}
    sensor = entities["learns_on_its_own"]
    assert sensor["value_template"] == "{{ value_json.learns_on_its_own }}" and sensor["json_attributes_topic"] == sensor["state_topic"]
    assert "learns_on_its_own_classes" in sensor["json_attributes_template"]
    assert "next_version_waits_for" in entities["next_version_labels"]["json_attributes_template"]
    assert entities["engine"]["state_topic"] == "edge-agent/shed/engine"
    # every engine event the daemon sends names a type the entity declares (one it does not is dropped by Home Assistant)
    taken = {"found": [["Apple___Black_rot", "v1001"]], "returned_to_review": 1, "to_withdraw_from_trainer": 0}
    before = {"engine": "v1000", "refused": {}, "healthy": True, "backup": None, "trusted": ["Apple___Black_rot"], "withdrawals": 0}
    now = before | {"engine": "v1001", "refused": {"v1002": "bad signature"}, "trusted": ["Apple___Apple_scab"]}
    events = status_events("shed", before, now | {"withdrawals": 1, "last_withdrawal": taken}, [])
    types = [body["event_type"] for kind, body in events if kind == "engine"]
    assert sorted(types) == sorted(ENGINE_EVENTS) and all(body["event_type"] == body["event"] for _, body in events if "event_type" in body)


def test_the_digest_says_what_the_device_learnt_from_and_what_waits_for_the_expert(tmp_path):
    from edge_agent._withdrawn_rows import PUT_SENT
    from edge_agent.ledger_rows import QueueEntry

    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db.path, digest_at="00:00")
    _result(db, "Apple___Apple_scab")
    assert w.digest_due(time.time())["message"] == "Apple scab (Apple): 1"  # nothing learnt, nothing waits: not said
    for i in range(2):
        sha = _result(db, "Apple___Black_rot", verdict="unsure")
        db.commit([], [QueueEntry(sha, sha[:16], "review", "Apple___Black_rot", 0.5, "v1000", f"q{i}.jpg", 10, time.time())])
    db.mark_expert(_result(db, "Apple___Black_rot"), "Apple___Black_rot", "x.jpg")
    with sqlite3.connect(db.path) as c:
        c.execute(PUT_SENT, ("ab" * 32, "Apple___Black_rot", "v1000", time.time(), None))
        c.execute(PUT_SENT, ("cd" * 32, "Apple___Black_rot", "v1000", time.time() - 2 * 86400, None))  # another day's
        c.execute(PUT_SENT, ("ef" * 32, "Apple___Black_rot", "v1000", time.time() - 2 * 86400, time.time()))  # taken back today
    w._digest()
    assert not w.outbox.get("digest_day")  # the daemon's first status not yet read: a digest due at the start waits
    w.observe({"engine": {"engine_version": "v1000"}, "healthy": True, "trust": {"trusted": []}})
    body = w.digest_due(time.time())
    assert body["message"].endswith(
        "; learning: 1 expert label, 1 pseudo-label to the trainer, 1 pseudo-label taken back (a sure answer of their class"
        " found wrong), learns from no class on its own yet, 2 photos wait for the expert (the Review page)"
    ), body["message"]
    w._digest()
    assert w.outbox.get("digest_day")  # once it has: at once
    w.outbox.set("digest_day", "")
    w.observe({"engine": {"engine_version": "v1000"}, "healthy": True, "trust": {"trusted": ["Apple___Black_rot"]}})
    body = w.digest_due(time.time())
    assert "learns on its own from Black rot (Apple), 2 photos wait" in body["message"]
    assert body["learning"] == {
        "expert_labels": 1,
        "pseudo_labels": 1,
        "pseudo_labels_withdrawn": 1,
        "learns_on_its_own": ["Apple___Black_rot"],
        "review_waiting": 2,
    }
    w.stop()
    db.close()


def test_a_digest_from_a_ledger_before_pseudo_labels_were_recorded_counts_none_and_says_the_rest(tmp_path):
    db = ResultsDB(tmp_path / "results.sqlite")
    db.mark_expert(_result(db, "Apple___Black_rot"), "Apple___Black_rot", "x.jpg")
    with sqlite3.connect(db.path) as c:
        c.execute("DROP TABLE pseudo_sent")
    w = _worker(tmp_path, db.path, digest_at="00:00")
    w.observe({"engine": {"engine_version": "v1000"}, "healthy": True, "trust": {"trusted": []}})
    body = w.digest_due(time.time())
    assert body["message"].endswith("; learning: 1 expert label, learns from no class on its own yet"), body["message"]
    assert body["learning"]["pseudo_labels"] == 0 and body["learning"]["pseudo_labels_withdrawn"] == 0
    w.stop()
    db.close()
