"""One daemon a state directory: a second start on the same folder stops at once and says which process holds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.instance import LOCK, StateInUse, hold_state

REPO = Path(__file__).parents[1]


def test_a_state_directory_is_held_by_one_daemon_at_a_time_and_free_again_once_it_ends(tmp_path):
    held = hold_state(tmp_path)
    assert (tmp_path / LOCK).read_text() == str(os.getpid())
    with pytest.raises(StateInUse, match=rf"another edge-agent daemon runs on it \(pid {os.getpid()}\)"):
        hold_state(tmp_path)
    held.close()
    hold_state(tmp_path).close()


def test_a_second_edge_agent_run_on_a_state_directory_in_use_stops_with_one_line_and_touches_nothing(tmp_path):
    """Before, a daemon started by hand on the service's state directory (or `make run` in a second terminal) ran
    beside it: both claimed the same photos, ledger and queue, and a start that found the ledger damaged would have
    replaced it under the other. Now the second stops at once, exit status 2, naming the first's pid."""
    state = tmp_path / "state"
    state.mkdir()
    held = hold_state(state)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "edge_agent", "run", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO, timeout=120
        )
    finally:
        held.close()
    assert out.returncode == 2 and f"another edge-agent daemon runs on it (pid {os.getpid()})" in out.stderr
    assert "Traceback" not in out.stderr and not (state / "results.sqlite").exists()
