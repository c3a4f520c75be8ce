"""Results as a spreadsheet reads them: CSV, one header row, one row a photo (or a plant's visit), no cell a
spreadsheet would run.

A photo's file name comes from whoever copied it into the inbox; a name such as ``=HYPERLINK(...)`` would be a
formula in Excel or LibreOffice, so a text cell that begins with ``=``, ``+``, ``-``, ``@`` or a control character
is written with a leading apostrophe (OWASP's advice for CSV injection), which spreadsheets show as plain text.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from edge_agent.plants import PlantDiagnosis

__all__ = ["CSV_COLUMNS", "PLANT_CSV_COLUMNS", "csv_lines", "plant_csv_lines", "safe_cell"]

#: The CSV's columns, in order.
CSV_COLUMNS = (
    "classified (local time)",
    "taken (local time)",
    "photo",
    "plant",
    "answer",
    "confidence",
    "verdict",
    "why not sure",
    "expert label",
    "engine",
    "photo id",
    "sha256",
    "latitude",
    "longitude",
)

#: The plants CSV's columns: one row a visit of a plant (:func:`edge_agent.plants.visits`).
PLANT_CSV_COLUMNS = (
    "plant",
    "visit began (local time)",
    "photos",
    "diagnosis",
    "verdict",
    "combined probability",
    "why",
    "labelled by the expert",
    "latitude",
    "longitude",
)

_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def safe_cell(value: object) -> str:
    """``value`` as a CSV cell a spreadsheet shows as written (text that looks like a formula gets an apostrophe)."""
    if value is None:
        return ""
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def _cells(row: Mapping) -> list[str]:
    """One result (as :meth:`edge_agent.results.ResultsDB.results` gives it) as the CSV's cells."""
    when, taken = (
        datetime.fromisoformat(row[k]).astimezone().strftime("%Y-%m-%d %H:%M:%S") if row.get(k) else "" for k in ("created", "taken")
    )
    photo = Path(row["path"]).name if row["path"] else row["source"]
    cells = [when, taken, photo, row["plant"], row["label"], f"{row['confidence']:.4f}", row["verdict"], row["verdict_reason"]]
    ids = (row["expert_label"], row["engine_version"], row["photo_id"], row["sha256"], row.get("latitude"), row.get("longitude"))
    return [safe_cell(c) for c in (*cells, *ids)]


def csv_lines(rows: Iterable[Mapping]) -> Iterator[str]:
    """The header line, then one line a result (each ending in CRLF, as RFC 4180 has it)."""
    return _lines(CSV_COLUMNS, map(_cells, rows))


def plant_csv_lines(visits: Iterable[tuple[str, float, PlantDiagnosis]]) -> Iterator[str]:
    """The header line, then one line a visit of a plant: (plant, when the visit began, its diagnosis)."""
    return _lines(PLANT_CSV_COLUMNS, (_visit_cells(*v) for v in visits))


def _visit_cells(plant: str, began: float, d: PlantDiagnosis) -> list[str]:
    """One visit of a plant as the plants CSV's cells."""
    when = datetime.fromtimestamp(began).strftime("%Y-%m-%d %H:%M:%S")
    sure = "" if d.expert else f"{d.probability:.4f}"  # the expert's word is not a probability
    lat, lon = d.place or (None, None)
    return [safe_cell(c) for c in (plant, when, d.photos, d.label, d.verdict, sure, d.reason, d.expert, lat, lon)]


def _lines(header: Sequence[str], rows: Iterable[list[str]]) -> Iterator[str]:
    """``header`` and ``rows`` as CSV lines, one at a time."""
    buf = io.StringIO()
    out = csv.writer(buf)
    out.writerow(header)
    for cells in rows:
        out.writerow(cells)
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
    if buf.getvalue():  # no rows: the header alone
        yield buf.getvalue()
