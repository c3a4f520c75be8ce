"""Retention: old photos and results go by age, the oldest photos go when the disk passes its floor, and what the
loop needs (the label queue, the golden photos, an undelivered alert's photo) stays."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections import namedtuple
from datetime import datetime
from pathlib import Path

import pytest

from edge_agent.alerts.outbox import Outbox
from edge_agent.config import RetentionSection
from edge_agent.ledger_rows import ResultRow
from edge_agent.results import LedgerUnreadable, ResultsDB
from edge_agent.retention import Retention, floor_bytes
from edge_agent.state import StateLayout

DAY = 86400.0
NOW = datetime(2026, 11, 25, 12, 0).timestamp()
Usage = namedtuple("Usage", "total used free")


def _photo(state: Path, db: ResultsDB, when: float, name: str, size: int = 10_000, source: str = "inbox") -> str:
    """A photo classified at ``when`` and moved to processed/<day>/ as the daemon does; returns its sha256."""
    data = name.encode().ljust(size, b"x")
    sha = hashlib.sha256(data).hexdigest()
    folder = state / "processed" / datetime.fromtimestamp(when).strftime("%Y-%m-%d")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    db.commit(
        [ResultRow(sha, sha[:16], f"/inbox/{name}", source, "Apple___Apple_scab", 0.97, [], "v1", {}, created=when, verdict="confident")]
    )
    return sha


def _disk(state: Path, total: int):
    """A simulated disk of ``total`` bytes holding only the state directory."""

    def usage(_path):
        used = sum(f.stat().st_size for f in state.rglob("*") if f.is_file())
        return Usage(total, used, total - used)

    return usage


def _state(tmp_path) -> tuple[Path, ResultsDB]:
    layout = StateLayout(tmp_path / "state")
    layout.create()
    return layout.root, ResultsDB(layout.db)


def test_photos_older_than_photo_days_and_results_older_than_result_days_go_and_the_rest_stays(tmp_path):
    state, db = _state(tmp_path)
    for age in (400, 200, 45, 31, 29, 1, 0):
        _photo(state, db, NOW - age * DAY, f"leaf-{age}.jpg")
    queued = state / "queue" / "review" / ("ab" * 32 + ".jpg")
    queued.parent.mkdir(parents=True, exist_ok=True)
    queued.write_bytes(b"the expert needs me")
    (state / "golden.npz").write_bytes(b"golden")
    r = Retention(RetentionSection(), state, db, now=lambda: NOW, usage=_disk(state, 1 << 40))
    pruned = r.run_once()
    left = sorted(p.name for p in (state / "processed").rglob("*.jpg"))
    assert left == ["leaf-0.jpg", "leaf-1.jpg", "leaf-29.jpg"] and pruned.photos == 4
    assert pruned.results == 1 and db.counts()["processed"] == 6  # the 400-day-old row went; rows outlive photos
    assert queued.read_bytes() == b"the expert needs me" and (state / "golden.npz").exists()
    assert len(list((state / "processed").iterdir())) == 3  # the emptied days' folders went too
    st = r.status()
    assert st["photos"] == 3 and st["pruned_photos"] == 4 and st["pruned_results"] == 1 and not st["below_floor"]
    assert st["oldest_photo_day"] == datetime.fromtimestamp(NOW - 29 * DAY).strftime("%Y-%m-%d")


def test_a_camera_may_keep_its_results_a_shorter_time_than_the_hot_folder(tmp_path):
    state, db = _state(tmp_path)
    for age in (10, 3):
        _photo(state, db, NOW - age * DAY, f"cam-{age}.jpg", source="camera:0")
        _photo(state, db, NOW - age * DAY, f"inbox-{age}.jpg")
    r = Retention(RetentionSection(source_result_days={"camera:0": 7}), state, db, now=lambda: NOW, usage=_disk(state, 1 << 40))
    assert r.run_once().results == 1
    assert sorted(src for src in db.sources()) == ["camera:0", "inbox"] and db.counts()["processed"] == 3


def test_a_farm_idle_longer_than_result_days_keeps_its_newest_row_so_a_new_result_never_reuses_an_old_id(tmp_path):
    """SQLite gives an emptied table's next row id 1 again: the alerts' cursor (past the old ids) would skip it."""
    state, db = _state(tmp_path)
    for age in (900, 800, 700):  # all older than result_days (365)
        _photo(state, db, NOW - age * DAY, f"leaf-{age}.jpg")
    newest = db.last_result_id()
    r = Retention(RetentionSection(), state, db, now=lambda: NOW, usage=_disk(state, 1 << 40))
    assert r.run_once().results == 2 and db.counts()["processed"] == 1 and db.last_result_id() == newest
    _photo(state, db, NOW, "leaf-new.jpg")
    assert db.last_result_id() == newest + 1


def test_the_records_of_what_was_handed_to_the_trainer_go_after_result_days_but_those_still_needed(tmp_path):
    """A withdrawal the trainer has not yet confirmed must still be sent; a pool photo's record keeps it from going
    to the trainer twice."""
    state, db = _state(tmp_path)
    old, new = NOW - 400 * DAY, NOW - 10 * DAY
    with sqlite3.connect(state / "results.sqlite") as c:
        c.executemany(
            "INSERT INTO pseudo_sent (sha256, label, engine_version, sent, withdrawn, confirmed) VALUES (?,?,?,?,?,?)",
            [
                ("old", "A", "v1", old, None, None),
                ("old-taken-back", "A", "v1", old, old + DAY, old + DAY),
                ("old-to-tell", "A", "v1", old, NOW - DAY, None),
                ("new", "A", "v1", new, None, None),
            ],
        )
        c.executemany(
            "INSERT INTO unlabelled_sent (sha256, label, verdict, sent) VALUES (?,?,?,?)",
            [("old-gone", "A", "unsure", old), ("old-in-pool", "A", "unsure", old), ("new", "A", "unsure", new)],
        )
        c.execute(
            "INSERT INTO label_queue (sha256, photo_id, kind, label, confidence, engine_version, file, bytes, created)"
            " VALUES ('old-in-pool', 'p', 'review', 'A', 0.4, 'v1', 'f.jpg', 1, ?)",
            (old,),
        )
    r = Retention(RetentionSection(), state, db, now=lambda: NOW, usage=_disk(state, 1 << 40))
    assert r.run_once().records == 3 and r.status()["pruned_records"] == 3
    with sqlite3.connect(state / "results.sqlite") as c:
        assert sorted(x for (x,) in c.execute("SELECT sha256 FROM pseudo_sent")) == ["new", "old-to-tell"]
        assert sorted(x for (x,) in c.execute("SELECT sha256 FROM unlabelled_sent")) == ["new", "old-in-pool"]
    assert db.withdrawals_due(10) == [("old-to-tell", "A", "v1")]
    assert r.run_once().records == 0
    r = Retention(RetentionSection(result_days=0), state, db, now=lambda: NOW + 900 * DAY, usage=_disk(state, 1 << 40))
    assert r.run_once().records == 0  # result_days = 0: kept, as the results are


def test_below_the_floor_the_oldest_photos_go_first_until_it_is_met(tmp_path):
    state, db = _state(tmp_path)
    for i in range(20):
        _photo(state, db, NOW - (19 - i) * 3600, f"p{i:02d}.jpg", size=100_000)
    total = 2_400_000  # the state holds ~2.0 MB: ~400 kB free
    section = RetentionSection(min_free_gb=0.001, min_free_percent=50)  # floor: min(1.07 MB, 1.2 MB)
    usage = _disk(state, total)
    assert usage(state).free < floor_bytes(section, total)
    r = Retention(section, state, db, now=lambda: NOW, usage=usage)
    pruned = r.run_once(age=False)
    assert usage(state).free >= floor_bytes(section, total) and pruned.photos >= 6
    left = sorted(p.name for p in (state / "processed").rglob("*.jpg"))
    assert left == [f"p{i:02d}.jpg" for i in range(20 - len(left), 20)]  # the newest kept
    assert not r.status()["below_floor"]


def test_below_the_floor_a_photo_the_review_pool_holds_too_is_kept_for_it_frees_nothing(tmp_path):
    """The spool hard-links a queued photo to the inbox file the daemon then moves to processed/: deleting that
    processed photo frees no byte while the review pool holds it. The floor passes over it to photos that free space,
    and counts only the bytes freed (before, it deleted the oldest photos, all held by the pool on a farm whose expert
    is behind, reported them freed, and went on; the photos the expert labels later from processed/ were gone)."""
    state, db = _state(tmp_path)
    names = [f"p{i:02d}.jpg" for i in range(10)]
    for i, name in enumerate(names):
        _photo(state, db, NOW - (9 - i) * 3600, name, size=100_000)
    held = [next((state / "processed").rglob(n)) for n in names[:4]]  # the four oldest, in the review pool
    (state / "queue" / "review").mkdir(parents=True, exist_ok=True)
    for f in held:
        os.link(f, state / "queue" / "review" / f"{hashlib.sha256(f.read_bytes()).hexdigest()}.jpg")

    def used() -> int:  # a disk counts a hard-linked file once
        return sum({(f.stat().st_dev, f.stat().st_ino): f.stat().st_size for f in state.rglob("*") if f.is_file()}.values())

    total = used() + 300_000  # 300 kB free
    section = RetentionSection(min_free_gb=0.0006, min_free_percent=50)  # floor: about 644 kB: 4 photos to free
    r = Retention(section, state, db, now=lambda: NOW, usage=lambda _path: Usage(total, used(), total - used()))
    pruned = r.run_once(age=False)
    assert total - used() >= floor_bytes(section, total)
    assert pruned.photo_bytes == total - used() - 300_000 == 400_000  # what it says it freed, it freed
    left = sorted(p.name for p in (state / "processed").rglob("*.jpg"))
    assert left == [*names[:4], *names[8:]]  # the pool's four kept; the oldest of the rest went


def test_the_photo_of_an_alert_not_yet_delivered_is_kept_however_old_and_whatever_the_floor(tmp_path):
    state, db = _state(tmp_path)
    old = _photo(state, db, NOW - 60 * DAY, "alerted.jpg")
    _photo(state, db, NOW - 60 * DAY, "other.jpg")
    photo_id = old[:16]  # as _photo records it
    box = Outbox(state / "alerts.sqlite", 1 << 20)
    box.put([("webhook:0", "alert", "u", json.dumps({"photo_id": photo_id}).encode(), 1, False)])
    box.close()
    r = Retention(RetentionSection(min_free_percent=90, min_free_gb=1000), state, db, now=lambda: NOW, usage=_disk(state, 100_000))
    r.run_once()
    assert [p.name for p in (state / "processed").rglob("*.jpg")] == ["alerted.jpg"]
    assert r.status()["below_floor"] and r.status()["largest"]


def test_an_alerts_outbox_that_cannot_be_read_prunes_nothing_instead_of_taking_its_alerts_as_none(tmp_path):
    """A locked ``alerts.sqlite`` once read as empty: the pass then deleted the photo an undelivered alert points at."""
    state, db = _state(tmp_path)
    old = _photo(state, db, NOW - 60 * DAY, "alerted.jpg")
    _photo(state, db, NOW - 60 * DAY, "other.jpg")
    box = Outbox(state / "alerts.sqlite", 1 << 20)
    box.put([("webhook:0", "alert", "u", json.dumps({"photo_id": old[:16]}).encode(), 1, False)])
    box.close()
    holder = sqlite3.connect(state / "alerts.sqlite", isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("DELETE FROM outbox WHERE 0")  # a write: the lock is taken and kept
    r = Retention(RetentionSection(min_free_percent=90, min_free_gb=1000), state, db, now=lambda: NOW, usage=_disk(state, 100_000))
    r.alerts_wait_s = 0.2
    for age in (True, False):  # by age, and to the disk's floor alone
        with pytest.raises(LedgerUnreadable, match="alerts.sqlite"):
            r.run_once(age=age)
    assert sorted(p.name for p in (state / "processed").rglob("*.jpg")) == ["alerted.jpg", "other.jpg"]
    holder.close()
    r.run_once()  # readable again: the next pass prunes as before
    assert [p.name for p in (state / "processed").rglob("*.jpg")] == ["alerted.jpg"]


def test_retention_off_prunes_nothing_and_a_daemon_status_shows_what_is_kept(tmp_path):
    from edge_agent.config import AppConfig
    from edge_agent.daemon import Daemon

    state, db = _state(tmp_path)
    _photo(state, db, time.time() - 90 * DAY, "old.jpg")
    db.close()
    cfg = AppConfig().model_copy(update={"retention": RetentionSection(enabled=False)})
    d = Daemon(cfg, state)
    d._setup()
    d._start_workers()
    try:
        assert d.retention is None and "retention" not in d.status()
    finally:
        d._stop.set()
        d._shutdown()
    assert [p.name for p in (state / "processed").rglob("*.jpg")] == ["old.jpg"]
    d = Daemon(AppConfig(), state)
    d._setup()
    d._start_workers()
    try:
        deadline = time.time() + 10
        while d.retention.last_pass is None and time.time() < deadline:
            time.sleep(0.05)
        st = d.status()["retention"]
        assert st["photo_days"] == 30 and st["floor_bytes"] > 0 and st["photos"] == 1  # the floor pass ran at start
    finally:
        d._stop.set()
        d._shutdown()


def test_results_print_where_a_photo_is_now_and_say_when_it_is_no_longer_kept(tmp_path, capsys):
    from edge_agent.cli import main

    state, db = _state(tmp_path)
    _photo(state, db, time.time(), "moved.jpg")
    _photo(state, db, time.time() - 60 * DAY, "pruned.jpg")
    db.close()
    Retention(RetentionSection(), state, ResultsDB(state / "results.sqlite"), usage=_disk(state, 1 << 40)).run_once()
    assert main(["results", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    day = datetime.now().strftime("%Y-%m-%d")
    assert str(state / "processed" / day / "moved.jpg") in out and "/inbox/pruned.jpg (no longer kept)" in out
    assert main(["results", "--json", "--state-dir", str(state)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["path"]: r["path_now"] for r in rows} == {
        "/inbox/moved.jpg": str(state / "processed" / day / "moved.jpg"),
        "/inbox/pruned.jpg": None,
    }


class _Clocks:
    """A wall clock and a monotonic one: ``run(s)`` lets both move, ``set_forward(s)`` moves the wall clock alone."""

    def __init__(self, wall: float) -> None:
        self.wall, self.mono = wall, 1000.0

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def set_forward(self, seconds: float) -> None:
        self.wall += seconds


def _kept(state: Path, db: ResultsDB) -> tuple[list[str], int]:
    return sorted(p.name for p in (state / "processed").rglob("*.jpg")), db.counts()["processed"]


def test_a_clock_set_forward_while_the_daemon_runs_prunes_nothing_early_and_the_jump_outlives_a_restart(tmp_path):
    from edge_agent.clock import ClockWatch

    state, db = _state(tmp_path)
    c = _Clocks(NOW)
    for age in (20, 5):
        _photo(state, db, NOW - age * DAY, f"leaf-{age}.jpg")
    section = RetentionSection(result_days=30)

    def retention() -> Retention:
        watch = ClockWatch(state / "clock.json", wall=lambda: c.wall, mono=lambda: c.mono)
        return Retention(section, state, db, now=lambda: c.wall, usage=_disk(state, 1 << 40), clock=watch)

    r = retention()
    r.run_once()
    c.run(60)
    c.set_forward(90 * DAY)  # a time sync after three months without a network: every record looks 90 days older
    assert r.run_once().photos == 0 and _kept(state, db) == (["leaf-20.jpg", "leaf-5.jpg"], 2)
    assert "set forward 90.0 days" in r.status()["clock_note"] and json.loads((state / "clock.json").read_text())["jumps"]
    _photo(state, db, c.wall, "leaf-new.jpg")  # stamped on the clock after the jump
    c.run(12 * DAY)  # 32 and 17 days old on their own clock
    r = retention()  # the daemon restarted: the jump is read back
    r.run_once()
    assert _kept(state, db) == (["leaf-5.jpg", "leaf-new.jpg"], 2)  # the 20-day-old went at its 30th day, not before
    c.run(15 * DAY)  # 32 and 27 days old
    r.run_once()
    assert _kept(state, db) == (["leaf-new.jpg"], 1)


def test_without_the_jump_the_same_photos_would_have_gone_at_once(tmp_path):
    """The test above can fail: a clock that is not watched ages everything by the jump."""
    state, db = _state(tmp_path)
    for age in (20, 5):
        _photo(state, db, NOW - age * DAY, f"leaf-{age}.jpg")
    _photo(state, db, NOW + 90 * DAY, "leaf-new.jpg")
    r = Retention(RetentionSection(result_days=30), state, db, now=lambda: NOW + 90 * DAY, usage=_disk(state, 1 << 40))
    assert r.run_once().photos == 2 and _kept(state, db) == (["leaf-new.jpg"], 1)


def test_a_clock_set_back_is_no_jump_and_a_torn_clock_file_reads_as_none(tmp_path):
    from edge_agent.clock import ClockWatch

    c = _Clocks(NOW)
    watch = ClockWatch(tmp_path / "clock.json", wall=lambda: c.wall, mono=lambda: c.mono)
    watch.look()
    c.set_forward(-30 * DAY)
    assert watch.look() is None and watch.jumps == [] and not (tmp_path / "clock.json").exists()
    c.set_forward(30 * 60)  # half an hour: drift or a time zone's worth, not a jump
    assert watch.look() is None and watch.note() is None
    (tmp_path / "clock.json").write_text('{"jumps": [{"before": 1.0e9, "by": ')
    torn = ClockWatch(tmp_path / "clock.json", wall=lambda: c.wall, mono=lambda: c.mono)
    assert torn.jumps == [] and torn.shift(0.0) == 0.0
    (tmp_path / "clock.json").write_text('{"jumps": [{"before": 1.0e9, "by": -5}, {"before": 2.0e9, "by": 86400}]}')
    assert ClockWatch(tmp_path / "clock.json").shift(1.5e9) == 86400  # a negative step is no jump


def test_status_and_the_health_page_say_the_clock_was_set_forward(tmp_path, capsys):
    import os

    from edge_agent.cli import main
    from edge_agent.clock import ClockWatch
    from edge_agent.state import write_status

    state, db = _state(tmp_path)
    c = _Clocks(NOW)
    watch = ClockWatch(state / "clock.json", wall=lambda: c.wall, mono=lambda: c.mono)
    r = Retention(RetentionSection(), state, db, now=lambda: c.wall, usage=_disk(state, 1 << 40), clock=watch)
    r.run_once()
    assert r.status()["clock_note"] is None
    c.set_forward(15 * DAY)
    r.run_once()
    note = r.status()["clock_note"]
    assert note.startswith("the clock was set forward 15.0 days at ") and note.endswith("photos and results from before keep their age")
    db.close()
    write_status(StateLayout(state).status, {"pid": os.getpid(), "updated": time.time(), "retention": r.status()})
    assert main(["status", "--state-dir", str(state)]) == 0
    assert f"clock: {note}\n" in capsys.readouterr().out
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from .web_helpers import client

    assert client(state).get("/health").text.split('id="clock-jump">')[1].startswith(f"clock: {note}")


def test_the_clock_watch_counts_a_laptops_sleep_as_time_passing_not_as_a_jump(tmp_path, monkeypatch):
    """A suspended laptop's monotonic clock stops while its wall clock runs on: the watch reads the time since boot,
    sleep included (Linux's CLOCK_BOOTTIME), and falls back to the monotonic clock where there is none."""
    from edge_agent import clock

    assert clock.ClockWatch(tmp_path / "clock.json").mono is clock.since_boot
    monkeypatch.setattr(clock.time, "CLOCK_BOOTTIME", 7, raising=False)
    monkeypatch.setattr(clock.time, "clock_gettime", lambda which: 123.0 if which == 7 else -1.0)
    assert clock.since_boot() == 123.0
    monkeypatch.delattr(clock.time, "CLOCK_BOOTTIME")
    monkeypatch.setattr(clock.time, "monotonic", lambda: 45.0)
    assert clock.since_boot() == 45.0
