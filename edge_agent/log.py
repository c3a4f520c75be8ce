"""Structured logging: JSON lines when stdout is not a terminal (journald keeps them), readable on a terminal."""

from __future__ import annotations

import logging
import os
import sys

import structlog

__all__ = ["configure_logging", "get_logger", "display_name", "logging_settings"]


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was configured.

    A logger bound earlier keeps working after ``sys.stderr`` is replaced (and the old one
    closed), as it is by test runners and by code that redirects output."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure_logging(level: str = "info", fmt: str = "auto", stream=None) -> None:
    """Set up structlog. ``fmt`` is ``"json"``, ``"console"`` or ``"auto"`` (console on a TTY).

    Lines go to ``stream``, or to the current ``sys.stderr`` when none is given."""
    stream = stream or _Stderr()
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    _settings.update(level=level, fmt=fmt)
    renderer = structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *([_escape_for_terminal] if fmt == "console" else []),  # JSON escapes them itself
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def _escape_for_terminal(logger, name: str, event: dict) -> dict:
    """Text logs print a photo's or device's name as it is shown, never as escape sequences the terminal obeys."""
    from edge_agent.names import printable

    out = {}
    for key, value in event.items():
        if isinstance(value, str):
            value = "\n".join(printable(line) for line in value.split("\n")) if key == "exception" else printable(value)
        out[key] = value
    return out


_settings = {"level": "info", "fmt": "json"}


def logging_settings() -> tuple[str, str]:
    """(level, format) of the last :func:`configure_logging`: what a child process configures to log alike."""
    return _settings["level"], _settings["fmt"]


def get_logger(name: str | None = None, **context) -> structlog.typing.FilteringBoundLogger:
    """A logger with ``context`` bound (photo, engine version, ...).

    The logger is resolved against the configuration in force now (call :func:`configure_logging`
    first), so a call on the per-photo path costs no lookup, and nothing when its level is filtered."""
    return structlog.get_logger(name).bind(**context)


def display_name(path) -> str:
    """``path`` as text any log line, JSON document or database takes: file-name bytes that are not UTF-8 (a Latin-1
    name from a camera card) shown as ``\\xNN`` instead of failing to encode."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")
