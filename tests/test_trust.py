"""Per-class trust from the expert's checks: which confident answers may become pseudo-labels, and what the expert is asked."""

from __future__ import annotations

import time

import pytest

from edge_agent.config import LabelsSection
from edge_agent.labelling import LabelQueuer, decide
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.results import ResultsDB
from edge_agent.review import checks
from edge_agent.review.checks import TrustBook, class_trust, trust_table, wilson_lower
from edge_agent.review.queue import prune_pool, to_ask
from edge_agent.spool import PhotoSpool

from .test_labelling import _answers


@pytest.fixture
def db(tmp_path):
    d = ResultsDB(tmp_path / "results.sqlite")
    yield d
    d.close()


_n = iter(range(10**6))


def _photo(db: ResultsDB, said: str, verdict: str = "confident", expert: str | None = None, review: bool = False, p: float = 0.99) -> str:
    """A classified photo (the model said ``said``), optionally in the review pool and labelled by the expert."""
    sha = f"{next(_n):064x}"
    top_k = [[said, p], ["other", round(1 - p, 4)]]
    row = ResultRow(sha, sha[:16], None, "inbox", said, p, top_k, "v0001", {}, verdict=verdict)
    entry = QueueEntry(sha, sha[:16], "review", said, p, "v0001", f"/nowhere/{sha}.jpg", 10)
    db.commit([row], [entry] if review or expert else [])
    if expert is not None:
        db.mark_expert(sha, expert, entry.file)
        time.sleep(0.002)  # distinct label times: the window keeps the newest
    return sha


def test_the_wilson_lower_bound_needs_nineteen_right_checks_for_95_percent():
    assert wilson_lower(0, 0) == 0.0
    assert wilson_lower(18, 18) < 0.95 <= wilson_lower(19, 19)
    assert wilson_lower(19, 20) < 0.95  # one wrong in twenty: not yet
    assert 0.0 <= wilson_lower(0, 5) < 0.01


def test_an_untrusted_class_sends_its_confident_answers_to_review_and_a_trusted_one_makes_pseudo_labels():
    policy = LabelsSection()
    assert decide("confident", 0.99, policy, trusted=False) == "review"
    assert decide("confident", 0.99, policy, trusted=True) == "pseudo"
    assert decide("unsure", 0.5, policy, trusted=True) == "review"  # trust changes only confident answers


def test_a_trusted_class_makes_pseudo_labels_only_of_answers_at_trust_confidence_the_others_wait_in_the_pool():
    """Field answers of a retrained v3000 from 0.9 up were 83-95 % right per class, from 0.98 up 95-100 % for the
    diseases (benchmarks/results/trust-rules/check-order-v3000.md): trust covers only the surer ones."""
    policy = LabelsSection()  # trust_confidence 0.98
    assert decide("confident", 0.97, policy, trusted=True) == "review"
    assert decide("confident", 0.98, policy, trusted=True) == "pseudo"
    assert decide("confident", 0.97, LabelsSection(trust_confidence=0.95), trusted=True) == "pseudo"
    assert decide("confident", 0.92, LabelsSection(trust_checks=0), trusted=True) == "pseudo"  # no test: every confident answer
    assert decide("confident", 0.85, LabelsSection(trust_confidence=0.5), trusted=True) == "review"  # pseudo_threshold still holds


def test_checks_of_answers_below_trust_confidence_earn_no_trust_and_are_not_asked_as_checks(db):
    policy = LabelsSection()
    for _ in range(40):
        _photo(db, "A", expert="A", p=0.96)  # right, but not sure enough for trust to cover
    assert "A" not in class_trust(db, policy)
    for _ in range(22):
        _photo(db, "A", expert="A")
    assert class_trust(db, policy)["A"].needed == 1  # the 40 earlier ones did not count
    low, high = _photo(db, "B", review=True, p=0.95), _photo(db, "B", review=True, p=0.985)
    asked = {it.entry.sha256: it.check for it in to_ask(db, 0, policy, everything=True)}
    assert asked == {low: False, high: True}
    assert class_trust(db, LabelsSection(trust_confidence=0.95))["A"].trusted  # a looser setting counts them


def test_a_class_earns_pseudo_labels_after_twenty_three_right_checks_in_a_row(db):
    policy = LabelsSection()  # sequential: 0.97 against 0.85, 5 %: log(20) / log(0.97 / 0.85) = 22.7 right checks
    for _ in range(22):
        _photo(db, "A", expert="A")
    t = class_trust(db, policy)["A"]
    assert (t.trusted, t.needed) == (False, 1)
    _photo(db, "A", expert="A")
    t = class_trust(db, policy)["A"]
    assert (t.checks, t.right, t.trusted, t.needed) == (23, 23, True, 0)
    _photo(db, "A", verdict="unsure", expert="B")  # an unsure answer the expert corrects is not a check
    assert class_trust(db, policy)["A"].trusted


def test_one_mistake_bars_trust_until_it_leaves_the_window_and_the_count_of_checks_needed_says_so(db):
    policy = LabelsSection()  # 29 right and 1 wrong: 29 x 0.132 - 1.609 = 2.22 < log(20); the mistake must go
    for _ in range(16):
        _photo(db, "A", expert="A")
    _photo(db, "A", expert="B")
    t = class_trust(db, policy)["A"]
    assert not t.trusted and t.needed == 30  # the wrong check is the 30th newest after 29 more; the 30th pushes it out
    for i in range(29):
        _photo(db, "A", expert="A")
        t = class_trust(db, policy)["A"]
        assert not t.trusted and t.needed == 29 - i, f"after {i + 1} right checks"
    _photo(db, "A", expert="A")
    assert class_trust(db, policy)["A"].trusted


def test_with_the_earlier_test_a_mistake_cost_ten_right_checks_inside_the_window(db):
    policy = LabelsSection(trust_against=0.80)  # log((1 - 0.97) / (1 - 0.80)) = -1.90, ten right steps of 0.19
    for _ in range(16):
        _photo(db, "A", expert="A")
    _photo(db, "A", expert="B")
    t = class_trust(db, policy)["A"]
    assert not t.trusted and t.needed == 10


def test_a_window_too_short_for_the_test_is_refused_with_the_window_it_needs():
    with pytest.raises(ValueError, match=r"trust_window \(20\) is shorter than the 23 right checks.*set trust_window to 23"):
        LabelsSection(trust_window=20)  # 20 right checks: 2.64 < log(20)
    assert LabelsSection(trust_window=23).trust_window == 23
    assert LabelsSection(trust_window=20, trust_against=0.80).trust_window == 20  # 16 right checks suffice there
    assert LabelsSection(trust_window=5, trust_checks=0).trust_window == 5  # every class trusted: no test to pass


def test_the_wilson_rule_is_kept_as_it_was_nineteen_right_checks(db):
    policy = LabelsSection(trust_rule="wilson", trust_precision=0.95)
    for _ in range(18):
        _photo(db, "A", expert="A")
    t = class_trust(db, policy)["A"]
    assert (t.trusted, t.needed) == (False, 1)  # 18 of 18: the lower bound (n / (n + 1)) is still under 0.95
    _photo(db, "A", expert="A")
    assert class_trust(db, policy)["A"].trusted


def test_an_expert_who_corrects_the_model_three_times_in_twenty_keeps_the_class_untrusted_throughout(db):
    """A class right 85 % of the time (the test's trust_against) never earns trust, whatever the order of mistakes."""
    policy = LabelsSection()
    for i in range(90):
        _photo(db, "A", expert="B" if i % 20 in (6, 13, 19) else "A")
        assert not class_trust(db, policy)["A"].trusted, f"trusted after {i + 1} checks at 85 % right"


def test_a_class_right_nine_times_in_ten_in_the_field_is_never_trusted_with_the_shipped_test(db):
    """Field classes 87-90 % right earned trust under 0.97 against 0.80 (benchmarks.check_order); not any more."""
    policy, earlier = LabelsSection(), LabelsSection(trust_against=0.80)
    ever_earlier = False
    for i in range(100):
        _photo(db, "A", expert="B" if i % 20 >= 18 else "A")  # 18 right, 2 wrong: 90 %, mistakes in pairs
        assert not class_trust(db, policy)["A"].trusted, f"trusted after {i + 1} checks at 90 % right"
        ever_earlier |= class_trust(db, earlier)["A"].trusted
    assert ever_earlier  # the earlier test trusted it after its first 16 right checks


def test_trust_against_must_lie_below_the_precision_it_is_tested_against():
    with pytest.raises(ValueError, match="trust_against"):
        LabelsSection(trust_precision=0.9, trust_against=0.95)


def test_an_expert_who_labels_against_the_model_every_time_never_lets_a_class_earn_trust(db):
    policy = LabelsSection()
    for i in range(60):
        _photo(db, "A", expert=f"B{i % 3}")
    t = class_trust(db, policy)["A"]
    assert (t.checks, t.right, t.trusted, t.precision) == (30, 0, False, 0.0)  # the window: the latest 30


def test_old_wrong_checks_fall_out_of_the_window(db):
    policy = LabelsSection(trust_window=25, trust_checks=10)
    for _ in range(25):
        _photo(db, "A", expert="B")  # the engine of long ago was wrong
    for _ in range(25):
        _photo(db, "A", expert="A")  # the newer engines are right
    assert class_trust(db, policy)["A"].trusted


def test_trust_checks_0_trusts_every_class_from_the_start(db):
    assert TrustBook(db, LabelsSection(trust_checks=0)).trusted("never seen")
    assert not TrustBook(db, LabelsSection()).trusted("never seen")


def test_the_trust_book_reads_the_database_again_only_after_a_new_expert_label(db, monkeypatch):
    calls = []
    real = checks.class_trust
    monkeypatch.setattr(checks, "class_trust", lambda d, p: calls.append(1) or real(d, p))
    book = TrustBook(db, LabelsSection(trust_rule="wilson", trust_checks=1, trust_precision=0.5))
    assert not book.trusted("A") and not book.trusted("A")
    assert len(calls) == 1
    _photo(db, "A", expert="A")
    assert book.trusted("A") and book.trusted("A")
    assert len(calls) == 2


def test_the_queuer_sends_confident_answers_to_review_until_the_class_is_trusted(tmp_path, db):
    q = LabelQueuer(db, PhotoSpool(tmp_path / "queue", 1 << 20), LabelsSection(trust_rule="wilson", trust_checks=2, trust_precision=0.5))
    first = q.queue(_answers(["A", "A"]))
    assert list(first.kinds.values()) == ["review", "review"]
    _photo(db, "A", expert="A")
    _photo(db, "A", expert="A")
    second = q.queue(_answers(["A", "B"], start=100))
    assert [second.kinds[a.sha256] for a in _answers(["A", "B"], start=100)] == ["pseudo", "review"]


def test_todays_questions_alternate_checks_and_unsure_photos_a_check_first(db):
    unsure = [_photo(db, "A", verdict="unsure", review=True, p=0.5 + i / 100) for i in range(4)]
    sure = [_photo(db, c, review=True) for c in ("A", "B", "C")]
    asked = to_ask(db, 5, LabelsSection(trust_rule="wilson"))  # no check yet: every class equally near to trust
    assert [it.check for it in asked] == [True, False, True, False, True]
    assert {it.entry.sha256 for it in asked if it.check} == set(sure)  # spread over the classes
    assert asked[1].entry.sha256 == unsure[0]  # the unsure ones by margin, smallest first
    assert len(to_ask(db, 5, LabelsSection(), everything=True)) == 7


def test_with_the_trust_policy_checks_go_to_the_class_nearest_to_trust_first(db):
    """Spread evenly, four classes each a few checks a day might none of them earn trust in a season; finishing one
    class's test before the next earns trust class by class."""
    policy = LabelsSection()
    for _ in range(12):
        _photo(db, "B", expert="B")  # B: 12 right checks, 4 from trust
    a = [_photo(db, "A", review=True, p=0.981) for _ in range(3)]  # smaller margins: the ranking alone asks A first
    b = [_photo(db, "B", review=True, p=0.995) for _ in range(3)]
    asked = [it.entry.sha256 for it in to_ask(db, 0, policy, everything=True) if it.check]
    assert asked[:3] == sorted(b, key=asked.index) and set(asked[3:]) == set(a)


def test_pruning_the_pool_keeps_checks_beside_the_most_informative_unsure_photos(tmp_path, db):
    for i in range(6):
        _photo(db, "A", verdict="unsure", review=True, p=0.5 + i / 100)
    sure = [_photo(db, "B", review=True) for _ in range(6)]
    assert prune_pool(db, PhotoSpool(tmp_path / "queue", 1 << 20), keep=6, policy=LabelsSection()) == 6
    kept = to_ask(db, 0, LabelsSection(), everything=True)
    assert sum(it.check for it in kept) == 3 and {it.entry.sha256 for it in kept if it.check} == set(sure[3:])  # the newest


def test_the_trust_table_holds_a_confusion_row_per_class_the_model_named(db):
    policy = LabelsSection(trust_rule="wilson", trust_checks=2, trust_precision=0.3)  # 2 of 3 right: lower bound 0.39
    _photo(db, "A", expert="A")
    _photo(db, "A", expert="A")
    _photo(db, "A", expert="B")
    _photo(db, "B", verdict="unsure", expert="Brand new disease")  # a class the model does not have
    _photo(db, "C")  # never labelled: not in the table
    rows, table, columns = trust_table(db, policy)
    assert [(r.label, r.labelled, r.right, r.checks, r.trusted) for r in rows] == [("A", 3, 2, 3, True), ("B", 1, 0, 0, False)]
    assert table == {"A": {"A": 2, "B": 1}, "B": {"Brand new disease": 1}}
    assert columns == ["A", "B", "Brand new disease"]
    assert trust_table(db, policy)[0][0].right_share == pytest.approx(2 / 3)


def test_an_answer_below_the_threshold_is_never_made_a_pseudo_label_by_trust():
    policy = LabelsSection(pseudo_threshold=0.9, review_threshold=0.8)
    assert decide("confident", 0.85, policy, trusted=True) is None


def test_review_trust_says_per_class_how_many_right_checks_in_a_row_it_still_waits_for(tmp_path, capsys):
    import json

    from edge_agent.cli import main

    state = tmp_path / "state"
    state.mkdir()
    d = ResultsDB(state / "results.sqlite")
    for _ in range(23):
        _photo(d, "Apple___Black_rot", expert="Apple___Black_rot")
    for _ in range(5):
        _photo(d, "Apple___healthy", expert="Apple___healthy")
    _photo(d, "Apple___healthy", expert="Apple___Apple_scab")  # a mistake: bars trust while in the window
    _photo(d, "Apple___scab", verdict="unsure", p=0.6, expert="Apple___scab")  # right, but not a check
    d.close()
    assert main(["review", "trust", "--state-dir", str(state), "--json"]) == 0
    rows = {r["label"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["Apple___Black_rot"]["trusted"] and rows["Apple___Black_rot"]["right_checks_needed"] == 0
    assert (rows["Apple___Black_rot"]["checks"], rows["Apple___Black_rot"]["right_checks"]) == (23, 23)
    healthy = rows["Apple___healthy"]
    assert (healthy["labelled"], healthy["right"], healthy["checks"], healthy["right_checks"]) == (6, 5, 6, 5)
    assert not healthy["trusted"] and healthy["right_checks_needed"] > 23  # the mistake must leave the window first
    assert rows["Apple___scab"]["checks"] == 0 and rows["Apple___scab"]["right_checks_needed"] == 23
    assert main(["review", "trust", "--state-dir", str(state)]) == 0
    out = capsys.readouterr()
    lines = {line.split()[0]: line for line in out.out.splitlines()[1:]}
    assert "trusted: its confident answers become pseudo-labels, 5 % of them still checked" in lines["Apple___Black_rot"]
    assert f"untrusted: {healthy['right_checks_needed']} more right checks in a row" in lines["Apple___healthy"]
    assert "0.98 or above" in out.err


def test_review_trust_before_any_expert_label_says_what_earns_trust_and_a_missing_state_is_an_error(tmp_path, capsys):
    from edge_agent.cli import main

    state = tmp_path / "state"
    state.mkdir()
    ResultsDB(state / "results.sqlite").close()
    assert main(["review", "trust", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "no expert labels yet" in out and "23 right checks in a row" in out
    assert main(["review", "trust", "--state-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "results database" in err and "edge-agent run" in err
