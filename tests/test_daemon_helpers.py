"""The tests' process helpers: a daemon or trainer a failed test left running does not outlive it."""

from __future__ import annotations

import subprocess
import sys

from .daemon_helpers import _STARTED, kill_leftovers


def test_a_process_a_test_left_running_is_killed_and_one_already_stopped_is_left_alone():
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopped = subprocess.Popen([sys.executable, "-c", "pass"])
    stopped.wait(10)
    _STARTED.extend([stopped, running])
    kill_leftovers()
    assert running.poll() is not None and stopped.returncode == 0 and not _STARTED
