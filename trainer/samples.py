"""The trainer's durable store of received labels (pseudo-labels and expert labels).

``<trainer state>/samples/<sha256><ext>`` holds each photo (written atomically
and fsynced) and ``samples.sqlite`` its label; a sample is acknowledged only
after both are durable. Ids are content hashes, so a resend is stored once.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edge_agent.storage_errors import storage_problem
from engines.durable import atomic_write, check_whole, connect_writable, relocate_rows, replace_row_file
from engines.errors import EdgeAgentError
from engines.salvage import Salvage, salvage_file, salvage_rows

__all__ = ["PENDING", "SampleStore", "Sample", "SamplesDamaged"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    label TEXT NOT NULL,
    confidence REAL NOT NULL,
    engine_version TEXT NOT NULL,
    file TEXT NOT NULL,
    received REAL NOT NULL,
    generation TEXT,
    first_label TEXT,
    device TEXT
);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
#: The tables a damaged file's rows are copied from (:mod:`engines.salvage`).
TABLES = ("samples", "state")


@dataclass(frozen=True)
class Sample:
    id: str
    kind: str
    label: str
    confidence: float
    engine_version: str
    file: str
    received: float
    generation: str | None
    #: The class an expert label first came as (None: :attr:`label`): a label the expert put right keeps its place
    #: among the field check's photos (:func:`trainer.field_check.held_back`).
    first_label: str | None = None

    @property
    def arrived_as(self) -> str:
        """The class this expert label arrived as (its place in the field check's order)."""
        return self.first_label or self.label


class SamplesDamaged(EdgeAgentError):
    """``samples.sqlite`` is damaged (a card that rots a page) where labels it holds cannot be read: they are not
    thrown away by a new file; the trainer does not start until the farm restores it or keeps what can be read."""

    def __init__(self, path: Path, exc: BaseException, found: Salvage) -> None:
        if found.lossless:  # (met by a process that may not replace it: the retrain's, a command's)
            said = (
                f"{path}: damaged ({exc}); every label it holds can still be read ({found.describe()}): the trainer's next "
                "start keeps them in a new file, the damaged one kept beside"
            )
        else:
            said = (
                f"{path}: damaged ({exc}): some of the expert's labels it holds cannot be read, so the trainer does not "
                "start. Restore the trainer's state from the newest backup (edge-agent restore FILE), or keep the labels "
                f"that can still be read ({found.describe()}) with `edge-trainer salvage` (the damaged file is kept beside; "
                "the photos of the labels lost stay in samples/, and for 14 days the devices are asked to say again the expert's "
                "labels of those they still keep)"
            )
        super().__init__(said)
        self.path = path
        self.found = found


#: How long after a salvage that lost labels the devices are asked to say them again (:meth:`SampleStore.lost_ids`).
LOST_ASK_S = 14 * 86400.0

#: The generation of samples a publish is under way with (``pending:<tag>``); see :meth:`SampleStore.settle_pending`.
PENDING = "pending:"


def _open(path: Path) -> sqlite3.Connection:
    """``samples.sqlite`` opened to write, its tables made (and a store from before upgraded), read whole for damage."""
    db = connect_writable(path)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA)
        columns = {r[1] for r in db.execute("PRAGMA table_info(samples)")}
        if "first_label" not in columns:  # a store from before
            db.execute("ALTER TABLE samples ADD COLUMN first_label TEXT")
        if "device" not in columns:  # a store from before: no device recorded (no device withdraws those over CURVE)
            db.execute("ALTER TABLE samples ADD COLUMN device TEXT")
        check_whole(db)  # (a season's labels: milliseconds)
    except BaseException:
        db.close()
        raise
    return db


class SampleStore:
    def __init__(self, root: str | Path, recover: Literal["never", "lossless", "all"] = "never") -> None:
        """The store in ``root``. A damaged ``samples.sqlite`` raises :class:`SamplesDamaged`, nothing changed, unless
        ``recover`` (the one process that owns the file: the trainer's start, ``edge-trainer salvage``) replaces it by
        one holding every row that can still be read of it (the damaged one kept beside): where no label is lost (the
        damage lay in its index) with ``"lossless"``, whatever is lost with ``"all"``."""
        self.root = Path(root)
        (self.root / "samples").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        path = self.root / "samples.sqlite"
        #: What was done at the open of a damaged ``samples.sqlite`` (None: nothing), for the log and ``salvage``.
        self.recovered: str | None = None
        try:
            self._db = _open(path)
        except sqlite3.DatabaseError as exc:
            if storage_problem(exc) != "damaged":
                raise
            if recover == "never":  # what a salvage would keep, counted in memory: the file is another process's to replace
                with contextlib.closing(_open(Path(":memory:"))) as counted:
                    aside, found = None, salvage_rows(path, counted, TABLES)
            else:
                keep = (lambda found: found.lossless) if recover == "lossless" else (lambda found: True)
                aside, found = salvage_file(path, _open, TABLES, keep_if=keep)
            if aside is None:
                raise SamplesDamaged(path, exc, found) from None
            self.recovered = (
                f"{path.name} was damaged ({exc}): kept as {aside.name}; a new one holds what could be read ({found.describe()})"
            )
            self._db = _open(path)
            if not found.lossless:  # the devices are asked to say the labels lost again (:meth:`lost_ids`)
                self.set_state("labels_lost_at", str(time.time()))
        try:
            relocate_rows(self._db, "samples", "id", self.root)  # restored or copied to another path: the photos here
        except BaseException:
            self._db.close()
            raise
        #: Labels replaced by a later expert label since this store was opened (:meth:`add`).
        self.corrections = 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def has(self, sample_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM samples WHERE id = ?", (sample_id,)).fetchone() is not None

    def add(self, header: dict, photo: bytes) -> bool:
        """Store a sample durably; False if it was already stored as it is (a resend). An expert label for a photo
        stored as a pseudo-label or with another class replaces it (the expert corrected it), new again for the next
        retrain; a pseudo-label never replaces an expert label. An expert label put right keeps the place it arrived
        in (held back for the field check or not, as it was); one that replaces a pseudo-label arrives now."""
        with self._lock:
            row = self._db.execute("SELECT kind, label FROM samples WHERE id = ?", (header["id"],)).fetchone()
        if row is not None:
            if header["kind"] != "expert" or tuple(row) == ("expert", header["label"]):
                return False
            with self._lock:
                self._db.execute(
                    "UPDATE samples SET kind = 'expert', label = ?, confidence = ?, engine_version = ?, generation = NULL,"
                    " first_label = CASE kind WHEN 'expert' THEN COALESCE(first_label, label) ELSE ? END,"
                    " received = CASE kind WHEN 'expert' THEN received ELSE ? END WHERE id = ?",
                    (header["label"], float(header["confidence"]), header["engine_version"], header["label"], time.time(), header["id"]),
                )
                self.corrections += 1  # the counts may not change: what is read from the labels must be read again
            return True
        path = self.root / "samples" / f"{header['id']}{header['ext']}"
        atomic_write(path, photo)
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO samples (id, kind, label, confidence, engine_version, file, received, device)"
                " VALUES (?,?,?,?,?,?,?,?)",
                (
                    header["id"],
                    header["kind"],
                    header["label"],
                    float(header["confidence"]),
                    header["engine_version"],
                    str(path),
                    time.time(),
                    header.get("device") or None,
                ),
            )
        return cur.rowcount == 1

    def replace_photo(self, sample_id: str, old: str, data: bytes, ext: str) -> bool:
        """Keep sample ``sample_id``'s photo as ``data`` (a reduced copy) where its row still names the file ``old``."""
        new = self.root / "samples" / f"{sample_id}{ext}"
        return replace_row_file(self._db, self._lock, "samples", "id", sample_id, old, new, data)

    def all(self) -> list[Sample]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, kind, label, confidence, engine_version, file, received, generation, first_label FROM samples ORDER BY received"
            ).fetchall()
        return [Sample(*r) for r in rows]

    def mark_used(self, samples: Iterable[Sample], generation: str) -> None:
        """Mark ``samples`` (as :meth:`all` read them) used by ``generation``: a label the expert put right since they
        were read (:meth:`add`) stays new, for the next retrain, and is not taken as trained on."""
        with self._lock:
            self._db.executemany(
                "UPDATE samples SET generation = ? WHERE id = ? AND kind = ? AND label = ?",
                [(generation, s.id, s.kind, s.label) for s in samples],
            )

    def mark_pending(self, samples: Iterable[Sample], tag: str) -> None:
        """Mark ``samples`` as being published with ``tag`` (written into that version's manifest) before the publish, so
        a trainer stopped at any point afterwards can tell, on its next start, whether they were (:meth:`settle_pending`)."""
        self.mark_used(samples, PENDING + tag)

    def settle_pending(self, published_with: Callable[[str], str | None]) -> dict[str, str | None]:
        """Samples a stopped publish left pending: marked with the version published with their tag
        (``published_with(tag)``), or new again where none was. Returns tag -> version (None: made new again)."""
        with self._lock:
            tags = [
                g[len(PENDING) :]
                for (g,) in self._db.execute("SELECT DISTINCT generation FROM samples WHERE generation LIKE ?", (PENDING + "%",)).fetchall()
            ]
        settled = {}
        for tag in tags:
            settled[tag] = published_with(tag)
            with self._lock:
                self._db.execute("UPDATE samples SET generation = ? WHERE generation = ?", (settled[tag], PENDING + tag))
        return settled

    def drop_old_pseudo(self, per_class: int) -> tuple[int, int]:
        """Delete each class's pseudo-labels beyond its ``per_class`` newest (none being published: a publish under
        way settles them first); expert labels are never deleted. Returns (deleted, their bytes); the running total
        is kept in the state table (``pseudo_deleted``)."""
        if per_class <= 0:
            return 0, 0
        with self._lock:
            rows = self._db.execute(
                "SELECT id, label, file FROM samples WHERE kind = 'pseudo' AND COALESCE(generation, '') NOT LIKE ?"
                " ORDER BY received DESC, id",
                (PENDING + "%",),
            ).fetchall()
        seen: dict[str, int] = {}
        doomed = []
        for sample_id, label, file in rows:
            seen[label] = seen.get(label, 0) + 1
            if seen[label] > per_class:
                doomed.append((sample_id, file))
        if not doomed:
            return 0, 0
        gone = []
        with self._lock:  # the rows first: a photo without a row is never read, a row without its photo would be
            for sample_id, file in doomed:  # (not one the expert labelled since it was read: its photo stays)
                if self._db.execute("DELETE FROM samples WHERE id = ? AND kind = 'pseudo'", (sample_id,)).rowcount:
                    gone.append(file)
        size = 0
        for file in gone:
            try:
                size += Path(file).stat().st_size
                Path(file).unlink()
            except OSError:
                continue
        total = int(self.get_state("pseudo_deleted", "0") or 0) + len(gone)
        self.set_state("pseudo_deleted", str(total))
        return len(gone), size

    def withdraw(self, sample_id: str, label: str, engine_version: str, device: str | None = None) -> Sample | None:
        """Delete the pseudo-label of ``sample_id`` where it is still stored as this pseudo-label (the class ``label`` by
        ``engine_version``) and, where ``device`` names the device asking (its CURVE key's), as that device's; the
        sample deleted (its photo still on disk: the caller keeps or deletes it), or None where there was none (an
        expert label since, another label, another device's, never stored). The running total is kept in the state
        table (``pseudo_withdrawn``)."""
        with self._lock:
            row = self._db.execute(
                "SELECT id, kind, label, confidence, engine_version, file, received, generation, first_label FROM samples"
                " WHERE id = ? AND kind = 'pseudo' AND label = ? AND engine_version = ? AND (? IS NULL OR device = ?)",
                (sample_id, label, engine_version, device, device),
            ).fetchone()
            if row is None:
                return None
            self._db.execute("DELETE FROM samples WHERE id = ? AND kind = 'pseudo'", (sample_id,))
            total = self._db.execute("SELECT value FROM state WHERE key = 'pseudo_withdrawn'").fetchone()
            self._db.execute(
                "INSERT OR REPLACE INTO state (key, value) VALUES ('pseudo_withdrawn', ?)", (str(int(total[0] if total else 0) + 1),)
            )
        return Sample(*row)

    def counts(self) -> dict:
        with self._lock:
            rows = self._db.execute("SELECT kind, generation IS NULL, COUNT(*) FROM samples GROUP BY 1, 2").fetchall()
        out = {"pseudo": 0, "expert": 0, "new": 0, "new_expert": 0}
        for kind, new, n in rows:
            out[kind] = out.get(kind, 0) + n
            if new:
                out["new"] += n
                out["new_expert"] += n if kind == "expert" else 0
        return out

    def lost_ids(self, within_s: float = LOST_ASK_S) -> set[str]:
        """The photos kept in ``samples/`` whose labels a salvage lost (no row names them), for the devices to say again,
        within ``within_s`` of that salvage (after it, a photo no device answered for is given up)."""
        try:
            since = float(self.get_state("labels_lost_at", "0") or 0)
        except ValueError:
            since = 0.0
        if not since or time.time() - since > within_s:
            return set()
        with self._lock:
            named = {r[0] for r in self._db.execute("SELECT id FROM samples")}
        kept = {f.stem for f in (self.root / "samples").iterdir() if f.is_file() and len(f.stem) == 64}
        return {i for i in kept - named if all(c in "0123456789abcdef" for c in i)}

    def get_state(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_state(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO state (key, value) VALUES (?, ?)", (key, value))
