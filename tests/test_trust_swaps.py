"""The trust replay across swaps (benchmarks.trust_swaps): the shipped window reads every engine's checks, the
serving one only the engine in service's."""

from __future__ import annotations

from benchmarks.trust_swaps import trust_by_day
from edge_agent.config import LabelsSection

POLICY = LabelsSection()  # the shipped test: 23 right checks with none wrong


def _day(engine: str, first: int, n: int, wrong: tuple[int, ...] = ()) -> tuple[str, dict[int, tuple[float, bool]]]:
    """``engine`` sure of photos ``first`` .. ``first + n - 1`` of the class, wrong on those in ``wrong``."""
    return engine, {i: (i / 1000, i not in wrong) for i in range(first, first + n)}


def test_a_wrong_check_by_an_engine_no_longer_serving_holds_the_shipped_window_back_but_not_the_serving_engines():
    # v1 serves two days and its last check is wrong; v2, right on every photo, serves from the third day; 8 checks a day
    days = [_day("v1", 0, 8), _day("v1", 0, 16, wrong=(15,))] + [_day("v2", 0, 8 * (d + 1)) for d in range(2, 7)]
    got = trust_by_day(days, lambda i: i // 8, 8, POLICY)
    assert got["serving"].index(True) == 4  # 24 right checks of v2's own
    assert got["shipped"].index(True) == 5  # until v1's wrong check has left the latest 30


def test_an_engine_wrong_on_the_class_is_trusted_by_neither_and_a_swap_starts_the_serving_window_again():
    wrong_often = [_day("v1", 0, 10 * (d + 1), wrong=tuple(range(0, 60, 9))) for d in range(6)]
    got = trust_by_day(wrong_often, lambda i: i // 10, 10, POLICY)
    assert not any(got["shipped"]) and not any(got["serving"])
    right = [_day("v1", 0, 10 * (d + 1)) for d in range(3)] + [_day("v2", 0, 40)]  # 30 right checks by v1, then a swap
    got = trust_by_day(right, lambda i: i // 10, 10, POLICY)
    assert got["shipped"][2] and got["shipped"][3]  # the shipped window keeps v1's checks
    assert got["serving"][2] and not got["serving"][3]  # v2 has 10 checks of its own: not yet


def test_an_older_engines_mistake_weighed_less_lets_trust_come_sooner_but_not_when_its_right_checks_are_weighed_less_too():
    # v1's 10th check is wrong; v2 serves from the third day and is right on all; 8 checks a day
    days = [_day("v1", 0, 8), _day("v1", 0, 16, wrong=(15,))] + [_day("v2", 0, 8 * (d + 1)) for d in range(2, 7)]
    got = trust_by_day(days, lambda i: i // 8, 8, POLICY, decays=(0.5, 0.0))
    assert got["shipped"].index(True) == 5
    assert got["wrong x0"].index(True) == 2  # the mistake forgotten: 23 right checks by the third day's end
    assert got["wrong x0.5"].index(True) == 3  # weighed half: it costs 6 more right checks, not the whole window
    assert got["older x0.5"].index(True) == 5  # v1's right checks count half too: no sooner than the shipped window
    assert got["older x0"] == got["serving"]


def test_the_simulated_farm_trusts_an_always_right_class_after_23_checks_and_an_always_wrong_one_never():
    import random

    from benchmarks.trust_swaps import simulate

    assert simulate(1.0, 1.0, 1, 20, 7, random.Random(0), POLICY) == 4  # 28 checks by day 4, 23 needed
    assert simulate(0.0, 0.0, 1, 20, 7, random.Random(0), POLICY) is None
    # a class right 80 % of the time: forgetting older engines' mistakes trusts it in most runs, the shipped test rarely
    rng = random.Random(1)
    forgot = sum(simulate(0.8, 0.0, 1, 20, 7, rng, POLICY) is not None for _ in range(200))
    kept = sum(simulate(0.8, 1.0, 1, 20, 7, rng, POLICY) is not None for _ in range(200))
    assert forgot > 150 and kept < 10
