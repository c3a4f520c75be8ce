"""Structured logging: where lines go, and that loggers survive stderr being replaced."""

from __future__ import annotations

import io
import json
import sys

import structlog

from edge_agent.log import configure_logging, get_logger


def test_lines_follow_sys_stderr_after_it_is_replaced_and_the_old_one_closed(monkeypatch):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("info", "json")
    try:
        get_logger("t", photo="a.jpg").info("one")
        second = io.StringIO()
        monkeypatch.setattr(sys, "stderr", second)
        first.close()  # what pytest's capture does to the stream a CLI test configured logging with
        get_logger("t", photo="b.jpg").info("two")
        line = json.loads(second.getvalue())
        assert line["event"] == "two" and line["photo"] == "b.jpg" and line["level"] == "info"
    finally:
        structlog.reset_defaults()


def test_level_filters_and_explicit_stream_is_used():
    out = io.StringIO()
    configure_logging("warning", "json", stream=out)
    try:
        log = get_logger("t")
        log.info("quiet")
        log.warning("loud", version="v0002")
        rows = [json.loads(x) for x in out.getvalue().splitlines()]
        assert [r["event"] for r in rows] == ["loud"] and rows[0]["version"] == "v0002"
    finally:
        structlog.reset_defaults()
