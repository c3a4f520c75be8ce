"""What the pages read from the results database: read-only, one short connection per request.

The daemon keeps writing while the page reads (SQLite WAL): nothing here takes a write lock, so the daemon
never waits for the page.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta
from itertools import groupby
from pathlib import Path
from urllib.parse import urlencode

from edge_agent.capture_place import NEAR_M, Place, near_sql
from edge_agent.ledger_rows import LedgerColumns, ResultRow, result_record
from edge_agent.plants import visit_of, visit_window
from edge_agent.results import query_readonly, query_snapshot

__all__ = ["ClassSeason", "Filters", "Reader"]


#: A result (``r``) whose own class counts as found: a sure answer the expert did not label (the expert's label is
#: what a labelled photo was found to show, whatever the model said). Read from the index of the sure answers.
_SURE_UNLABELLED = "r.verdict = 'confident' AND r.sha256 NOT IN (SELECT sha256 FROM expert_labels)"


@dataclass(frozen=True)
class ClassSeason:
    """One class over the photos kept (:meth:`Reader.per_class`)."""

    photos: int = 0  # the model answered it
    sure: int = 0  # of them, sure
    labelled: int = 0  # the expert labelled it
    found: int = 0  # photos it was found on: a sure answer the expert did not correct, or the expert's label
    plants: int = 0  # plants it was found on
    first: float | None = None  # when the first and last of those photos were taken (else classified)
    last: float | None = None


@dataclass(frozen=True)
class Filters:
    """The recent-photos filters: a class, a verdict (the API's), a range of local days (inclusive), a plant, and
    a place with how near to it (metres) a photo was taken (its EXIF GPS)."""

    label: str = ""
    day_from: date | None = None
    day_to: date | None = None
    verdict: str = ""
    plant: str = ""
    near: Place | None = None
    within_m: int = NEAR_M

    def __bool__(self) -> bool:
        return bool(self.label or self.day_from or self.day_to or self.verdict or self.plant or self.near)

    def query(self, without: str = "") -> str:
        """The filters as a URL's query (``without``: one of them left out), for links to more of the same photos."""
        near = f"{self.near.lat},{self.near.lon}" if self.near else ""
        pairs = {
            "label": self.label,
            "from": self.day_from.isoformat() if self.day_from else "",
            "to": self.day_to.isoformat() if self.day_to else "",
            "verdict": self.verdict,
            "plant": self.plant,
            "near": near,
            "within": str(self.within_m) if near and self.within_m != NEAR_M else "",
        }
        return urlencode({k: v for k, v in pairs.items() if v and k != without and not (without == "near" and k == "within")})

    def where(self, when: str = "created") -> tuple[str, list]:
        """The SQL condition and its arguments; days are of ``when`` (the SQL of a result's time: when taken, else
        classified, :attr:`~edge_agent.ledger_rows.LedgerColumns.when`)."""
        clauses, args = [], []
        if self.label:
            clauses.append("label = ?")
            args.append(self.label)
        if self.verdict:
            clauses.append("verdict = ?")
            args.append(self.verdict)
        if self.plant:
            clauses.append("plant = ?")
            args.append(self.plant)
        if self.day_from:
            clauses.append(f"{when} >= ?")
            args.append(datetime.combine(self.day_from, time()).timestamp())
        if self.day_to:
            clauses.append(f"{when} < ?")
            args.append(datetime.combine(self.day_to + timedelta(days=1), time()).timestamp())
        if self.near:
            sql, near_args = near_sql(self.near, self.within_m)
            clauses.append(sql)
            args += near_args
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def _plant_match(match: str) -> tuple[str, tuple]:
    """The condition for plants whose name holds ``match`` in any case (every plant when it is empty)."""
    if not match:
        return "plant IS NOT NULL", ()
    return "plant IS NOT NULL AND instr(lower(plant), ?) > 0", (match.lower(),)


class Reader:
    """Read-only queries on ``results.sqlite`` (an absent database reads as empty)."""

    wait_s = 5.0  # how long a query waits for a locked ledger before the page says so (503)

    def __init__(self, db_path: Path) -> None:
        self.path = db_path
        self._ledger = LedgerColumns(self._rows)  # a daemon not yet upgraded has not added the newest columns

    def _rows(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        return query_readonly(self.path, sql, args, timeout=self.wait_s)

    def _columns(self) -> str:
        """A result's columns as :meth:`ResultRow.from_sql` reads them (NULL for those a ledger not yet upgraded has not)."""
        return self._ledger.row_sql()

    def _where(self, filters: Filters) -> tuple[str, list]:
        """The filters' SQL on this ledger (a ledger not yet upgraded has no places: no photo is near any)."""
        if filters.near and not self._ledger.has("lat"):
            return " WHERE 0", []
        return filters.where(self._ledger.when)

    def near_visit(self, place: Place, within_m: float, when: float, gap_s: float, limit: int) -> list[ResultRow]:
        """The photos taken within ``within_m`` metres of ``place`` and ``gap_s`` seconds of ``when`` (when taken, else
        classified; the whole season where ``gap_s`` is 0), in time order, at most ``limit``."""
        if not self._ledger.has("lat"):
            return []
        near, args = near_sql(place, within_m)
        w = self._ledger.when
        rows = self._rows(
            f"SELECT {self._columns()} FROM results WHERE {near} AND {w} BETWEEN ? AND ? ORDER BY {w}, id LIMIT ?",
            [*args, *visit_window(when, gap_s), limit],
        )
        return [ResultRow.from_sql(r) for r in rows]

    def count(self, filters: Filters) -> int:
        """How many results the filters match."""
        where, args = self._where(filters)
        total = self._rows(f"SELECT COUNT(*) FROM results{where}", args)
        return total[0][0] if total else 0

    def places(self, filters: Filters, limit: int) -> tuple[list[tuple], int]:
        """The newest ``limit`` photos the filters match that have a place, each (sha256, latitude, longitude, label,
        confidence, verdict, plant, when taken else classified); and how many they match have none."""
        if not self._ledger.has("lat"):  # a ledger not yet upgraded: no photo has a place
            return [], self.count(filters)
        where, args = self._where(filters)
        joined = f"{where} AND" if where else " WHERE"
        rows = self._rows(
            f"SELECT sha256, lat, lon, label, confidence, verdict, plant, {self._ledger.when} FROM results{joined}"
            " lat IS NOT NULL AND lon IS NOT NULL ORDER BY id DESC LIMIT ?",
            [*args, limit],
        )
        # all the filters match less those with a place, in one read: each count reads an index, not every row
        counts = self._rows(
            f"SELECT COUNT(*), (SELECT COUNT(*) FROM results{joined} lat IS NOT NULL AND lon IS NOT NULL) FROM results{where}",
            [*args, *args],
        )
        return rows, (counts[0][0] - counts[0][1] if counts else 0)

    def recent(self, filters: Filters, page: int, page_size: int) -> tuple[list[ResultRow], int]:
        """One page of results, newest first, and how many match in all (days: when taken, else classified)."""
        columns = self._columns()
        where, args = self._where(filters)
        rows = self._rows(f"SELECT {columns} FROM results{where} ORDER BY id DESC LIMIT ? OFFSET ?", [*args, page_size, page * page_size])
        return [ResultRow.from_sql(r) for r in rows], self.count(filters)

    def each(self, filters: Filters, batch: int = 1000) -> Iterator[dict]:
        """Every result the filters match, newest first, with the expert's label (:func:`result_record`), read
        ``batch`` at a time from the newest down, so photos classified meanwhile neither repeat nor shift any."""
        columns = self._columns()
        where, args = self._where(filters)
        below = (self._rows("SELECT COALESCE(MAX(id), 0) FROM results") or [(0,)])[0][0] + 1
        while True:
            cond = f"{where} AND id < ?" if where else " WHERE id < ?"
            rows = self._rows(f"SELECT id, {columns} FROM results{cond} ORDER BY id DESC LIMIT ?", [*args, below, batch])
            if not rows:
                return
            found = [ResultRow.from_sql(r[1:]) for r in rows]
            said = self.expert_labels([r.sha256 for r in found])
            yield from (result_record(r, said.get(r.sha256)) for r in found)
            below = rows[-1][0]

    def photo(self, sha256: str) -> ResultRow | None:
        rows = self._rows(f"SELECT {self._columns()} FROM results WHERE sha256 = ?", (sha256,))
        return ResultRow.from_sql(rows[0]) if rows else None

    def plants(self, limit: int = 50, match: str = "") -> list[tuple[str, int, float]]:
        """The plants photographed, the most recent first: (name, photos, the newest photo's time); only those whose name
        holds ``match`` (any case) when it is given."""
        where, args = _plant_match(match)
        return self._rows(
            f"SELECT plant, COUNT(*), MAX(created) FROM results WHERE {where} GROUP BY plant ORDER BY MAX(id) DESC LIMIT ?", (*args, limit)
        )

    def plant_count(self, match: str = "") -> int:
        """How many plants :meth:`plants` would list with no limit."""
        where, args = _plant_match(match)
        rows = self._rows(f"SELECT COUNT(DISTINCT plant) FROM results WHERE {where}", args)
        return rows[0][0] if rows else 0

    def plant_named(self, name: str) -> str | None:
        """The stored name of the plant called ``name`` in any case (the most recently photographed), or None."""
        rows = self._rows("SELECT plant FROM results WHERE plant = ? COLLATE NOCASE ORDER BY id DESC LIMIT 1", (name,))
        return rows[0][0] if rows else None

    def plant(self, name: str) -> list[ResultRow]:
        """One plant's photos, oldest first (by :attr:`ResultRow.when`)."""
        columns = self._columns()
        when = self._ledger.when
        return [ResultRow.from_sql(r) for r in self._rows(f"SELECT {columns} FROM results WHERE plant = ? ORDER BY {when}, id", (name,))]

    def newest_visits(self, names: Sequence[str], gap_s: float) -> dict[str, tuple[list[ResultRow], int]]:
        """Each named plant's newest visit (:func:`edge_agent.plants.visits`: its photos, oldest first) and how many
        photos it has in all, in two reads however many plants: the list of plants reads a season's earlier visits'
        times, not their rows."""
        when, out, ids = self._ledger.when, {}, []
        for at in range(0, len(names), 500):  # (SQLite's limit on a statement's variables)
            part = list(names[at : at + 500])
            times = self._rows(
                f"SELECT plant, id, {when} FROM results WHERE plant IN ({','.join('?' * len(part))}) ORDER BY plant, {when} DESC, id DESC",
                part,
            )
            for plant, group in groupby(times, key=lambda t: t[0]):
                group = list(reversed(list(group)))  # oldest first
                out[plant] = ([], len(group))
                ids += [(i, plant) for _, i, _ in group[visit_of([t for _, _, t in group], -1, gap_s).start :]]
        plant_of = dict(ids)
        found = []
        for at in range(0, len(ids), 500):
            part = [i for i, _ in ids[at : at + 500]]
            found += self._rows(f"SELECT {self._columns()}, {when}, id FROM results WHERE id IN ({','.join('?' * len(part))})", part)
        for r in sorted(found, key=lambda r: (r[-2], r[-1])):  # oldest first, as :meth:`plant` orders them
            out[plant_of[r[-1]]][0].append(ResultRow.from_sql(r[:-2]))
        return out

    def expert_labels(self, sha256s: Collection[str]) -> dict[str, str]:
        """The expert's label of each of these photos that has one (sha256 -> class)."""
        shas, out = list(sha256s), {}
        for i in range(0, len(shas), 500):  # SQLite's bound parameters per statement
            part = shas[i : i + 500]
            out.update(self._rows(f"SELECT sha256, label FROM expert_labels WHERE sha256 IN ({','.join('?' * len(part))})", part))
        return out

    def queue_file(self, sha256: str) -> tuple[str, str] | None:
        """(kind, file) of the photo's label-queue entry, if it has one."""
        rows = self._rows("SELECT kind, file FROM label_queue WHERE sha256 = ?", (sha256,))
        return (rows[0][0], rows[0][1]) if rows else None

    def quarantined(self, name: str) -> str | None:
        """The reason a photo named ``name`` (as it arrived) was quarantined, if it was."""
        rows = self._rows("SELECT reason FROM quarantine WHERE path = ? OR path LIKE ? ORDER BY id DESC LIMIT 1", (name, "%/" + name))
        return rows[0][0] if rows else None

    def labels(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT DISTINCT label FROM results ORDER BY label")]

    def per_class(self) -> dict[str, ClassSeason]:
        """Each class's season over what is kept: the photos the model answered as it (of them, sure), the photos the
        expert labelled as it, and where it was found (a sure answer the expert did not correct, or the expert's label):
        how many photos, on how many plants, first and last photographed."""
        out: dict[str, ClassSeason] = defaultdict(ClassSeason)
        when = self._ledger.when_of("r.")
        answered, labelled, sure, sure_plants, said = query_snapshot(  # (one state of the ledger: no photo counted twice)
            self.path,
            [
                ("SELECT label, COUNT(*), SUM(verdict = 'confident') FROM results GROUP BY label", ()),
                ("SELECT label, COUNT(*) FROM expert_labels GROUP BY label", ()),
                (f"SELECT r.label, COUNT(*), MIN({when}), MAX({when}) FROM results r WHERE {_SURE_UNLABELLED} GROUP BY r.label", ()),
                (f"SELECT r.label, r.plant FROM results r WHERE {_SURE_UNLABELLED} AND r.plant IS NOT NULL GROUP BY r.label, r.plant", ()),
                (f"SELECT e.label, r.plant, {when} FROM expert_labels e JOIN results r ON r.sha256 = e.sha256", ()),
            ],
            self.wait_s,
        )
        for label, n, sure_n in answered:
            out[label] = replace(out[label], photos=n, sure=sure_n or 0)
        for label, n in labelled:
            out[label] = replace(out[label], labelled=n)
        found: dict[str, list] = {label: [n, set(), first, last] for label, n, first, last in sure}  # photos, plants, first, last
        for label, plant in sure_plants:
            found[label][1].add(plant)
        for label, plant, w in said:
            f = found.setdefault(label, [0, set(), w, w])
            f[0], f[2], f[3] = f[0] + 1, min(f[2], w), max(f[3], w)
            if plant is not None:
                f[1].add(plant)
        for label, (n, plants, first, last) in found.items():
            out[label] = replace(out[label], found=n, plants=len(plants), first=first, last=last)
        return dict(out)

    def found_on(self, label: str, limit: int = 20) -> list[str]:
        """The plants ``label`` was found on (a sure answer the expert did not correct, or the expert's label), the most
        recently photographed first, at most ``limit``."""
        when = self._ledger.when_of("r.")
        return [
            plant
            for plant, _ in self._rows(
                f"SELECT plant, MAX(w) AS last FROM (SELECT r.plant AS plant, {when} AS w FROM results r"
                f" WHERE r.label = ? AND r.plant IS NOT NULL AND {_SURE_UNLABELLED} UNION ALL SELECT r.plant, {when}"
                " FROM expert_labels e JOIN results r ON r.sha256 = e.sha256 WHERE e.label = ? AND r.plant IS NOT NULL)"
                " GROUP BY plant ORDER BY last DESC LIMIT ?",
                (label, label, limit),
            )
        ]

    def expert_named(self, label: str) -> bool:
        """The expert has labelled a photo as ``label`` (a class the model may not know yet)."""
        return bool(self._rows("SELECT 1 FROM expert_labels WHERE label = ? LIMIT 1", (label,)))

    def per_day_per_class(self, days: int) -> dict[str, dict[str, int]]:
        """{local day: {class: photos}} for the last ``days`` days."""
        since = datetime.combine(date.today() - timedelta(days=days - 1), time()).timestamp()
        rows = self._rows(
            "SELECT date(created, 'unixepoch', 'localtime') AS day, label, COUNT(*) FROM results"
            " WHERE created >= ? GROUP BY day, label ORDER BY day",
            (since,),
        )
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for day, label, n in rows:
            out[day][label] = n
        return dict(out)

    def photos_since(self, since: float) -> int:
        rows = self._rows("SELECT COUNT(*) FROM results WHERE created >= ?", (since,))
        return rows[0][0] if rows else 0

    def recent_quarantine(self, limit: int = 10) -> list[tuple[str, str, float]]:
        return self._rows("SELECT path, reason, created FROM quarantine ORDER BY id DESC LIMIT ?", (limit,))
