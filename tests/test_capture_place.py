"""Where a photo was taken: read from its EXIF's GPS directory, kept only where it is a place on Earth, stored with its
result, shown on its page with the photos taken near it, and carried by the CSV, the API, the CLI and the alerts."""

from __future__ import annotations

import io
import json
import random
import sqlite3
import struct
import time
from itertools import count

import pytest

from edge_agent.capture import read_capture
from edge_agent.capture_place import NEAR_M, Place, exif_place, geo_uri, metres_per_degree, parse_place
from edge_agent.imageheader import ifd_entries
from edge_agent.ledger_rows import ResultRow
from edge_agent.results import ResultsDB

Image = pytest.importorskip("PIL.Image")
TiffImagePlugin = pytest.importorskip("PIL.TiffImagePlugin")

_n = count(1)
ORCHARD = (47.397812, 8.547231)  # an orchard's tree, in degrees north and east


def _dms(deg: float) -> tuple:
    """Degrees as a phone writes them: whole degrees, whole minutes, seconds to a hundredth, each a fraction."""
    r = TiffImagePlugin.IFDRational
    d = int(deg)
    m = int((deg - d) * 60)
    s = round(((deg - d) * 60 - m) * 60 * 100)
    return (r(d, 1), r(m, 1), r(s, 100))


def _gps(lat: float | None, lon: float | None, lat_ref: str = "", lon_ref: str = "", status: str = "", raw: dict | None = None) -> bytes:
    """An EXIF block (as a JPEG's APP1 holds it, with "Exif\\0\\0") whose GPS directory says ``lat``, ``lon``."""
    exif = Image.Exif()
    gps = exif.get_ifd(0x8825)
    if lat is not None:
        gps[1], gps[2] = lat_ref or ("N" if lat >= 0 else "S"), _dms(abs(lat))
    if lon is not None:
        gps[3], gps[4] = lon_ref or ("E" if lon >= 0 else "W"), _dms(abs(lon))
    if status:
        gps[9] = status
    gps.update(raw or {})
    return exif.tobytes()


def photo(fmt: str = "JPEG", seed: int = 0, **gps) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (20 + seed % 200, 160, 40)).save(out, fmt, **({"exif": _gps(**gps)} if gps else {}))
    return out.getvalue()


def place_of(data: bytes) -> Place | None:
    return read_capture(data, time.time()).place


def test_a_phones_gps_position_is_read_in_every_hemisphere_from_jpeg_tiff_png_and_webp():
    for lat, lon in (ORCHARD, (-33.868820, 151.209290), (-12.046374, -77.042793), (40.712776, -74.005974)):
        for fmt in ("JPEG", "TIFF", "PNG", "WEBP"):  # PNG's eXIf chunk and WebP's EXIF chunk as a JPEG's APP1
            got = place_of(photo(fmt, lat=lat, lon=lon))
            assert got is not None and abs(got.lat - lat) < 1e-5 and abs(got.lon - lon) < 1e-5, (fmt, lat, lon, got)
    assert place_of(photo()) is None  # no EXIF at all
    assert place_of(b"not a photo") is None


def test_a_heic_photos_position_is_read_through_libheif():
    pillow_heif = pytest.importorskip("pillow_heif")
    out = io.BytesIO()
    pillow_heif.from_pillow(Image.new("RGB", (64, 48), (30, 150, 40))).save(out, exif=_gps(*ORCHARD))
    got = place_of(out.getvalue())
    assert got is not None and abs(got.lat - ORCHARD[0]) < 1e-5 and abs(got.lon - ORCHARD[1]) < 1e-5


def test_no_fix_a_void_fix_half_a_position_one_off_the_earth_or_one_the_phone_says_is_far_off_is_no_place():
    r = TiffImagePlugin.IFDRational
    assert place_of(photo(lat=0.0, lon=0.0)) is None  # a phone without a fix writes 0, 0
    assert place_of(photo(lat=ORCHARD[0], lon=ORCHARD[1], status="V")) is None  # the receiver said void
    assert place_of(photo(lat=ORCHARD[0], lon=ORCHARD[1], status="A")) is not None  # active: kept
    assert place_of(photo(lat=ORCHARD[0], lon=None)) is None  # half a position
    assert place_of(photo(lat=ORCHARD[0], lon=ORCHARD[1], lat_ref="X")) is None  # no hemisphere
    assert place_of(photo(lat=None, lon=None, raw={1: "N", 2: (r(91, 1), r(0, 1), r(0, 1)), 3: "E", 4: _dms(8.5)})) is None
    assert place_of(photo(lat=None, lon=None, raw={1: "N", 2: (r(47, 1), r(61, 1), r(0, 1)), 3: "E", 4: _dms(8.5)})) is None
    assert place_of(photo(lat=None, lon=None, raw={1: "N", 2: (r(47, 1), r(3, 1), r(0, 1)), 3: "E", 4: (r(181, 1),)})) is None
    rounded = place_of(photo(lat=None, lon=None, raw={1: "N", 2: (r(47, 1), r(11, 1), r(6000, 100)), 3: "E", 4: _dms(8.5)}))
    assert rounded is not None and rounded.lat == pytest.approx(47 + 12 / 60)  # 59.996 s rounded to 60.00 s: kept
    tiny = place_of(photo(lat=None, lon=None, raw={1: "N", 2: (r(47, 1), r(30, 1), r(0, 1)), 3: "E", 4: (r(8, 1),)}))
    assert tiny == Place(47.5, 8.0)  # degrees and minutes only, as some cameras write it
    here = {"lat": ORCHARD[0], "lon": ORCHARD[1]}
    as_is = place_of(photo(**here))
    assert place_of(photo(**here, raw={0x1F: r(48, 10)})) == as_is  # the phone says within 4.8 m: kept
    assert place_of(photo(**here, raw={0x1F: r(50, 1)})) == as_is  # 50 m: kept
    assert place_of(photo(**here, raw={0x1F: r(250, 1)})) is None  # 250 m off (indoors): among the wrong trees, no place
    assert place_of(photo(**here, raw={0x1F: r(5, 0)})) == as_is  # an error it cannot say: the fix as it is


def test_a_zero_denominator_or_a_garbled_or_cut_gps_block_reads_as_no_place_and_never_raises():
    good = _gps(*ORCHARD)[6:]
    assert exif_place(good) is not None
    zero = bytearray(good)
    gps = next(struct.unpack(e + "I", v)[0] for e, tag, _t, _c, v in ifd_entries(good) if tag == 0x8825)
    values = next(struct.unpack(e + "I", v)[0] for e, tag, _t, _c, v in ifd_entries(good, gps) if tag == 2)
    zero[values + 20 : values + 24] = bytes(4)  # the latitude's seconds over 0
    assert exif_place(bytes(zero)) is None
    rng = random.Random(11)
    for _ in range(400):
        bad = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        for block in (bytes(bad), bytes(bad[: rng.randrange(len(bad) + 1)])):
            got = exif_place(block)  # no exception, whatever the bytes
            assert got is None or (-90 <= got.lat <= 90 and -180 <= got.lon <= 180 and (got.lat, got.lon) != (0, 0))
    jpeg = photo(lat=ORCHARD[0], lon=ORCHARD[1])
    assert place_of(jpeg[: len(jpeg) // 2]) is None  # a half-copied photo: no place (it is retried later)


def test_a_place_typed_in_a_query_is_read_or_refused_saying_why():
    assert parse_place("47.3978, 8.5472") == Place(47.3978, 8.5472)
    assert parse_place("-33.8688,151.2093") == Place(-33.8688, 151.2093)
    for bad in ("", "47.3", "a,b", "1,2,3", "91,0", "0,181", "nan,1", "inf,0", "1e999,0", "4" * 50 + ",1"):
        with pytest.raises(ValueError, match="place|Earth"):
            parse_place(bad)
    assert geo_uri(*ORCHARD) == "geo:47.397812,8.547231"
    north, east = metres_per_degree(ORCHARD[0])
    assert 111_000 < north < 111_200 and 75_000 < east < 75_400  # a degree east is shorter away from the equator


def _rows(db: ResultsDB, places: list[tuple[float, float] | None], label: str = "Apple___Apple_scab") -> list[str]:
    rows, now = [], time.time()
    for place in places:
        sha = f"{next(_n):064x}"
        top_k = [[label, 0.96], ["Apple___healthy", 0.03]]
        lat, lon = place or (None, None)
        rows.append(
            ResultRow(
                sha, sha[:16], f"/inbox/{sha[:8]}.jpg", "inbox", label, 0.96, top_k, "v1", {}, now, "confident", None, "", None, lat, lon
            )
        )
    db.commit(rows)
    return [r.sha256 for r in rows]


def _metres(north: float, east: float) -> tuple[float, float]:
    """The orchard's tree moved ``north`` and ``east`` metres."""
    dn, de = metres_per_degree(ORCHARD[0])
    return round(ORCHARD[0] + north / dn, 6), round(ORCHARD[1] + east / de, 6)


def test_the_photos_page_finds_the_photos_taken_near_a_photo_and_the_api_and_csv_carry_where(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from .web_helpers import client, make_state

    state = make_state(tmp_path)  # six photos without GPS
    db = ResultsDB(state / "results.sqlite")
    here, near, across, far = _rows(db, [ORCHARD, _metres(8, -6), _metres(0, 14.5), _metres(12, 12)])
    diagonal = _rows(db, [_metres(14, 14)])[0]  # inside the box of 15 m, but 19.8 m away: not near
    alone = _rows(db, [_metres(1000, 0)])[0]
    db.close()
    c = client(state)
    page = c.get(f"/photo/{here}").text
    assert 'id="place"' in page and 'href="geo:47.397812,8.547231"' in page
    link = page.split('id="near-link" href="')[1].split('"')[0]
    assert link == "/photos?near=47.397812,8.547231"
    assert f"2 other photos taken within {NEAR_M} m" in page
    spot = page.split('id="spot">')[1].split("</dd>")[0]  # the three photos here, their answers together
    assert "Apple · Apple scab" in spot and "the 3 photos taken within 15 m and 12 hours of it, together" in spot
    assert 'id="spot"' not in c.get(f"/photo/{alone}").text  # alone: nothing to combine
    assert f'id="near-none">no other photo taken within {NEAR_M} m' in c.get(f"/photo/{alone}").text
    every = c.get("/api/v1/results?size=100").json()["results"]
    without = [r for r in every if r["latitude"] is None]
    assert len(every) == 12 and len(without) == 6 and all(r["longitude"] is None for r in without)
    assert 'id="place"' not in c.get(f"/photo/{without[0]['sha256']}").text  # no GPS: no Where
    got = c.get(link).text
    cards = {part.split('"')[0] for part in got.split('data-sha="')[1:]}
    assert cards == {here, near, across}  # 10 m and 14.5 m away are near; 17 m and 19.8 m are not
    assert 'id="near-filter"' in got and "within 15 m of" in got
    wider = c.get("/photos?near=47.397812,8.547231&within=25").text
    assert {part.split('"')[0] for part in wider.split('data-sha="')[1:]} == {here, near, across, far, diagonal}
    api = c.get("/api/v1/results?near=47.397812,8.547231").json()
    assert api["total"] == 3 and {r["sha256"] for r in api["results"]} == {here, near, across}
    first = next(r for r in api["results"] if r["sha256"] == here)
    assert (first["latitude"], first["longitude"]) == ORCHARD
    for bad in ("near=91,0", "near=abc", "near=1,2&within=0", "near=1,2&within=99999", "near=nan,1"):
        r = c.get(f"/api/v1/results?{bad}")
        assert r.status_code == 400, bad
        assert r.json()["error"].startswith(("near: ", "within: ", "not a number")), (bad, r.json())
        assert c.get(f"/photos?{bad}").status_code == 400, bad
    sheet = c.get("/photos.csv?near=47.397812,8.547231").text.splitlines()
    assert sheet[0].endswith(",latitude,longitude") and len(sheet) == 4
    assert any(line.endswith(",47.397812,8.547231") for line in sheet[1:])
    csv_link = got.split('id="csv" href="')[1].split('"')[0]
    assert csv_link == "/photos.csv?near=47.397812%2C8.547231"
    assert c.get("/photos.csv").text.splitlines()[-1].endswith(",,")  # a photo without GPS: two empty cells
    upload = c.get("/upload").text  # the Upload page says why a phone's uploads have no position
    assert 'id="upload-gps"' in upload and "copy the photos" in upload
    anywhere = got.split('id="near-filter"')[1].split("anywhere")[0].rsplit('href="', 1)[1].split('"')[0]
    assert anywhere == "/photos?"


def test_the_pipeline_records_where_each_photo_was_taken_and_the_cli_and_json_say_it(tmp_path, tiny_store, capsys):
    from edge_agent.config import PipelineSection
    from edge_agent.pipeline import Job
    from engines.loader import open_engine

    from .test_engines import ort_config
    from .test_pipeline import FixedEngine, make_pipeline

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jpg").write_bytes(photo(lat=ORCHARD[0], lon=ORCHARD[1]))
    (inbox / "b.jpg").write_bytes(photo(seed=1))
    with open_engine(tiny_store, ort_config()) as engine:
        p, db, *_ = make_pipeline(tmp_path, FixedEngine(engine), settings=PipelineSection(max_batch=2, max_wait_ms=0), inbox=inbox)
        try:
            for name in ("a.jpg", "b.jpg"):
                p.submit(Job("inbox", inbox / name))
            assert p.drain(30)
        finally:
            p.stop()
    places = {path.rsplit("/", 1)[1]: (lat, lon) for path, lat, lon in db._query("SELECT path, lat, lon FROM results")}
    assert places["b.jpg"] == (None, None)
    assert abs(places["a.jpg"][0] - ORCHARD[0]) < 2e-6 and abs(places["a.jpg"][1] - ORCHARD[1]) < 2e-6  # 0.01" as written
    records = {r["path"].rsplit("/", 1)[1]: r for r in db.results()}
    assert (records["a.jpg"]["latitude"], records["a.jpg"]["longitude"]) == places["a.jpg"] and records["b.jpg"]["latitude"] is None
    db.close()
    from edge_agent.cli import main

    assert main(["results", "--state-dir", str(tmp_path)]) == 0
    lines = {line.split("/")[-1].split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert f"  at: {places['a.jpg'][0]},{places['a.jpg'][1]}" in lines["a.jpg"] and "at:" not in lines["b.jpg"]
    assert main(["results", "--state-dir", str(tmp_path), "--near", "47.3979, 8.5472", "--json"]) == 0  # 12 m away
    assert [json.loads(ln)["path"].rsplit("/", 1)[1] for ln in capsys.readouterr().out.splitlines()] == ["a.jpg"]
    assert main(["results", "--state-dir", str(tmp_path), "--near", "47.3979,8.5472", "--within", "5", "--csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1  # the header alone: none within 5 m
    for bad, said in ((["--near", "91,0"], "--near: no place on Earth"), (["--near", "1,2", "--within", "0"], "--within 0")):
        with pytest.raises(SystemExit, match=said):
            main(["results", "--state-dir", str(tmp_path), *bad])


def test_an_alert_and_the_state_say_where_the_photo_was_taken_for_home_assistants_map(tmp_path):
    from edge_agent.alerts.config import AlertsSection, MqttSection, WebhookSection
    from edge_agent.alerts.messages import result_body
    from edge_agent.alerts.rules import Candidate
    from edge_agent.alerts.worker import AlertWorker

    db = ResultsDB(tmp_path / "results.sqlite")
    hook = WebhookSection(url="http://127.0.0.1:9/alerts")  # never sent here (the worker's thread is not started): queued
    w = AlertWorker(AlertsSection(quiet_period_s=0), MqttSection(), [hook], db.path, tmp_path, "orchard")
    try:
        _rows(db, [ORCHARD])
        w.scan()
        assert (w._state["latitude"], w._state["longitude"]) == ORCHARD
        _rows(db, [None], label="Apple___Black_rot")
        w.scan()
        assert (w._state["latitude"], w._state["longitude"]) == (None, None)  # the newest photo's, not an older one's
        with sqlite3.connect(tmp_path / "alerts.sqlite") as con:
            sent = [json.loads(p) for (p,) in con.execute("SELECT payload FROM outbox WHERE kind = 'alert' ORDER BY id")]
        assert [(b["latitude"], b["longitude"]) for b in sent] == [ORCHARD, (None, None)]
    finally:
        w.stop()
        db.close()
    c = Candidate(1, time.time(), "orchard", "Apple___Apple_scab", 0.95, "confident", "p1", "0" * 64, place=ORCHARD)
    assert (result_body(c)["latitude"], result_body(c)["longitude"]) == ORCHARD


def test_a_ledger_from_before_places_reads_as_none_near_anywhere_and_is_upgraded_when_the_daemon_opens_it(tmp_path):
    from edge_agent.web.queries import Filters, Reader

    path = tmp_path / "results.sqlite"
    db = ResultsDB(path)
    _rows(db, [None])
    db._db.execute("DROP INDEX results_place")  # as a daemon before this change left it
    db._db.execute("DROP INDEX results_placed")
    db._db.execute("ALTER TABLE results DROP COLUMN lat")
    db._db.execute("ALTER TABLE results DROP COLUMN lon")
    db.close()
    reader = Reader(path)  # the page, before the daemon is restarted
    assert reader.recent(Filters(), 0, 10)[0][0].place is None
    assert reader.recent(Filters(near=Place(*ORCHARD)), 0, 10) == ([], 0)  # no error: no photo has a place yet
    assert [r["latitude"] for r in ResultsDB(path, readonly=True).results()] == [None]
    db = ResultsDB(path)  # the daemon upgraded: the columns are back, the old photo has no place
    try:
        assert db._query("SELECT lat, lon FROM results") == [(None, None)]
    finally:
        db.close()


def _plant_rows(db: ResultsDB, plant: str, places: list[tuple[float, float] | None], taken: float) -> None:
    rows = []
    for i, place in enumerate(places):
        sha = f"{next(_n):064x}"
        lat, lon = place or (None, None)
        top_k = [["Apple___Apple_scab", 0.96], ["Apple___healthy", 0.03]]
        rows.append(
            ResultRow(
                sha, sha[:16], f"/inbox/{plant}/{sha[:8]}.jpg", "inbox", "Apple___Apple_scab", 0.96, top_k, "v1", {},
                time.time(), "confident", plant, "", taken + 60 * i, lat, lon,
            )
        )  # fmt: skip
    db.commit(rows)


def test_a_plant_is_where_its_visits_photos_were_taken_one_bad_fix_does_not_move_it_and_a_folder_of_many_is_nowhere(tmp_path, capsys):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    import csv

    from .web_helpers import client, make_state

    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    now = time.time()
    _plant_rows(db, "tree 12", [_metres(50, 50), _metres(51, 50)], now - 9 * 86400)  # an earlier visit, elsewhere
    _plant_rows(db, "tree 12", [ORCHARD, _metres(2, 1), None, _metres(-1, -2), _metres(900, 0)], now - 86400)  # one bad fix
    _plant_rows(db, "tree 13", [None, None], now - 86400)  # a camera without GPS
    _plant_rows(db, "camera roll", [_metres(k * 40, 0) for k in range(14)], now - 86400)  # no plant: nowhere
    db.close()
    c = client(state)
    api = c.get("/api/v1/plants/tree%2012").json()
    lat, lon = api["latitude"], api["longitude"]
    assert abs(lat - ORCHARD[0]) * 111_132 < 2 and abs(lon - ORCHARD[1]) * 75_200 < 2  # the median: within 2 m of the tree
    earlier = api["visits"][1]
    assert abs(earlier["latitude"] - _metres(50.5, 50)[0]) < 1e-5  # each visit where its own photos were taken
    assert c.get("/api/v1/plants/tree%2013").json()["latitude"] is None
    assert c.get("/api/v1/plants/camera%20roll").json()["latitude"] is None
    page = c.get("/plants/tree%2012").text
    assert f'class="plant-place" href="geo:{lat:.6f},{lon:.6f}"' in page
    assert 'class="plant-place"' not in c.get("/plants/tree%2013").text
    table = list(csv.DictReader(c.get("/plants.csv").text.splitlines()))
    rows = {(r["plant"], r["photos"]): r for r in table}
    assert float(rows[("tree 12", "5")]["latitude"]) == lat and float(rows[("tree 12", "2")]["longitude"]) > lon
    assert rows[("tree 13", "2")]["latitude"] == "" and rows[("camera roll", "14")]["latitude"] == ""
    from edge_agent.cli import main

    assert main(["plants", "list", "--state-dir", str(state), "--json"]) == 0
    listed = {p["plant"]: p for p in map(json.loads, capsys.readouterr().out.splitlines())}
    assert (listed["tree 12"]["latitude"], listed["tree 12"]["longitude"]) == (lat, lon) and listed["tree 13"]["latitude"] is None
    assert main(["plants", "list", "--state-dir", str(state), "--name", "tree 12"]) == 0
    assert f"  at {lat},{lon}  " in capsys.readouterr().out


def test_the_review_page_says_what_the_expert_called_the_photos_taken_beside_a_question_the_same_visit(tmp_path, capsys):
    """A farmer who photographs the orchard without a folder a tree: the expert's labels of the photos taken within
    15 m the same visit are the question's hint, as a plant's other photos are; not those of last month, nor 40 m off."""
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from edge_agent.ledger_rows import QueueEntry

    from .web_helpers import client, make_state

    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    now, scab, rot = time.time(), "Apple___Apple_scab", "Apple___Black_rot"

    def photo_at(place, label, verdict, taken, said=None):
        sha = f"{next(_n):064x}"
        top_k = [[label, 0.55], [scab if label != scab else rot, 0.40]]
        lat, lon = place or (None, None)
        db.commit(
            [
                ResultRow(
                    sha, sha[:16], f"/inbox/{sha[:8]}.jpg", "inbox", label, 0.55, top_k, "v1", {}, now, verdict, None, "", taken, lat, lon
                )
            ]
        )
        if said:
            db.mark_expert(sha, said, "")
        return sha

    asked = photo_at(ORCHARD, rot, "unsure", now - 3600)  # the model hesitates between black rot and scab
    photo_at(_metres(4, 3), scab, "unsure", now - 3000, said=scab)
    photo_at(_metres(-6, 2), rot, "unsure", now - 2000, said=scab)
    photo_at(_metres(40, 0), rot, "unsure", now - 2500, said=rot)  # another tree
    photo_at(ORCHARD, scab, "confident", now - 30 * 86400, said="Apple___healthy")  # the same tree last month
    alone = photo_at(None, rot, "unsure", now - 3600)  # no position: no hint
    file = state / "queue" / "review" / "asked.jpg"
    file.write_bytes(b"a photo")
    db.commit([], [QueueEntry(sha, sha[:16], "review", rot, 0.55, "v1", str(file), 7) for sha in (asked, alone)])
    db.close()
    c = client(state)
    items = {it["sha256"]: it for it in c.get("/api/v1/review").json()["items"]}
    assert items[asked]["near_labels"] == {scab: 2} and items[asked]["plant_labels"] == {}
    assert items[alone]["near_labels"] == {} and items[alone]["plant_labels"] == {}
    pages = [c.get(f"/review?i={i}").text for i in range(len(items))]
    page = next(p for p in pages if f'name="photo" value="{asked}"' in p)
    assert "the expert's label of 2 other photos taken within 15 m of it" in page
    assert "the expert's label of" not in next(p for p in pages if f'name="photo" value="{alone}"' in p)
    from edge_agent.cli import main

    assert main(["review", "list", "--state-dir", str(state), "--all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and sum("taken within 15 m of it" in ln for ln in out) == 1  # make_state queued two more
    line = next(ln for ln in out if "taken within 15 m of it" in ln)
    assert f"(the expert said {scab} of 2 other photos taken within 15 m of it)" in line
    assert main(["review", "list", "--state-dir", str(state), "--all", "--json"]) == 0
    listed = {j["sha256"]: j for j in map(json.loads, capsys.readouterr().out.splitlines())}
    assert listed[asked]["near_labels"] == {scab: 2} and listed[alone]["near_labels"] == {}


def test_a_fixed_cameras_place_is_its_frames_and_a_place_off_the_earth_is_refused_naming_the_key_and_file(tmp_path, tiny_store):
    from edge_agent.config import ConfigError, PipelineSection, load_config
    from edge_agent.pipeline import Job
    from engines.loader import open_engine

    from .test_engines import ort_config
    from .test_pipeline import FixedEngine, make_pipeline

    bad = tmp_path / "edge-agent.toml"
    bad.write_text('[camera]\nplace = "91.5, 8.2"\n')
    with pytest.raises(ConfigError, match=r"camera\.place.*no place on Earth: latitude 91\.5") as exc:
        load_config(bad)
    assert str(bad) in str(exc.value)
    bad.write_text('[camera]\nplace = "greenhouse 2"\n')
    with pytest.raises(ConfigError, match=r"camera\.place.*latitude,longitude"):
        load_config(bad)
    bad.write_text('[camera]\nplace = " -33.8688, 151.2093 "\n')
    assert load_config(bad).camera.place == "-33.8688, 151.2093"
    with open_engine(tiny_store, ort_config()) as engine:
        p, db, *_ = make_pipeline(tmp_path, FixedEngine(engine), settings=PipelineSection(max_batch=2, max_wait_ms=0))
        try:
            p.submit(Job("camera:0", data=photo(seed=3), place=(-33.8688, 151.2093)))  # a frame: no EXIF, the camera's place
            p.submit(Job("camera:0", data=photo(seed=4, lat=ORCHARD[0], lon=ORCHARD[1]), place=(-33.8688, 151.2093)))  # its own wins
            p.submit(Job("camera:1", data=photo(seed=5)))  # a camera whose place is not configured
            assert p.drain(30)
        finally:
            p.stop()
    places = sorted(db._query("SELECT source, lat, lon FROM results"), key=lambda r: (r[0], r[1] or 0))
    db.close()
    assert places[0] == ("camera:0", -33.8688, 151.2093) and places[1][0] == "camera:0" and abs(places[1][1] - ORCHARD[0]) < 2e-6
    assert places[2] == ("camera:1", None, None)


def test_a_farm_across_the_180th_meridian_is_one_farm_near_on_the_map_and_in_the_middle(tmp_path):
    """Taveuni (Fiji) lies across the 180th meridian: two trees 11 m apart, one at 179.99995 E and one at 179.99995 W."""
    from edge_agent.capture_place import middle
    from edge_agent.web.field_map import MapPoint, field_map
    from edge_agent.web.queries import Filters, Reader

    east_tree, west_tree, far = (-16.8, 179.99995), (-16.8, -179.99995), (-16.8, -179.999)  # far: 106 m west of the line
    assert abs(middle([east_tree, west_tree]).lon) > 179.9999  # not 0, half the world away
    db = ResultsDB(tmp_path / "results.sqlite")
    shas = {}
    for name, (lat, lon) in (("east", east_tree), ("west", west_tree), ("far", far)):
        sha = f"{next(_n):064x}"
        shas[name] = sha
        db.commit(
            [
                ResultRow(
                    sha, sha[:16], None, "inbox", "Apple___healthy", 0.9, [], "v1", {}, time.time(), "confident", None, "", None, lat, lon
                )
            ]
        )
    db.close()
    reader = Reader(tmp_path / "results.sqlite")
    for here in (east_tree, west_tree):
        rows, total = reader.recent(Filters(near=Place(*here)), 0, 10)
        assert {r.sha256 for r in rows} == {shas["east"], shas["west"]} and total == 2, here
    assert reader.count(Filters(near=Place(*west_tree), within_m=200)) == 3
    drawing = field_map([MapPoint(f"{i:064x}", lat, lon, "healthy", "") for i, (lat, lon) in enumerate((east_tree, west_tree, far))])
    assert drawing.drawn == 3 and drawing.span_m < 200  # not 40,000 km wide


def test_a_photos_spot_combines_the_photos_taken_beside_it_that_visit_not_last_months_nor_a_plants(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from .web_helpers import client, make_state

    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    now = time.time()

    def at(place, label, p, taken, plant=None):
        sha = f"{next(_n):064x}"
        top_k = [[label, p], ["Apple___healthy" if label != "Apple___healthy" else "Apple___Apple_scab", 1 - p]]
        verdict = "confident" if p >= 0.9 else "unsure"
        db.commit(
            [ResultRow(sha, sha[:16], f"/inbox/{sha[:8]}.jpg", "inbox", label, p, top_k, "v1", {}, now, verdict, plant, "", taken, *place)]
        )
        return sha

    first = at(ORCHARD, "Apple___Apple_scab", 0.8, now - 3600)  # unsure alone
    at(_metres(3, 0), "Apple___Apple_scab", 0.85, now - 3000)  # unsure alone, sure together
    at(ORCHARD, "Apple___healthy", 0.99, now - 30 * 86400)  # the same tree last month: not this visit
    tree = at(_metres(1, 1), "Apple___healthy", 0.99, now - 3500, plant="tree 9")  # a plant's photo: its plant speaks
    db.close()
    c = client(state)
    spot = c.get(f"/photo/{first}").text.split('id="spot">')[1].split("</dd>")[0]
    assert "the 3 photos taken within 15 m and 12 hours of it" in spot  # the two, and the plant's photo beside them
    assert 'id="spot"' not in c.get(f"/photo/{tree}").text  # a plant's photo: its plant speaks, no spot


def test_the_photos_of_a_spot_ticked_on_a_photos_page_are_labelled_at_once_and_only_they(tmp_path):
    """The same tree photographed leaf by leaf without a folder a tree: its photos labelled together, as a plant's are."""
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    import hashlib

    from edge_agent.web.queries import Reader

    from .web_helpers import client, csrf_of, make_state

    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    now = time.time()
    day = state / "processed" / time.strftime("%Y-%m-%d", time.localtime(now))
    day.mkdir(parents=True, exist_ok=True)

    def at(place, seed):
        data = photo(seed=seed)  # a file the state directory keeps, as the daemon leaves it
        sha = hashlib.sha256(data).hexdigest()
        name = f"leaf-{seed}.jpg"
        (day / name).write_bytes(data)
        top_k = [["Apple___Apple_scab", 0.8], ["Apple___healthy", 0.2]]
        row = ResultRow(sha, sha[:16], str(state / "inbox" / name), "folder", "Apple___Apple_scab", 0.8, top_k, "v1", {}, now, "unsure")
        row.lat, row.lon = place
        db.commit([row])
        return sha

    a, b, c_ = at(ORCHARD, 10), at(_metres(2, 0), 60), at(_metres(0, 4), 110)  # colours far apart: different files
    far = at(_metres(500, 0), 160)  # another row of the orchard: no spot with these
    db.close()
    web = client(state)
    page = web.get(f"/photo/{a}").text
    form = page.split('id="spot-label"')[1].split("</form>")[0]
    assert form.count('name="photo"') == 3 and form.count(" checked>") == 3  # none labelled yet: every one ticked
    token = csrf_of(web)

    def post(sha, photos, label="Apple___Black_rot"):
        return web.post(f"/photo/{sha}/label-spot", data={"csrf": token, "label": label, "photo": photos})

    def said():
        return Reader(state / "results.sqlite").expert_labels([a, b, c_, far])

    assert post(a, [a, far]).status_code == 400 and said() == {}  # a photo of another spot: nothing labelled
    assert post(a, []).status_code == 400 and said() == {}
    assert post(a, [a, b], "Apple___Black_rott").status_code == 400 and said() == {}  # a class typed wrong
    assert post(far, [far]).status_code == 404  # alone: no spot
    r = post(a, [a, b])  # the neighbour's leaf (c_) unticked
    assert r.status_code == 303 and r.headers["location"].endswith("spot_labelled=2&spot_missed=0")
    assert said() == {a: "Apple___Black_rot", b: "Apple___Black_rot"}
    page = web.get(r.headers["location"]).text
    assert "Labelled 2 photos" in page.split('id="spot-labelled"')[1].split("</p>")[0]
    form = page.split('id="spot-label"')[1].split("</form>")[0]
    assert form.count(" checked>") == 1 and form.count("expert: Apple · Black rot") == 2  # only c_ is left ticked
    api = web.post(f"/api/v1/results/{a}/spot/label", json={"label": "Apple___healthy", "photos": [c_]}, headers={"X-CSRF-Token": token})
    assert api.status_code == 200 and [x["sha256"] for x in api.json()["labelled"]] == [c_]  # a program, the same way
    assert said()[c_] == "Apple___healthy"
    stray = web.post(f"/api/v1/results/{a}/spot/label", json={"label": "Apple___healthy", "photos": [far]}, headers={"X-CSRF-Token": token})
    assert stray.status_code == 400 and "not a photo of this spot" in stray.json()["error"]
