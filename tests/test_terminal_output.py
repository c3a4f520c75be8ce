"""What reaches an operator's terminal from names others chose (a photo's file name, a device's reasons) is shown,
never obeyed: escape sequences that set the window's title, clear the screen or colour it print as ``\\x1b``."""

from __future__ import annotations

import json
import os
import time

import pytest

from edge_agent.ledger_rows import ResultRow
from edge_agent.names import printable
from edge_agent.results import ResultsDB
from edge_agent.state import StateLayout

EVIL = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m\r\u202e"


def test_printable_escapes_control_and_invisible_characters_and_keeps_every_other_letter():
    assert printable("Apple scab, 苹果, é") == "Apple scab, 苹果, é"
    shown = printable(f"leaf{EVIL}.jpg")
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown and "\u202e" not in shown
    assert "\\x1b]0;owned\\x07" in shown and shown.isprintable()


def test_edge_agent_results_shows_a_photo_named_with_escape_sequences_without_obeying_them(tmp_path, capsys):
    from edge_agent.cli import main

    layout = StateLayout(tmp_path / "state")
    layout.create()
    db = ResultsDB(layout.db)
    top_k = [["Apple___healthy", 0.9], ["Apple___scab", 0.1]]
    db.commit([ResultRow("ab" * 32, "p0", f"/inbox/leaf{EVIL}.jpg", "folder", "Apple___healthy", 0.9, top_k, "v0001", {})], [])
    db.close()
    assert main(["results", "--state-dir", str(layout.root)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]0;owned" in out
    assert main(["results", "--json", "--state-dir", str(layout.root)]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["path"] == f"/inbox/leaf{EVIL}.jpg"  # JSON keeps the name exactly (escaped by JSON itself)


def test_edge_trainer_fleet_shows_a_devices_reasons_without_obeying_their_escape_sequences(tmp_path, capsys):
    pytest.importorskip("torch", reason="the trainer's command line")
    from trainer.cli import main

    status = tmp_path / "state" / "trainer" / "status.json"
    status.parent.mkdir(parents=True)
    device = {
        "name": f"old{EVIL}",  # a status written before names were checked
        "address": "127.0.0.1",
        "last_seen": time.time(),
        "engine_version": "v0001",
        "pinned": "",
        "samples_received": 3,
        "queue": 0,
        "refused": {"v0002": f"signed by {EVIL}"},
        "last_result": None,
    }
    live = {
        "pid": os.getpid(),
        "updated": time.time(),
        "fleet": [device],
        "handshakes_refused": [{"address": EVIL, "count": 2, "reason": EVIL}],
    }
    status.write_text(json.dumps(live))
    assert main(["fleet", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert out.count("\\x1b]0;owned\\x07") >= 3 and "REFUSED CONNECTION" in out


def test_text_logs_show_a_photos_name_escaped_and_json_logs_keep_it_exact():
    import io

    from edge_agent.log import configure_logging, get_logger

    try:
        for fmt in ("console", "json"):
            buf = io.StringIO()
            configure_logging("info", fmt, buf)
            get_logger("test").warning("photo_rejected", photo=f"leaf{EVIL}.jpg")
            line = buf.getvalue()
            assert "]0;owned\x07" not in line and "\u202e" not in line, fmt
            if fmt == "json":
                assert json.loads(line)["photo"] == f"leaf{EVIL}.jpg"
            else:
                assert "\\x1b]0;owned\\x07" in line
    finally:
        configure_logging("info", "json")


def test_the_fleet_list_says_a_revoked_device_is_revoked(tmp_path, capsys):
    pytest.importorskip("torch", reason="the trainer's command line")
    from trainer.cli import main

    status = tmp_path / "state" / "trainer" / "status.json"
    status.parent.mkdir(parents=True)
    device = {
        "name": "stolen",
        "address": "10.0.0.7",
        "last_seen": time.time(),
        "engine_version": "v0001",
        "samples_received": 3,
        "queue": 0,
        "refused": {},
        "last_result": None,
        "revoked": True,
    }
    status.write_text(json.dumps({"pid": os.getpid(), "updated": time.time(), "fleet": [device]}))
    assert main(["fleet", "--state-dir", str(tmp_path / "state")]) == 0
    assert "REVOKED" in capsys.readouterr().out
