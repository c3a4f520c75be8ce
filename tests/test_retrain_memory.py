"""A retrain's memory by phase: each phase's record rises by what it held, and the record never invents a phase."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainer._memory import PhaseMemory, peak_rss_mb

_PROGRAM = """
import json, numpy as np
from trainer._memory import PhaseMemory
m = PhaseMemory()
m.enter("small")
small = np.ones(8 * 2**20 // 8)
m.enter("big")
big = np.ones(300 * 2**20 // 8)
del big
m.enter("after")
print(json.dumps(m.summary()))
"""


@pytest.mark.skipif(peak_rss_mb() is None, reason="the platform does not report a peak resident size")
def test_the_phase_that_held_300_mb_raises_the_record_by_about_that_and_the_next_does_not():
    out = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, check=True, timeout=60)
    memory = json.loads(out.stdout)
    by_phase = memory["by_phase"]
    assert list(by_phase) == ["small", "big", "after"]
    assert 200 <= by_phase["big"] - by_phase["small"] <= 340  # the record before it may hold an import's freed heap
    assert by_phase["after"] == by_phase["big"] == memory["peak_mb"]  # freed: the peak stays where it was


def test_a_repeated_phase_is_one_phase_and_a_summary_ends_the_last():
    m = PhaseMemory()
    for _ in range(3):
        m.enter("training")
    m.enter("gate")
    summary = m.summary()
    assert list(summary["by_phase"]) == ["training", "gate"]
    assert m.summary()["by_phase"] == summary["by_phase"]  # nothing running: no phase added
