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
