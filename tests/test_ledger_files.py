"""The databases the services write: a stopped daemon's ledger is one file that holds every result, and a read-only
look by another user while a service is stopped never leaves it unable to write."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest

from edge_agent.ledger_rows import ResultRow
from edge_agent.results import ResultsDB


def _row(i: int) -> ResultRow:
    return ResultRow(f"{i:064x}", f"p{i}", None, "folder", "Apple___healthy", 0.97, [["Apple___healthy", 0.97]], "v4000", {})


def test_a_closed_ledger_is_one_file_that_holds_every_result_though_other_threads_read_it(tmp_path):
    """The pipeline's threads each read the ledger through a connection of their own (``has``); closing it closes
    them too, so the last close folds the write-ahead log in: a copy of ``results.sqlite`` alone, taken while the
    daemon is stopped, holds every result (before, the log stayed beside it, and the copy held none)."""
    db = ResultsDB(tmp_path / "results.sqlite")
    db.commit([_row(1), _row(2)])
    seen = []
    readers = [threading.Thread(target=lambda: seen.append(db.has(_row(1).sha256))) for _ in range(2)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    assert seen == [True, True]
    db.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.sqlite", "results.sqlite.closed.json"]
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "results.sqlite", tmp_path / "copy" / "results.sqlite")
    assert ResultsDB(tmp_path / "copy" / "results.sqlite", readonly=True).counts()["processed"] == 2


def _stores(root: Path):
    """Each service's database, opened for writing: (its file, a writer that records one row, its close)."""
    from edge_agent.alerts.outbox import Outbox
    from trainer.loop.unlabelled_pool import UnlabelledPool
    from trainer.samples import SampleStore

    header = {"id": "a" * 64, "ext": ".jpg", "kind": "expert", "label": "Apple___healthy", "confidence": 1.0, "engine_version": "v1"}
    yield root / "results.sqlite", lambda: ResultsDB(root / "results.sqlite"), lambda s: s.commit([_row(3)])
    yield root / "alerts.sqlite", lambda: Outbox(root / "alerts.sqlite", 1 << 20), lambda s: s.set("cursor", "1")
    yield root / "samples.sqlite", lambda: SampleStore(root), lambda s: s.add(header, b"a photo")
    yield root / "unlabelled.sqlite", lambda: UnlabelledPool(root, 10, 1 << 20), lambda s: s.add(header, b"a photo")


@pytest.mark.parametrize("which", ["results", "alerts", "samples", "unlabelled"])
def test_an_empty_log_that_a_reader_under_another_user_left_is_removed_before_a_writer_opens_and_one_with_commits_never_is(
    tmp_path, monkeypatch, which
):
    """SQLite makes ``-wal`` and ``-shm`` as whoever opens a database first: ``edge-agent status`` run by another
    member of the service's group while the daemon is stopped left them as that user, and the daemon's next start
    could not write (``attempt to write a readonly database``; tried with two users on this VM). The files are
    another user's here because ``os.access`` says this process cannot write them (root can write any file)."""
    path, opened, write = next((p, o, w) for p, o, w in _stores(tmp_path) if p.stem == which)
    store = opened()
    store.close()
    assert not Path(f"{path}-wal").exists()
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)  # the other user's look: an empty log and index
    reader.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    reader.close()  # (its process gone: a read-only connection leaves them)
    assert Path(f"{path}-wal").stat().st_size == 0 and Path(f"{path}-shm").exists()
    theirs = {f"{path}-wal", f"{path}-shm"}
    os.link(f"{path}-shm", tmp_path / "their-shm")  # (keeps its inode from being reused by the writer's own)
    access = os.access
    monkeypatch.setattr("engines.durable.os.access", lambda p, mode: str(p) not in theirs and access(p, mode))
    store = opened()
    write(store)
    assert not os.path.samefile(f"{path}-shm", tmp_path / "their-shm")  # this process's own now, and in use
    store.close()

    Path(f"{path}-wal").write_bytes(b"commits not folded in yet")  # a log with content is never removed
    Path(f"{path}-shm").write_bytes(bytes(32768))
    from engines.durable import connect_writable

    connect_writable(path).close()
    assert Path(f"{path}-wal").read_bytes() == b"commits not folded in yet"


def test_the_daemons_start_reads_the_ledger_whole_for_damage_only_where_it_changed_since_closed_and_a_label_never(tmp_path, monkeypatch):
    """SQLite's quick_check reads the whole file: about 150 ms for a season's ledger of 300,000 results (149 MB) on
    these cores, seconds from a Pi's card after a reboot. Every writable open ran it, so each label given on the
    Review page or with `edge-agent review label` waited for it, and every start did. Now a label never does, and the
    daemon's start does where the ledger changed since it was last closed whole (a power cut leaves its log, a card
    that fails cuts it short, a copy or a restore is another file); a reader's look since changes nothing."""
    import os

    import edge_agent._ledger_file as ledger_file

    statements: list[str] = []
    connect = ledger_file.connect_writable

    def traced(path):
        con = connect(path)
        con.set_trace_callback(statements.append)
        return con

    def start_checked() -> bool:
        statements.clear()
        db, note = ResultsDB.open_or_recover(ledger)  # the daemon's start
        assert note is None
        checked = any("quick_check" in s for s in statements)
        db.commit([_row(len(statements))])
        db.close()
        return checked

    monkeypatch.setattr(ledger_file, "connect_writable", traced)
    ledger = tmp_path / "results.sqlite"
    ResultsDB(ledger).close()  # the page's or the command line's open, to write a label
    assert statements and not [s for s in statements if "quick_check" in s]
    assert not start_checked()  # closed whole just before
    assert not start_checked()  # and again
    reader = ResultsDB(ledger, readonly=True)  # `status` since: an empty log left
    reader.counts()
    reader.close()
    assert Path(f"{ledger}-wal").exists() and not start_checked()
    os.utime(ledger, ns=(0, 0))  # changed since (as a card, a copy or a restore changes it)
    assert start_checked() and not start_checked()
    crashed = ResultsDB(ledger)  # a power cut: its log left with results in it
    crashed._db.execute("PRAGMA wal_autocheckpoint = 0")
    crashed.commit([_row(999)])
    wal = Path(f"{ledger}-wal").read_bytes()
    crashed.close()
    Path(f"{ledger}-wal").write_bytes(wal)
    assert start_checked()


def test_a_seasons_counts_by_class_and_its_plants_are_read_from_indexes_not_from_every_row(tmp_path):
    """At a season's end (300,000 results, 149 MB here) each count by class read every row: /metrics 225 ms a scrape,
    the Photos page 165 ms, the Map 270 ms, the Plants page 445 ms (28, 34, 135 and 191 ms with these indexes). A
    ledger from before gets them at the daemon's next start, and loses the plant index they replace."""
    import sqlite3

    path = tmp_path / "results.sqlite"
    ResultsDB(path).close()
    old = sqlite3.connect(path)  # as a ledger from before left it
    old.execute("DROP INDEX results_label_verdict")
    old.execute("DROP INDEX results_plant_created")
    old.execute("CREATE INDEX results_plant ON results(plant) WHERE plant IS NOT NULL")
    old.close()
    ResultsDB(path).close()
    con = sqlite3.connect(path)
    indexes = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"results_label_verdict", "results_plant_created"} <= indexes and "results_plant" not in indexes

    def plan(sql: str) -> str:
        return " ".join(r[-1] for r in con.execute(f"EXPLAIN QUERY PLAN {sql}"))

    for sql in (
        "SELECT label, COALESCE(verdict, 'none'), COUNT(*) FROM results GROUP BY label, verdict",  # /metrics
        "SELECT label, COUNT(*), SUM(verdict = 'confident') FROM results GROUP BY label",  # the Diseases page
        "SELECT DISTINCT label FROM results ORDER BY label",  # the Photos and Map pages' class filter
    ):
        assert "COVERING INDEX results_label_verdict" in plan(sql), sql
    plants = "SELECT plant, COUNT(*), MAX(created) FROM results WHERE plant IS NOT NULL GROUP BY plant ORDER BY MAX(id) DESC LIMIT 50"
    assert "COVERING INDEX results_plant_created" in plan(plants)


def test_a_full_disk_at_the_first_start_after_an_upgrade_keeps_the_ledger_and_never_sets_it_aside_as_damaged(tmp_path, monkeypatch):
    """The first start after an upgrade makes the ledger's new indexes (7aeb3fd): on a full card SQLite refuses with
    "database or disk is full", which the start took as a damaged ledger and set aside, starting a new one (the
    season's history gone from the page). A full, locked or read-only disk is now said, and the ledger kept."""
    import sqlite3

    import edge_agent._ledger_file as ledger_file

    path = tmp_path / "results.sqlite"
    db = ResultsDB(path)
    db.commit([_row(1), _row(2)])
    db.close()
    connect = ledger_file.connect_writable

    class FullCard:
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *args):
            if sql.startswith("CREATE INDEX"):
                err = sqlite3.OperationalError("database or disk is full")
                err.sqlite_errorcode = 13  # SQLITE_FULL
                raise err
            return self.con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.con, name)

    monkeypatch.setattr(ledger_file, "connect_writable", lambda p: FullCard(connect(p)))
    Path(f"{path}{ledger_file.CLOSED}").unlink()  # (changed since, as an upgrade's first start may find it)
    with pytest.raises(sqlite3.OperationalError, match="full"):
        ResultsDB.open_or_recover(path, expected=True)
    assert not list(tmp_path.glob("results.sqlite.corrupt-*"))
    monkeypatch.undo()
    db, note = ResultsDB.open_or_recover(path, expected=True)  # room again: the same ledger, upgraded
    assert note is None and db.counts()["processed"] == 2
    db.close()


@pytest.mark.parametrize("code, damaged", [(13, False), (5, False), (8, False), (11, True), (26, True)])
def test_the_alert_outbox_is_set_aside_only_when_sqlite_calls_it_damaged_not_for_a_full_locked_or_read_only_disk(
    tmp_path, monkeypatch, code, damaged
):
    """As the ledger (above): alerts not yet delivered stay in the outbox the daemon opens again once there is room."""
    import sqlite3

    import edge_agent.alerts.outbox as outbox

    outbox.Outbox(tmp_path / "alerts.sqlite", 1 << 20).close()
    connect = outbox.connect_writable
    calls = {"n": 0}

    def refusing(path):
        calls["n"] += 1
        if calls["n"] == 1:
            err = sqlite3.OperationalError("(the text is never read)")
            err.sqlite_errorcode = code
            raise err
        return connect(path)

    monkeypatch.setattr(outbox, "connect_writable", refusing)
    if damaged:
        box = outbox.Outbox(tmp_path / "alerts.sqlite", 1 << 20)
        assert box.recovered and list(tmp_path.glob("alerts.sqlite.corrupt-*"))
        box.close()
    else:
        with pytest.raises(sqlite3.OperationalError):
            outbox.Outbox(tmp_path / "alerts.sqlite", 1 << 20)
        assert not list(tmp_path.glob("alerts.sqlite.corrupt-*"))


def test_a_photo_named_by_id_or_hash_prefix_is_found_from_indexes_and_by_path_or_file_name_as_before(tmp_path):
    """`review label PHOTO`, a label from a photo's page and retention's look for alerts not yet sent read every row
    for a photo id or a hash prefix (56 ms at 300,000 results here); now from indexes, the path and the file name
    tried after them as before."""
    import sqlite3

    from edge_agent.ledger_rows import ResultRow
    from edge_agent.results import _REF, _ref_args

    db = ResultsDB(tmp_path / "results.sqlite")
    sha = "ab" * 32
    db.commit(
        [ResultRow(sha, "0123456789abcdef", "/farm/inbox/tree 4/leaf.jpg", "folder", "Apple___healthy", 0.9, [], "v4000", {}), _row(7)]
    )
    for ref in ("0123456789abcdef", "abababab", "ABABABABAB", "/farm/inbox/tree 4/leaf.jpg", "leaf.jpg"):
        assert db.find_result(ref)[0] == sha, ref
    for ref in ("abababa", "ababab%", "0123456789abcdeF", "tree 4/leaf"):  # too short, not a hash, another id, no name
        assert db.find_result(ref) is None, ref
    assert db.photos_by_id(["0123456789abcdef"]) == [(sha, db.find_result(sha)[6], "/farm/inbox/tree 4/leaf.jpg")]
    db.close()
    con = sqlite3.connect(tmp_path / "results.sqlite")
    plan = " ".join(r[-1] for r in con.execute(f"EXPLAIN QUERY PLAN SELECT sha256 FROM results WHERE {_REF}", _ref_args("abababab")))
    assert "SCAN" not in plan and "results_photo_id" in plan and "sqlite_autoindex_results_1" in plan


def test_a_file_set_aside_twice_in_one_second_keeps_both_copies(tmp_path):
    """Its name is stamped to the second: a second set-aside in that second replaced the first copy (a start that sets
    the ledger aside, and the alert outbox found damaged right after it, in the same second)."""
    from engines.durable import set_aside

    path = tmp_path / "alerts.sqlite"
    kept = []
    for body in (b"first", b"second", b"third"):
        path.write_bytes(body)
        Path(f"{path}-wal").write_bytes(body)
        kept.append(set_aside(path))
    assert len(set(kept)) == 3 and [p.read_bytes() for p in kept] == [b"first", b"second", b"third"]
    assert [Path(f"{p}-wal").read_bytes() for p in kept] == [b"first", b"second", b"third"] and not path.exists()


def test_a_trainer_whose_labels_file_rotted_stops_with_one_line_saying_how_to_get_them_back(tmp_path):
    """`edge-trainer serve` on a samples.sqlite with a rotted page ended in a traceback (relocating its rows); a page
    not read at the start failed a retrain later. Now the start reads it whole, keeps it (the expert's labels are in
    it: never replaced by an empty file) and says in one line to restore it or move it aside."""
    import subprocess
    import sys

    from trainer.samples import SamplesDamaged, SampleStore

    from .conftest import rot_pages

    root = tmp_path / "state" / "trainer"
    store = SampleStore(root)
    store.close()
    rot_pages(root / "samples.sqlite", "samples")
    with pytest.raises(SamplesDamaged, match="restore FILE"):
        SampleStore(root)
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "serve", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "samples.sqlite: damaged" in out.stderr and "`edge-trainer salvage`" in out.stderr
    assert (root / "samples.sqlite").exists() and not list(root.glob("samples.sqlite.corrupt-*"))


def test_a_rotted_unlabelled_pool_is_set_aside_and_a_new_one_started(tmp_path):
    """The pool holds photos nobody labelled (a cache of them): a damaged file is kept aside and a new pool started, as
    the alert outbox is, instead of the trainer failing at every start."""
    from trainer.loop.unlabelled_pool import UnlabelledPool

    from .conftest import rot_pages

    pool = UnlabelledPool(tmp_path, 100, 1 << 20)
    pool._db.close()
    rot_pages(tmp_path / "unlabelled.sqlite", "pool")
    pool = UnlabelledPool(tmp_path, 100, 1 << 20)
    assert pool.recovered and "kept as unlabelled.sqlite.corrupt-" in pool.recovered
    assert list(tmp_path.glob("unlabelled.sqlite.corrupt-*"))
