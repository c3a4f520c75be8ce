"""A page a card rots costs the rows on it, not the file: the ledger and the trainer's labels keep what can be read."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.config import AppConfig
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.results import ResultsDB
from engines.salvage import salvage_file, salvage_rows

from .conftest import rot_pages

REPO = Path(__file__).parents[1]


def _table(path: Path, rows: int = 3000) -> None:
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, sha TEXT NOT NULL UNIQUE, body TEXT)")
        con.executemany("INSERT INTO t (sha, body) VALUES (?, ?)", [(f"{i:064x}", "x" * 100) for i in range(rows)])
    con.close()


def _fresh(con_path: Path | str = ":memory:") -> sqlite3.Connection:
    con = sqlite3.connect(con_path, isolation_level=None)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, sha TEXT NOT NULL UNIQUE, body TEXT)")
    return con


def test_a_rotted_leaf_costs_only_its_rows_counted_exactly_and_the_damaged_file_is_not_changed(tmp_path):
    src = tmp_path / "a.sqlite"
    _table(src)
    rot_pages(src, "t", kind="leaf", only=10)
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    dst = _fresh()
    found = salvage_rows(src, dst, ["t"])
    kept = dst.execute("SELECT count(*), min(id), max(id) FROM t").fetchone()
    assert kept[0] == found.kept["t"] and 2900 < kept[0] < 3000 and kept[1:] == (1, 3000)
    assert found.unread["t"] == 3000 - kept[0] and "t" in found.counted and not found.lossless  # the index counted them
    assert f"{kept[0]} rows kept, {3000 - kept[0]} lost" in found.describe()
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
    assert dst.execute("SELECT body FROM t WHERE id = 3000").fetchone() == ("x" * 100,)


def test_rows_past_a_long_run_of_deleted_rowids_are_kept_where_the_tables_last_leaf_and_index_rotted(tmp_path):
    """A season's ledger after retention: its first 100,000 rowids deleted; with neither ``max(rowid)`` nor an index
    to say where the table ends, the read goes by the table's own tree, not by a guess at how far to look."""
    src = tmp_path / "a.sqlite"
    with sqlite3.connect(src) as con:
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, sha TEXT NOT NULL UNIQUE, body TEXT)")
        con.execute("INSERT INTO t (id, sha, body) VALUES (100000, 'first', 'x')")
        con.executemany("INSERT INTO t (sha, body) VALUES (?, ?)", [(f"{i:064x}", "x" * 100) for i in range(3000)])
        con.execute("DELETE FROM t WHERE id = 100000")
        con.executemany("INSERT INTO t (id, sha, body) VALUES (?, ?, 'y')", [(200000 + i, f"late{i}") for i in range(5)])
        con.execute("DELETE FROM t WHERE id BETWEEN 100800 AND 102000")  # a gap no wider than a chunk's run
    con.close()
    rot_pages(src, "sqlite_autoindex_t_1")
    rot_pages(src, "t", kind="leaf", only=-1)  # the last leaf: max(rowid) cannot be read
    found = salvage_rows(src, dst := _fresh(), ["t"])
    ids = [i for (i,) in dst.execute("SELECT id FROM t ORDER BY id")]
    assert found.kept["t"] == len(ids) > 1500 and ids[0] == 100001 and max(ids) < 200000
    assert "t" not in found.counted and found.unread["t"] > 0  # (the rotted leaf's rows: an upper bound)


def test_a_rotted_index_loses_no_row_and_a_rotted_root_is_said_to_be_unreadable(tmp_path):
    src = tmp_path / "a.sqlite"
    _table(src)
    rot_pages(src, "sqlite_autoindex_t_1")
    found = salvage_rows(src, dst := _fresh(), ["t"])
    assert found.lossless and found.kept == {"t": 3000} and dst.execute("SELECT count(*) FROM t").fetchone() == (3000,)
    src.unlink()
    _table(src)
    with sqlite3.connect(src) as con:
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 't'").fetchone()[0]
    con.close()
    with open(src, "r+b") as f:  # the table's root page
        f.seek((root - 1) * 4096)
        f.write(b"\xff" * 64)
    found = salvage_rows(src, _fresh(), ["t"])
    assert not found.lossless and found.kept["t"] == 0 and found.unread["t"] == 3000 and "t: 0 rows kept, 3000 lost" in found.describe()


def test_a_file_whose_first_page_rotted_gives_nothing_and_says_so(tmp_path):
    src = tmp_path / "a.sqlite"
    _table(src, 10)
    data = bytearray(src.read_bytes())
    data[:100] = b"\xff" * 100
    src.write_bytes(bytes(data))
    found = salvage_rows(src, _fresh(), ["t"])
    assert found.unreadable == ["t"] and not found.lossless and found.describe() == "t: nothing readable"


def test_a_table_the_damaged_file_never_had_is_no_loss(tmp_path):
    """A ledger from before a table was added (its new file has it): nothing of it to keep, and nothing lost."""
    src = tmp_path / "a.sqlite"
    _table(src, 10)
    rot_pages(src, "sqlite_autoindex_t_1")
    dst = _fresh()
    dst.execute("CREATE TABLE later (k TEXT PRIMARY KEY)")
    found = salvage_rows(src, dst, ["t", "later"])
    assert found.lossless and found.describe() == "t: 10 rows kept"


def test_a_salvage_that_fails_on_the_way_leaves_the_damaged_file_where_it_was_and_no_half_made_copy(tmp_path):
    """A full disk while the new file is filled: the damaged file stays in place (its next try may succeed) and the
    half-made one is removed, so nothing is lost and nothing is left behind."""
    src = tmp_path / "a.sqlite"
    _table(src)
    rot_pages(src, "t", kind="leaf", only=3)

    class Full(sqlite3.Connection):
        def execute(self, sql, *args):
            if sql.startswith("INSERT"):
                raise sqlite3.OperationalError("database or disk is full")
            return super().execute(sql, *args)

    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        salvage_file(src, lambda p: _make(p, Full), ["t"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.sqlite"]
    aside, found = salvage_file(src, _make, ["t"], keep_if=lambda found: found.lossless)
    assert aside is None and sorted(p.name for p in tmp_path.iterdir()) == ["a.sqlite"]  # refused: nothing changed
    aside, found = salvage_file(src, _make, ["t"])
    assert aside.name.startswith("a.sqlite.corrupt-") and aside.exists()
    with sqlite3.connect(src) as con:
        assert con.execute("PRAGMA quick_check").fetchone() == ("ok",)
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] == found.kept["t"]
    con.close()


def _make(path: Path, factory=sqlite3.Connection) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None, factory=factory)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, sha TEXT NOT NULL UNIQUE, body TEXT)")
    return con


def _row(i: int) -> ResultRow:
    return ResultRow(
        f"{i:064x}", f"p{i}", f"/farm/inbox/{i}.jpg", "folder", "Apple___healthy", 0.97, [["Apple___healthy", 0.97]], "v4000", {}
    )


def test_a_ledger_with_a_rotted_page_keeps_every_other_result_and_the_experts_labels_and_the_queue(tmp_path):
    """Before, a ledger SQLite called damaged was set aside whole and a new, empty one started: a season's results,
    the expert's labels and the label queue's entries went with one rotted page (the queue's photos came back as
    questions for the expert, their labels lost). Now the new ledger holds every row that can still be read."""
    path = tmp_path / "results.sqlite"
    db = ResultsDB(path)
    db.commit([_row(i) for i in range(1, 2001)])
    queued = tmp_path / "queue" / "expert" / f"{7:064x}.jpg"
    distances = {f"{7:064x}": ("v4000", bytes(range(152)))}  # (what the typical order clusters: tests/test_review_typical.py)
    db.commit([], [QueueEntry(f"{7:064x}", "p7", "review", None, None, None, str(queued), 10)], distances)
    db.mark_expert(f"{7:064x}", "Apple___Apple_scab", str(queued))
    db.close()
    rot_pages(path, "results", kind="leaf", only=20)
    (tmp_path / "results.sqlite.closed.json").unlink()  # (as a daemon that met the page forgets it: read whole at the start)
    db, note = ResultsDB.open_or_recover(path, expected=True)
    kept = db.counts()["processed"]
    assert 1900 < kept < 2000 and db.expert_labels() == {f"{7:064x}": "Apple___Apple_scab"}
    assert db.queue_entry(f"{7:064x}").label == "Apple___Apple_scab"
    assert [(sha, d.tobytes(), labelled) for sha, d, labelled in db.pool_distances()] == [(f"{7:064x}", bytes(range(152)), True)]
    assert f"results: {kept} rows kept, {2000 - kept} lost" in note and "the photos of the results lost stay in processed/" in note
    assert "kept as results.sqlite.corrupt-" in note and list(tmp_path.glob("results.sqlite.corrupt-*"))
    db.commit([_row(5000)])  # the new ledger takes results, its indexes rebuilt
    assert db.has(_row(5000).sha256) and db.has(_row(2000).sha256)
    db.close()
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()


def test_every_table_the_ledger_makes_is_one_a_salvage_copies(tmp_path):
    from edge_agent._ledger_file import LEDGER_TABLES

    ResultsDB(tmp_path / "results.sqlite").close()
    with sqlite3.connect(tmp_path / "results.sqlite") as con:
        made = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    con.close()
    assert made == set(LEDGER_TABLES)


def _samples(root: Path, n: int = 400):
    from trainer.samples import SampleStore

    store = SampleStore(root)
    for i in range(n):
        header = {"id": f"{i:064x}", "ext": ".jpg", "kind": "expert", "label": "Apple___healthy", "confidence": 1.0, "engine_version": "v1"}
        store.add(header, b"a photo")
    store.set_state("pseudo_deleted", "3")
    store.close()


def test_the_trainer_starts_on_its_own_where_only_an_index_of_its_labels_rotted(tmp_path):
    """Every label can still be read: the trainer keeps them all in a new file (the damaged one beside) and starts,
    saying so in its log, instead of waiting for the farm."""
    from trainer.samples import SampleStore

    _samples(tmp_path)
    rot_pages(tmp_path / "samples.sqlite", "sqlite_autoindex_samples_1")
    store = SampleStore(tmp_path, recover="lossless")
    assert store.recovered and "samples: 400 rows kept" in store.recovered and "kept as samples.sqlite.corrupt-" in store.recovered
    assert len(store.all()) == 400 and store.get_state("pseudo_deleted") == "3" and store.has(f"{5:064x}")
    store.close()


def test_where_labels_would_be_lost_the_trainer_waits_for_the_farm_and_salvage_keeps_what_can_be_read(tmp_path):
    """A rotted leaf of the labels: the trainer does not start on its own (a backup may hold them all), says in one
    line what `edge-trainer salvage` would keep and lose; that command keeps them and the trainer starts."""
    from trainer.samples import SamplesDamaged, SampleStore

    state = tmp_path / "state"
    root = state / "trainer"
    _samples(root)
    rot_pages(root / "samples.sqlite", "samples", kind="leaf", only=2)
    with pytest.raises(SamplesDamaged) as err:
        SampleStore(root)
    kept = err.value.found.kept["samples"]
    assert 350 < kept < 400 and f"samples: {kept} rows kept, {400 - kept} lost" in str(err.value)
    assert not list(root.glob("samples.sqlite.*"))  # nothing changed
    run = [sys.executable, "-m", "trainer"]
    out = subprocess.run([*run, "serve", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "edge-trainer salvage" in out.stderr
    out = subprocess.run([*run, "salvage", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and f"samples: {kept} rows kept, {400 - kept} lost" in out.stdout, out.stderr
    assert len(SampleStore(root).all()) == kept and list(root.glob("samples.sqlite.corrupt-*"))
    out = subprocess.run([*run, "salvage", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and "reads whole: nothing to salvage" in out.stdout
    out = subprocess.run([*run, "salvage", "--state-dir", str(tmp_path / "typo")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2 and "no trainer samples at" in out.stderr and not (tmp_path / "typo").exists()


def test_a_retrain_that_meets_damaged_labels_fails_as_damage_and_never_replaces_the_file_under_the_service(tmp_path):
    """The retrain's own process opens the labels while the service has them open: it never replaces the file (the
    service would go on writing into the one set aside), and its failure says damage, not a failure to wait out."""
    from trainer._child import RetrainDamaged, retrain_in_child

    root = tmp_path / "trainer"
    _samples(root, 50)
    rot_pages(root / "samples.sqlite", "sqlite_autoindex_samples_1")  # every label readable: a start would keep them
    with pytest.raises(RetrainDamaged, match="SamplesDamaged"):
        retrain_in_child(
            AppConfig(), tmp_path / "engines", root, root / "strategy", root / "signing.key", print, lambda *a, **k: None, lambda: False
        )
    assert (root / "samples.sqlite").is_file() and not list(root.glob("samples.sqlite.*"))  # (no copy set aside, none half-made)


def test_a_trainer_that_meets_a_damaged_page_storing_a_label_or_retraining_stops_for_its_start_to_keep_them(tmp_path, monkeypatch):
    """Before, a label met a damaged page at every try (no ack: the device sent it again for ever, "labels not
    stored") and a retrain failed and waited for new labels that could not be stored. Now the trainer stops with
    status 1, so its next start (systemd's) keeps the labels that can be read or says how to get them back."""
    import threading

    from edge_agent.config import parse_config
    from trainer import service
    from trainer._child import RetrainDamaged

    def rotted(*a, **k):
        raise sqlite3.DatabaseError("database disk image is malformed")

    svc = service.TrainerService(parse_config({}), tmp_path / "state")
    monkeypatch.setattr(type(svc.samples), "add", rotted)
    header = {"id": "a" * 64, "ext": ".jpg", "kind": "expert", "label": "Apple___healthy", "confidence": 1.0, "engine_version": "v1"}
    svc.receiver._handle(out := [], [b"peer", *_encoded(header)])
    assert out == [] and svc.receiver.store_problem["damaged"]  # no ack: the device keeps the label
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("rc", svc.run()))
    runner.start()
    runner.join(30)
    assert not runner.is_alive() and result["rc"] == 1 and "malformed" in svc.damaged

    svc = service.TrainerService(parse_config({}), tmp_path / "state2")

    def damaged_retrain(*a, **k):
        raise RetrainDamaged("SamplesDamaged('...')")

    monkeypatch.setattr(service, "retrain_in_child", damaged_retrain)
    svc._retrain_once()
    assert svc._stop.is_set() and svc.damaged and svc.last.reason.startswith("failed: a damaged page")
    svc.samples.close()
    svc.unlabelled.close()


def _encoded(header: dict) -> list[bytes]:
    from edge_agent.handoff.protocol import encode

    return encode("sample", header, b"a photo")


def test_the_labels_a_salvage_lost_are_asked_of_the_devices_and_a_device_queues_again_those_its_expert_gave(tmp_path):
    """A rotted leaf of the trainer's labels lost their rows, though their photos stay in samples/ and the device that
    sent them keeps the expert's label of each. Now the trainer's heartbeat names those photos (at most 64 at a time,
    for 14 days), and a device queues again each its expert labelled whose photo it still keeps, once a run."""
    from edge_agent.config import parse_config
    from edge_agent.daemon import Daemon
    from edge_agent.handoff.protocol import LOST_ASKED, ProtocolError, decode, encode
    from edge_agent.review.queue import label_photo
    from trainer import service
    from trainer.samples import SampleStore

    from .web_helpers import make_state, sha_of

    root = tmp_path / "trainer"
    _samples(root, 400)
    rot_pages(root / "samples.sqlite", "samples", kind="leaf", only=2)
    store = SampleStore(root, recover="all")
    kept = {s.id for s in store.all()}
    lost = store.lost_ids()
    assert lost and lost == {f"{i:064x}" for i in range(400)} - kept
    assert store.lost_ids(within_s=0) == set()  # given up after the time
    store.close()
    svc = service.TrainerService(parse_config({}), tmp_path)
    said = svc._describe()["lost"].split(",")
    assert len(said) == min(LOST_ASKED, len(lost)) and set(said) <= lost
    header = {"id": said[0], "ext": ".jpg", "kind": "expert", "label": "Apple___healthy", "confidence": 1.0, "engine_version": "v1"}
    svc.samples.add(header, b"a photo")  # said again by a device
    assert said[0] not in svc._describe().get("lost", "")
    heartbeat = decode(encode("heartbeat", {"role": "trainer", "time": 1.0, **svc._describe()}))
    assert set(heartbeat.header["lost"].split(",")) <= lost
    with pytest.raises(ProtocolError):
        decode(encode("heartbeat", {"role": "trainer", "time": 1.0, "lost": "not-an-id"}))
    from edge_agent.config import HandoffSection
    from edge_agent.handoff.sender import Sender
    from edge_agent.handoff.transport import Link
    from edge_agent.spool import PhotoSpool

    got = []
    sender = Sender(None, PhotoSpool(tmp_path / "q", 1 << 20), HandoffSection(), Link("ipc://x", "ipc://y"), on_lost=got.extend)
    sender._handle(encode("heartbeat", {"role": "trainer", "time": 1.0, **svc._describe()}))
    assert got == heartbeat.header["lost"].split(",")
    svc.samples.close()
    svc.unlabelled.close()
    svc._held.close()

    state = make_state(tmp_path / "device")
    db = ResultsDB(state / "results.sqlite")
    sha = sha_of(state, "p3")  # a processed photo, its copy kept in processed/
    entry = label_photo(db, state / "queue", 1 << 30, ["Apple___Apple_scab"], "p3", "Apple___Black_rot", new_class=True)
    assert db.remove_queued_entry(db.queue_entry(sha)) and Path(entry.file).unlink() is None  # delivered and acknowledged
    daemon = Daemon(parse_config({}), state)
    daemon.db = db
    daemon._say_labels_again([sha, "f" * 64])
    again = db.queue_entry(sha)
    assert again is not None and (again.kind, again.label) == ("expert", "Apple___Black_rot") and Path(again.file).is_file()
    assert db.remove_queued_entry(again)
    daemon._say_labels_again([sha])  # once a run: asked again by the next heartbeat, not queued again
    assert db.queue_entry(sha) is None
    db.close()
