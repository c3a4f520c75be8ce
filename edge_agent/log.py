"""Structured logging: JSON lines when stdout is not a terminal (journald keeps them), readable on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_logging", "get_logger"]


def configure_logging(level: str = "info", fmt: str = "auto", stream=None) -> None:
    """Set up structlog. ``fmt`` is ``"json"``, ``"console"`` or ``"auto"`` (console on a TTY)."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    renderer = structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None, **context) -> structlog.typing.FilteringBoundLogger:
    """A logger with ``context`` bound (photo, engine version, ...).

    The logger is resolved against the configuration in force now (call :func:`configure_logging`
    first), so a call on the per-photo path costs no lookup, and nothing when its level is filtered."""
    return structlog.get_logger(name).bind(**context)
