"""The trainer's pool of unlabelled field photos: bounded on disk, fair between devices, kept across restarts.

``<trainer state>/unlabelled/<sha256><ext>`` holds each photo (written atomically and fsynced) and
``unlabelled.sqlite`` the model's answer to it (class, verdict, confidence, version) and the device it came from;
a photo is acknowledged only once both are durable, so a trainer stopped at any point keeps what it acknowledged. The
pool holds at most ``[trainer] unlabelled_pool`` photos and ``unlabelled_pool_mb`` of disk: past either, photos leave
from the device holding the most, from that device's commonest (class, verdict), oldest first, so a device flooding
the pool evicts its own photos, never another device's, and the rarest answers stay. A photo that arrives labelled
(an expert label or a pseudo-label) leaves the pool: the label says more.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent.log import get_logger
from edge_agent.results import query_readonly
from edge_agent.storage_errors import open_or_set_aside
from engines.durable import atomic_write, check_whole, connect_writable, relocate_rows, replace_row_file

if TYPE_CHECKING:
    from trainer.samples import Sample

__all__ = ["UnlabelledPhoto", "UnlabelledPool", "pool_photos"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS pool (
    id TEXT PRIMARY KEY,
    device TEXT NOT NULL,
    label TEXT NOT NULL,
    verdict TEXT NOT NULL,
    confidence REAL NOT NULL,
    engine_version TEXT NOT NULL,
    file TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    received REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS pool_device ON pool(device, label, verdict, received);
"""


@dataclass(frozen=True)
class UnlabelledPhoto:
    """One photo of the pool and the model's answer to it when it was taken."""

    id: str
    device: str
    label: str
    verdict: str
    confidence: float
    engine_version: str
    file: str
    bytes: int
    received: float


class UnlabelledPool:
    """Unlabelled photos from the devices, bounded by count and bytes (see the module's docstring)."""

    def __init__(self, root: str | Path, max_photos: int, max_bytes: int) -> None:
        self.root = Path(root)
        self.dir = self.root / "unlabelled"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_photos, self.max_bytes = max_photos, max_bytes
        self._lock = threading.Lock()
        #: What was done about a damaged file (None: nothing), for the log.
        self.recovered: str | None = None
        # a cache of photos nobody labelled: a new one loses nothing to keep
        self._db, kept = open_or_set_aside(self.root / "unlabelled.sqlite", self._open)
        if kept is not None:
            self.recovered = f"unlabelled.sqlite was damaged ({kept[1]}): kept as {kept[0].name}, a new pool started"
        self.evicted = 0
        relocate_rows(self._db, "pool", "id", self.root)  # restored or copied to another path: the photos here
        self._sweep()

    def _open(self) -> sqlite3.Connection:
        db = connect_writable(self.root / "unlabelled.sqlite")
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(SCHEMA)
            check_whole(db)  # (at most the pool's photos' rows: milliseconds)
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _sweep(self) -> None:
        """Files without a row (a stop between the file and its row, or an eviction cut short) are removed."""
        with self._lock:
            known = {Path(f).name for (f,) in self._db.execute("SELECT file FROM pool")}
        for path in self.dir.iterdir():
            if path.name not in known:
                path.unlink(missing_ok=True)

    def add(self, header: dict, photo: bytes) -> bool:
        """Keep an unlabelled photo durably (evicting past the bounds); False: already held, or the pool keeps none."""
        if self.max_photos <= 0:
            return False
        with self._lock:
            if self._db.execute("SELECT 1 FROM pool WHERE id = ?", (header["id"],)).fetchone():
                return False
        path = self.dir / f"{header['id']}{header['ext']}"
        atomic_write(path, photo)
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO pool (id, device, label, verdict, confidence, engine_version, file, bytes, received)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    header["id"],
                    header.get("device") or "?",
                    header["label"],
                    header.get("verdict") or "unsure",
                    float(header["confidence"]),
                    header["engine_version"],
                    str(path),
                    len(photo),
                    time.time(),
                ),
            )
        self._evict()
        return True

    def keep_withdrawn(self, sample: Sample) -> bool:
        """A withdrawn pseudo-label's photo (:meth:`trainer.samples.SampleStore.withdraw`) kept as an unlabelled one, the
        pseudo-label its model answer; its sample file deleted whether kept or not (the label was the point)."""
        path = Path(sample.file)
        try:
            header = {
                "id": sample.id,
                "ext": path.suffix.lower() or ".jpg",
                "label": sample.label,
                "verdict": "confident",
                "confidence": sample.confidence,
                "engine_version": sample.engine_version,
            }
            return self.add(header, path.read_bytes()) if self.max_photos > 0 else False
        finally:
            path.unlink(missing_ok=True)

    def _evict(self) -> None:
        while True:
            with self._lock:
                n, size = self._db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM pool").fetchone()
                if n <= self.max_photos and size <= self.max_bytes:
                    return
                (device,) = self._db.execute("SELECT device FROM pool GROUP BY device ORDER BY COUNT(*) DESC, device LIMIT 1").fetchone()
                label, verdict = self._db.execute(
                    "SELECT label, verdict FROM pool WHERE device = ? GROUP BY 1, 2 ORDER BY COUNT(*) DESC, label, verdict LIMIT 1",
                    (device,),
                ).fetchone()
                pid, file = self._db.execute(
                    "SELECT id, file FROM pool WHERE device = ? AND label = ? AND verdict = ? ORDER BY received LIMIT 1",
                    (device, label, verdict),
                ).fetchone()
                self._db.execute("DELETE FROM pool WHERE id = ?", (pid,))
            Path(file).unlink(missing_ok=True)  # the row first: a file left behind is swept at the next start
            self.evicted += 1

    def discard(self, photo_id: str) -> None:
        """The photo arrived labelled: it leaves the pool."""
        with self._lock:
            row = self._db.execute("SELECT file FROM pool WHERE id = ?", (photo_id,)).fetchone()
            if row is None:
                return
            self._db.execute("DELETE FROM pool WHERE id = ?", (photo_id,))
        Path(row[0]).unlink(missing_ok=True)

    def replace_photo(self, photo_id: str, old: str, data: bytes, ext: str) -> bool:
        """Keep photo ``photo_id`` as ``data`` (a reduced copy) where its row still names the file ``old``."""
        new = self.dir / f"{photo_id}{ext}"
        return replace_row_file(self._db, self._lock, "pool", "id", photo_id, old, new, data, size_column="bytes")

    def photos(self) -> list[UnlabelledPhoto]:
        """Every photo held, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, device, label, verdict, confidence, engine_version, file, bytes, received FROM pool ORDER BY received"
            ).fetchall()
        return [UnlabelledPhoto(*r) for r in rows]

    def summary(self) -> dict:
        """Photos, bytes and photos per device, for the trainer's status."""
        with self._lock:
            n, size = self._db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM pool").fetchone()
            by_device = dict(self._db.execute("SELECT device, COUNT(*) FROM pool GROUP BY device").fetchall())
        return {"photos": n, "bytes": size, "by_device": by_device, "limit_photos": self.max_photos, "limit_bytes": self.max_bytes}


def pool_photos(root: str | Path, wait_s: float = 30.0) -> list[UnlabelledPhoto]:
    """The photos of the pool under ``root``, newest first, read without opening it for writing (a retrain's child
    process reads while the service's receiver adds and evicts: a photo evicted meanwhile is simply missing). A pool
    that cannot be read (locked past ``wait_s``, damaged) reads as empty and is logged: the retrain goes on without it."""
    path = Path(root) / "unlabelled.sqlite"
    try:
        rows = query_readonly(
            path,
            "SELECT id, device, label, verdict, confidence, engine_version, file, bytes, received FROM pool ORDER BY received DESC",
            timeout=wait_s,
        )
    except sqlite3.DatabaseError as exc:  # locked past the wait (LedgerUnreadable), or not a database
        get_logger("trainer").warning(
            "unlabelled_pool_unreadable",
            file=str(path),
            error=f"{type(exc).__name__}: {exc}",
            effect="this retrain learns from no unlabelled photo",
        )
        return []
    return [UnlabelledPhoto(*r) for r in rows]
