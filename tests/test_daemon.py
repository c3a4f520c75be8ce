"""The daemon end to end, as a real process on real photos."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from .conftest import trusted_store
from .daemon_helpers import DaemonProc, NotifySocket, db_rows, wait_until


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def real_photos(plantvillage: Path, n: int) -> list[Path]:
    photos = sorted(plantvillage.rglob("*.jpg"))
    step = max(1, len(photos) // n)
    return photos[::step][:n]


def test_500_real_photos_mixed_with_bad_files(plantvillage, tmp_path):
    d = DaemonProc(tmp_path / "state").start()
    d.wait_ready()
    photos = real_photos(plantvillage, 500)
    assert len(photos) == 500
    inbox = d.inbox
    rng = random.Random(5)
    bad: dict[str, str] = {}
    for i, p in enumerate(photos):
        sub = inbox / f"field_{i % 4}"
        sub.mkdir(exist_ok=True)
        shutil.copy(p, sub / f"{i:03d}_{p.name}")
        if i % 25 == 0:  # interleave the bad ones
            k = i // 25
            raw = p.read_bytes()
            (inbox / f"zero_{k}.jpg").write_bytes(b"")
            bad[f"zero_{k}.jpg"] = "empty file"
            (inbox / f"text_{k}.jpg").write_text("this is not a photo\n")
            bad[f"text_{k}.jpg"] = "not a supported image"
            (inbox / f"corrupt_{k}.jpg").write_bytes(b"\xff\xd8\xff" + bytes(rng.randrange(256) for _ in range(2000)))
            bad[f"corrupt_{k}.jpg"] = "JPEG"
            (inbox / f"half_{k}.jpg").write_bytes(raw[: len(raw) // 2])  # a copy that never finished
            bad[f"half_{k}.jpg"] = "truncated"
    (inbox / "notes.txt").write_text("ignored: not an image extension")
    # a photo written slowly, in pieces, that does finish
    slow = photos[0].read_bytes()
    slow_path = inbox / "slow_camera_app.jpg"
    with open(slow_path, "wb") as f:
        for i in range(0, len(slow), len(slow) // 5 + 1):
            f.write(slow[i : i + len(slow) // 5 + 1])
            f.flush()
            time.sleep(0.25)
    expected = {sha(p) for p in photos}

    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] >= len(expected), 180, "all results")
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM quarantine")[0][0] >= len(bad), 60, "all quarantined")
    time.sleep(1.5)  # a rescan later: nothing more happens
    assert d.proc.poll() is None, "daemon died"

    got = [r[0] for r in db_rows(d.state, "SELECT sha256 FROM results")]
    assert len(got) == len(set(got)) == len(expected)  # exactly one result per good photo
    assert set(got) == expected  # the slow photo is a duplicate of photos[0] by content
    reasons = {Path(r[0]).name: r[1] for r in db_rows(d.state, "SELECT path, reason FROM quarantine")}
    assert set(reasons) == set(bad)
    for name, fragment in bad.items():
        assert fragment in reasons[name], (name, reasons[name])
        assert (d.state / "quarantine" / name).exists()
        assert json.loads((d.state / "quarantine" / f"{name}.reason.json").read_text())["reason"] == reasons[name]
    assert (inbox / "notes.txt").exists()
    assert not [p for p in inbox.rglob("*.jpg")]
    assert d.terminate() == 0


def test_sigkill_ten_times_loses_and_duplicates_nothing(plantvillage, tmp_path):
    photos = real_photos(plantvillage, 240)
    state = tmp_path / "state"
    inbox = state / "inbox"
    inbox.mkdir(parents=True)
    d = DaemonProc(state, {"pipeline": {"max_batch": 8}})
    stop_feeding = threading.Event()

    def feed():
        for i, p in enumerate(photos):  # photos keep arriving the whole time
            tmp = inbox / f".{i:04d}.tmp"
            shutil.copy(p, tmp)
            os.rename(tmp, inbox / f"{i:04d}_{p.name}")
            time.sleep(0.03)
            if stop_feeding.is_set():
                return

    feeder = threading.Thread(target=feed)
    feeder.start()
    rng = random.Random(11)
    kills = 0
    try:
        while kills < 10:
            d.start()
            d.wait_ready()
            time.sleep(rng.uniform(0.1, 1.2))
            d.kill()
            kills += 1
    finally:
        feeder.join()
    d.start()
    d.wait_ready()
    expected = {sha(p) for p in photos}
    wait_until(lambda: db_rows(state, "SELECT COUNT(*) FROM results")[0][0] >= len(expected), 180, "all results")
    time.sleep(1.5)
    assert d.terminate() == 0

    got = [r[0] for r in db_rows(state, "SELECT sha256 FROM results")]
    assert len(got) == len(set(got)) == len(expected) and set(got) == expected
    processed = list((state / "processed").rglob("*.jpg"))
    assert len(processed) == len(photos)  # each photo moved exactly once, none left behind
    assert not list(inbox.glob("*.jpg"))
    # pseudo-labels: every confident result queued once, with its file; no file without its entry
    confident = {r[0] for r in db_rows(state, "SELECT sha256 FROM results WHERE verdict = 'confident'")}
    queued = db_rows(state, "SELECT sha256, file FROM label_queue WHERE kind = 'pseudo'")
    assert confident and {q[0] for q in queued} == confident and len(queued) == len(confident)
    assert all(Path(f).is_file() and sha(Path(f)) == s for s, f in queued)
    assert {p.name for p in (state / "queue" / "pseudo").iterdir()} == {Path(f).name for _, f in queued}
    # once the log said "queued", it was never lost
    logged = {e["photo_id"] for e in d.events() if e.get("event") == "classified" and e.get("queued") == "pseudo"}
    assert logged <= {s[:16] for s, _ in queued}
    assert kills >= 10


def test_sd_notify_ready_watchdog_status_stopping(tmp_path, tiny_store, signing_key):
    sock = NotifySocket(tmp_path / "notify.sock")
    d = DaemonProc(
        tmp_path / "state",
        {"store": trusted_store(tiny_store, signing_key)},
        env={"NOTIFY_SOCKET": str(sock.path), "WATCHDOG_USEC": "2000000"},
    ).start()
    try:
        msgs = sock.collect(4.0)
        lines = [m for _, m in msgs]
        assert "READY=1" in lines
        ready_at = next(t for t, m in msgs if m == "READY=1")
        assert sum(1 for t, m in msgs if m == "WATCHDOG=1" and t > ready_at) >= 3
        assert not any(m == "WATCHDOG=1" for t, m in msgs if t < ready_at)  # no pings before READY
        extends = [t for t, m in msgs if m.startswith("EXTEND_TIMEOUT_USEC=")]
        assert extends and max(extends) < ready_at  # more start-up time asked while it starts, never after
        assert any(m.startswith("STATUS=") and "classified" in m for m in lines)
        assert d.terminate() == 0
        assert "STOPPING=1" in [m for _, m in sock.collect(0.5)]
    finally:
        sock.close()


def test_a_long_start_asks_systemd_for_more_time_until_it_ends_and_no_longer_than_the_bound(tmp_path):
    from edge_agent.systemd import Notifier

    sock = NotifySocket(tmp_path / "notify.sock")
    notifier = Notifier({"NOTIFY_SOCKET": str(sock.path)})
    try:
        with notifier.starting("starting: building the plan", every_s=0.1):
            sock.collect(0.55)  # an engine build outlasting TimeoutStartSec, in small
        during = [m for _, m in sock.collect(0.3)]  # what was sent before the block ended, still in the socket too
        assert during.count("EXTEND_TIMEOUT_USEC=300000") >= 4 and "STATUS=starting: building the plan" in during
        sock.messages.clear()
        assert sock.collect(0.3) == []  # the start over: nothing more asked
        with notifier.starting("starting", every_s=0.1, at_most_s=0.25):  # a start that hangs is not kept alive for ever
            sock.collect(0.8)
        asked = [int(m.split("=")[1]) for _, m in sock.messages if m.startswith("EXTEND_TIMEOUT_USEC=")]
        assert 2 <= len(asked) <= 4 and asked == sorted(asked, reverse=True) and asked[0] <= 250000  # up to the bound
    finally:
        sock.close()
    with Notifier({}).starting("outside systemd"):  # nothing to tell, no thread
        assert not any(t.name == "start-time" for t in threading.enumerate())


def test_a_notify_socket_nobody_reads_costs_a_message_its_timeout_and_never_hangs_the_daemon(tmp_path):
    import socket as socket_mod

    from edge_agent.systemd import Notifier

    deaf = socket_mod.socket(socket_mod.AF_UNIX, socket_mod.SOCK_DGRAM)  # bound, alive, never read
    deaf.bind(str(tmp_path / "deaf.sock"))
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "deaf.sock")}, timeout_s=0.05)
    sent: list[tuple[bool, float]] = []

    def ping() -> None:
        while not sent or sent[-1][0]:  # until one is refused: the receiver's queue is full
            t0 = time.monotonic()
            sent.append((notifier.watchdog(), time.monotonic() - t0))
        t0 = time.monotonic()
        sent.append((notifier.ready("still here"), time.monotonic() - t0))

    thread = threading.Thread(target=ping, daemon=True)
    thread.start()
    thread.join(10)
    try:
        assert not thread.is_alive(), "a send blocked on a receiver that does not read"
        assert len(sent) > 2 and not sent[-1][0] and not sent[-2][0]  # dropped, said so
        assert max(seconds for _, seconds in sent) < 1.0
        assert deaf.recv(4096) == b"WATCHDOG=1"  # what fitted was delivered
    finally:
        deaf.close()


def test_watchdog_stops_while_the_pipeline_is_stuck(tmp_path, tiny_store):
    """In-process: an engine that hangs makes the pipeline stall; WATCHDOG=1 must stop, then resume."""
    from edge_agent.config import parse_config
    from edge_agent.daemon import Daemon
    from edge_agent.systemd import Notifier
    from engines.loader import open_engine

    from .conftest import encode, leaf_image
    from .test_pipeline import FixedEngine

    sock = NotifySocket(tmp_path / "notify.sock")
    gate = threading.Event()
    cfg = parse_config({"daemon": {"stall_timeout_s": 1.0}, "inbox": {"settle_s": 0.1}, "store": {"path": str(tiny_store)}})
    engine = FixedEngine(open_engine(tiny_store, cfg.engine), block=gate)
    daemon = Daemon(cfg, tmp_path / "state", notifier=Notifier({"NOTIFY_SOCKET": str(sock.path)}), engine=engine)
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        sock.collect(1.5)
        assert "READY=1" in [m for _, m in sock.messages]
        before = sum(1 for _, m in sock.messages if m == "WATCHDOG=1")
        assert before >= 2  # idle and healthy: pings
        (tmp_path / "state" / "inbox" / "leaf.jpg").write_bytes(encode(leaf_image(1)))
        sock.messages.clear()
        sock.collect(4.0)  # photo stuck in inference for > stall_timeout_s
        pings = [t for t, m in sock.messages if m == "WATCHDOG=1"]
        assert pings and max(pings) < time.monotonic() - 2.0, "WATCHDOG=1 kept coming while stuck"
        assert daemon.healthy is False
        gate.set()
        sock.messages.clear()
        sock.collect(1.5)
        assert "WATCHDOG=1" in [m for _, m in sock.messages]  # progress again: pings resume
    finally:
        gate.set()
        daemon.request_stop()
        runner.join(30)
        sock.close()


def test_sigterm_drains_in_flight_and_exits_zero(plantvillage, tmp_path):
    d = DaemonProc(tmp_path / "state").start()
    d.wait_ready()
    photos = real_photos(plantvillage, 60)
    for i, p in enumerate(photos):
        shutil.copy(p, d.inbox / f"{i}.jpg")
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] > 0, 60, "first result")
    t0 = time.monotonic()
    assert d.terminate() == 0
    assert time.monotonic() - t0 < 20
    done = db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0]
    left = len(list(d.inbox.glob("*.jpg")))
    assert done + left == len(photos)  # nothing lost: each photo is either done or still in the inbox
    events = [e["event"] for e in d.events()]
    assert events[-1] == "stopped"


def test_cli_status_results_review(plantvillage, tmp_path, tiny_store, signing_key):
    import subprocess
    import sys

    from .daemon_helpers import REPO

    d = DaemonProc(tmp_path / "state", {"store": trusted_store(tiny_store, signing_key)}).start()
    d.wait_ready()
    photos = real_photos(plantvillage, 6)
    for i, p in enumerate(photos):
        shutil.copy(p, d.inbox / f"{i}.jpg")
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] == 6, 60, "results")
    time.sleep(1.0)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "edge_agent", *args, "--state-dir", str(d.state)], capture_output=True, text=True, cwd=REPO
        )

    # files the daemon does not read are never dropped silently: counted per extension, logged once each
    for name in ("notes.xyz", "scan.XYZ", "clip.mov"):
        (d.inbox / name).write_bytes(b"not read")
    (d.inbox / "copying.jpg.part").write_bytes(b"half")  # a temporary name: its final name comes later
    wait_until(
        lambda: json.loads(cli("status", "--json").stdout).get("folder", {}).get("unsupported") == {".xyz": 2, ".mov": 1},
        30,
        "unsupported files counted",
    )
    time.sleep(2.5)  # past a rescan: still logged once each
    ignored = [e for e in d.events() if e.get("event") == "file_ignored"]
    assert sorted(Path(e["photo"]).name for e in ignored) == ["clip.mov", "notes.xyz", "scan.XYZ"]
    assert "ignored (not a format the daemon reads; left in the inbox): 1 .mov file, 2 .xyz files" in cli("status").stdout
    assert (d.inbox / "notes.xyz").exists()

    st = json.loads(cli("status", "--json").stdout)
    assert st["running"] and st["processed"] == 6 and st["engine"]["engine_version"] == "v0001"
    assert sum(st["per_class"].values()) == 6 and "queue_depths" in st and st["uptime_s"] > 0
    rows = [json.loads(line) for line in cli("results", "--json").stdout.splitlines()]
    assert len(rows) == 6 and {"path", "sha256", "label", "confidence", "engine_version"} <= set(rows[0])
    assert cli("results", "--json", "--since", "1h").stdout.count("\n") == 6
    assert cli("results", "--json", "--since", "2999-01-01T00:00").stdout == ""
    assert "expected an ISO time" in cli("results", "--since", "yesterday-ish").stderr
    # the untrained tiny model is never confident: everything waits for an expert
    review = [json.loads(line) for line in cli("review", "list", "--json").stdout.splitlines()]
    assert len(review) == 6
    out = cli("review", "label", "--config", str(d.config_path), review[0]["photo_id"], "Tomato___healthy")
    assert out.returncode == 0, out.stderr
    assert cli("review", "label", "--config", str(d.config_path), review[1]["photo_id"], "Mango___rust").returncode == 2
    assert cli("review", "label", "--config", str(d.config_path), review[1]["photo_id"], "Mango___rust", "--new-class").returncode == 0
    expert = db_rows(d.state, "SELECT label, file FROM label_queue WHERE kind = 'expert' ORDER BY label")
    assert [e[0] for e in expert] == ["Mango___rust", "Tomato___healthy"]
    assert all(Path(f).is_file() and "/expert/" in f for _, f in expert)
    # what the alerts are told of the device's learning: every class trusted here (trust_checks = 0), nothing taken back
    assert json.loads((d.state / "status.json").read_text())["trust"] == {"trusted": None, "withdrawals": 0, "last_withdrawal": None}
    assert d.terminate() == 0
    assert not json.loads(cli("status", "--json").stdout)["running"]


def test_stop_with_a_stuck_pipeline_still_exits(tmp_path, tiny_store):
    """SIGTERM while inference hangs: drain gives up after drain_timeout_s, the photo stays in the inbox."""
    from edge_agent.config import parse_config
    from edge_agent.daemon import Daemon
    from edge_agent.pipeline import STOP_JOIN_S
    from edge_agent.systemd import Notifier
    from engines.loader import open_engine

    from .conftest import encode, leaf_image
    from .test_pipeline import FixedEngine

    gate = threading.Event()
    cfg = parse_config({"daemon": {"drain_timeout_s": 1.0}, "inbox": {"settle_s": 0.1}, "store": {"path": str(tiny_store)}})
    daemon = Daemon(cfg, tmp_path / "state", notifier=Notifier({}), engine=FixedEngine(open_engine(tiny_store, cfg.engine), block=gate))
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("rc", daemon.run()))
    runner.start()
    try:
        wait_until(lambda: daemon.pipeline is not None and daemon.folder is not None, 10, "daemon up")
        photo = tmp_path / "state" / "inbox" / "leaf.jpg"
        photo.write_bytes(encode(leaf_image(3)))
        wait_until(lambda: daemon.pipeline.in_flight == 1, 10, "photo in flight")
        t0 = time.monotonic()
        daemon.request_stop()
        runner.join(20)
        assert not runner.is_alive() and result["rc"] == 0
        # the drain's 1 s, then one deadline for every stage to end (not one each: 11 s before it was shared)
        assert time.monotonic() - t0 < 1.0 + STOP_JOIN_S + 1.5
        assert photo.exists()  # not lost: it is processed at the next start
    finally:
        gate.set()


@pytest.mark.parametrize("met_by", ["a commit", "the backup", "the review pool's pruning"])
def test_a_ledger_found_damaged_while_running_stops_the_daemon_with_a_failure_and_keeps_the_photos(
    tmp_path, tiny_store, monkeypatch, met_by
):
    """A page of the ledger found rotted while the daemon runs: before, the sink tried again every second for ever (each
    try counted as progress, so the watchdog never fired) and no photo was recorded; the review pool's pruning said a
    warning a minute; the day's backup copied the page as it lay. Now the daemon stops with status 1 (systemd starts it
    again 5 s on), the photos wait in the inbox, and the ledger is not recorded as closed whole, so that start reads it
    and keeps every row that can still be read."""
    import sqlite3

    from edge_agent.config import parse_config
    from edge_agent.daemon import Daemon
    from edge_agent.results import ResultsDB
    from edge_agent.systemd import Notifier
    from engines.loader import open_engine

    from .conftest import encode, leaf_image

    malformed = sqlite3.DatabaseError("database disk image is malformed")

    def rotted(*a, **k):
        raise malformed

    cfg = parse_config({"inbox": {"settle_s": 0.1}, "store": {"path": str(tiny_store)}})
    daemon = Daemon(cfg, tmp_path / "state", notifier=Notifier({}), engine=open_engine(tiny_store, cfg.engine))
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("rc", daemon.run()))
    runner.start()
    photo = tmp_path / "state" / "inbox" / "leaf.jpg"
    try:
        wait_until(lambda: daemon.pipeline is not None and daemon.folder is not None, 20, "daemon up")
        if met_by == "a commit":
            monkeypatch.setattr(ResultsDB, "commit", rotted)
            photo.write_bytes(encode(leaf_image(3)))
        elif met_by == "the backup":
            daemon._backup_found_damage("results.sqlite", malformed)
        else:
            monkeypatch.setattr("edge_agent.review.queue.prune_pool", rotted)
            daemon._prune_review_pool()
        runner.join(30)
        assert not runner.is_alive() and result["rc"] == 1
    finally:
        daemon.request_stop()
        runner.join(10)
    assert (photo.exists() or met_by != "a commit") and not (tmp_path / "state" / "results.sqlite.closed.json").exists()


def test_a_phone_heic_and_a_scanner_tiff_get_results_and_an_unknown_file_is_counted(tmp_path):
    """The same real photo as HEIC (an iPhone's format) and as TIFF gets the label its JPEG gets; a .xyz file
    is left alone and shows in status."""
    import io
    import subprocess
    import sys

    import cv2
    import pillow_heif
    from PIL import Image

    from .daemon_helpers import REPO

    sample = REPO / "samples" / "apple_scab.jpg"
    rgb = cv2.cvtColor(cv2.imread(str(sample)), cv2.COLOR_BGR2RGB)
    heic, tiff = io.BytesIO(), io.BytesIO()
    pillow_heif.from_pillow(Image.fromarray(rgb)).save(heic, quality=-1, chroma=444)
    Image.fromarray(rgb).save(tiff, "TIFF", compression="tiff_lzw")
    d = DaemonProc(tmp_path / "state").start()
    d.wait_ready()
    (d.inbox / "IMG_0001.HEIC").write_bytes(heic.getvalue())
    (d.inbox / "scan.tif").write_bytes(tiff.getvalue())
    (d.inbox / "notes.xyz").write_bytes(b"?")
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] == 2, 60, "two results")
    rows = db_rows(d.state, "SELECT path, label, confidence FROM results ORDER BY path")
    assert [(Path(p).name, label) for p, label, _ in rows] == [("IMG_0001.HEIC", "Apple___Apple_scab"), ("scan.tif", "Apple___Apple_scab")]
    assert all(conf > 0.9 for _, _, conf in rows)
    time.sleep(1.0)
    st = json.loads(
        subprocess.run(
            [sys.executable, "-m", "edge_agent", "status", "--json", "--state-dir", str(d.state)], capture_output=True, text=True, cwd=REPO
        ).stdout
    )
    assert st["folder"]["unsupported"] == {".xyz": 1} and st["quarantined"] == 0
    assert d.terminate() == 0


def test_names_that_are_not_utf8_or_too_long_and_a_symlink_loop_cost_no_photo(tmp_path):
    """A Latin-1 file name (a camera card), a 250-byte name of a file that is no image, and a symlink loop in the
    inbox: the photo gets its result, the others are quarantined once (moved out, with the reason), and photos
    dropped afterwards still get results."""
    import os

    from .daemon_helpers import REPO

    photo = (REPO / "samples" / "apple_scab.jpg").read_bytes()
    d = DaemonProc(tmp_path / "state").start()
    d.wait_ready()
    inbox = os.fsencode(d.inbox)
    with open(inbox + b"/feuille-\xe9t\xe9.jpg", "wb") as f:  # Latin-1: not valid UTF-8
        f.write(photo)
    long_name = "x" * 246 + ".jpg"
    (d.inbox / long_name).write_bytes(b"not an image at all, and a very long name")
    os.symlink(d.inbox / "loop-b.jpg", d.inbox / "loop-a.jpg")
    os.symlink(d.inbox / "loop-a.jpg", d.inbox / "loop-b.jpg")
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] == 1, 60, "the Latin-1 photo's result")
    (d.inbox / "after.jpg").write_bytes((REPO / "samples" / "corn_common_rust.jpg").read_bytes())
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] == 2, 60, "a later photo's result")
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM quarantine")[0][0] >= 3, 30, "three quarantined (two links, one file)")
    time.sleep(2)  # rescans: nothing is quarantined twice
    rows = db_rows(d.state, "SELECT path, moved_to FROM quarantine")
    assert len(rows) == 3 and all(moved for _, moved in rows), rows
    paths = [p for (p,) in db_rows(d.state, "SELECT path FROM results")]
    assert any("\\xe9t\\xe9" in p for p in paths)
    assert not (d.inbox / long_name).exists() and not os.path.lexists(d.inbox / "loop-a.jpg")
    assert d.terminate() == 0


@pytest.mark.parametrize("damage", ["truncated", "emptied", "rotted"])
def test_a_corrupt_or_emptied_ledger_is_kept_aside_and_a_new_one_started(tmp_path, damage):
    """A results.sqlite cut short (a failing SD card), left empty although photos were processed, or with pages a card
    rotted in place since its clean close (its size and times unchanged: the start did not read it whole, failed on the
    page, and said "keeps it aside at its next start" at every start): the daemon starts, keeps the old file beside the
    new one, says so in status, and photos get results again."""
    import subprocess
    import sys

    from .daemon_helpers import REPO

    d = DaemonProc(tmp_path / "state").start()
    d.wait_ready()
    (d.inbox / "a.jpg").write_bytes((REPO / "samples" / "apple_scab.jpg").read_bytes())
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] == 1, 60, "a result")
    assert d.terminate() == 0
    ledger = d.state / "results.sqlite"
    queued = [f for f in (d.state / "queue").glob("*/*") if f.is_file()]
    assert queued  # the photo waits in the label queue (no trainer here)
    import sqlite3

    if damage == "rotted":  # every page of the results table, in place; the file's size and times as they were
        from .conftest import rot_pages

        assert (d.state / "results.sqlite.closed.json").exists() and not (d.state / "results.sqlite-wal").exists()
        rot_pages(ledger, "results")
    else:
        with sqlite3.connect(ledger) as con:  # the rows into the main file, as after any checkpoint
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = ledger.stat().st_size
        ledger.write_bytes(ledger.read_bytes()[: size // 3] if damage == "truncated" else b"")
        for extra in ("results.sqlite-wal", "results.sqlite-shm"):
            (d.state / extra).unlink(missing_ok=True)
    if damage == "truncated":
        out = subprocess.run(
            [sys.executable, "-m", "edge_agent", "status", "--state-dir", str(d.state)], capture_output=True, text=True, cwd=REPO
        )
        assert out.returncode == 2 and "unreadable" in out.stderr and "Traceback" not in out.stderr
    d.start()
    d.wait_ready()
    assert list(d.state.glob("results.sqlite.corrupt-*"))  # kept, not deleted
    assert db_rows(d.state, "SELECT COUNT(*) FROM label_queue")[0][0] == len(queued)  # none lost
    (d.inbox / "b.jpg").write_bytes((REPO / "samples" / "corn_common_rust.jpg").read_bytes())
    wait_until(
        lambda: db_rows(d.state, "SELECT COUNT(*) FROM results WHERE path LIKE '%b.jpg'")[0][0] == 1, 60, "a result in the new ledger"
    )
    time.sleep(1.5)
    out = subprocess.run(
        [sys.executable, "-m", "edge_agent", "status", "--state-dir", str(d.state)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0 and "LEDGER: results.sqlite was " in out.stdout and "kept as results.sqlite.corrupt-" in out.stdout
    assert "stay in processed/" in out.stdout
    assert d.terminate() == 0


def test_an_inbox_removed_and_made_again_is_said_and_watched_again_within_seconds(tmp_path):
    import subprocess
    import sys

    from .daemon_helpers import REPO

    d = DaemonProc(tmp_path / "state").start()
    d.wait_ready()
    shutil.rmtree(d.inbox)
    wait_until(lambda: '"inbox_missing"' in d.log_path.read_text(), 5, "the missing inbox logged")
    assert '"found": "nothing"' in d.log_path.read_text()
    time.sleep(1.5)
    out = subprocess.run(
        [sys.executable, "-m", "edge_agent", "status", "--state-dir", str(d.state)], capture_output=True, text=True, cwd=REPO
    )
    assert "INBOX MISSING" in out.stdout and d.log_path.read_text().count('"inbox_missing"') == 1  # said once
    d.inbox.mkdir()
    time.sleep(0.1)
    (d.inbox / "back.jpg").write_bytes((REPO / "samples" / "apple_scab.jpg").read_bytes())
    t0 = time.monotonic()
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] == 1, 10, "a result from the inbox made again")
    assert time.monotonic() - t0 < 3.0  # the watch is back, not the 10 s rescan
    assert '"inbox_back"' in d.log_path.read_text()
    assert d.terminate() == 0


def test_on_a_full_disk_the_status_is_still_written_and_says_why(tmp_path, monkeypatch):
    """The status file is padded to a fixed slot; when a new file cannot be made (ENOSPC) the slot is overwritten in
    place, so `status` and the Health page see a running daemon and the reason, not "not running"."""
    import errno

    import edge_agent.state as state_mod
    from engines import durable

    path = tmp_path / "status.json"
    doc = {"pid": os.getpid(), "updated": time.time(), "healthy": True, "counters": {"processed": 3}}
    assert state_mod.write_status(path, doc) is None and path.stat().st_size == state_mod.STATUS_SLOT_BYTES

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable, "atomic_write", full)
    doc = {**doc, "updated": time.time(), "counters": {"processed": 4}, "big": "x" * (2 * state_mod.STATUS_SLOT_BYTES)}
    assert "disk full" in state_mod.write_status(path, doc)
    live, running = state_mod.live_status(path, 10)
    assert running and live["counters"]["processed"] == 4 and "No space left" in live["disk_full"] and "big" not in live
    assert path.stat().st_size == state_mod.STATUS_SLOT_BYTES  # not one block more


def test_a_photo_that_cannot_be_moved_out_is_recorded_once_and_not_offered_again(tmp_path, monkeypatch, tiny_store, signing_key):
    """A file the daemon may not move (another user's, a read-only card): one result, one error, and the rescans
    that still see it in the inbox leave it alone until it changes."""
    import errno

    from edge_agent import inbox_files
    from edge_agent.config import parse_config
    from edge_agent.daemon import Daemon
    from edge_agent.systemd import Notifier

    def refuse(src, folder):
        raise PermissionError(errno.EACCES, "Permission denied", str(src))

    monkeypatch.setattr(inbox_files, "move_out", refuse)
    shutil.copytree(tiny_store, tmp_path / "store")
    cfg = parse_config(
        {
            "store": trusted_store(tmp_path / "store", signing_key),
            "handoff": {"enabled": False},
            "inbox": {"settle_s": 0.1, "rescan_interval_s": 0.3},
        }
    )
    daemon = Daemon(cfg, tmp_path / "state", notifier=Notifier({}))
    t = threading.Thread(target=daemon.run)
    t.start()
    try:
        wait_until(lambda: daemon.folder is not None, 20, "daemon up")
        from .conftest import encode, leaf_image

        (daemon.inbox / "stuck.jpg").write_bytes(encode(leaf_image(7)))
        wait_until(lambda: daemon.pipeline.counters["processed"] == 1, 30, "its result")
        time.sleep(2.0)  # several rescans see it still there
        errors = [e for e in daemon.pipeline.last_errors if "could not move" in e.get("error", "")]
        assert len(errors) == 1 and daemon.pipeline.counters["duplicates"] == 0
        assert (daemon.inbox / "stuck.jpg").exists()
    finally:
        daemon.request_stop()
        t.join(30)


def test_the_default_daemon_asks_the_expert_about_confident_answers_until_their_class_has_earned_trust(tmp_path):
    """Out of the box no class is trusted ([labels] trust_checks = 10): a confident answer is not a pseudo-label yet,
    it joins the review pool as a check; the expert's label is recorded against the model's answer."""
    import subprocess
    import sys

    d = DaemonProc(tmp_path / "state", {"labels": {"trust_checks": 10}}).start()
    try:
        d.wait_ready()
        samples = sorted((Path(__file__).parents[1] / "samples").glob("*.jpg"))
        for p in samples:
            shutil.copy(p, d.inbox / p.name)
        wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM label_queue")[0][0] >= len(samples), 60, "every photo queued")
        confident = {pid for (pid,) in db_rows(d.state, "SELECT photo_id FROM results WHERE verdict = 'confident'")}
        assert confident  # the shipped model is sure of some of the sample photos, and none becomes a pseudo-label
        assert db_rows(d.state, "SELECT kind, COUNT(*) FROM label_queue GROUP BY kind") == [("review", len(samples))]
        reasons = db_rows(d.state, "SELECT verdict, verdict_reason FROM results")  # each answer keeps why it is not sure
        assert all((verdict == "confident") == (why == "") for verdict, why in reasons) and len(reasons) > len(confident)

        def cli(*args):
            return subprocess.run(
                [sys.executable, "-m", "edge_agent", *args, "--config", str(d.config_path), "--state-dir", str(d.state)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout

        asked = [json.loads(line) for line in cli("review", "list", "--json").splitlines()]
        assert len(asked) == len(samples)
        listed = [json.loads(line) for line in cli("results", "--json").splitlines()]
        assert sorted((r["verdict"], r["verdict_reason"]) for r in listed) == sorted(reasons)
        first = next(a for a in asked if a["photo_id"] in confident)
        cli("review", "label", first["photo_id"], first["label"])  # the expert agrees: one right check
        said, verdict, expert = db_rows(d.state, "SELECT r.label, r.verdict, e.label FROM expert_labels e JOIN results r USING (sha256)")[0]
        assert (said, verdict, expert) == (first["label"], "confident", first["label"])
        wait_until(  # what the alerts are told of the device's learning: no class trusted yet, nothing taken back
            lambda: json.loads((d.state / "status.json").read_text()).get("trust", {}).get("trusted") == [], 30, "the checks read"
        )
        assert json.loads((d.state / "status.json").read_text())["trust"] == {"trusted": [], "withdrawals": 0, "last_withdrawal": None}
    finally:
        d.terminate()


def test_a_status_file_is_readable_by_its_services_group_and_by_no_one_else_whatever_the_umask(tmp_path):
    """It names photos, devices and errors: 0640 from its first byte (the red team found it 0644)."""
    import stat

    from edge_agent.state import write_status

    old = os.umask(0o000)
    try:
        write_status(tmp_path / "status.json", {"pid": 1})
        write_status(tmp_path / "status.json", {"pid": 2})  # and again, over the first
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "status.json").stat().st_mode) == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_an_empty_file_is_a_copy_not_started_yet_until_the_grace_period_ends(plantvillage, tmp_path):
    """A copy creates the file, then writes it: on a busy machine it stayed 0 bytes past settle_s and a real photo was
    quarantined as "empty file" (seen in the suite). An empty file now waits like a truncated one: given its bytes
    within incomplete_grace_s it is classified; still empty after it, quarantined with the reason."""
    photo = real_photos(plantvillage, 1)[0]
    d = DaemonProc(tmp_path / "state", {"inbox": {"incomplete_grace_s": 4.0, "settle_s": 0.2}}).start()
    d.wait_ready()
    (d.inbox / "late.jpg").write_bytes(b"")
    (d.inbox / "never.jpg").write_bytes(b"")
    time.sleep(1.5)  # settled at 0 bytes several times over
    assert (d.inbox / "late.jpg").exists() and not (d.state / "quarantine" / "late.jpg").exists()
    (d.inbox / "late.jpg").write_bytes(photo.read_bytes())
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] == 1, 30, "the late photo's result")
    assert db_rows(d.state, "SELECT sha256 FROM results")[0][0] == sha(photo)
    # the ledger's record comes last (the photo, its reason, then the row): the file alone may be there before its reason
    wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM quarantine")[0][0] == 1, 30, "the empty file quarantined")
    assert (d.state / "quarantine" / "never.jpg").exists()
    assert json.loads((d.state / "quarantine" / "never.jpg.reason.json").read_text())["reason"] == "empty file (0 bytes)"
    assert not (d.state / "quarantine" / "late.jpg").exists()
    assert d.terminate() == 0


def test_a_heic_with_a_valid_header_and_a_corrupt_body_gets_a_result_or_a_quarantine_never_stays(tmp_path):
    """Whatever libheif makes of it, each corrupt HEIC leaves the inbox: decoded (libheif conceals damaged data), or
    quarantined with its reason and counted; a box that claims more bytes than the file has is judged once the file
    is older than ``incomplete_grace_s``, or has looked truncated that long here (its mtime may be in the future)."""
    import io
    import struct

    import numpy as np
    import pillow_heif
    from PIL import Image

    rgb = (np.random.default_rng(0).random((300, 400, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    pillow_heif.from_pillow(Image.fromarray(rgb)).save(buf, quality=50)
    good = buf.getvalue()
    mdat = good.find(b"mdat") - 4
    variants = {
        "zeroed.heic": good[: mdat + 28] + bytes(len(good) - mdat - 28),
        "long-box.heic": good[:mdat] + struct.pack(">I", len(good) - mdat + 5000) + good[mdat + 4 :],
        "no-body.heic": good[: mdat + 8],
        "meta-garbage.heic": good[:40] + bytes(b ^ 0x5A for b in good[40:mdat]) + good[mdat:],
    }
    d = DaemonProc(tmp_path / "state", {"inbox": {"incomplete_grace_s": 2.0, "settle_s": 0.2}}).start()
    d.wait_ready()
    for name, data in variants.items():
        (d.inbox / name).write_bytes(data)
    future = time.time() + 86400  # a camera whose clock is a day ahead: the file looks modified "just now" forever
    os.utime(d.inbox / "long-box.heic", (future, future))
    wait_until(lambda: not [p for p in d.inbox.iterdir() if p.suffix == ".heic"], 60, "every corrupt HEIC left the inbox")
    recorded = "SELECT (SELECT COUNT(*) FROM results) + (SELECT COUNT(*) FROM quarantine)"  # each row after its files
    wait_until(lambda: db_rows(d.state, recorded)[0][0] == len(variants), 30, "every HEIC's result or quarantine recorded")
    results = db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0]
    quarantined = sorted(p.name for p in (d.state / "quarantine").glob("*.heic"))
    assert results + len(quarantined) == len(variants)
    for name in quarantined:
        assert json.loads((d.state / "quarantine" / f"{name}.reason.json").read_text())["reason"]
    assert d.terminate() == 0


def test_a_state_disk_too_full_for_the_shipped_engines_says_what_to_free_and_the_daemon_serves_the_package_store(tmp_path, monkeypatch):
    """No traceback: one line naming the folder, what it needs and what is free; the CLI exits 2 with it, and the
    daemon serves the package's own store read-only meanwhile, saying so in its status."""
    import errno
    import shutil as sh

    import edge_agent.state as st
    from edge_agent.config import AppConfig, default_store_path
    from edge_agent.daemon import Daemon
    from edge_agent.state import StateDiskFull, resolve_store, resolve_store_or_shipped

    real = sh.copy2
    copied = []

    def full(src, dst, **kw):
        if len(copied) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        copied.append(dst)
        return real(src, dst, **kw)

    monkeypatch.setattr(st.shutil, "copy2", full)
    with pytest.raises(StateDiskFull) as caught:
        resolve_store(AppConfig(), tmp_path / "state")
    why = str(caught.value)
    assert str(tmp_path / "state" / "engines") in why and "No space left on device" in why and "MB free" in why and "\n" not in why
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]  # nothing half-copied left behind
    store, note = resolve_store_or_shipped(AppConfig(), tmp_path / "state")
    assert store.root == default_store_path() and "read-only" in note
    copied.clear()
    d = Daemon(AppConfig(), tmp_path / "state")
    d._setup()
    try:
        d._seed_state_store()  # a first start copies the release just after READY=1
        assert d.status()["store_problem"] and d.classifier.engine.engine_version == store.current()
        assert d.store.root == default_store_path()
    finally:
        d._stop.set()
        d._shutdown()


def test_the_daemon_tells_its_alerts_what_the_next_version_waits_for_as_a_trainer_here_last_said(tmp_path):
    """What Home Assistant shows; nothing where no trainer wrote a status here, or it cannot be read as one."""
    from types import SimpleNamespace

    from edge_agent.config import parse_config
    from edge_agent.daemon import Daemon

    me = SimpleNamespace(cfg=parse_config({}), state=SimpleNamespace(root=tmp_path))
    assert Daemon._trainer_next(me) is None
    (tmp_path / "trainer").mkdir()
    nxt = {"sentence": "1 more expert label of any class ...", "waiting_for": "field_check", "expert_labels_needed": 1}
    (tmp_path / "trainer" / "status.json").write_text(json.dumps({"pid": 0, "next_publish": nxt}))
    assert Daemon._trainer_next(me) == nxt  # (a trainer not running: its last word)
    for garbage in ("[1, 2]", '{"next_publish": "soon"}', "{torn"):
        (tmp_path / "trainer" / "status.json").write_text(garbage)
        assert Daemon._trainer_next(me) is None, garbage
