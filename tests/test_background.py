"""Work that can wait yields to the photos: the ledger's read, the backups and the trainer at the lowest CPU and IO
priority, the daemon's own threads untouched."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from edge_agent import background
from edge_agent.background import IOPRIO_CLASS_IDLE, idle_io, io_priority, yield_to_photos
from edge_agent.backup_schedule import BackupSchedule
from edge_agent.config import AppConfig
from edge_agent.ledger_check import LedgerCheck

linux_only = pytest.mark.skipif(io_priority() is None, reason="ioprio_get is Linux's (x86-64, arm, aarch64, riscv64)")


def _lowered(worker) -> tuple[tuple[int, int] | None, int]:
    """The worker thread's IO priority and niceness once it has lowered them (or after 5 s)."""
    tid = worker._thread.native_id
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (io_priority(tid) or (0, 0))[0] != IOPRIO_CLASS_IDLE:
        time.sleep(0.01)
    return io_priority(tid), os.getpriority(os.PRIO_PROCESS, tid)


@linux_only
def test_the_ledgers_background_read_runs_at_the_lowest_cpu_and_io_priority_and_the_daemons_threads_keep_theirs(tmp_path):
    mine = io_priority(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    check = LedgerCheck(tmp_path / "results.sqlite", lambda exc, path: None, first_s=3600, poll_s=0.05)
    check.start()
    try:
        io, nice = _lowered(check)
        assert io == (IOPRIO_CLASS_IDLE, 0) and nice == 19
        assert (io_priority(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())) == mine  # the daemon's own
    finally:
        check.stop()


@linux_only
def test_a_backup_thread_runs_at_the_lowest_cpu_and_io_priority(tmp_path):
    schedule = BackupSchedule(AppConfig(), tmp_path, poll_s=0.05)
    schedule.start()
    try:
        assert _lowered(schedule) == ((IOPRIO_CLASS_IDLE, 0), 19)
    finally:
        schedule.stop()


@linux_only
def test_the_trainers_idle_io_holds_for_the_threads_it_starts_after():
    seen = {}

    def trainer():
        seen["kept"] = idle_io()
        child = threading.Thread(target=lambda: seen.setdefault("child", io_priority()))
        child.start()
        child.join()

    t = threading.Thread(target=trainer)
    t.start()
    t.join()
    assert seen == {"kept": None, "child": (IOPRIO_CLASS_IDLE, 0)}


def test_a_kernel_without_ioprio_set_leaves_the_thread_running_and_says_why(monkeypatch):
    monkeypatch.setattr(background.platform, "machine", lambda: "sparc64")
    seen = {}
    t = threading.Thread(target=lambda: seen.setdefault("kept", yield_to_photos()))
    t.start()
    t.join()
    assert seen["kept"] == f"IO priority kept (no ioprio_set on {sys.platform} sparc64)"
    assert io_priority() is None


@linux_only
def test_a_refused_ioprio_set_is_said_not_raised(monkeypatch):
    def refuse(number, *args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(background, "_call", refuse)
    assert idle_io() == "IO priority kept ([Errno 1] Operation not permitted)"


@linux_only
def test_every_thread_of_a_served_trainer_waits_for_the_daemon_its_libraries_threads_too(tmp_path):
    """`edge-trainer serve` lowers itself before it imports what starts threads (numpy's, ZeroMQ's): set in the
    service, the threads started at import kept niceness 0 and the daemon's IO priority."""
    from .daemon_helpers import TrainerProc

    state = tmp_path / "state"
    state.mkdir()
    trainer = TrainerProc(state, {"trainer": {"nice": 5}}).start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not trainer.logged("serving"):
            time.sleep(0.2)
        assert trainer.logged("serving"), trainer.log_path.read_text()[-2000:]
        tasks = [int(t) for t in os.listdir(f"/proc/{trainer.proc.pid}/task")]
        seen = {tid: (io_priority(tid), os.getpriority(os.PRIO_PROCESS, tid)) for tid in tasks}
    finally:
        trainer.terminate()
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert len(seen) >= 4 and all(io and io[0] == IOPRIO_CLASS_IDLE for io, _ in seen.values()), seen
    assert all(nice >= min(19, base + 5) for _, nice in seen.values()), seen


@linux_only
def test_a_backup_by_hand_lets_the_daemon_go_first(tmp_path, monkeypatch):
    """`edge-agent backup` while the daemon runs on the card: written at the lowest CPU and IO priority, as the
    daemon's own backups are."""
    import edge_agent.backup
    from edge_agent.cli import main

    from .web_helpers import make_state

    state, seen = make_state(tmp_path), {}

    def written(cfg, state_dir, out, **kw):
        seen["io"], seen["nice"] = io_priority(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        out.write_bytes(b"x")
        return {"files": [], "outside": {}}

    def command():  # (a thread of its own: what the command lowers is the thread that runs it)
        before = io_priority(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        seen["rc"] = main(["backup", "--state-dir", str(state), "--out", str(tmp_path / "b.tar.gz")])
        seen["after"] = (io_priority(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())) == before

    monkeypatch.setattr(edge_agent.backup, "backup", written)
    t = threading.Thread(target=command)
    t.start()
    t.join()
    assert {k: seen[k] for k in ("io", "nice", "rc")} == {"io": (IOPRIO_CLASS_IDLE, 0), "nice": 19, "rc": 0}
    if os.geteuid() == 0:  # (only root may raise a thread's priority again: a command by hand ends with it anyway)
        assert seen["after"], "the calling thread's own priority is given back after the backup"
