"""What every request of the page and the API needs: the configuration, the state directory, and its parameters' checks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path

from edge_agent.config import AppConfig
from edge_agent.results import ResultsDB
from edge_agent.state import StateLayout, resolve_store
from edge_agent.web.queries import Reader
from engines.errors import EdgeAgentError

__all__ = ["WebContext", "BadParameter", "parse_day", "parse_int"]


@dataclass
class WebContext:
    """What every request needs: the configuration and where the daemon keeps things."""

    cfg: AppConfig
    state: StateLayout
    inbox: Path
    bind: str

    @property
    def reader(self) -> Reader:
        return Reader(self.state.db)

    def store(self):
        return resolve_store(self.cfg, self.state.root)

    def classes(self) -> list[str]:
        return self.store().open(verify=False).classes

    def db(self, readonly: bool = True) -> ResultsDB | None:
        if not self.state.db.is_file():
            return None
        return ResultsDB(self.state.db, readonly=readonly)


class BadParameter(EdgeAgentError, ValueError):
    """A query or form parameter out of its range: answered 400 with the reason."""


def parse_day(text: str | None) -> date | None:
    """A day from ``YYYY-MM-DD`` between 1970 (a board without a clock) and 2999 (None when empty); raises :class:`BadParameter`."""
    if not text:
        return None
    try:
        day = date.fromisoformat(text[:10])
    except ValueError:
        raise BadParameter(f"not a day (YYYY-MM-DD): {text[:20]!r}") from None
    if not 1970 <= day.year <= 2999:
        raise BadParameter(f"no photos can be from {day.isoformat()}")
    return day


def parse_int(text: str | None, default: int = 0, hi: int = 1_000_000) -> int:
    """A whole number in 0..``hi`` (``default`` when empty); raises :class:`BadParameter`."""
    if not text:
        return default
    if len(text) > 12 or not text.strip().isdigit() or int(text) > hi:
        raise BadParameter(f"not a number from 0 to {hi}: {text[:20]!r}")
    return int(text)
