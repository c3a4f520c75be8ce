"""The ledger's rows as the code reads them: a result, a queue entry, how a queued photo arrived, and the columns a
reader finds in a ledger (one a daemon not yet upgraded keeps reads NULL for the newest)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from edge_agent.capture_place import Place, place_of

__all__ = [
    "Arrival",
    "LedgerColumns",
    "QueueEntry",
    "RESULT_COLUMNS",
    "RESULT_LATER_COLUMNS",
    "ResultRow",
    "iso",
    "result_columns",
    "result_record",
]


def result_columns(query) -> set[str]:
    """The columns of the results table of the ledger ``query`` (SQL -> rows) reads (a daemon not yet upgraded has not
    added the newest: a reader opened read-only reads NULL instead)."""
    return {row[1] for row in query("PRAGMA table_info(results)")}


#: A result's columns every ledger has, then those added since (a reader of a ledger not yet upgraded reads NULL).
RESULT_COLUMNS = ("sha256", "photo_id", "path", "source", "label", "confidence", "top_k", "engine_version", "timings", "created", "verdict")
RESULT_LATER_COLUMNS = ("plant", "verdict_reason", "taken", "lat", "lon")


class LedgerColumns:
    """The columns of the results table a reader of the ledger finds (``query``: SQL -> rows), asked again until it has
    the one wanted: a daemon not yet upgraded has not added the newest, and adds them when it starts."""

    def __init__(self, query) -> None:
        self._query, self._kept = query, set()

    def has(self, name: str) -> bool:
        """Whether the results table has column ``name``."""
        if name not in self._kept:
            self._kept = result_columns(self._query)
        return name in self._kept

    def or_null(self, name: str, prefix: str = "") -> str:
        """Column ``name`` (of table alias ``prefix``), or NULL where the ledger has none."""
        return f"{prefix}{name}" if self.has(name) else "NULL"

    def row_sql(self, prefix: str = "") -> str:
        """The columns :meth:`ResultRow.from_sql` reads, each of table alias ``prefix`` (NULL for those a ledger not
        yet upgraded has not)."""
        later = [self.or_null(name, prefix) for name in RESULT_LATER_COLUMNS]
        return ", ".join([*(f"{prefix}{name}" for name in RESULT_COLUMNS), *later])

    @property
    def when(self) -> str:
        """The SQL of the time that tells a plant's visits apart (:mod:`edge_agent.capture_time`): when the photo was
        taken where known, else when it was classified (all a ledger not yet upgraded keeps)."""
        return self.when_of("")

    def when_of(self, prefix: str) -> str:
        """:attr:`when` of the results table under alias ``prefix`` ("r.")."""
        return f"COALESCE({prefix}taken, {prefix}created)" if self.has("taken") else f"{prefix}created"


def iso(ts: float) -> str:
    """``ts`` (seconds since the epoch) as ISO 8601 in UTC, to the millisecond, as the JSON output and the CSV carry it."""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


def result_record(row: ResultRow, expert_label: str | None) -> dict:
    """A result as ``edge-agent results --json`` prints it and the CSV export reads it (:mod:`edge_agent.export`)."""
    return {
        "photo_id": row.photo_id,
        "path": row.path,
        "sha256": row.sha256,
        "source": row.source,
        "label": row.label,
        "confidence": row.confidence,
        "verdict": row.verdict,
        "verdict_reason": row.verdict_reason,
        "top_k": row.top_k,
        "engine_version": row.engine_version,
        "timings_ms": row.timings,
        "created": iso(row.created),
        "taken": None if row.taken is None else iso(row.taken),
        "latitude": row.lat,
        "longitude": row.lon,
        "expert_label": expert_label,
        "plant": row.plant,
    }


class Arrival(NamedTuple):
    """How a queued photo arrived: the file it came as, its source (inbox or a camera), its plant, when it was classified
    and when taken (all None for a queue row whose result is gone)."""

    path: str | None
    source: str | None
    plant: str | None
    created: float | None
    taken: float | None = None  # ResultRow.taken
    lat: float | None = None  # ResultRow.lat
    lon: float | None = None

    @property
    def place(self) -> Place | None:
        """Where the photo was taken (its EXIF GPS), None where not known."""
        return place_of(self.lat, self.lon)

    @property
    def when(self) -> float | None:
        """:attr:`ResultRow.when`: when taken where known, else when classified (None for a result gone)."""
        return self.created if self.taken is None else self.taken

    @property
    def name(self) -> str | None:
        """The file name it arrived under (None: a camera's frame, or its result is gone)."""
        return Path(self.path).name if self.path else None

    @property
    def where(self) -> str:
        """The photo as the farmer knows it: its plant and file name (a camera's name for a frame)."""
        name = self.name or self.source or ""
        return f"plant {self.plant}: {name}" if self.plant else name


@dataclass
class ResultRow:
    """One photo's result, a row of the ledger's results table."""

    sha256: str
    photo_id: str
    path: str | None
    source: str
    label: str
    confidence: float
    top_k: list
    engine_version: str
    timings: dict
    created: float = field(default_factory=time.time)
    verdict: str | None = None  # confident | unsure | unknown; None for results stored before verdicts existed
    plant: str | None = None  # the inbox subfolder it arrived in (edge_agent.plants), None: a photo on its own
    verdict_reason: str | None = None  # why the verdict is not confident, in words ("" when it is; None before 2026-12)
    taken: float | None = None  # when it was taken (EXIF, edge_agent.capture_time), None: not known or not believed
    lat: float | None = None  # where it was taken (EXIF GPS, edge_agent.capture_place): degrees north; None: not known
    lon: float | None = None  # degrees east

    @classmethod
    def from_sql(cls, row: Sequence) -> "ResultRow":
        """A result read with :meth:`LedgerColumns.row_sql`'s columns."""
        sha, pid, path, source, label, conf, top_k, ev, timings, created, verdict, *later = row
        return cls(sha, pid, path, source, label, conf, json.loads(top_k), ev, json.loads(timings), created, verdict, *later)

    @property
    def place(self) -> Place | None:
        """(latitude, longitude) where the photo was taken, None where its EXIF did not say."""
        return place_of(self.lat, self.lon)

    @property
    def when(self) -> float:
        """When the photo was taken where that is known, else when it was classified: what a plant's visits split by."""
        return self.created if self.taken is None else self.taken


@dataclass
class QueueEntry:
    """A photo waiting in the label queue (a pseudo-label, a review question or an expert's label), with its file."""

    sha256: str
    photo_id: str
    kind: str
    label: str | None
    confidence: float | None
    engine_version: str | None
    file: str
    bytes: int
    created: float = field(default_factory=time.time)
