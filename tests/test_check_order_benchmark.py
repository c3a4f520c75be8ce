"""The check-order replay's own arithmetic: on which day a class's checks earn it trust, by the device's rule."""

from __future__ import annotations

import random

from benchmarks.check_order import BANDS, RULES, by_day, markdown, trust_day
from edge_agent.config import LabelsSection


def test_a_class_right_on_every_check_is_trusted_on_the_day_its_twenty_third_check_is_asked():
    days = [[(0.5, True)] * 10 for _ in range(6)]  # 10 confident answers a day, all right
    assert trust_day(days, "margin", 7, LabelsSection()) == 4  # 7, 14, 21, then 28 >= 23
    assert trust_day(days, "margin", 7, LabelsSection(trust_against=0.80)) == 3  # 16 right checks then
    assert trust_day(days, "drawn", 7, LabelsSection(), random.Random(0)) == 4


def test_checking_the_smallest_margins_first_finds_the_wrong_answers_a_fair_draw_may_miss():
    # each day: 2 wrong answers at small margins among 18 right ones at large margins (90 % right)
    days = [[(0.05, False), (0.06, False)] + [(0.5 + i / 100, True) for i in range(18)] for _ in range(8)]
    policy = LabelsSection(trust_against=0.80)
    assert trust_day(days, "margin", 7, policy) is None  # the two wrong ones are asked first every day
    drawn = [trust_day(days, "drawn", 7, policy, random.Random(k)) for k in range(50)]
    assert any(d is not None for d in drawn)  # a lucky draw of right answers trusted a 90 % class under 0.80


def test_no_day_brings_trust_to_a_class_the_expert_keeps_correcting():
    days = [[(0.5, i % 2 == 0) for i in range(10)] for _ in range(10)]
    assert all(trust_day(days, "drawn", 7, LabelsSection(), random.Random(k)) is None for k in range(20))


def test_the_table_shows_each_rule_and_the_precision_at_each_confidence():
    row = {
        "seed": 1,
        "engine": "v2002",
        "class": "Apple___Apple_scab",
        "confident": 55,
        "precision": 0.873,
        "test_confident": 22,
        "test_precision": 0.955,
        "bands": {str(b): [10, 0.9] for b in BANDS} | {"0.99": [0, None], "0.995": [0, None]},
        "rules": {name: {"margin_day": 3, "drawn_trusted": 0.57, "drawn_day": 3.0, "pseudo": [55, 0.873]} for name in RULES},
    }
    row["rules"]["0.97 vs 0.85, from 0.98 (shipped: trust_confidence)"] |= {"margin_day": None, "pseudo": [12, 0.917]}
    text = markdown([row], "python -m benchmarks.check_order X")
    assert "| 1 | v2002 | Apple_scab | 0.873 of 55 | 0.955 of 22 | day 3; drawn 0.57; 0.873 of 55 |" in text
    assert "| day -; drawn 0.57; 0.917 of 12 |" in text  # the stricter threshold's own answers
    assert "| 1 | v2002 | Apple_scab | 0.90 of 10 | 0.90 of 10 | 0.90 of 10 | 0.90 of 10 | - | - |" in text


def test_a_rule_with_its_own_confidence_threshold_checks_and_pseudo_labels_only_the_answers_that_reach_it():
    answers = [(0, 0.2, 0.91, False), (5, 0.6, 0.99, True), (120, 0.7, 0.985, True), (130, 0.1, 0.95, False)]
    mine, days = by_day(answers, 0.98, 100, 2)
    assert [a[0] for a in mine] == [5, 120] and days == [[(0.6, True)], [(0.7, True)]]
    assert by_day(answers, 0.9, 100, 2)[1] == [[(0.2, False), (0.6, True)], [(0.7, True), (0.1, False)]]


def test_the_mixed_order_asks_the_least_sure_half_of_each_days_checks_so_it_never_misses_the_wrong_answers_at_the_smallest_margins():
    days = [[(0.05, False), (0.06, False)] + [(0.5 + i / 100, True) for i in range(18)] for _ in range(8)]
    policy = LabelsSection(trust_against=0.80)
    assert all(trust_day(days, "mixed", 7, policy, random.Random(k)) is None for k in range(50))
    right = [[(0.5, True)] * 10 for _ in range(6)]
    assert trust_day(right, "mixed", 7, LabelsSection(), random.Random(0)) == 4  # as soon as the other orders


def test_the_mixed_order_draws_the_rest_of_its_checks_so_it_can_find_a_wrong_answer_the_smallest_margins_first_never_ask():
    days = [[(i / 100, i != 8) for i in range(30)] for _ in range(10)]  # the ninth least sure is wrong: 29 of 30 right
    assert trust_day(days, "margin", 7, LabelsSection()) == 4  # the seven least sure each day: never the wrong one
    mixed = [trust_day(days, "mixed", 7, LabelsSection(), random.Random(k)) for k in range(100)]
    assert None in mixed or any(d > 4 for d in mixed)  # some draws asked it, and their trust came later or not at all


def test_the_table_gives_the_share_of_mixed_draws_that_trust_a_class_where_the_report_has_them():
    rules = {
        name: {"margin_day": 4, "drawn_trusted": 0.5, "drawn_day": 5.0, "mixed_trusted": 0.25, "mixed_day": 6.0, "pseudo": [40, 0.95]}
        for name in RULES
    }
    row = {
        "seed": 2,
        "engine": "v4003",
        "class": "Apple___healthy",
        "confident": 40,
        "precision": 0.95,
        "test_confident": 0,
        "test_precision": None,
        "bands": {str(b): [0, None] for b in BANDS},
        "rules": rules,
    }
    text = markdown([row], "python -m benchmarks.check_order X")
    assert "| day 4; drawn 0.50; mixed 0.25; 0.950 of 40 |" in text and "the share of mixed draws" in text
