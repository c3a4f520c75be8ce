"""When a photo was taken: read from its EXIF, believed only where a camera's clock can be, and a plant's visits told
apart by it (a card of a week's photos copied in at once is not one visit); phones' clocks tell when this device's is
behind."""

from __future__ import annotations

import io
import json
import random
import sqlite3
import time
from datetime import date, datetime, timedelta, timezone
from itertools import count

import pytest

from edge_agent.capture import read_capture
from edge_agent.capture_time import BELIEVED_DAYS, believed, clock_behind, exif_time, parse_exif_time
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.results import ResultsDB

Image = pytest.importorskip("PIL.Image")

_n = count(1)
DAY = 86400.0


def _exif(original: str = "", offset: str = "", digitized: str = "", changed: str = "") -> bytes:
    """A TIFF-structured EXIF block holding these times ("": absent), as a JPEG's APP1 holds it after "Exif\\0\\0"."""
    exif = Image.Exif()
    if changed:
        exif[0x0132] = changed  # DateTime: when the file was last changed, not taken
    sub = exif.get_ifd(0x8769)
    for tag, text in ((0x9003, original), (0x9011, offset), (0x9004, digitized)):
        if text:
            sub[tag] = text
    block = exif.tobytes()
    assert block[:6] == b"Exif\x00\x00"
    return block[6:]


def taken_at(data: bytes, arrived: float) -> float | None:
    return read_capture(data, arrived).taken


def photo(fmt: str = "JPEG", seed: int = 0, **times: str) -> bytes:
    """A small photo in ``fmt`` whose EXIF holds ``times`` (:func:`_exif`), none when no time is given."""
    out = io.BytesIO()
    im = Image.new("RGB", (64, 48), (20 + seed % 200, 160, 40))
    im.save(out, fmt, **({"exif": b"Exif\x00\x00" + _exif(**times)} if times else {}))
    return out.getvalue()


def exif_stamp(t: float) -> tuple[str, str]:
    """``t`` as a camera writes it in UTC+2: (DateTimeOriginal, OffsetTimeOriginal)."""
    return datetime.fromtimestamp(t, timezone(timedelta(hours=2))).strftime("%Y:%m:%d %H:%M:%S"), "+02:00"


def test_a_photos_exif_time_is_read_in_its_zone_from_jpeg_tiff_png_and_webp_and_the_time_a_file_was_changed_is_not_taken_for_it():
    now = time.time()
    t = round(now - 3 * DAY)
    original, offset = exif_stamp(t)
    for fmt in ("JPEG", "TIFF", "PNG", "WEBP"):
        assert taken_at(photo(fmt, original=original, offset=offset), now) == t, fmt
    assert exif_time(_exif(digitized="2026:05:04 10:11:12")) == ("2026:05:04 10:11:12", "")  # the scanner's time serves
    assert exif_time(_exif(changed="2026:05:04 10:11:12")) == ("", "")  # DateTime: rewritten by any editor
    assert taken_at(photo("PNG"), now) is None and taken_at(photo(), now) is None  # no EXIF: not known
    assert parse_exif_time("2026:05:04 10:11:12") == datetime(2026, 5, 4, 10, 11, 12).timestamp()  # no zone: local
    assert parse_exif_time("2026:05:04 10:11:12", "-05:30") == datetime(2026, 5, 4, 15, 41, 12, tzinfo=timezone.utc).timestamp()
    assert parse_exif_time("2026:05:04 10:11:12", "+99:00") == parse_exif_time("2026:05:04 10:11:12")  # no zone at all
    for nonsense in ("", "0000:00:00 00:00:00", "2026:02:30 10:00:00", "    :  :     :  :  ", "yesterday"):
        assert parse_exif_time(nonsense) is None, nonsense


def test_a_photo_whose_time_has_its_zone_says_how_far_it_is_from_this_devices_clock_and_one_without_does_not():
    now = round(time.time())
    original, offset = exif_stamp(now - 3600)
    zoned = read_capture(photo(original=original, offset=offset), now)
    assert zoned.taken == now - 3600 and zoned.ahead == -3600
    ahead = read_capture(photo(original=exif_stamp(now + 3 * DAY)[0], offset="+02:00"), now)
    assert ahead.taken is None and abs(ahead.ahead - 3 * DAY) < 1  # not believed, but it tells how far
    assert read_capture(photo(original="2026:05:04 10:11:12"), now).ahead is None  # no zone: the camera's local time
    assert read_capture(photo(original="2026:05:04 10:11:12", offset="+99:00"), now).ahead is None
    assert read_capture(b"not a photo", now) == (None, None, None)


def test_phones_clocks_a_day_ahead_say_this_devices_clock_is_behind_and_one_camera_set_wrong_does_not():
    assert clock_behind([]) is None and clock_behind([-60.0] * 10) is None
    assert clock_behind([5 * DAY, 5 * DAY, -60.0]) is None  # two photos: one camera set wrong, maybe
    note = clock_behind([-60.0] * 7 + [3 * DAY, 3.2 * DAY, 4 * DAY])
    assert note.startswith("3 of the last 10 photos from phones were taken, by their own clocks, about 3.2 days after")
    assert "sudo timedatectl set-time" in note


def test_a_heic_photos_exif_time_is_read_through_libheif():
    pillow_heif = pytest.importorskip("pillow_heif")
    now = time.time()
    t = round(now - DAY)
    out = io.BytesIO()
    original, offset = exif_stamp(t)
    exif = b"Exif\x00\x00" + _exif(original=original, offset=offset)
    pillow_heif.from_pillow(Image.new("RGB", (64, 48), (20, 160, 40))).save(out, exif=exif)
    assert taken_at(out.getvalue(), now) == t


def test_a_camera_clock_never_set_or_far_ahead_is_not_believed_and_one_a_few_hours_ahead_is_taken_as_arrival():
    now = time.time()
    assert believed(now - 5 * DAY, now) == now - 5 * DAY
    assert believed(now - (BELIEVED_DAYS + 1) * DAY, now) is None  # 2000-01-01: a clock never set
    assert believed(now + 2 * DAY, now) is None  # ahead by days: wrong
    assert believed(now + 3 * 3600, now) == now  # a zone or two off: not after it arrived
    never_set = photo(original="2000:01:01 00:03:12")
    assert taken_at(never_set, now) is None


def test_a_garbled_or_cut_exif_block_reads_as_no_time_and_never_raises():
    good = _exif(original="2026:05:04 10:11:12", offset="+02:00")
    assert exif_time(good) == ("2026:05:04 10:11:12", "+02:00")
    rng = random.Random(7)
    for _ in range(400):
        bad = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        cut = bytes(bad[: rng.randrange(len(bad) + 1)])
        for block in (bytes(bad), cut):
            text, zone = exif_time(block)  # no exception, whatever the bytes
            assert isinstance(text, str) and isinstance(zone, str)
    assert exif_time(b"II*\x00\xff\xff\xff\xff") == ("", "") and exif_time(b"") == ("", "")
    jpeg = photo(original="2026:05:04 10:11:12")
    assert taken_at(jpeg[: len(jpeg) // 2], time.time()) is None  # a half-copied photo: no time (it is retried later)


def test_the_pipeline_records_when_each_photo_was_taken_and_a_photo_without_exif_has_none(tmp_path, tiny_store, capsys):
    from edge_agent.config import PipelineSection
    from edge_agent.pipeline import Job
    from engines.loader import open_engine

    from .test_engines import ort_config
    from .test_pipeline import FixedEngine, make_pipeline

    inbox = tmp_path / "inbox"
    (inbox / "tree 12").mkdir(parents=True)
    t = round(time.time() - 4 * DAY)
    original, offset = exif_stamp(t)
    (inbox / "tree 12" / "a.jpg").write_bytes(photo(original=original, offset=offset))
    (inbox / "tree 12" / "b.jpg").write_bytes(photo(seed=1))
    with open_engine(tiny_store, ort_config()) as engine:
        p, db, *_ = make_pipeline(tmp_path, FixedEngine(engine), settings=PipelineSection(max_batch=2, max_wait_ms=0), inbox=inbox)
        try:
            for name in ("a.jpg", "b.jpg"):
                p.submit(Job("inbox", inbox / "tree 12" / name))
            assert p.drain(30)
        finally:
            p.stop()
    taken = {path.rsplit("/", 1)[1]: when for path, when in db._query("SELECT path, taken FROM results")}
    assert taken == {"a.jpg": t, "b.jpg": None}
    db.close()
    from edge_agent.cli import main

    assert main(["results", "--state-dir", str(tmp_path)]) == 0
    lines = {line.split("/")[-1].split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["a.jpg"].endswith(f"taken: {datetime.fromtimestamp(t, timezone.utc).isoformat(timespec='milliseconds')}")
    assert "taken:" not in lines["b.jpg"]
    db = ResultsDB(tmp_path / "results.sqlite", readonly=True)
    records = {r["path"].rsplit("/", 1)[1]: r for r in db.results()}
    assert records["a.jpg"]["taken"] == datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")
    assert records["b.jpg"]["taken"] is None
    db.close()


def test_a_devices_clock_behind_the_phones_photos_is_said_by_status_and_the_health_page(tmp_path, tiny_store, capsys):
    """A board without a clock battery, offline, starts at the time it was switched off: photos from phones (their
    clocks set by the network, their zone written) taken days after its clock says they arrived say so."""
    import os

    from edge_agent.cli import main
    from edge_agent.config import PipelineSection
    from edge_agent.pipeline import Job
    from edge_agent.state import StateLayout, write_status
    from engines.loader import open_engine

    from .test_engines import ort_config
    from .test_pipeline import FixedEngine, make_pipeline

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    later = time.time() + 4 * DAY  # the phones' "now", four days after this device's
    for i in range(4):
        original, offset = exif_stamp(later + 60 * i)
        (inbox / f"phone{i}.jpg").write_bytes(photo(seed=i, original=original, offset=offset))
    with open_engine(tiny_store, ort_config()) as engine:
        p, db, *_ = make_pipeline(tmp_path, FixedEngine(engine), settings=PipelineSection(max_batch=2, max_wait_ms=0), inbox=inbox)
        try:
            for i in range(2):
                p.submit(Job("inbox", inbox / f"phone{i}.jpg"))
            assert p.drain(30)
            assert clock_behind(list(p.camera_clocks)) is None  # two photos: not yet
            for i in range(2, 4):
                p.submit(Job("inbox", inbox / f"phone{i}.jpg"))
            assert p.drain(30)
            note = clock_behind(list(p.camera_clocks))
        finally:
            p.stop()
    assert db._query("SELECT COUNT(*), COUNT(taken) FROM results") == [(4, 0)]  # classified; their times not believed
    db.close()
    assert note.startswith("4 of the last 4 photos from phones were taken, by their own clocks, about 4.0 days after")
    state = tmp_path  # the pipeline's ledger is there
    StateLayout(state).create()
    write_status(StateLayout(state).status, {"pid": os.getpid(), "updated": time.time(), "clock_behind": note})
    assert main(["status", "--state-dir", str(state)]) == 0
    assert f"CLOCK BEHIND: {note}\n" in capsys.readouterr().out
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    import html

    from .web_helpers import client

    assert f'id="clock-behind">Clock behind: {note}' in html.unescape(client(state).get("/health").text)
    assert "\nedge_agent_clock_behind 1\n" in client(state).get("/metrics").text


def _card(db: ResultsDB, plant: str, label: str, taken: list[float], verdict: str = "confident") -> list[str]:
    """Photos of ``plant`` taken at ``taken``, classified now in that order (a card copied in at once); their sha256s."""
    rows, now = [], time.time()
    for t in taken:
        sha = f"{next(_n):064x}"
        top_k = [[label, 0.96], ["Apple___healthy" if label != "Apple___healthy" else "Apple___Apple_scab", 0.03]]
        rows.append(
            ResultRow(sha, sha[:16], f"/inbox/{plant}/{sha[:8]}.jpg", "inbox", label, 0.96, top_k, "v1", {}, now, verdict, plant, "", t)
        )
    db.commit(rows)
    return [r.sha256 for r in rows]


def test_a_card_of_a_weeks_photos_copied_in_at_once_is_one_visit_a_day_not_one_visit(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from edge_agent.plants import diagnose

    from .web_helpers import client, make_state

    state = make_state(tmp_path)
    now = time.time()
    monday, friday = now - 6 * DAY, now - 2 * DAY
    db = ResultsDB(state / "results.sqlite")
    # copied in one minute, in the card's own order (file names), not the order they were taken
    fri = _card(db, "tree 12", "Apple___Apple_scab", [friday, friday + 60])
    _card(db, "tree 12", "Apple___healthy", [monday, monday + 30, monday + 90])
    asked = state / "queue" / "review" / "asked.jpg"
    asked.write_bytes(b"a photo")
    db.commit([], [QueueEntry(fri[0], fri[0][:16], "review", "Apple___Apple_scab", 0.5, "v1", str(asked), 7)])
    rows = [r for r in db._query("SELECT photo_id FROM results WHERE plant = 'tree 12' ORDER BY id")]
    db.close()
    from edge_agent.web.queries import Reader

    plant = Reader(state / "results.sqlite").plant("tree 12")
    assert [r.when for r in plant] == sorted(r.when for r in plant) and len(rows) == 5  # oldest taken first
    d = diagnose(plant, 38, gap_s=12 * 3600)
    assert (d.label, d.verdict, d.photos, d.earlier) == ("Apple___Apple_scab", "confident", 2, 3)  # Friday's, not all five
    c = client(state)
    api = c.get("/api/v1/plants/tree%2012").json()
    assert [(v["photos"], v["label"]) for v in api["visits"]] == [(2, "Apple___Apple_scab"), (3, "Apple___healthy")]
    assert abs(datetime.fromisoformat(api["last"]).timestamp() - (friday + 60)) < 1  # last photographed, not copied in
    began = datetime.fromisoformat(api["visits"][1]["began"]).timestamp()
    assert abs(began - monday) < 1  # the visit began when its first photo was taken, not when it was copied in
    assert all(r["taken"] is not None for r in api["results"])
    day = datetime.fromtimestamp(monday).strftime("%Y-%m-%d")
    that_day = c.get(f"/photos?from={day}&to={day}").text  # the photos taken that day, though copied in today
    assert that_day.count('<li class="card"') == 3
    assert c.get(f"/api/v1/results?from={day}&to={day}").json()["total"] == 3
    assert len(c.get(f"/photos.csv?from={day}&to={day}").text.splitlines()) == 4  # the header and Monday's three
    cards = c.get("/photos?plant=tree%2012").text
    assert cards.count('class="taken"') == 5 and f"taken {datetime.fromtimestamp(monday).strftime('%Y-%m-%d %H:%M')}" in cards
    assert c.get("/photos").text.count('class="taken"') == 5  # make_state's 6 photos have no EXIF: when classified
    page = c.get(f"/photo/{api['results'][0]['sha256']}").text
    assert 'id="taken"' in page and "the camera's clock" in page
    sheet = c.get("/photos.csv?plant=tree%2012").text.splitlines()
    assert sheet[0].startswith("classified (local time),taken (local time),photo,")
    taken_cells = sorted(line.split(",")[1] for line in sheet[1:])
    assert taken_cells[0] == datetime.fromtimestamp(monday).strftime("%Y-%m-%d %H:%M:%S")
    items = {it["sha256"]: it for it in c.get("/api/v1/review").json()["items"]}
    assert abs(datetime.fromisoformat(items[fri[0]]["taken"]).timestamp() - friday) < 1  # the expert sees when it was taken
    assert [it["taken"] for sha, it in items.items() if sha != fri[0]] == [None, None]
    pages = [c.get(f"/review?i={i}").text for i in range(3)]
    asked_page = next(page for page in pages if fri[0][:16] in page)
    assert f"taken {datetime.fromtimestamp(friday).strftime('%Y-%m-%d %H:%M')}" in asked_page
    assert sum("taken " in page.split('id="arrival"')[1].split("</span>")[0] for page in pages) == 1
    no_time = c.get("/photos.csv").text.splitlines()[-1].split(",")  # make_state's photos: no EXIF, an empty cell
    assert no_time[1] == ""


def test_a_plant_alerts_once_a_visit_however_its_cards_photos_arrive_in_time(tmp_path):
    from edge_agent.alerts.config import AlertsSection, MqttSection, WebhookSection
    from edge_agent.alerts.worker import AlertWorker

    db = ResultsDB(tmp_path / "results.sqlite")
    hook = WebhookSection(url="http://127.0.0.1:9/alerts")  # never sent here (the worker's thread is not started): queued
    w = AlertWorker(AlertsSection(quiet_period_s=0), MqttSection(), [hook], db.path, tmp_path, "orchard", visit_gap_s=12 * 3600)
    now = time.time()
    friday, monday = now - 2 * DAY, now - 6 * DAY
    try:
        _card(db, "tree 12", "Apple___Apple_scab", [friday + 600, friday + 660])
        w.scan()
        _card(db, "tree 12", "Apple___Apple_scab", [monday, monday + 60])  # Monday's, copied after: a visit of its own
        w.scan()
        _card(db, "tree 12", "Apple___Apple_scab", [friday])  # Friday's first photo, copied last: the same visit
        w.scan()
        with sqlite3.connect(tmp_path / "alerts.sqlite") as con:
            alerts = con.execute("SELECT label FROM alerts ORDER BY id").fetchall()
            sent = [json.loads(p) for (p,) in con.execute("SELECT payload FROM outbox WHERE kind = 'alert' ORDER BY id")]
        assert alerts == [("Apple___Apple_scab",), ("Apple___Apple_scab",)]  # once for Friday, once for Monday
        assert len(sent) == 2
        for body, newest in zip(sent, (friday + 600, monday)):  # each: its visit's newest photo when it alerted (the first)
            assert abs(datetime.fromisoformat(body["taken"]).timestamp() - newest) < 1
            stamp = datetime.fromtimestamp(newest).strftime("%Y-%m-%d %H:%M")
            assert body["title"] == f"Apple scab seen on orchard, plant tree 12 (photographed {stamp})", body["title"]
    finally:
        w.stop()
        db.close()


def test_a_results_live_message_says_when_its_photo_was_taken():
    from edge_agent.alerts.messages import result_body
    from edge_agent.alerts.rules import Candidate

    now = time.time()
    c = Candidate(1, now, "orchard", "Apple___Apple_scab", 0.95, "confident", "p1", "0" * 64, taken=now - 3 * DAY)
    body = result_body(c)
    assert abs(datetime.fromisoformat(body["taken"]).timestamp() - (now - 3 * DAY)) < 1
    assert result_body(Candidate(1, now, "orchard", "Apple___Apple_scab", 0.95, "confident", "p1", "0" * 64))["taken"] is None


def test_a_ledger_from_before_capture_times_is_read_as_taken_when_classified_and_upgraded_when_the_daemon_opens_it(tmp_path):
    from edge_agent.web.queries import Filters, Reader

    path = tmp_path / "results.sqlite"
    db = ResultsDB(path)
    _card(db, "tree 1", "Apple___Apple_scab", [time.time() - DAY])
    db._db.execute("DROP INDEX results_when")  # as a daemon before this change left it
    db._db.execute("DROP INDEX results_sure")
    db._db.execute("ALTER TABLE results DROP COLUMN taken")
    db.close()
    old = Reader(path).plant("tree 1")  # the page, before the daemon is restarted
    assert len(old) == 1 and old[0].taken is None and old[0].when == old[0].created
    assert ResultsDB(path, readonly=True).plant_photos("tree 1")[0][1] == old[0].created
    assert Reader(path).recent(Filters(day_from=date.today() - timedelta(days=2)), 0, 10)[1] == 1  # days: when classified
    db = ResultsDB(path)  # the daemon upgraded: the column is back, the old photo has no time
    try:
        assert db._query("SELECT taken FROM results") == [(None,)]
    finally:
        db.close()
