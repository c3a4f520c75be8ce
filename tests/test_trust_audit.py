"""A trusted class's audits: a share of its sure answers still goes to the expert, and a wrong one takes its trust away."""

from __future__ import annotations

import json
import time

import pytest
from structlog.testing import capture_logs

from edge_agent.config import LabelsSection
from edge_agent.labelling import LabelQueuer, decide
from edge_agent.results import ResultsDB
from edge_agent.review.checks import TrustBook, audited, class_trust
from edge_agent.review.queue import to_ask
from edge_agent.review.rank import draw
from edge_agent.review.trusted_pool import TrustedPool
from edge_agent.spool import PhotoSpool

from .test_labelling import _answers
from .test_trust import _photo


@pytest.fixture
def db(tmp_path):
    d = ResultsDB(tmp_path / "results.sqlite")
    yield d
    d.close()


def _trusted(db: ResultsDB, label: str = "A") -> None:
    for _ in range(23):  # the sequential test's 23 right checks in a row (the defaults)
        _photo(db, label, expert=label)
    assert class_trust(db, LabelsSection())[label].trusted


def test_an_audit_goes_to_the_expert_where_the_same_answer_of_another_photo_becomes_a_pseudo_label():
    policy = LabelsSection()
    assert decide("confident", 0.99, policy, trusted=True, audit=True) == "review"
    assert decide("confident", 0.99, policy, trusted=True, audit=False) == "pseudo"
    assert decide("unsure", 0.5, policy, trusted=True, audit=True) == "review"  # an audit changes only what trust makes


def test_about_one_photo_in_twenty_is_an_audit_the_same_one_every_time_and_not_the_first_of_the_draw_order():
    policy = LabelsSection()  # audit_share 0.05
    shas = [f"{i:064x}" for i in range(4000)]
    chosen = {s for s in shas if audited(s, policy)}
    assert 0.04 < len(chosen) / len(shas) < 0.06
    assert chosen == {s for s in shas if audited(s, LabelsSection())}  # drawn by the photo: the same at every answer
    first_drawn = {s for s in shas if draw(s) < 0.05}  # the order `ask_order = "draw"` asks unsure photos in
    assert len(chosen & first_drawn) < len(chosen) / 4  # its own draw: audits are not the photos asked first anyway
    assert not any(audited(s, LabelsSection(audit_share=0)) for s in shas)
    assert all(audited(s, LabelsSection(audit_share=1)) for s in shas)
    assert not any(audited(s, LabelsSection(audit_share=1, trust_checks=0)) for s in shas)  # no test: nothing to audit


@pytest.mark.parametrize("share", [0.05, 0.0, 0.2])
def test_a_trusted_class_sends_its_audit_share_of_sure_answers_to_the_expert_the_rest_become_pseudo_labels(tmp_path, db, share):
    _trusted(db)
    policy = LabelsSection(audit_share=share)
    q = LabelQueuer(db, PhotoSpool(tmp_path / "queue", 1 << 24), policy)
    answers = _answers(["A"] * 300, start=10_000)
    kinds = q.queue(answers).kinds
    review = {a.sha256 for a in answers if kinds[a.sha256] == "review"}
    assert review == {a.sha256 for a in answers if audited(a.sha256, policy)}
    assert abs(len(review) / 300 - share) < 0.04
    untrusted = LabelQueuer(db, PhotoSpool(tmp_path / "queue2", 1 << 24), policy).queue(_answers(["B"] * 20, start=20_000))
    assert set(untrusted.kinds.values()) == {"review"}  # a class not trusted: every sure answer is a check


def test_a_wrong_audit_takes_the_class_trust_away_and_its_sure_answers_go_to_the_expert_again(tmp_path, db):
    _trusted(db)
    q = LabelQueuer(db, PhotoSpool(tmp_path / "queue", 1 << 24), LabelsSection())
    before = q.queue(_answers(["A"] * 40, start=30_000)).kinds
    assert "pseudo" in before.values()
    _photo(db, "A", expert="B")  # an audit: the model sure it was A, the expert says B
    after = q.queue(_answers(["A"] * 40, start=40_000)).kinds
    assert set(after.values()) == {"review"}
    t = class_trust(db, LabelsSection())["A"]
    assert not t.trusted and t.needed == 30  # back only once the wrong check has left the window


def test_a_trusted_class_keeps_its_trust_while_its_audits_are_right(tmp_path, db):
    _trusted(db)
    for _ in range(40):  # more right checks than the window holds
        _photo(db, "A", expert="A")
    assert class_trust(db, LabelsSection())["A"].trusted


def test_the_journal_says_when_a_class_earns_trust_and_when_it_loses_it(db):
    with capture_logs() as logs:
        book = TrustBook(db, LabelsSection())
        assert book.trusted_classes() == frozenset()
        _trusted(db)
        assert book.trusted_classes() == {"A"}
        assert book.trusted_classes() == {"A"}  # nothing new: said once
        _photo(db, "A", expert="B")
        assert book.trusted_classes() == frozenset()
    said = [(e["event"], e.get("classes")) for e in logs if e["event"].startswith("class_trust")]
    assert said == [("class_trust_earned", ["A"]), ("class_trust_lost", ["A"])]
    assert next(e for e in logs if e["event"] == "class_trust_lost")["log_level"] == "warning"


def test_a_trust_book_says_nothing_of_the_trust_it_finds_at_its_first_read(db):
    _trusted(db)
    with capture_logs() as logs:
        assert TrustBook(db, LabelsSection()).trusted_classes() == {"A"}
    assert not [e for e in logs if e["event"].startswith("class_trust")]


def test_audits_of_a_trusted_class_are_asked_before_the_checks_of_classes_earning_trust(db):
    policy = LabelsSection()
    _trusted(db, "A")
    for _ in range(20):
        _photo(db, "B", expert="B")  # B: 3 right checks from trust, nearest of the untrusted
    audits = []
    while len(audits) < 2:  # photos the daemon would have sent as audits (the others of A become pseudo-labels)
        sha = _photo(db, "A", review=True, p=0.999)
        if audited(sha, policy):
            audits.append(sha)
    b = [_photo(db, "B", review=True, p=0.981) for _ in range(3)]
    c = [_photo(db, "C", review=True, p=0.981) for _ in range(3)]
    asked = [it for it in to_ask(db, 0, policy, everything=True) if it.check]
    checks = [it.entry.sha256 for it in asked]
    assert checks[:2] == sorted(audits, key=checks.index)  # the audits first
    assert [it.as_json()["audit"] for it in asked] == [True, True] + [False] * (len(asked) - 2)  # said so
    assert checks[2:5] == sorted(b, key=checks.index) and set(checks[5:8]) == set(c)
    assert set(checks[8:]) == {sha for sha in checks if sha not in audits + b + c}  # A's other waiting photos last


def test_the_trusted_pool_leaves_a_trusted_classes_audits_waiting_for_the_expert(db, tmp_path):
    policy = LabelsSection()
    q = LabelQueuer(db, PhotoSpool(tmp_path / "queue", 1 << 24), policy)
    waiting = [_photo(db, "A", review=True, p=0.999) for _ in range(80)]  # sure, before A was trusted
    _trusted(db)
    made = {e.sha256 for e in TrustedPool(db, q).run("v0001")}
    assert made == {sha for sha in waiting if not audited(sha, policy)}
    assert 0 < len(waiting) - len(made) < 12  # about one in twenty stays
    left = {it.entry.sha256 for it in to_ask(db, 0, policy, everything=True)}
    assert set(waiting) - made <= left


def test_the_audit_benchmark_loses_trust_after_a_swap_only_where_audits_are_drawn():
    import random

    from benchmarks.trust_audit import simulate

    none = simulate(LabelsSection(audit_share=0), random.Random(1), 0, [1.0, 0.0], 3, 20, 5)
    assert none[1] == {
        "asked": 0,
        "untrusted_days": 0,
        "made": 60,
        "wrong": 60,
        "lost_day": None,
        "withdrawn_right": 0,
        "withdrawn_wrong": 0,
    }  # wrong forever, and nothing found wrong to take them back
    half = simulate(LabelsSection(audit_share=0.5), random.Random(1), 0, [1.0, 0.0], 3, 20, 5)
    assert half[0]["untrusted_days"] == 0 and half[0]["wrong"] == 0 and half[0]["asked"] > 0
    assert half[1]["lost_day"] == 0 and 0 < half[1]["wrong"] < 20  # the swap's first day, its audits all wrong
    assert half[1]["untrusted_days"] == 2 and half[1]["made"] == half[1]["wrong"]  # untrusted from the next day on
    assert half[1]["withdrawn_wrong"] == half[1]["wrong"] and half[0]["withdrawn_right"] == 0  # the worse engine's taken back


def test_review_list_says_which_questions_are_checks_and_how_unsure_the_others_are(tmp_path, capsys):
    from edge_agent.cli import main

    state = tmp_path / "state"
    state.mkdir()
    d = ResultsDB(state / "results.sqlite")
    sure = _photo(d, "A", review=True, p=0.99)
    unsure = _photo(d, "A", verdict="unsure", review=True, p=0.6)
    d.close()
    assert main(["review", "list", "--state-dir", str(state), "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = {sha: next(line for line in lines if sha in line).split("  ")[1] for sha in (sure, unsure)}
    assert said == {sure: "a check", unsure: "margin 0.200"}


def test_the_review_page_says_an_audit_is_one_and_asks_it_first(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from edge_agent.config import AppConfig

    from .web_helpers import client, make_state

    state = make_state(tmp_path)  # two unsure photos in the pool
    db = ResultsDB(state / "results.sqlite")
    _trusted(db, "Apple___Black_rot")
    while not audited(_photo(db, "Apple___Black_rot", review=True, p=0.999), LabelsSection()):
        pass  # the class's other sure photos would have become pseudo-labels; these wait as checks, asked last
    db.close()
    c = client(state, cfg=AppConfig(labels={"review_per_day": 0}))  # the 23 labels of today used no budget
    first = c.get("/review").text
    assert 'id="audit-mark"' in first and "has earned trust for Apple" in first and 'id="check-mark"' not in first
    assert all('id="audit-mark"' not in c.get("/review", params={"i": i}).text for i in (1, 2, 3))


def test_the_audits_a_class_had_while_trusted_are_counted_and_how_many_were_right_not_its_checks_before(db):
    from edge_agent.review.checks import audit_tally, trust_table

    policy = LabelsSection(audit_share=0.5)  # half the photos drawn: audits come quickly
    drawn = []
    for _ in range(23):
        drawn.append(audited(_photo(db, "A", expert="A"), policy))  # before trust: checks, drawn or not
    assert any(drawn) and audit_tally(db.expert_checks(), policy) == {}
    undrawn = next(sha for sha in iter(lambda: _photo(db, "A", review=True, p=0.999), None) if not audited(sha, policy))
    db.mark_expert(undrawn, "A", f"/nowhere/{undrawn}.jpg")  # while trusted, a check not drawn (a photo labelled by hand)
    time.sleep(0.002)
    asked = []
    while len(asked) < 3:  # three audits: right, right, then wrong
        sha = _photo(db, "A", review=True, p=0.999)
        if audited(sha, policy):
            db.mark_expert(sha, "A" if len(asked) < 2 else "B", f"/nowhere/{sha}.jpg")
            time.sleep(0.002)  # distinct label times: the replay goes by them
            asked.append(sha)
    while not audited(_photo(db, "A", expert="B"), policy):  # after the loss: checks, not audits, drawn or not
        pass
    assert audit_tally(db.expert_checks(), policy) == {"A": (3, 2)}
    [row] = [r for r in trust_table(db, policy)[0] if r.label == "A"]
    assert (row.audits, row.right_audits, row.trusted) == (3, 2, False)
    assert audit_tally(db.expert_checks(), LabelsSection(audit_share=0)) == {}


def test_review_trust_and_the_trust_page_say_how_right_a_class_was_found_when_audited(tmp_path, capsys):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from edge_agent.cli import main

    from .web_helpers import client, make_state

    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    _trusted(db, "Apple___Black_rot")
    found = 0
    while found < 2:
        sha = _photo(db, "Apple___Black_rot", review=True, p=0.999)
        if audited(sha, LabelsSection()):
            db.mark_expert(sha, "Apple___Black_rot", f"/nowhere/{sha}.jpg")
            time.sleep(0.002)
            found += 1
    db.close()
    assert main(["review", "trust", "--state-dir", str(state), "--json"]) == 0
    [row] = [r for r in map(json.loads, capsys.readouterr().out.splitlines()) if r["label"] == "Apple___Black_rot"]
    assert (row["audits"], row["right_audits"], row["trusted"]) == (2, 2, True)
    assert main(["review", "trust", "--state-dir", str(state)]) == 0
    assert "still checked (audits while trusted: 2 of 2 right)" in capsys.readouterr().out
    page = client(state).get("/trust").text
    assert "audits while trusted: 2 of 2 right" in page


def test_status_says_which_classes_make_pseudo_labels_and_how_right_their_audits_were(tmp_path, capsys):
    from edge_agent.cli import main
    from edge_agent.state import StateLayout

    layout = StateLayout(tmp_path / "state")
    layout.create()
    db = ResultsDB(layout.db)
    db.close()
    assert main(["status", "--state-dir", str(layout.root)]) == 0
    assert "trust: no class makes pseudo-labels now: every sure answer goes to the expert as a check" in capsys.readouterr().out
    db = ResultsDB(layout.db)
    _trusted(db, "Apple___Black_rot")
    sha = next(sha for sha in iter(lambda: _photo(db, "Apple___Black_rot", review=True, p=0.999), None) if audited(sha, LabelsSection()))
    db.mark_expert(sha, "Apple___Black_rot", f"/nowhere/{sha}.jpg")
    db.close()
    assert main(["status", "--state-dir", str(layout.root)]) == 0
    out = capsys.readouterr().out
    assert "trust: pseudo-labels from Apple___Black_rot (audits 1 of 1 right); 5 % of their sure answers still checked" in out
    assert main(["status", "--state-dir", str(layout.root), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["trusted_classes"]
    assert said == {"Apple___Black_rot": {"audits": 1, "right_audits": 1}}
    db = ResultsDB(layout.db)
    _photo(db, "Apple___Black_rot", expert="Apple___Scab")  # a check found wrong: trust lost
    db.close()
    assert main(["status", "--state-dir", str(layout.root)]) == 0
    assert "trust: no class makes pseudo-labels now" in capsys.readouterr().out
    cfg = tmp_path / "all.toml"
    cfg.write_text("[labels]\ntrust_checks = 0\n")
    assert main(["status", "--state-dir", str(layout.root), "--config", str(cfg)]) == 0
    assert "trust: every class's sure answers become pseudo-labels" in capsys.readouterr().out


def test_what_the_book_last_read_is_known_without_a_query_and_nothing_before_its_first_read(db):
    book = TrustBook(db, LabelsSection())
    _trusted(db)
    assert book.known() is None  # not read yet: the alerts take no news from it
    book.now()
    assert book.known() == {"A"}
    _photo(db, "A", expert="B")
    assert book.known() == {"A"}  # as last read, no query
    book.now()
    assert book.known() == frozenset()
    assert TrustBook(db, LabelsSection(trust_checks=0)).known() is None  # every class trusted: none to tell apart
