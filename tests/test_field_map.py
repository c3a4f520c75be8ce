"""The Map page: the season's photos drawn where they were taken, north up at one scale both ways, coloured by what
they show (the expert's label first), a photo taken far away not shrinking the farm, every dot a link to its photo."""

from __future__ import annotations

import re
import time
from itertools import count

import pytest

from edge_agent.capture_place import metres_per_degree
from edge_agent.ledger_rows import ResultRow
from edge_agent.results import ResultsDB
from edge_agent.web.field_map import STATES, MapPoint, field_map, state_of

ORCHARD = (47.397812, 8.547231)
_n = count(1)


def _at(north: float, east: float) -> tuple[float, float]:
    dn, de = metres_per_degree(ORCHARD[0])
    return ORCHARD[0] + north / dn, ORCHARD[1] + east / de


def _point(north: float, east: float, state: str = "healthy", title: str = "", plant: str | None = None) -> MapPoint:
    return MapPoint(f"{next(_n):064x}", *_at(north, east), state, title or f"{north},{east}", plant)


def _dots(svg: str) -> dict[str, tuple[float, float]]:
    """Each dot's photo (sha256) and its centre in the drawing."""
    found = re.findall(r'<a href="/photo/([0-9a-f]{64})"><circle class="dot \w+" cx="([\d.]+)" cy="([\d.]+)"', svg)
    return {sha: (float(x), float(y)) for sha, x, y in found}


def test_a_photo_shows_the_experts_label_first_then_a_sure_answer_then_the_verdict():
    assert state_of("Apple___healthy", "confident", "Apple___Apple_scab") == "sick"  # the expert corrected the model
    assert state_of("Apple___Apple_scab", "unsure", "Apple___healthy") == "healthy"
    assert state_of("Apple___Apple_scab", "unsure") == "unsure" and state_of("Apple___Apple_scab", "unknown") == "unknown"
    assert state_of("Apple___Apple_scab", "confident") == "sick" and state_of("Apple___healthy", None) == "healthy"


def test_the_map_is_north_up_at_one_scale_both_ways_with_a_scale_bar_that_says_its_length():
    here, north, east = _point(0, 0), _point(100, 0), _point(0, 50)
    fm = field_map([here, north, east])
    dots = _dots(fm.svg)
    assert fm.drawn == 3 and fm.outside == 0
    (x0, y0), (xn, yn), (xe, ye) = dots[here.sha256], dots[north.sha256], dots[east.sha256]
    assert abs(xn - x0) < 0.2 and yn < y0  # north is up
    assert abs(ye - y0) < 0.2 and xe > x0  # east is right
    assert abs((y0 - yn) / (xe - x0) - 2.0) < 0.01  # 100 m north is twice 50 m east: one scale both ways
    bar = re.search(r'<line x1="([\d.]+)" y1="[\d.]+" x2="([\d.]+)" y2="[\d.]+"/><text [^>]*>([\d.]+) (m|km)</text>', fm.svg)
    assert bar is not None
    metres = float(bar[3]) * (1000 if bar[4] == "km" else 1)
    px_per_m = (y0 - yn) / 100
    assert abs((float(bar[2]) - float(bar[1])) / px_per_m - metres) < 0.5
    assert str(metres).rstrip("0").rstrip(".")[0] in "125"  # 1, 2 or 5 times a power of ten


def test_a_photo_taken_far_away_lies_outside_the_view_and_does_not_shrink_the_orchard():
    orchard = [_point(i % 6 * 5, i // 6 * 4) for i in range(48)]  # 6 rows of 8 trees, 25 m by 28 m
    home = _point(3000, -2000)
    fm = field_map([*orchard, home])
    assert (fm.drawn, fm.outside) == (48, 1) and home.sha256 not in _dots(fm.svg)
    assert fm.span_m < 60  # the orchard fills the view
    few = field_map([_point(0, 0), _point(3000, -2000)])  # few photos: each is drawn, however far apart
    assert few.drawn == 2 and few.outside == 0
    assert field_map([]).drawn == 0 and field_map([]).svg == ""
    one = field_map([_point(0, 0)])
    assert one.drawn == 1 and one.span_m >= 40  # one photo: a view of at least 40 m, not a division by nothing


def test_a_dots_colour_and_its_text_say_what_it_shows_and_a_plants_name_is_written_safely():
    sick = _point(0, 0, "sick", title='Apple scab <script>alert(1)</script> & "tree"', plant="<b>tree 1</b>")
    fm = field_map([sick, _point(5, 5, "unsure"), _point(10, 0, "healthy")])
    assert f'fill="{STATES["sick"][0]}"' in fm.svg and f'fill="{STATES["unsure"][0]}"' in fm.svg
    assert "<script>" not in fm.svg and "&lt;script&gt;" in fm.svg and "<b>" not in fm.svg and "&lt;b&gt;tree 1&lt;/b&gt;" in fm.svg
    assert fm.counts == {"healthy": 1, "unknown": 0, "unsure": 1, "sick": 1}
    assert fm.svg.rindex('class="dot sick"') > fm.svg.rindex('class="dot healthy"')  # a disease is drawn on top


def _rows(db: ResultsDB, photos: list[tuple[str, str, tuple[float, float] | None, str | None]]) -> list[str]:
    """(label, verdict, place, plant) of each photo, classified now; their sha256s."""
    rows = []
    for label, verdict, place, plant in photos:
        sha = f"{next(_n):064x}"
        lat, lon = place or (None, None)
        path = f"/inbox/{plant + '/' if plant else ''}{sha[:8]}.jpg"
        rows.append(
            ResultRow(sha, sha[:16], path, "inbox", label, 0.95, [[label, 0.95]], "v1", {}, time.time(), verdict, plant, "", None, lat, lon)
        )
    db.commit(rows)
    return [r.sha256 for r in rows]


def test_the_map_page_draws_the_photos_with_a_place_each_a_link_to_its_photo_filtered_as_the_photos_page(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from .web_helpers import client, make_state

    state = make_state(tmp_path)  # six photos without GPS
    c = client(state)
    empty = c.get("/map").text
    assert 'id="map-empty"' in empty and "None of the 6 photos has a position" in empty and "Save location" in empty
    assert 'href="/map"' in empty  # in the menu
    db = ResultsDB(state / "results.sqlite")
    scab, healthy, unsure, elsewhere = _rows(
        db,
        [
            ("Apple___Apple_scab", "confident", _at(0, 0), "tree 1"),
            ("Apple___healthy", "confident", _at(5, 4), "tree 2"),
            ("Apple___Black_rot", "unsure", _at(10, 8), None),
            ("Apple___healthy", "confident", _at(2, 2), None),
        ],
    )
    db.close()
    page = c.get("/map").text
    dots = _dots(page)
    assert set(dots) == {scab, healthy, unsure, elsewhere}
    assert re.search(rf'href="/photo/{scab}"><circle class="dot sick"', page)
    assert re.search(rf'href="/photo/{unsure}"><circle class="dot unsure"', page)
    assert "tree 1</text>" in page and "tree 2</text>" in page
    assert 'id="map-without">6 photos of the season have no position' in page
    assert "Apple · Apple scab 95% · plant tree 1 ·" in page  # the dot's hover text
    assert re.search(r"healthy \(2\).*a disease \(1\)", page.split('id="map-legend"')[1].split("</p>")[0])
    sick_only = c.get("/map?show=sick").text  # the legend's "a disease": only those dots, every count still said
    assert set(_dots(sick_only)) == {scab} and re.search(r"healthy \(2\).*a disease \(1\)", sick_only.split('id="map-legend"')[1])
    assert 'class="key on" data-show="sick" href="/map?"' in sick_only  # the chosen kind's link shows every kind again
    assert 'id="map-none-shown"' in c.get("/map?show=unknown").text and c.get("/map?show=blue").status_code == 400
    only = c.get("/map?label=Apple___healthy").text
    assert set(_dots(only)) == {healthy, elsewhere} and "6 photos" not in only  # the filters' photos only
    tree = c.get("/map?plant=tree%201").text
    assert set(_dots(tree)) == {scab} and 'id="plant-filter"' in tree
    db = ResultsDB(state / "results.sqlite")
    db.mark_expert(healthy, "Apple___Apple_scab", "")  # the expert says the healthy-looking one has scab
    db.close()
    assert re.search(rf'href="/photo/{healthy}"><circle class="dot sick"', c.get("/map").text)
    for bad in ("from=yesterday", "label=x&to=2026-13-01"):
        assert c.get(f"/map?{bad}").status_code == 400, bad


def test_the_map_of_a_ledger_from_before_places_says_no_photo_has_one_and_does_not_fail(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    from .web_helpers import client, make_state

    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    db._db.execute("DROP INDEX results_place")
    db._db.execute("DROP INDEX results_placed")
    db._db.execute("ALTER TABLE results DROP COLUMN lat")
    db._db.execute("ALTER TABLE results DROP COLUMN lon")
    db.close()
    r = client(state).get("/map")
    assert r.status_code == 200 and "None of the 6 photos has a position" in r.text


def test_the_heap_is_given_back_where_glibc_can_and_elsewhere_nothing_happens(monkeypatch):
    import ctypes.util
    import platform

    from edge_agent.web import _heap

    monkeypatch.setattr(_heap, "_libc", None)
    assert _heap.trim_heap() is (platform.libc_ver()[0] == "glibc")
    monkeypatch.setattr(_heap, "_libc", None)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libno-such-c-library.so.9")
    assert _heap.trim_heap() is False and _heap.trim_heap() is False  # asked once, then remembered


def test_the_farms_image_lies_under_the_dots_with_its_corners_where_its_bounds_say():
    from edge_agent.web.field_map import Backdrop

    nw, se = _point(30, -20), _point(-10, 40)  # photos taken at the image's north-west and south-east corners
    middle = _point(5, 5)
    (south, west), (north, east) = _at(-10, -20), _at(30, 40)
    drawn = field_map([nw, se, middle], backdrop=Backdrop("/map/image", south, west, north, east))
    image = re.search(
        r'<image class="map-image" id="map-image" href="/map/image" x="([-\d.]+)" y="([-\d.]+)" width="([\d.]+)" height="([\d.]+)"',
        drawn.svg,
    )
    x, y, w, h = map(float, image.groups())
    dots = _dots(drawn.svg)
    assert (x, y) == pytest.approx(dots[nw.sha256], abs=0.15) and (x + w, y + h) == pytest.approx(dots[se.sha256], abs=0.15)
    assert drawn.svg.index("<image") < drawn.svg.index("<circle")  # under the dots
    assert "<image" not in field_map([nw, se, middle]).svg


def test_the_map_page_draws_the_farms_image_when_configured_and_says_why_when_it_cannot(tmp_path):
    pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
    import cv2
    import numpy as np
    from starlette.testclient import TestClient

    from edge_agent.config import AppConfig, ConfigError, parse_config
    from edge_agent.state import StateLayout
    from edge_agent.web.app import WebContext, create_app

    from .web_helpers import LOCAL, make_state

    state = make_state(tmp_path)
    db = ResultsDB(state / "results.sqlite")
    _rows(db, [("Apple___healthy", "confident", _at(0, 0), None), ("Apple___Apple_scab", "confident", _at(10, 10), None)])
    db.close()
    (south, west), (north, east) = _at(-50, -50), _at(50, 50)

    def client(image: str) -> TestClient:
        cfg = AppConfig()
        cfg = cfg.model_copy(
            update={"web": cfg.web.model_copy(update={"map_image": image, "map_bounds": [south, west, north, east] if image else []})}
        )
        return TestClient(
            create_app(WebContext(cfg, StateLayout(state), state / "inbox", "127.0.0.1")), base_url="http://localhost", client=LOCAL
        )

    photo = tmp_path / "drone.png"
    photo.write_bytes(cv2.imencode(".png", np.full((60, 80, 3), 90, np.uint8))[1].tobytes())
    c = client(str(photo))
    page = c.get("/map").text
    assert 'id="map-image"' in page and "the farm's own image from above" in page and 'id="map-image-problem"' not in page
    r = c.get("/map/image")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png" and r.content == photo.read_bytes()
    for bad, said in ((tmp_path / "gone.jpg", "cannot be read"), (tmp_path / "notes.txt", "not a supported image")):
        if bad.suffix == ".txt":
            bad.write_text("not a photo")
        c = client(str(bad))
        page = c.get("/map").text
        assert 'id="map-image"' not in page and said in page.split('id="map-image-problem"')[1].split("</p>")[0]
        assert c.get("/map").status_code == 200 and c.get("/map/image").status_code == 404  # the dots drawn all the same
    none = client("")
    assert none.get("/map/image").status_code == 404 and "<code>[web] map_image</code> and <code>map_bounds</code>" in none.get("/map").text
    with pytest.raises(ConfigError, match="map_image needs map_bounds"):
        parse_config({"web": {"map_image": str(photo)}})
    with pytest.raises(ConfigError, match="south below north"):
        parse_config({"web": {"map_image": str(photo), "map_bounds": [north, west, south, east]}})
