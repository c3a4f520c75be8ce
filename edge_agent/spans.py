"""Spans of time in words, as ``status`` and the pages say them: "3 min ago", "in 2 h", "5 days"."""

from __future__ import annotations

__all__ = ["ago", "span", "within"]


def span(seconds: float) -> str:
    """``seconds`` in the unit a person reads it in: minutes up to an hour and a half, hours up to two days, then days."""
    if seconds < 5400:
        return f"{max(1, round(seconds / 60))} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def ago(seconds: float) -> str:
    """How long ago something ``seconds`` old happened ("just now" within a minute)."""
    return "just now" if seconds < 60 else f"{span(seconds)} ago"


def within(seconds: float) -> str:
    """When something ``seconds`` away will happen ("at the next look" within a minute)."""
    return "at the next look" if seconds < 60 else f"in {span(seconds)}"
