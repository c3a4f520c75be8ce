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


def test_a_second_trainer_on_a_state_directory_in_use_stops_before_opening_its_files(tmp_path):
    """Two `edge-trainer serve` on one folder: the second took the hand-off's socket from the first (an ipc:// bind
    replaces the socket file) and opened its labels file beside it. Now it stops at once naming the first."""
    from edge_agent.config import parse_config
    from trainer.service import TrainerService

    first = TrainerService(parse_config({}), tmp_path)
    with pytest.raises(StateInUse, match=rf"another edge-trainer runs on it \(pid {os.getpid()}\).*systemctl stop edge-trainer"):
        TrainerService(parse_config({}), tmp_path)
    first.samples.close()
    first.unlabelled.close()
    first._held.close()
    again = TrainerService(parse_config({}), tmp_path)
    again.samples.close()
    again.unlabelled.close()


def test_salvage_waits_for_no_trainer_it_refuses_while_one_runs(tmp_path):
    from trainer.samples import SampleStore

    state = tmp_path / "state"
    SampleStore(state / "trainer").close()
    held = hold_state(state / "trainer", "trainer")  # a running `serve`
    try:
        out = subprocess.run(
            [sys.executable, "-m", "trainer", "salvage", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO, timeout=120
        )
    finally:
        held.close()
    assert out.returncode == 2 and "another edge-trainer runs on it" in out.stderr and "Traceback" not in out.stderr
