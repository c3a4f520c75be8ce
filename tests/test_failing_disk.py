"""A disk that fails every read and write (EIO: an SD card dying or pulled out) is said as such by the daemon, every
command and the page, and loses no photo: never called a damaged ledger, a full disk or an internal error."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
import sys
import threading

import pytest

from edge_agent.storage_errors import FAILING_DISK, access_problem, storage_problem
from engines.durable import failing_disk

from .daemon_helpers import REPO, DaemonProc, wait_until

EIO = OSError(errno.EIO, "Input/output error")


def _db_error(text: str, code: int | None) -> sqlite3.DatabaseError:
    exc = (sqlite3.DatabaseError if code == 11 else sqlite3.OperationalError)(text)
    if code is not None:
        exc.sqlite_errorcode = code  # as Python 3.11 sets it
    return exc


def test_an_input_output_error_is_a_failing_disk_and_a_database_error_is_one_only_where_its_disk_fails_the_probe(tmp_path, monkeypatch):
    """On an ext4 disk shut down under it SQLite said "database disk image is malformed" (read as a damaged page: the
    daemon promised to set a whole ledger aside), "disk I/O error" and "unable to open database file"."""
    import edge_agent.storage_errors as storage_errors

    assert storage_problem(OSError(errno.EIO, "Input/output error", "/x/status.json")) == "failing"
    malformed, io, cannot_open = _db_error("malformed", 11), _db_error("disk I/O error", 10), _db_error("unable to open", 14)
    assert storage_problem(malformed, tmp_path) == "damaged"  # a disk that takes and gives the probe whole
    assert [storage_problem(e, tmp_path) for e in (io, cannot_open)] == [None, None]
    monkeypatch.setattr(storage_errors, "failing_disk", lambda where: EIO)
    assert [storage_problem(e, tmp_path) for e in (malformed, io, cannot_open)] == ["failing"] * 3
    assert storage_problem(malformed) == "damaged"  # (where the disk is not known)
    assert storage_problem(_db_error("database is locked", 5), tmp_path) == "locked"  # (no probe for what is not the disk's)
    said = access_problem(OSError(errno.EIO, "Input/output error", "/var/lib/edge-agent/engines/current"))
    assert said == f"/var/lib/edge-agent/engines/current: {FAILING_DISK}"
    assert access_problem(io, tmp_path) == f"{tmp_path}: {FAILING_DISK}"


def test_the_probe_finds_a_disk_that_fails_to_flush_and_not_one_that_is_well_full_or_missing(tmp_path, monkeypatch):
    import engines.durable as durable

    assert failing_disk(tmp_path) is None and failing_disk(tmp_path / "no such folder") is None
    for errno_, found in ((errno.EIO, True), (errno.ENOSPC, False)):

        def fails(fd, n=errno_):
            raise OSError(n, os.strerror(n))

        monkeypatch.setattr(durable.os, "fsync", fails)
        exc = failing_disk(tmp_path)
        assert (exc is not None and exc.errno == errno.EIO) if found else exc is None
    assert list(tmp_path.iterdir()) == []  # the probe's file removed each time


def test_a_command_on_a_failing_disk_says_so_in_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    """It was a traceback (`edge-agent run` at every start systemd made, `status`, `results`)."""
    import edge_agent.daemon as daemon
    from edge_agent.cli import main

    where = tmp_path / "state" / "engines" / "current"

    class DeadCard:
        def __init__(self, *a, **k):
            raise OSError(errno.EIO, "Input/output error", str(where))

    monkeypatch.setattr(daemon, "Daemon", DeadCard)
    assert main(["run", "--state-dir", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err
    assert err == f"edge-agent: {where}: {FAILING_DISK}\n"


@pytest.mark.parametrize("met_by", ["the status file, idle", "a photo's commit"])
def test_a_disk_that_fails_under_a_running_daemon_stops_it_with_a_failure_saying_so_and_keeps_the_photo(
    tmp_path, tiny_store, monkeypatch, met_by
):
    """Before, an idle daemon on a dead card logged a failed status write and a hot-swap error every few seconds for
    ever; one storing a photo called the ledger damaged and promised to set it aside (or put the photo in quarantine as
    "internal error while decoding", met by the exactly-once check). Now it stops with status 1 saying the disk fails,
    the photo waits in the inbox, and nothing is quarantined."""
    from structlog.testing import capture_logs

    import edge_agent._daemon_status as daemon_status
    import edge_agent.storage_errors as storage_errors
    from edge_agent.config import parse_config
    from edge_agent.daemon import Daemon
    from edge_agent.results import ResultsDB
    from edge_agent.systemd import Notifier
    from engines.loader import open_engine

    from .conftest import encode, leaf_image

    def dead(*a, **k):
        raise OSError(errno.EIO, "Input/output error", "status.json")

    def io_error(*a, **k):
        raise sqlite3.OperationalError("disk I/O error")

    cfg = parse_config({"daemon": {"status_interval_s": 0.2}, "inbox": {"settle_s": 0.1}, "store": {"path": str(tiny_store)}})
    daemon = Daemon(cfg, tmp_path / "state", notifier=Notifier({}), engine=open_engine(tiny_store, cfg.engine))
    result = {}
    photo = tmp_path / "state" / "inbox" / "leaf.jpg"
    with capture_logs() as logs:
        runner = threading.Thread(target=lambda: result.setdefault("rc", daemon.run()))
        runner.start()
        try:
            wait_until(lambda: daemon.pipeline is not None and daemon.folder is not None, 20, "daemon up")
            monkeypatch.setattr(storage_errors, "failing_disk", lambda where: EIO)
            if met_by == "a photo's commit":
                monkeypatch.setattr(ResultsDB, "commit", io_error)
                photo.write_bytes(encode(leaf_image(3)))
            else:
                monkeypatch.setattr(daemon_status, "write_status", dead)
            runner.join(30)
            assert not runner.is_alive() and result["rc"] == 1
        finally:
            daemon.request_stop()
            runner.join(10)
    events = [e["event"] for e in logs]
    assert "stopped_for_failing_disk" in events and "stopped_for_damaged_ledger" not in events and "ledger_damaged" not in events
    stopped = next(e for e in logs if e["event"] == "stopped_for_failing_disk")
    assert stopped["problem"] == FAILING_DISK
    if met_by == "a photo's commit":
        assert photo.exists() and events.count("state_disk_failing") == 1
    assert not list((tmp_path / "state" / "quarantine").glob("*"))


def test_a_page_met_by_a_failing_disk_says_so_with_503_not_an_internal_error(tmp_path, monkeypatch):
    """The page that says what went wrong counted the review queue for its menu from the same dead disk, and failed
    again: every page answered 500 "the device could not answer this request"."""
    import edge_agent.storage_errors as storage_errors
    from edge_agent.results import ResultsDB
    from edge_agent.web.queries import Reader

    from .web_helpers import client, make_state

    state = make_state(tmp_path)
    c = client(state)
    assert c.get("/review").status_code == 200

    def cannot_open(self, *a, **k):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(ResultsDB, "__init__", cannot_open)
    monkeypatch.setattr(Reader, "recent", cannot_open)
    monkeypatch.setattr(storage_errors, "failing_disk", lambda where: EIO)
    for path in ("/review", "/photos", "/health"):
        r = c.get(path)
        assert r.status_code == 503 and FAILING_DISK.replace("'", "&#39;") in r.text, (path, r.status_code, r.text[-500:])
    r = c.get("/api/v1/results")
    assert r.status_code == 503 and r.json()["error"] == FAILING_DISK


# ---- on a real disk ---------------------------------------------------------------------------------------------
def test_on_a_real_card_shut_down_under_it_the_daemon_stops_keeps_the_photo_and_every_command_says_the_disk_fails(card, tmp_path):
    """ext4's shutdown (what a card that dies or is pulled out does): the daemon running on it, its hot folder on
    another disk, is given a photo; it stops with status 1 saying the disk fails, the photo stays, and `status`
    answers in one line."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    d = DaemonProc(card.path / "state", {"inbox": {"path": str(inbox)}})
    d.config_path = tmp_path / "state.toml"  # (not on the card: the next command reads it)
    d.config_path.write_text((card.path / "state.toml").read_text())
    d.log_path = tmp_path / "state.log"
    d.start().wait_ready()
    assert failing_disk(card.path / "state") is None
    card.pull_out()
    assert failing_disk(card.path / "state").errno == errno.EIO
    photo = inbox / "leaf.jpg"
    shutil.copy(REPO / "samples" / "apple_scab.jpg", photo)
    assert d.proc.wait(60) == 1
    d._log.close()
    stopped = [e for e in d.events() if e["event"] == "stopped_for_failing_disk"]
    assert stopped and stopped[0]["problem"] == FAILING_DISK and photo.exists()
    r = subprocess.run(
        [sys.executable, "-m", "edge_agent", "status", "--state-dir", str(card.path / "state")], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 2 and FAILING_DISK in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_backup_of_a_state_directory_on_a_card_that_fails_names_the_card_not_the_backups_disk(card, tmp_path):
    """It said "<the backup file>: could not write the backup: Input/output error", sending the farmer to a USB stick
    that was well."""
    from edge_agent.backup import BackupError, backup
    from edge_agent.config import AppConfig

    from .web_helpers import make_state

    state = make_state(card.path)
    card.pull_out()
    out = tmp_path / "stick" / "farm.tar.gz"
    with pytest.raises(BackupError) as refused:
        backup(AppConfig(), state, out)
    said = str(refused.value)
    assert said.startswith(f"{state}: could not be read for the backup") and "its disk fails to read" in said, said
    assert str(out) not in said and not out.exists()
