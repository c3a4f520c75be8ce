"""The page answers only to its own names and takes writes only from its own pages (DNS rebinding), and its redirects stay on it."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
from starlette.testclient import TestClient  # noqa: E402

from edge_agent.config import AppConfig  # noqa: E402
from edge_agent.state import StateLayout, resolve_store  # noqa: E402
from edge_agent.web.app import WebContext, create_app  # noqa: E402
from edge_agent.web.auth import Tokens  # noqa: E402
from edge_agent.web.hosts import host_name, page_names  # noqa: E402

from .daemon_helpers import SHIPPED, SHIPPED_NEXT  # noqa: E402
from .web_helpers import LOCAL, REMOTE, _second_version, make_state  # noqa: E402


@pytest.fixture
def state(tmp_path):
    return make_state(tmp_path)


def _client(state, base_url: str, who=LOCAL, hosts: list[str] | None = None, bind: str = "127.0.0.1") -> TestClient:
    cfg = AppConfig()
    if hosts:
        cfg = cfg.model_copy(update={"web": cfg.web.model_copy(update={"hosts": hosts})})
    app = create_app(WebContext(cfg, StateLayout(state), state / "inbox", bind))
    return TestClient(app, base_url=base_url, client=who, follow_redirects=False)


def _csrf(c: TestClient) -> str:
    import re

    return re.search(r'name="csrf" value="([^"]+)"', c.get("/engines").text).group(1)


def test_a_rebound_name_gets_403_on_the_page_and_in_json_on_the_api(state):
    evil = _client(state, "http://evil.example:8080")
    r = evil.get("/")
    assert r.status_code == 403 and "evil.example" in r.text and "[web] hosts" in r.text
    r = evil.get("/api/v1/results")
    assert r.status_code == 403 and "evil.example" in r.json()["error"]


def test_a_rebound_name_cannot_roll_back_even_with_a_csrf_pair_read_from_the_real_page(state):
    _second_version(state)
    good = _client(state, "http://127.0.0.1:8080")
    csrf, session = _csrf(good), good.cookies.get("edge_session")
    evil = _client(state, "http://evil.example:8080")
    evil.cookies.set("edge_session", session)
    r = evil.post("/engines/rollback", data={"csrf": csrf, "to": SHIPPED, "confirm": "yes"}, headers={"Origin": "http://evil.example:8080"})
    assert r.status_code == 403
    assert resolve_store(AppConfig(), state).current() == SHIPPED_NEXT


@pytest.mark.parametrize("base", ["http://localhost:8080", "http://127.0.0.1:8080", "http://[::1]:8080", "http://192.168.1.7:8080"])
def test_localhost_and_any_ip_address_are_the_pages_own_names(state, base):
    assert _client(state, base).get("/engines").status_code == 200


def test_this_machines_name_and_a_configured_name_are_answered(state):
    import socket

    short = socket.gethostname().split(".")[0]
    assert _client(state, f"http://{short}:8080").get("/engines").status_code == 200
    assert _client(state, f"http://{short}.local:8080").get("/engines").status_code == 200
    assert _client(state, "http://farm.example:8080").get("/engines").status_code == 403
    assert _client(state, "http://farm.example:8080", hosts=["Farm.Example"]).get("/engines").status_code == 200


def test_a_write_from_another_origin_or_a_cross_site_fetch_is_refused_and_changes_nothing(state):
    _second_version(state)
    c = _client(state, "http://127.0.0.1:8080")
    csrf = _csrf(c)
    form = {"csrf": csrf, "to": SHIPPED, "confirm": "yes"}
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:9999"},
        {"Sec-Fetch-Site": "cross-site"},
    ):
        r = c.post("/engines/rollback", data=form, headers=headers)
        assert r.status_code == 403, headers
    assert resolve_store(AppConfig(), state).current() == SHIPPED_NEXT
    r = c.post("/engines/rollback", data=form, headers={"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 303 and resolve_store(AppConfig(), state).current() == SHIPPED


def test_a_program_with_a_token_and_no_origin_still_writes(state):
    _second_version(state)
    token = Tokens(state / "web").new("admin")
    c = _client(state, "http://192.168.1.7:8080", who=REMOTE, bind="0.0.0.0")
    r = c.post("/api/v1/engines/rollback", json={"to": SHIPPED}, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.json()["current"] == SHIPPED


def test_an_api_write_on_loopback_without_a_token_or_session_is_answered_401_in_json(state):
    c = _client(state, "http://127.0.0.1:8080")
    r = c.post("/api/v1/engines/rollback", json={"to": SHIPPED})
    assert r.status_code == 401 and "Bearer" in r.json()["error"] and r.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize("path", ["//evil.example/x", "/%2F%2Fevil.example", "/%5Cevil.example", "/\\evil.example", "///evil.example"])
def test_the_token_redirect_stays_on_the_page(state, path):
    token = Tokens(state / "web").new("admin")
    c = _client(state, "http://192.168.1.7:8080", who=REMOTE, bind="0.0.0.0")
    r = c.get(f"{path}?token={token}")
    where = r.headers.get("location", "")
    assert r.status_code in (303, 404) and not where.startswith("//") and not where.startswith("/\\") and "://" not in where, where


@pytest.mark.parametrize(
    "value, name",
    [
        ("localhost", "localhost"),
        ("LocalHost:8080", "localhost"),
        ("[::1]:8080", "::1"),
        ("a.b.", "a.b"),
        ("x:y", None),
        ("[::1", None),
        ("h:123456", None),
        ("", None),
    ],
)
def test_host_headers_are_parsed_strictly(value, name):
    assert host_name(value) == name


def test_the_bind_address_and_extra_names_join_the_machines_names():
    names = page_names("10.0.0.5", ["Greenhouse.Farm."])
    assert {"localhost", "10.0.0.5", "greenhouse.farm"} <= names and "0.0.0.0" not in page_names("0.0.0.0")
