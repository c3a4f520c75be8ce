"""A backup of a card that is failing: an SD card that fails remounts itself read-only, and one that is full has no
room for the databases' copies; the backup is taken all the same, onto the stick or the file named, whole."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

import edge_agent.backup as backup_module
from edge_agent.backup import backup
from edge_agent.config import AppConfig
from edge_agent.restore import restore
from edge_agent.results import ResultsDB

from .backup_helpers import stick_cfg
from .web_helpers import make_state


def _crashed_ledger(state: Path, rows: int) -> None:
    """``rows`` more results in ``state``'s ledger, left as a daemon killed when its card failed leaves them: in the
    write-ahead log, its index lost."""
    from edge_agent.ledger_rows import ResultRow

    db = ResultsDB(state / "results.sqlite")
    db._db.execute("PRAGMA wal_autocheckpoint = 0")
    db.commit([ResultRow(f"{i:064x}", f"c{i}", None, "folder", "Apple___healthy", 0.9, [], "v4000", {}) for i in range(rows)])
    kept = {s: Path(f"{state}/results.sqlite{s}").read_bytes() for s in ("", "-wal")}
    db.close()
    for s, data in kept.items():
        Path(f"{state}/results.sqlite{s}").write_bytes(data)
    Path(f"{state}/results.sqlite-shm").unlink(missing_ok=True)
    assert len(kept["-wal"]) > 0


@pytest.fixture
def card(tmp_path):
    """A disk of its own (a tmpfs), remounted read-only by ``card.fail()``: needs root and ``mount``."""
    where = tmp_path / "card"
    where.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "none", str(where)]).returncode:
        pytest.skip("needs root and mount: a tmpfs remounted read-only stands for a failing SD card")

    class Card:
        path = where

        @staticmethod
        def fail() -> None:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)

    yield Card
    subprocess.run(["umount", "-l", str(where)])


def test_a_card_remounted_read_only_is_backed_up_whole_to_a_file_and_onto_the_stick(tmp_path, card, capsys):
    """The moment a farm most needs a backup: `edge-agent backup` made its databases' copies in the state directory,
    and on a read-only card said "could not write the backup: Read-only file system" of the file it was to write
    elsewhere; a backup into `[backup] dir` could not make its lock. Now the copies go beside the backup and the
    lock beside the backups, and a ledger whose log lies without its index (the daemon killed as the card failed)
    is copied with its log's results (`status`, which cannot open it there, says the disk is read-only, not that the
    ledger is unreadable and will be set aside)."""
    from edge_agent.backup_folder import take

    state = make_state(card.path)
    shutil.rmtree(state / "engines")  # (the shipped engines: 107 MB this test needs none of)
    _crashed_ledger(state, 5)
    card.fail()
    with pytest.raises(OSError):
        (state / "probe").write_bytes(b"")  # read-only now
    from edge_agent.cli import main

    assert main(["status", "--state-dir", str(state)]) == 2  # SQLite cannot open that ledger here: said as what it is
    said = capsys.readouterr().err
    assert said.startswith(f"edge-agent: {state}: the state directory's disk is mounted read-only") and "unreadable" not in said

    manifest = backup(AppConfig(), state, tmp_path / "out" / "farm.tar.gz")
    assert "results.sqlite" in manifest["files"]
    restore(tmp_path / "out" / "farm.tar.gz", tmp_path / "restored")
    assert ResultsDB(tmp_path / "restored" / "results.sqlite", readonly=True).counts()["processed"] == 6 + 5

    (tmp_path / "stick").mkdir()
    taken = take(stick_cfg(tmp_path / "stick"), state)
    restore(Path(taken["path"]), tmp_path / "restored-from-stick")
    assert ResultsDB(tmp_path / "restored-from-stick" / "results.sqlite", readonly=True).counts()["processed"] == 11
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".tmp-")]


def test_a_full_card_is_backed_up_with_the_databases_copies_made_beside_the_backup(tmp_path, monkeypatch):
    """A state disk without room for the databases' copies failed the backup ("no room for its copy in the state
    directory"); now they are made beside the backup, and nothing is left there."""
    from collections import namedtuple

    state = make_state(tmp_path)
    shutil.rmtree(state / "engines")
    made = []
    copy = backup_module._sqlite_copy
    monkeypatch.setattr(backup_module, "_sqlite_copy", lambda src, dst: made.append(dst.parent) or copy(src, dst))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(backup_module.shutil, "disk_usage", lambda p: usage(1 << 34, (1 << 34) - (1 << 20), 1 << 20))
    backup(AppConfig(), state, tmp_path / "stick" / "farm.tar.gz")
    assert made and all(p.parent == tmp_path / "stick" for p in made)
    assert not [p for p in state.iterdir() if p.name.startswith(".tmp-")]
    assert not [p for p in (tmp_path / "stick").iterdir() if p.name.startswith(".tmp-")]
    restore(tmp_path / "stick" / "farm.tar.gz", tmp_path / "restored")
    assert ResultsDB(tmp_path / "restored" / "results.sqlite", readonly=True).counts()["processed"] == 6
    assert sqlite3.connect(tmp_path / "restored" / "results.sqlite").execute("PRAGMA quick_check").fetchone() == ("ok",)


def test_the_services_on_a_read_only_card_say_so_in_one_line_with_what_to_do(card, capsys):
    """`edge-agent run` on a card remounted read-only said "permission denied" (SQLite's "attempt to write a readonly
    database"), and `edge-trainer serve` ended in a traceback; `status` said nothing of it (a daemon still running
    there cannot write its status: it looked stopped), and it and the page could not open a ledger its daemon had
    closed (SQLite opens a WAL database read-only on such a disk only with its index, or as immutable)."""
    pytest.importorskip("torch", reason="the trainer's command line")
    from edge_agent.cli import main as agent
    from trainer.cli import main as trainer

    pytest.importorskip("starlette", reason="the web page")
    from edge_agent.web.auth import csrf_secret

    from .web_helpers import client

    state = make_state(card.path)
    csrf_secret(state / "web" / "csrf.key")  # the page has run here before: its key is made
    assert not Path(f"{state}/results.sqlite-wal").exists()  # its daemon closed it: one file
    card.fail()
    for main, name, command in ((agent, "edge-agent", "run"), (trainer, "edge-trainer", "serve")):
        assert main([command, "--state-dir", str(state)]) == 2
        said = capsys.readouterr().err
        assert said.startswith(f"{name}: {state}") and "disk is mounted read-only" in said and "edge-agent backup --out" in said
        assert "Traceback" not in said and said.count("\n") == 1
    assert agent(["status", "--state-dir", str(state)]) == 0  # status still reads it, and says what is wrong first
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("STATE DISK READ-ONLY: the state directory's disk is mounted read-only: nothing is recorded")
    page = client(state)  # and the page shows the season (its ledger, closed by its daemon, opened as immutable)
    assert page.get("/photos").text.count('class="card"') == 6
    assert 'id="read-only"' in page.get("/health").text


def test_a_state_directory_this_user_may_not_write_is_said_in_one_line_naming_it_and_the_fix(tmp_path, monkeypatch, capsys):
    """As a user outside the service's group (here: the folder refused by the OS), both commands ended in a traceback."""
    pytest.importorskip("torch", reason="the trainer's command line")
    from edge_agent.cli import main as agent
    from edge_agent.state import StateLayout
    from trainer.cli import main as trainer

    denied = tmp_path / "var-lib-edge-agent"

    def refuse(self, *a, **kw):
        raise PermissionError(13, "Permission denied", str(denied))

    monkeypatch.setattr(StateLayout, "create", refuse)
    monkeypatch.setattr(Path, "mkdir", refuse)
    for main, name, command in ((agent, "edge-agent", "run"), (trainer, "edge-trainer", "serve")):
        assert main([command, "--state-dir", str(denied)]) == 2
        said = capsys.readouterr().err
        assert (
            said
            == f"{name}: permission denied: {denied}: run it as the service's user (sudo -u edge-agent ...), or give a --state-dir this user may write\n"
        )


def test_a_full_card_at_the_first_start_after_an_upgrade_keeps_its_ledger_and_says_the_disk_is_full(card, capsys):
    """A real full disk (the tmpfs filled): the new indexes cannot be made, and the ledger was set aside as damaged."""
    import sqlite3

    from edge_agent._ledger_file import CLOSED
    from edge_agent.cli import main
    from edge_agent.ledger_rows import ResultRow

    state = make_state(card.path)
    shutil.rmtree(state / "engines")
    ledger = state / "results.sqlite"
    old = sqlite3.connect(ledger)  # as a ledger from before 7aeb3fd left it
    old.execute("DROP INDEX results_label_verdict")
    old.execute("DROP INDEX results_plant_created")
    old.close()
    Path(f"{ledger}{CLOSED}").unlink(missing_ok=True)
    with open(card.path / "filler", "wb", buffering=0) as f:  # the card full to its last byte
        try:
            while True:
                f.write(bytes(1 << 20))
        except OSError:
            pass
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(bytes(size))
            except OSError:
                pass
    with pytest.raises(sqlite3.OperationalError):
        ResultsDB.open_or_recover(ledger, expected=True)
    assert not list(state.glob("results.sqlite.corrupt-*"))
    assert main(["review", "label", "--state-dir", str(state), "p0", "Apple___Apple_scab"]) == 2
    assert "the disk is full" in capsys.readouterr().err
    (card.path / "filler").unlink()
    db, note = ResultsDB.open_or_recover(ledger, expected=True)
    assert note is None and db.counts()["processed"] == 6
    db.commit([ResultRow("f" * 64, "pf", None, "folder", "Apple___healthy", 0.9, [], "v4000", {})])
    db.close()
