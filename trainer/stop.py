"""Stopping a retrain part-way: SIGTERM during a retrain abandons the candidate, never a sample."""

from __future__ import annotations

from engines.errors import EdgeAgentError

__all__ = ["Stopped", "check"]


class Stopped(EdgeAgentError):
    """Training was asked to stop (SIGTERM, SIGINT); the candidate is abandoned and nothing is marked as used."""


def check(should_stop, where: str) -> None:
    """Raise :class:`Stopped` if ``should_stop()`` says so."""
    if should_stop():
        raise Stopped(f"stopped {where}")
