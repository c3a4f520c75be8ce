"""The ledger read whole in the background: a page a card rotted is found within a day (a minute after a start that
did not read it, at once where a look met it), and the daemon stops for its next start to keep what can be read."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edge_agent._ledger_file import record_closed
from edge_agent.ledger_check import REQUEST, LedgerCheck, request_check
from edge_agent.ledger_rows import ResultRow
from edge_agent.results import ResultsDB

from .conftest import rot_pages
from .daemon_helpers import wait_until

REPO = Path(__file__).parents[1]


def _ledger(state: Path, n: int = 50) -> Path:
    db = ResultsDB(state / "results.sqlite")
    db.commit(
        [
            ResultRow(f"{i:064x}", f"p{i}", None, "folder", "Apple___healthy", 0.97, [["Apple___healthy", 0.97]], "v4000", {})
            for i in range(n)
        ]
    )
    db.close()
    return state / "results.sqlite"


def test_the_check_finds_a_rotted_page_nothing_else_read_tells_the_daemon_and_leaves_a_whole_ledger_alone(tmp_path):
    told = []
    path = _ledger(tmp_path)
    assert LedgerCheck(path, lambda exc, file: told.append(exc)).run_once() and told == []
    rot_pages(path, "sqlite_autoindex_results_1")  # the hashes' index: no read of a page, a count or the newest, meets it
    assert ResultsDB(path, readonly=True).last_result_id() == 50
    check = LedgerCheck(path, lambda exc, file: told.append(exc), first_s=0, poll_s=0.02)
    check.start()
    try:
        wait_until(lambda: told, 10, "the damage told")
    finally:
        check.stop()
    assert "btreeInitPage" in str(told[0]) and "btreeInitPage" in check.last["damaged"]
    assert check.next > time.monotonic() + 3600  # once told, not again each turn: the next read a day on


def test_a_request_is_read_at_once_and_answered_once(tmp_path):
    told = []
    path = _ledger(tmp_path)
    record_closed(path)
    check = LedgerCheck(path, lambda exc, file: told.append(exc), first_s=86400, poll_s=0.02)
    check.start()
    try:
        time.sleep(0.2)
        assert check.last is None  # not due for a day
        request_check(tmp_path)  # a look met a damaged page
        assert not (tmp_path / "results.sqlite.closed.json").exists()  # a stopped daemon's next start reads it whole
        wait_until(lambda: check.last is not None, 10, "the requested read")
        assert not (tmp_path / REQUEST).exists() and told == []
    finally:
        check.stop()


def test_a_daemon_whose_ledger_rotted_where_its_start_does_not_read_finds_it_within_its_first_minute(tmp_path, tiny_store, monkeypatch):
    """Before, a page the start's reads did not meet waited until a commit, the hand-off or a backup read it (since a
    clean restart skips reading the ledger whole): weeks, on a page of old results. Now the daemon reads it whole a
    minute after such a start, stops with status 1, and its next start keeps every row that can be read."""
    from edge_agent.config import parse_config
    from edge_agent.daemon import Daemon
    from edge_agent.systemd import Notifier
    from engines.loader import open_engine

    state = tmp_path / "state"
    path = _ledger(state)
    record_closed(path)
    rot_pages(path, "sqlite_autoindex_results_1")
    monkeypatch.setattr("edge_agent.ledger_check.FIRST_S", 0.5)
    cfg = parse_config({"inbox": {"settle_s": 0.1}, "store": {"path": str(tiny_store)}})

    def run() -> tuple[int, Daemon]:
        daemon = Daemon(cfg, state, notifier=Notifier({}), engine=open_engine(tiny_store, cfg.engine))
        result = {}
        runner = threading.Thread(target=lambda: result.setdefault("rc", daemon.run()))
        runner.start()
        runner.join(30)
        if runner.is_alive():
            daemon.request_stop()
            runner.join(10)
        return result.get("rc"), daemon

    rc, daemon = run()
    assert rc == 1 and daemon.ledger_note is None and not (state / "results.sqlite.closed.json").exists()
    monkeypatch.setattr("edge_agent.ledger_check.FIRST_S", 3600)
    daemon = Daemon(cfg, state, notifier=Notifier({}), engine=open_engine(tiny_store, cfg.engine))
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        wait_until(lambda: daemon.pipeline is not None, 20, "daemon up")
        assert "results: 50 rows kept" in daemon.ledger_note and daemon.db.last_result_id() == 50
        assert daemon.ledger_check.next > time.monotonic() + 3600  # this start read it whole: the next a day on
    finally:
        daemon.request_stop()
        runner.join(10)


def test_a_look_that_meets_a_damaged_page_says_so_and_asks_the_daemon_to_read_the_ledger(tmp_path):
    """The page answered 500 "the device could not answer this request" and the command line said the ledger would be
    set aside at the next start (true only for a daemon that stopped): now both say the page is damaged and ask a
    running daemon to read the ledger whole now (it then restarts and keeps what can be read)."""
    pytest.importorskip("starlette")
    from .web_helpers import client, make_state

    state = make_state(tmp_path)
    record_closed(state / "results.sqlite")
    rot_pages(state / "results.sqlite", "results")
    r = client(state).get("/api/v1/results")
    assert r.status_code == 503 and "damaged" in r.json()["error"] and r.headers["Retry-After"] == "60"
    assert (state / REQUEST).exists() and not (state / "results.sqlite.closed.json").exists()
    (state / REQUEST).unlink()
    out = subprocess.run(
        [sys.executable, "-m", "edge_agent", "results", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert out.returncode == 2 and "a page of the device's records is damaged" in out.stderr and "Traceback" not in out.stderr
    assert (state / REQUEST).exists()


def test_status_and_the_health_page_say_when_the_records_were_last_read_whole_and_what_was_found(tmp_path):
    """A farm sees its card's records are read for damage (and when next), or that a damaged page was found."""
    import json
    import os

    pytest.importorskip("starlette")
    from edge_agent.ledger_check import check_line

    from .web_helpers import client, make_state

    now = time.time()
    assert check_line({"last": None, "next": now + 50}, now) == "to be read whole for damage at the next look"
    whole = {"last": {"time": now - 7200, "seconds": 0.153, "damaged": None}, "next": now + 22 * 3600}
    assert check_line(whole, now) == "read whole for damage 2 h ago (0.2 s), none found; again in 22 h"
    found = {"last": {"time": now - 30, "seconds": 0.1, "damaged": "Page 3: btreeInitPage() returns error code 11"}, "next": now}
    assert check_line(found, now).startswith("a damaged page found just now: the daemon's next start keeps every row")
    state = make_state(tmp_path)
    for st, shown in ((whole, "read whole for damage 2 h ago"), (found, "a damaged page found just now")):
        (state / "status.json").write_text(json.dumps({"pid": os.getpid(), "updated": time.time(), "ledger_check": st}))
        warn = ' class="warn"' if st is found else ""
        assert f'<span id="records-check"{warn}>records: {shown}' in client(state).get("/health").text
        out = subprocess.run(
            [sys.executable, "-m", "edge_agent", "status", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO, timeout=60
        )
        assert f"records: {shown}" in out.stdout, out.stdout + out.stderr


def test_a_trainer_beside_the_daemon_is_asked_to_read_its_labels_when_the_daemons_backup_finds_them_damaged(tmp_path):
    """The daemon's backup holds the trainer's files where both share a state directory, and the trainer takes no
    backups of its own: a damaged labels file failed the backup every day and nobody told the trainer. Now the daemon
    leaves the request in the trainer's folder; the trainer reads its files whole within seconds and stops (status 1)
    for its next start to keep what can be read."""
    from edge_agent.config import parse_config
    from edge_agent.daemon import Daemon
    from trainer import service

    state = tmp_path / "state"
    svc = service.TrainerService(parse_config({}), state)
    header = {"id": "a" * 64, "ext": ".jpg", "kind": "expert", "label": "Apple___healthy", "confidence": 1.0, "engine_version": "v1"}
    svc.samples.add(header, b"a photo")
    svc.samples._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rot_pages(svc.root / "samples.sqlite", "sqlite_autoindex_samples_1")
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("rc", svc.run()))
    runner.start()
    try:
        daemon = Daemon(parse_config({}), state)
        daemon._backup_found_damage("trainer/samples.sqlite", sqlite3.DatabaseError("integrity check: ..."))
        assert (svc.root / REQUEST).exists()
        runner.join(30)
        assert not runner.is_alive() and result["rc"] == 1 and svc.damaged.startswith("trainer/samples.sqlite")
    finally:
        svc.request_stop()
        runner.join(10)
