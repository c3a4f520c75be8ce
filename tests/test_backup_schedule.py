"""Backups on their own: the daemon writes one into ``[backup] dir`` every ``every_h`` hours, keeps this device's
newest there and nothing else touched, never writes where it cannot be whole, and says when the last one was taken
and why one failed (``status``, the Health page, ``/metrics``, the health alerts)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from edge_agent.backup import BackupError, BackupStopped, backup, last_backup
from edge_agent.backup_folder import device_name, own_backups, take
from edge_agent.backup_schedule import BackupSchedule, backup_lines
from edge_agent.config import AppConfig
from edge_agent.restore import restore
from edge_agent.results import ResultsDB

from .backup_helpers import stick_cfg, stick_fixtures

HOUR = 3600.0


stick, season, state = stick_fixtures()


def test_the_schedule_keeps_this_devices_newest_backups_and_touches_nothing_else_there(tmp_path, state):
    usb = tmp_path / "usb"
    usb.mkdir()
    (usb / "holiday.jpg").write_bytes(b"the farmer's own file")
    (usb / "edge-agent-shed-20260101-000000.tar.gz").write_bytes(b"another device's backup")
    cfg = stick_cfg(usb, keep=2)
    t0 = time.time()
    done = [take(cfg, state, device="barn", now=t0 + i * 86400) for i in range(3)]
    kept = own_backups(usb, "barn")
    assert [p.name for p in kept] == [Path(d["path"]).name for d in done[1:]]
    assert done[2]["deleted"] == [Path(done[0]["path"]).name]
    assert (usb / "holiday.jpg").read_bytes() == b"the farmer's own file"
    assert (usb / "edge-agent-shed-20260101-000000.tar.gz").exists()
    shared = [p for p in (usb / "edge-agent-barn.files").rglob("*") if p.is_file()]
    on_stick = kept[-1].stat().st_size + sum(p.stat().st_size for p in shared)
    assert last_backup(state)["path"] == str(kept[-1].resolve()) and last_backup(state)["bytes"] == on_stick
    assert sorted(p.name for p in usb.iterdir()) == sorted(
        ["holiday.jpg", "edge-agent-shed-20260101-000000.tar.gz", "edge-agent-barn.files"] + [p.name for p in kept]
    )
    restored = restore(kept[-1], tmp_path / "new-card")
    db = ResultsDB(restored.state_dir / "results.sqlite", readonly=True)
    assert db.counts() == ResultsDB(state / "results.sqlite", readonly=True).counts()
    assert last_backup(restored.state_dir)["restored"] >= t0  # the restored device knows its backup, and that it was restored


def test_a_folder_that_is_not_there_is_a_failure_said_and_tried_again_hourly_and_never_created(tmp_path, state):
    usb = tmp_path / "media" / "usb"
    now = [time.time()]
    sched = BackupSchedule(stick_cfg(usb), state, clock=lambda: now[0], first_delay_s=0)
    assert sched.due(now[0])
    assert sched.run_once() is None
    assert "does not exist: is the USB stick" in sched.failed["error"] and not usb.exists()
    assert not sched.due(now[0] + 0.5 * HOUR)
    lines = backup_lines(sched.section, last_backup(state), sched.status(), now[0] + 60)
    assert any(warn and text.startswith("FAILED") and "does not exist" in text for text, warn in lines)
    now[0] += HOUR + 1
    assert sched.due(now[0])
    usb.mkdir(parents=True)  # the stick is back
    assert sched.run_once() is not None and sched.failed is None and len(own_backups(usb, device_name())) == 1


def test_a_folder_too_small_loses_only_this_devices_oldest_backups_and_never_its_newest(tmp_path, state, monkeypatch):
    usb = tmp_path / "usb"
    usb.mkdir()
    old = [usb / f"edge-agent-barn-2026110{i}-000000.tar.gz" for i in (1, 2, 3)]
    for p in old:
        p.write_bytes(b"an older backup")
    other = usb / "edge-agent-shed-20261101-000000.tar.gz"
    other.write_bytes(b"another device's")
    real = shutil.disk_usage
    room = {"free": 0}

    def usage(path):
        total, used, _ = real(path)
        gone = sum(not p.exists() for p in old)  # each backup deleted frees a gigabyte
        return type(real(path))(total, used, room["free"] + gone * (1 << 30))

    monkeypatch.setattr("edge_agent.backup_folder.shutil.disk_usage", usage)
    done = take(stick_cfg(usb), state, device="barn")
    assert done["deleted"] == [old[0].name] and old[1].exists() and old[2].exists() and other.exists()
    for p in own_backups(usb, "barn")[2:]:
        p.unlink()  # only the two older ones again
    old[0].write_bytes(b"an older backup")
    monkeypatch.setattr("edge_agent.backup_folder.shutil.disk_usage", lambda path: type(real(path))(10 << 30, 10 << 30, 1 << 20))
    with pytest.raises(BackupError, match=r"has 1 MiB free, a backup needs about \d+ MiB"):
        take(stick_cfg(usb), state, device="barn")
    assert [p.exists() for p in old] == [False, False, True] and other.exists()  # the newest is never deleted


def test_a_folder_on_the_state_directorys_own_disk_is_refused_as_a_mount_point_whose_stick_is_not_there(tmp_path, state, monkeypatch):
    folder = tmp_path / "media" / "usb"  # the mount point, on the card, with no stick in it
    folder.mkdir(parents=True)
    monkeypatch.undo()
    with pytest.raises(BackupError, match="is on the state directory's own disk, where a backup dies with the card"):
        take(stick_cfg(folder), state, device="barn")
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(
    "read_only, why",
    [(True, "is read-only here: .* install-systemd again"), (False, "may not be written by the user .*uid=edge-agent in /etc/fstab")],
)
def test_a_folder_this_user_may_not_write_is_refused_with_what_to_do(tmp_path, state, monkeypatch, read_only, why):
    folder = tmp_path / "usb"
    folder.mkdir()
    flags = os.statvfs(folder).f_flag | (os.ST_RDONLY if read_only else 0)
    monkeypatch.setattr("edge_agent.backup_folder.os.access", lambda path, mode: False)  # (root may write anywhere)
    monkeypatch.setattr("edge_agent.backup_folder.os.statvfs", lambda path: type("V", (), {"f_flag": flags})())
    with pytest.raises(BackupError, match=why):
        take(stick_cfg(folder), state, device="barn")
    assert list(folder.iterdir()) == []


def test_a_backup_stopped_half_way_leaves_nothing_behind(tmp_path, state):
    usb = tmp_path / "usb"
    usb.mkdir()
    files = len(backup(AppConfig(), state, usb / "whole.tar.gz")["files"])
    record = last_backup(state)
    for after in (3, files + 3):  # while the files are read, and while the archive is written
        calls = iter(range(10**6))
        with pytest.raises(BackupStopped):
            backup(AppConfig(), state, usb / "b.tar.gz", should_stop=lambda calls=calls, after=after: next(calls) >= after)
        assert [p.name for p in usb.iterdir()] == ["whole.tar.gz"] and last_backup(state) == record
        assert not [p for p in state.iterdir() if p.name.startswith(".tmp-")]


def test_files_replaced_or_deleted_while_the_archive_is_written_still_restore(tmp_path, state):
    """The daemon goes on while a backup is written: a file it replaces (atomically) or deletes after the backup
    listed it is archived as it was, so the sha256 the backup records still matches and the restore takes it."""
    notes = state / "class-notes.toml"
    notes.write_text("# as it was\n")
    review = sorted((state / "queue" / "review").iterdir())[0]
    before = review.read_bytes()
    changed = []

    def meanwhile():
        if not changed:
            tmp = notes.with_name("notes.new")
            tmp.write_text("# written by the page meanwhile, longer than before\n")
            os.replace(tmp, notes)
            review.unlink()
            changed.append(1)
        return False

    out = tmp_path / "b.tar.gz"
    backup(AppConfig(), state, out, should_stop=meanwhile)
    back = restore(out, tmp_path / "new-card").state_dir
    assert (back / "class-notes.toml").read_text() == "# as it was\n"
    assert (back / "queue" / "review" / review.name).read_bytes() == before


def test_a_backup_is_due_by_the_last_one_taken_by_hand_too_and_after_the_clock_was_set_back(tmp_path, state):
    sched = BackupSchedule(stick_cfg(tmp_path), state, first_delay_s=600)
    now = time.time()
    assert not sched.due(now) and sched.due(now + 601)  # none yet: 10 minutes after the start
    record = state / "last-backup.json"
    for age_h, due in ((1, False), (23.9, False), (24.1, True), (-24, True)):
        record.write_text(json.dumps({"time": now - age_h * HOUR, "path": "/media/usb/x.tar.gz", "bytes": 1, "files": 1}))
        assert sched.due(now) is due, age_h
    record.write_text("{not json")
    assert last_backup(state) is None


def test_the_thread_writes_the_backup_when_due_and_at_low_priority(tmp_path, state):
    usb = tmp_path / "usb"
    usb.mkdir()
    sched = BackupSchedule(stick_cfg(usb), state, poll_s=0.05, first_delay_s=0)
    sched.start()
    try:
        end = time.monotonic() + 60
        while not sched.taken and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        sched.stop()
    assert sched.taken == 1 and len(list(usb.glob("edge-agent-*.tar.gz"))) == 1
    assert not sched.due(time.time())


def test_status_says_when_the_last_backup_was_taken_and_what_to_do_where_none_is(tmp_path, state):
    import subprocess
    import sys

    conf = tmp_path / "edge-agent.toml"
    conf.write_text(f"[daemon]\nstate_dir = {json.dumps(str(state))}\n")
    repo = Path(__file__).resolve().parents[1]

    def status() -> str:
        out = subprocess.run(
            [sys.executable, "-m", "edge_agent", "status", "--config", str(conf)], capture_output=True, text=True, cwd=repo
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    first = status()
    assert "backup: no backup taken yet" in first and "set [backup] dir to a USB stick's folder" in first
    backup(AppConfig(), state, tmp_path / "by-hand.tar.gz")
    second = status()
    size = f"{(tmp_path / 'by-hand.tar.gz').stat().st_size / 2**20:.0f}"
    assert f"backup: last backup just now, {size} MiB: {tmp_path / 'by-hand.tar.gz'}" in second
    assert "backup: [backup] dir unset: none is taken on its own every 24 h" in second and "a dead SD card" not in second
    conf.write_text(f"[daemon]\nstate_dir = {json.dumps(str(state))}\n[backup]\ndir = {json.dumps(str(tmp_path / 'usb'))}\n")
    assert f"backup: every 24 h into {tmp_path / 'usb'} by the daemon: it is not running" in status()


def test_the_health_page_and_metrics_say_when_the_last_backup_was_taken(tmp_path, state):
    pytest.importorskip("starlette")
    from .web_helpers import client

    c = client(state)
    page = c.get("/health").text
    assert 'id="backup"' in page and "no backup taken yet" in page
    assert "edge_agent_backup_last_timestamp_seconds 0" in c.get("/metrics").text
    backup(AppConfig(), state, tmp_path / "b.tar.gz")
    assert "last backup just now" in c.get("/health").text
    [line] = [x for x in c.get("/metrics").text.splitlines() if x.startswith("edge_agent_backup_last_timestamp_seconds ")]
    assert abs(float(line.split()[1]) - time.time()) < 60


def test_a_backup_that_fails_and_the_next_that_is_written_are_health_events(tmp_path):
    from edge_agent.alerts.config import AlertsSection, WebhookSection
    from edge_agent.alerts.worker import AlertWorker

    from .test_alerts import NO_MQTT

    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(AlertsSection(), NO_MQTT, [WebhookSection(url="http://127.0.0.1:9/", events=["health"])], db.path, tmp_path, "barn")
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}, "backup": {"failed": None}}
    w.observe(st)
    failed = {"time": time.time(), "error": "/media/usb does not exist: is the USB stick plugged in?", "since": time.time()}
    w.observe(st | {"backup": {"failed": failed}})
    w.observe(st | {"backup": {"failed": failed | {"time": time.time() + HOUR}}})  # failing still: said once
    w.observe(st)
    sent = [json.loads(m.payload) for m in w.outbox.due("webhook:0")]
    assert [(d["event"], d["title"]) for d in sent] == [
        ("backup_failed", "edge-agent barn: backup failed"),
        ("backup_written", "edge-agent barn: backups written again"),
    ]
    assert "USB stick" in sent[0]["message"]
    w.stop()
    db.close()


def test_a_trainer_that_stores_no_labels_and_stores_them_again_are_health_events_once_each(tmp_path):
    """The trainer's heartbeat says when it cannot store labels (its disk full): the device's alerts say so once, and
    once when it stores them again (the labels waited on the device, unsaid but on its status)."""
    from edge_agent.alerts.config import AlertsSection, WebhookSection
    from edge_agent.alerts.worker import AlertWorker

    from .test_alerts import NO_MQTT

    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(AlertsSection(), NO_MQTT, [WebhookSection(url="http://127.0.0.1:9/", events=["health"])], db.path, tmp_path, "barn")
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}, "backup": {"failed": None}}
    storing = {"trainer_alive": True, "trainer": {"state": "idle", "stores_labels": True}}
    stuck = {"trainer_alive": True, "trainer": {"state": "labels not stored: disk full", "stores_labels": False}}
    for handoff in (storing, stuck, stuck, {"trainer_alive": False, "trainer": {}}, stuck, storing, {"trainer": {"state": "idle"}}):
        w.observe(st | {"handoff": handoff})
    sent = [json.loads(m.payload) for m in w.outbox.due("webhook:0")]
    assert [(d["event"], d["title"]) for d in sent] == [  # once each: a trainer silent a while is no news either way
        ("trainer_not_storing", "edge-agent barn: the trainer stores no labels"),
        ("trainer_storing", "edge-agent barn: the trainer stores labels again"),
    ]
    assert sent[0]["message"].startswith("labels not stored: disk full: the labels wait on this device")
    w.stop()
    db.close()


def test_a_trainer_with_no_room_to_retrain_and_with_room_again_are_health_events_once_each(tmp_path):
    """The trainer's heartbeat says when no retrain can start for want of room on its disk: the device's alerts say so
    once, and once when it has room again (the loop stalls silently otherwise: no new version, no error anywhere);
    a trainer from before, which never says, is no news."""
    from edge_agent.alerts.config import AlertsSection, WebhookSection
    from edge_agent.alerts.worker import AlertWorker

    from .test_alerts import NO_MQTT

    db = ResultsDB(tmp_path / "results.sqlite")
    w = AlertWorker(AlertsSection(), NO_MQTT, [WebhookSection(url="http://127.0.0.1:9/", events=["health"])], db.path, tmp_path, "barn")
    st = {"engine": {"engine_version": "v1000"}, "healthy": True, "hotswap": {"refused": {}}, "backup": {"failed": None}}
    room = {"trainer_alive": True, "trainer": {"state": "idle", "stores_labels": True, "waits_for_room": False}}
    full = {"trainer_alive": True, "trainer": {"state": "waiting for room: disk full", "stores_labels": True, "waits_for_room": True}}
    older = {"trainer_alive": True, "trainer": {"state": "idle"}}
    for handoff in (older, room, full, full, {"trainer_alive": False, "trainer": {}}, full, room, older):
        w.observe(st | {"handoff": handoff})
    sent = [json.loads(m.payload) for m in w.outbox.due("webhook:0")]
    assert [(d["event"], d["title"]) for d in sent] == [
        ("trainer_waiting_for_room", "edge-agent barn: the trainer cannot retrain: its disk is full"),
        ("trainer_room_again", "edge-agent barn: the trainer has room to retrain again"),
    ]
    assert sent[0]["message"].startswith("waiting for room: disk full: no new version until there is room")
    w.stop()
    db.close()


def test_the_daemon_runs_the_schedule_where_a_folder_is_configured_and_says_so(tmp_path):
    from .daemon_helpers import DaemonProc, wait_until

    usb = tmp_path / "usb"
    d = DaemonProc(tmp_path / "state", {"backup": {"dir": str(usb)}}).start()
    try:
        d.wait_ready()
        status = tmp_path / "state" / "status.json"
        wait_until(lambda: status.is_file() and "backup" in json.loads(status.read_text()), 30, "the schedule in the status")
        st = json.loads(status.read_text())["backup"]
        assert st["dir"] == str(usb) and st["every_h"] == 24 and st["failed"] is None and st["next"] > time.time() + 300
    finally:
        assert d.terminate() == 0


def test_a_database_that_cannot_be_copied_is_a_failure_said_and_the_schedule_goes_on(tmp_path, state):
    usb = tmp_path / "usb"
    usb.mkdir()
    (state / "alerts.sqlite").write_bytes(b"not a database, " * 512)  # torn by a dead card, say
    sched = BackupSchedule(stick_cfg(usb), state, first_delay_s=0)
    assert sched.run_once() is None
    assert "alerts.sqlite: damaged (file is not a database)" in sched.failed["error"] and list(usb.iterdir()) == []
    assert not [p for p in state.iterdir() if p.name.startswith(".tmp-")]


def test_a_ledger_with_a_rotted_page_is_not_backed_up_the_backups_before_it_are_kept_and_the_daemon_is_told(tmp_path, state):
    """SQLite's backup copies pages as they lie: a page a card rotted went into every day's backup, and once the
    `keep` newest all held it, none held the page whole. Now each database copied is read whole: a damaged one is
    no backup (none before it deleted), the ledger no longer counts as closed whole, and the daemon is told (it
    stops, and its next start keeps every row that can still be read); the next backup is whole again."""
    from edge_agent._ledger_file import record_closed

    from .conftest import rot_pages

    usb = tmp_path / "usb"
    usb.mkdir()
    cfg = stick_cfg(usb, keep=1)
    first = take(cfg, state, now=time.time() - 86400)
    record_closed(state / "results.sqlite")
    rot_pages(state / "results.sqlite", "sqlite_autoindex_results_1")  # the index of the photos' hashes
    told = []
    sched = BackupSchedule(cfg, state, first_delay_s=0, on_damaged=lambda name, exc: told.append(name))
    assert sched.run_once() is None
    error = sched.failed["error"]
    assert "results.sqlite: damaged (integrity check:" in error and "none of the backups before it is deleted" in error
    assert "keeps every row that can still be read" in error and told == ["results.sqlite"]
    assert [p.name for p in own_backups(usb, device_name())] == [Path(first["path"]).name]
    assert not (state / "results.sqlite.closed.json").exists()  # the daemon's next start reads it whole
    assert not [p for p in state.iterdir() if p.name.startswith(".tmp-")]
    db, note = ResultsDB.open_or_recover(state / "results.sqlite", expected=True)  # as that start does
    assert "results: 6 rows kept" in note and db.last_result_id() == 6
    db.close()
    assert sched.run_once() is not None and sched.failed is None
    assert [p.name for p in own_backups(usb, device_name())] != [Path(first["path"]).name]  # the older one deleted now


def test_a_trainer_whose_backup_finds_its_labels_damaged_stops_for_its_next_start_to_keep_them(tmp_path):
    from edge_agent.config import parse_config
    from trainer import service

    from .conftest import rot_pages

    usb = tmp_path / "usb"
    usb.mkdir()
    svc = service.TrainerService(parse_config({"backup": {"dir": str(usb)}}), tmp_path / "trainer-machine")
    header = {"id": "a" * 64, "ext": ".jpg", "kind": "expert", "label": "Apple___healthy", "confidence": 1.0, "engine_version": "v1"}
    svc.samples.add(header, b"a photo")
    svc.samples._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # (the row into the file, as any checkpoint does)
    svc._start_backups()
    try:
        rot_pages(svc.root / "samples.sqlite", "sqlite_autoindex_samples_1")
        svc.backups.first_delay_s = 0
        assert svc.backups.run_once() is None and "trainer/samples.sqlite: damaged" in svc.backups.failed["error"]
        assert svc._stop.is_set() and svc.damaged.startswith("trainer/samples.sqlite")
        assert own_backups(usb, device_name()) == []
    finally:
        svc.backups.stop()
        svc.samples.close()
        svc.unlabelled.close()
    from trainer.samples import SampleStore

    again = SampleStore(svc.root, recover="lossless")  # its next start: every label read, kept in a new file
    assert again.recovered and [s.id for s in again.all()] == ["a" * 64]
    again.close()


def _secret(tmp_path: Path, text: str = "correct horse battery staple\n") -> Path:
    p = tmp_path / "backup.pass"
    p.write_text(text)
    return p


def test_a_sealed_backup_holds_nothing_readable_and_restores_only_with_its_passphrase(tmp_path, state):
    from edge_agent._backup_seal import MAGIC
    from edge_agent.backup import BackupSealed
    from engines.signing import load_or_create_key

    key = load_or_create_key(state / "trainer" / "signing.key")
    out = tmp_path / "usb" / "farm.tar.gz.sealed"
    backup(AppConfig(), state, out, passphrase=b"correct horse battery staple")
    data = out.read_bytes()
    assert data.startswith(MAGIC) and b"\x1f\x8b" not in data[: len(MAGIC) + 64]  # no gzip stream to be seen
    assert (state / "trainer" / "signing.key").read_bytes() not in data and key.seed.hex().encode() not in data
    assert last_backup(state)["sealed"] is True
    with pytest.raises(BackupSealed, match="sealed with a passphrase"):
        restore(out, tmp_path / "new-card")
    with pytest.raises(BackupError, match="the wrong passphrase"):
        restore(out, tmp_path / "new-card", passphrase=b"correct horse battery")
    assert not (tmp_path / "new-card").exists() and not list(tmp_path.glob(".tmp-*"))
    back = restore(out, tmp_path / "new-card", passphrase=b"correct horse battery staple").state_dir
    assert (back / "trainer" / "signing.key").read_bytes() == (state / "trainer" / "signing.key").read_bytes()
    assert ResultsDB(back / "results.sqlite", readonly=True).counts() == ResultsDB(state / "results.sqlite", readonly=True).counts()


@pytest.mark.parametrize(
    "what, change, why",
    [
        ("a byte changed", lambda d: d[:5000] + bytes([d[5000] ^ 1]) + d[5001:], "cannot be opened"),
        ("cut short", lambda d: d[:-100], "damaged|cut short"),
        ("its last part gone", lambda d: _drop_last_chunk(d), "cut short"),
        ("bytes added", lambda d: d + b"more", "bytes after its end"),
        ("a forged header", lambda d: _forged_limits(d), "key-derivation limits"),
    ],
)
def test_a_sealed_backup_damaged_or_changed_restores_nothing_and_says_why(tmp_path, state, what, change, why):
    good = tmp_path / "good.tar.gz.sealed"
    backup(AppConfig(), state, good, passphrase=b"pass phrase")
    bad = tmp_path / "bad.tar.gz.sealed"
    bad.write_bytes(change(good.read_bytes()))
    with pytest.raises(BackupError, match=why):
        restore(bad, tmp_path / "new-card", passphrase=b"pass phrase")
    assert not (tmp_path / "new-card").exists() and not list(tmp_path.glob(".tmp-*")), what


def _drop_last_chunk(data: bytes) -> bytes:
    """The file without its final (tagged) chunk: every chunk before it whole, the end missing."""
    import struct

    from edge_agent._backup_seal import MAGIC

    pos, last = len(MAGIC) + 16 + 16 + 24, None
    while pos < len(data):
        last = pos
        pos += 4 + struct.unpack(">I", data[pos : pos + 4])[0]
    return data[:last]


def _forged_limits(data: bytes) -> bytes:
    import struct

    from edge_agent._backup_seal import MAGIC

    at = len(MAGIC) + 16
    return data[:at] + struct.pack(">QQ", 4, 1 << 40) + data[at + 16 :]  # a terabyte of memory asked for


def test_the_schedule_seals_with_the_passphrase_file_and_never_puts_the_passphrase_in(tmp_path, state):
    usb = tmp_path / "usb"
    usb.mkdir()
    secret = _secret(state)  # kept, carelessly, in the state directory
    cfg = stick_cfg(usb, passphrase_file=str(secret), keep=1)
    first = take(cfg, state, device="barn", now=time.time())
    second = take(cfg, state, device="barn", now=time.time() + 86400)
    assert Path(second["path"]).name.endswith(".tar.gz.sealed") and second["deleted"] == [Path(first["path"]).name]
    back = restore(Path(second["path"]), tmp_path / "new-card", passphrase=b"correct horse battery staple").state_dir
    assert not (back / "backup.pass").exists() and (back / "results.sqlite").is_file()
    lines = backup_lines(cfg.backup, last_backup(state), BackupSchedule(cfg, state).status(), time.time())
    assert not any("not sealed" in text for text, _ in lines)
    lines = backup_lines(stick_cfg(usb).backup, last_backup(state), BackupSchedule(stick_cfg(usb), state).status(), time.time())
    assert any("not sealed: the stick holds this device's keys" in text for text, _ in lines)
    (tmp_path / "empty.pass").write_text("\n")
    with pytest.raises(BackupError, match="the passphrase file is empty"):
        take(stick_cfg(usb, passphrase_file=str(tmp_path / "empty.pass")), state, device="barn")


def test_the_command_line_seals_and_restores_with_a_passphrase_file_and_says_so_without_one(tmp_path, state):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "edge_agent", *a], capture_output=True, text=True, cwd=repo, stdin=subprocess.DEVNULL
    )  # noqa: E731
    secret = _secret(tmp_path)
    out = tmp_path / "b.tar.gz.sealed"
    made = run("backup", "--state-dir", str(state), "--out", str(out), "--passphrase-file", str(secret))
    assert made.returncode == 0 and f"sealed with the passphrase in {secret}" in made.stdout, made.stderr
    refused = run("restore", str(out), "--state-dir", str(tmp_path / "fresh"))
    assert refused.returncode == 2 and "sealed with a passphrase" in refused.stderr
    back = run("restore", str(out), "--state-dir", str(tmp_path / "fresh"), "--passphrase-file", str(secret))
    assert back.returncode == 0 and "restored" in back.stdout, back.stderr
    # a new card has no passphrase file (never in the backup it seals): the next backup would fail; it says so now
    assert "write it again, one line, into the file [backup] passphrase_file names" in back.stdout
    conf = tmp_path / "edge-agent.toml"
    conf.write_text(f"[backup]\npassphrase_file = {json.dumps(str(tmp_path / 'gone.pass'))}\n")
    named = run("restore", str(out), "--state-dir", str(tmp_path / "fresh2"), "--passphrase-file", str(secret), "--config", str(conf))
    assert named.returncode == 0 and f"into {tmp_path / 'gone.pass'} (chmod 600)" in named.stdout, named.stdout + named.stderr
    conf.write_text(f"[backup]\npassphrase_file = {json.dumps(str(secret))}\n")
    there = run("restore", str(out), "--state-dir", str(tmp_path / "fresh3"), "--passphrase-file", str(secret), "--config", str(conf))
    assert there.returncode == 0 and "write it again" not in there.stdout  # the file is there: nothing to do
    plain = tmp_path / "plain.tar.gz"
    assert run("backup", "--state-dir", str(state), "--out", str(plain)).returncode == 0
    assert "write it again" not in run("restore", str(plain), "--state-dir", str(tmp_path / "fresh4")).stdout


def test_a_configuration_named_by_a_relative_path_is_restored_with_where_it_was_in_full(tmp_path, state):
    import subprocess
    import sys

    (tmp_path / "edge-agent.toml").write_text(f"[daemon]\nstate_dir = {json.dumps(str(state))}\n")
    run = lambda *a: subprocess.run([sys.executable, "-m", "edge_agent", *a], capture_output=True, text=True, cwd=tmp_path)  # noqa: E731
    made = run("backup", "--config", "edge-agent.toml", "--out", "b.tar.gz")
    assert made.returncode == 0, made.stderr
    back = run("restore", "b.tar.gz", "--state-dir", "fresh")
    assert back.returncode == 0 and f"was {tmp_path / 'edge-agent.toml'};" in back.stdout, back.stdout + back.stderr


def _restore_on_a_terminal(archive: Path, dest: Path, typed: bytes) -> tuple[int, str]:
    """``edge-agent restore`` run on a terminal (a pty) where ``typed`` is typed at its prompt."""
    import pty
    import select
    import sys

    pid, fd = pty.fork()
    if pid == 0:  # the child: its terminal is the pty
        os.execv(sys.executable, [sys.executable, "-m", "edge_agent", "restore", str(archive), "--state-dir", str(dest)])
    out, end = b"", time.monotonic() + 60

    def read() -> bytes:  # what the terminal shows next; b"" once the child is gone or a minute is up
        if not select.select([fd], [], [], max(0.0, end - time.monotonic()))[0]:
            return b""
        try:
            return os.read(fd, 4096)
        except OSError:  # the child is gone
            return b""

    while b"passphrase: " not in out and (chunk := read()):
        out += chunk
    os.write(fd, typed)
    while chunk := read():
        out += chunk
    if time.monotonic() >= end:
        os.kill(pid, 9)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out.decode(errors="replace")


def test_restore_asks_for_a_sealed_backups_passphrase_on_a_terminal_and_never_echoes_it(tmp_path, state):
    out = tmp_path / "b.tar.gz.sealed"
    backup(AppConfig(), state, out, passphrase=b"the farm passphrase")
    rc, said = _restore_on_a_terminal(out, tmp_path / "new", b"not it\n")
    assert rc == 2 and "the wrong passphrase" in said and "not it" not in said
    rc, said = _restore_on_a_terminal(out, tmp_path / "new", b"the farm passphrase\n")
    assert rc == 0 and "restored" in said and "the farm passphrase" not in said, said


def test_a_backup_taken_by_hand_ends_a_failure_of_the_schedule(tmp_path, state):
    sched = BackupSchedule(stick_cfg(tmp_path / "not-plugged-in"), state, first_delay_s=0)
    assert sched.run_once() is None and sched.status()["failed"]
    backup(AppConfig(), state, tmp_path / "by-hand.tar.gz")
    st = sched.status()
    assert st["failed"] is None and st["next"] > time.time() + 23 * HOUR
    assert not any(text.startswith("FAILED") for text, _ in backup_lines(sched.section, last_backup(state), st, time.time()))


def test_a_trainer_alone_on_its_machine_backs_up_its_signing_key_and_leaves_a_shared_state_to_the_daemon(tmp_path):
    import subprocess
    import sys

    from edge_agent.config import parse_config
    from trainer import service

    usb = tmp_path / "usb"
    usb.mkdir()
    state = tmp_path / "trainer-machine"
    conf = tmp_path / "edge-agent.toml"
    conf.write_text(f"[backup]\ndir = {json.dumps(str(usb))}\n")
    svc = service.TrainerService(parse_config({"backup": {"dir": str(usb)}}), state)
    svc._start_backups()
    try:
        svc.backups.first_delay_s = 0
        assert svc.backups.due(time.time()) and svc.backups.run_once() is not None
        [made] = own_backups(usb, device_name())
        back = restore(made, tmp_path / "new-machine").state_dir
        key = svc.root.relative_to(state) / "signing.key"
        assert (back / key).read_bytes() == (state / key).read_bytes()
        svc._write_status()
        shown = subprocess.run(
            [sys.executable, "-m", "trainer", "status", "--config", str(conf), "--state-dir", str(state)],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert "backup: last backup just now" in shown.stdout, shown.stdout + shown.stderr
        ResultsDB(state / "results.sqlite").close()  # a daemon starts on this state directory: its backups hold the trainer's
        st = svc.status()["backup"]
        assert "the daemon on this state directory takes its backups" in st["deferred"] and not svc.backups.due(time.time() + 2 * 86400)
    finally:
        svc.backups.stop()
        svc.samples.close()
        svc.unlabelled.close()


def test_back_up_now_on_the_health_page_asks_the_daemon_which_writes_one_at_its_next_look(tmp_path, state):
    pytest.importorskip("starlette")
    from edge_agent.backup_schedule import request_backup, requested

    from .web_helpers import client, csrf_of

    usb = tmp_path / "usb"
    usb.mkdir()
    cfg = stick_cfg(usb)
    c = client(state, cfg=cfg)
    assert 'id="backup-now"' in c.get("/health").text
    assert c.post("/health/backup", data={}).status_code == 403 and requested(state) is None  # no CSRF token: refused
    r = c.post("/health/backup", data={"csrf": csrf_of(c)})
    assert r.status_code == 303 and requested(state) is not None
    assert "asked for just now: written when the daemon runs again" in c.get("/health").text  # (no daemon runs here)
    schedule = BackupSchedule(cfg, state)
    assert schedule.next_due(time.time()) > time.time() + 500 and schedule.due(time.time())  # not due by the clock: asked
    real_take = take

    def meanwhile(*a, **kw):  # asked again while this one is written: that request stays for the next look
        done = real_take(*a, **kw)
        time.sleep(0.01)
        request_backup(state)
        return done

    import edge_agent.backup_schedule as schedule_module

    schedule_module.take, was = meanwhile, schedule_module.take
    try:
        assert schedule.run_once() is not None and requested(state) is not None and len(own_backups(usb, device_name())) == 1
    finally:
        schedule_module.take = was
    assert schedule.run_once() is not None and requested(state) is None and not schedule.due(time.time())
    assert "asked for" not in c.get("/health").text


def test_back_up_now_without_a_folder_configured_is_refused_with_what_to_set(tmp_path, state):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from edge_agent.backup_schedule import requested
    from edge_agent.web.auth import Tokens

    from .web_helpers import REMOTE, app_for, client, csrf_of

    c = client(state)
    assert 'id="backup-now"' not in c.get("/health").text
    r = c.post("/health/backup", data={"csrf": csrf_of(c)})
    assert r.status_code == 409 and "no [backup] dir is set" in r.text and requested(state) is None
    usb = tmp_path / "usb"
    usb.mkdir()
    api = TestClient(app_for(state, cfg=stick_cfg(usb)), base_url="http://localhost", client=REMOTE, follow_redirects=False)
    read, admin = (Tokens(state / "web").new(role) for role in ("read", "admin"))
    assert api.post("/api/v1/backup", headers={"Authorization": f"Bearer {read}"}).status_code == 403
    r = api.post("/api/v1/backup", headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200 and r.json()["dir"] == str(usb) and r.json()["requested"] == requested(state)
