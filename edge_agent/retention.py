"""Retention: the state directory never fills the disk. Old photos and results go by age, and the oldest photos go
whenever the disk passes its floor; what the loop still needs stays.

* Processed photos (``processed/YYYY-MM-DD/``) older than ``[retention] photo_days`` are removed, whole days, oldest
  first; result rows older than ``result_days`` (per source: ``source_result_days``) and the page's cached
  thumbnails too. A result row may outlive its photo: the history stays. The ledger's records of what was handed to
  the trainer (pseudo-labels delivered, unlabelled photos) go after ``result_days`` too, but a withdrawal the trainer
  has not yet confirmed and a photo still in the review pool (it would be handed over again).
* Whenever less than the floor is free (``min_free_gb`` or ``min_free_percent`` of the disk, whichever is smaller), the
  oldest processed photos go, then the oldest thumbnails, until the floor is met; looked at every minute. A photo the
  label queue or review pool holds too (the same file, hard-linked) stays: deleting it would free nothing.
* Old engine versions: the farm's own retrains beyond the ``engine_versions`` newest, on each pass by age
  (:mod:`edge_agent.engine_keep`; never the one in service, a release, a rollback's pin or the golden photos' version).
* Measured, never removed: the photos of the labels a trainer sharing the state directory holds (``trainer/samples``:
  the expert's are the farm's truth, its pseudo-labels bounded by ``[trainer] pseudo_per_class``).
* Never removed: the label queue's and review pool's photos (``queue/``: copies of their own, which the hand-off
  and the expert need), the golden photos (``golden.npz``), and the photo of an alert not yet delivered (its link
  must open).

:class:`Retention` runs in the daemon as a thread; :meth:`Retention.status` is what ``status``, the Health page and
``/metrics`` show: what is kept, what was pruned, the floor.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path

from edge_agent.clock import ClockWatch
from edge_agent.config import RetentionSection
from edge_agent.engine_keep import prune_engines
from edge_agent.inbox_files import places
from edge_agent.log import get_logger
from edge_agent.results import ResultsDB, query_readonly
from edge_agent.worker import Worker
from engines.prune import store_bytes
from engines.store import EngineStore, sha256_file

__all__ = ["Retention", "Pruned", "floor_bytes", "pending_alert_photos"]

DiskUsage = Callable[[Path], "shutil._ntuple_diskusage"]


def floor_bytes(section: RetentionSection, total: int) -> int:
    """The free space to keep: ``min_free_gb`` or ``min_free_percent`` of a ``total``-byte disk, whichever is smaller."""
    return int(min(section.min_free_gb * (1 << 30), section.min_free_percent / 100 * total))


@dataclass
class Pruned:
    """What one pass removed."""

    photos: int = 0
    photo_bytes: int = 0
    results: int = 0
    thumbs: int = 0
    engines: int = 0  # engine versions deleted
    engine_bytes: int = 0
    kept_for_alerts: int = 0
    records: int = 0  # ledger rows of what was handed to the trainer
    notes: list[str] = field(default_factory=list)

    def add(self, other: Pruned) -> None:
        self.photos += other.photos
        self.photo_bytes += other.photo_bytes
        self.results += other.results
        self.thumbs += other.thumbs
        self.engines += other.engines
        self.engine_bytes += other.engine_bytes
        self.records += other.records


def pending_alert_photos(state_root: Path, db: ResultsDB, wait_s: float = 30.0) -> dict[str, tuple[float, str]]:
    """The photos of alerts not yet delivered somewhere: sha256 -> (when classified, the path it arrived as).
    Raises :class:`~edge_agent.results.LedgerUnreadable` when the outbox stays locked ``wait_s``: nothing is pruned."""
    ids = set()
    outbox = state_root / "alerts.sqlite"
    for (payload,) in query_readonly(outbox, "SELECT payload FROM outbox WHERE kind = 'alert'", timeout=wait_s):
        try:
            ids.add(str(json.loads(bytes(payload))["photo_id"]))
        except (ValueError, KeyError, TypeError):
            continue
    return {sha: (created, path) for sha, created, path in db.photos_by_id(ids)}


def _files_in(folder: Path) -> tuple[int, int]:
    """How many files ``folder`` holds (not below it) and their bytes; (0, 0) where it is missing or unreadable."""
    count = size = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        count, size = count + 1, size + entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        pass
    return count, size


def _date(ts: float) -> date:
    return datetime.fromtimestamp(ts).date()


def _midnight(day: date) -> float:
    """When ``day`` began, local time: the earliest a photo filed under it was stamped."""
    return datetime.combine(day, datetime.min.time()).timestamp()


def _day(folder: Path) -> date | None:
    try:
        return datetime.strptime(folder.name, "%Y-%m-%d").date()
    except ValueError:
        return None


class Retention(Worker):
    """Prunes ``state_root`` by ``section``; ``now`` and ``usage`` are injectable (a simulated month, a small disk)."""

    thread_name = "retention"
    floor_every_s = 60.0
    alerts_wait_s = 30.0  # how long a pass waits for a locked alerts outbox before it prunes nothing this time

    def __init__(
        self,
        section: RetentionSection,
        state_root: Path,
        db: ResultsDB,
        now: Callable[[], float] = time.time,
        usage: DiskUsage = shutil.disk_usage,
        clock: ClockWatch | None = None,
        store: EngineStore | None = None,
        serving: Callable[[], str] = lambda: "",
        engine_cache: str = "",
    ) -> None:
        """``store``: the engine store whose old retrains go (None: none, as the package's own store), ``serving``
        the version the daemon serves now, ``engine_cache`` the engines' cache folder."""
        super().__init__()
        self.section, self.root, self.db, self.now, self.usage = section, Path(state_root), db, now, usage
        self.store, self.serving, self.engine_cache = store, serving, engine_cache
        self.clock = clock or ClockWatch(self.root / "clock.json", wall=now)
        self.processed, self.thumbs = self.root / "processed", self.root / "web" / "thumbs"
        self.log = get_logger("retention")
        self.pruned = Pruned()  # since start
        self.kept: dict = {}
        self.last_pass: float | None = None
        self._hashes: dict[Path, tuple[int, int, str]] = {}

    # ---- what is there ------------------------------------------------------------
    def _photos_oldest_first(self) -> list[tuple[date, Path]]:
        days = (
            sorted((d, p) for p in self.processed.iterdir() if p.is_dir() and (d := _day(p)) is not None) if self.processed.is_dir() else []
        )
        out = []
        for d, folder in days:
            files = []
            for f in folder.iterdir():
                try:
                    if f.is_file():
                        files.append((f.stat().st_mtime, f))
                except OSError:
                    continue
            out += [(d, f) for _, f in sorted(files)]
        return out

    def _protected(self, pending: dict[str, tuple[float, str]]) -> set[Path]:
        """The files of the ``pending`` alerts' photos (:func:`pending_alert_photos`): found where the daemon moves a
        photo (:func:`~edge_agent.inbox_files.places`), checked by hash."""
        keep = set()
        for sha, (created, path) in pending.items():
            for candidate in places(self.root, path, created) if path else ():
                try:
                    if candidate.is_file() and self._hash_of(candidate) == sha:
                        keep.add(candidate)
                        break
                except OSError:
                    continue
        return keep

    def _hash_of(self, path: Path) -> str:
        """``path``'s sha256, remembered while its size and mtime stay (an alert pending for days is hashed once)."""
        st = path.stat()
        known = self._hashes.get(path)
        if known is None or known[:2] != (st.st_size, st.st_mtime_ns):
            known = self._hashes[path] = (st.st_size, st.st_mtime_ns, sha256_file(path))
        return known[2]

    def _remove(self, path: Path, pruned: Pruned, frees_only: bool = False) -> None:
        """Delete a processed photo, counting the bytes that frees: none where the label queue or review pool holds the
        same file (a hard link, as the spool makes); with ``frees_only`` (the floor) such a photo is kept instead."""
        try:
            st = path.stat()
            if frees_only and st.st_nlink > 1:
                return
            path.unlink()
        except OSError:
            return
        pruned.photos += 1
        pruned.photo_bytes += st.st_size if st.st_nlink == 1 else 0

    # ---- the passes -----------------------------------------------------------------
    def by_age(self) -> Pruned:
        """Photos older than ``photo_days``, results and thumbnails older than ``result_days``."""
        s, now, pruned = self.section, self.now(), Pruned()
        pending = pending_alert_photos(self.root, self.db, self.alerts_wait_s)
        shift = self.clock.shift  # a record's age counted on the clock that stamped it (a jump forward ages nothing)
        if s.photo_days > 0:
            photo_cutoff = now - s.photo_days * 86400
            self._prune_photos(pruned, lambda day: day >= _date(photo_cutoff - shift(_midnight(day))), pending)
        keep = set(pending)
        sources = dict(s.source_result_days)
        try:
            if s.result_days > 0:
                default_sources = [src for src in self.db.sources() if src not in sources]
                for src in default_sources:
                    pruned.results += self._prune_results(now - s.result_days * 86400, src, keep)
            for src, days in sources.items():
                if days > 0:
                    pruned.results += self._prune_results(now - days * 86400, src, keep)
            if s.result_days > 0:
                pruned.records += self._prune_records(now - s.result_days * 86400)
        except sqlite3.Error as exc:  # a locked or full disk: next pass
            pruned.notes.append(f"results not pruned: {exc}")
        if s.result_days > 0:
            pruned.thumbs += self._prune_thumbs(lambda mtime: mtime < now - s.result_days * 86400 - shift(mtime))
        return pruned

    def _prune_results(self, cutoff: float, source: str, keep: set[str]) -> int:
        """``source``'s result rows older than ``cutoff``, each counted on the clock that stamped it."""
        return sum(
            self.db.prune_results(hi, source, keep, since=None if math.isinf(lo) else lo) for lo, hi in self.clock.older_than(cutoff)
        )

    def _prune_records(self, cutoff: float) -> int:
        """The records of pseudo-labels delivered and unlabelled photos handed over before ``cutoff``, each counted on
        the clock that stamped it."""
        return sum(self.db.prune_pseudo_sent(hi, lo) + self.db.prune_unlabelled_sent(hi, lo) for lo, hi in self.clock.older_than(cutoff))

    def to_floor(self) -> Pruned:
        """The oldest photos, then thumbnails, until the disk has its floor free."""
        pruned = Pruned()
        u = self.usage(self.root)
        floor = floor_bytes(self.section, u.total)
        if u.free >= floor:
            return pruned
        need = floor - u.free
        pending = pending_alert_photos(self.root, self.db, self.alerts_wait_s)
        self._prune_photos(pruned, lambda day: pruned.photo_bytes >= need, pending, frees_only=True)
        if pruned.photo_bytes < need:
            pruned.thumbs += self._prune_thumbs(lambda mtime: True, need - pruned.photo_bytes)
        return pruned

    def _prune_photos(
        self, pruned: Pruned, enough: Callable[[date], bool], pending: dict[str, tuple[float, str]], frees_only: bool = False
    ) -> None:
        """Remove processed photos oldest first until ``enough(day of the next)``, never a ``pending`` alert's (nor,
        with ``frees_only``, one whose removal frees nothing: :meth:`_remove`)."""
        protected = self._protected(pending)
        for day, f in self._photos_oldest_first():
            if enough(day):
                break
            if f in protected:
                pruned.kept_for_alerts += 1
                continue
            self._remove(f, pruned, frees_only)
        self._drop_empty_days()

    def _prune_thumbs(self, old: Callable[[float], bool], need: int | None = None) -> int:
        if not self.thumbs.is_dir():
            return 0
        files = []
        for f in self.thumbs.rglob("*"):
            try:
                st = f.stat()
            except OSError:
                continue
            if f.is_file() and old(st.st_mtime):
                files.append((st.st_mtime, st.st_size, f))
        gone, freed = 0, 0
        for _, size, f in sorted(files):
            if need is not None and freed >= need:
                break
            try:
                f.unlink()
            except OSError:
                continue
            gone, freed = gone + 1, freed + size
        return gone

    def old_engines(self) -> Pruned:
        """Delete the store's old retrains (:func:`edge_agent.engine_keep.prune_engines`)."""
        if self.store is None or not self.section.engine_versions:
            return Pruned()
        deleted = prune_engines(self.store, self.section.engine_versions, self.root, [self.serving()], self.engine_cache, self.log)
        return Pruned(engines=len(deleted), engine_bytes=sum(d.bytes for d in deleted))

    def _drop_empty_days(self) -> None:
        if self.processed.is_dir():
            today = datetime.fromtimestamp(self.now()).strftime("%Y-%m-%d")
            for folder in self.processed.iterdir():
                if folder.is_dir() and folder.name != today:
                    try:
                        folder.rmdir()  # only when empty
                    except OSError:
                        pass

    def run_once(self, age: bool = True) -> Pruned:
        """One pass (by age when ``age``, then the floor); the counters and :attr:`kept` updated, the pass logged."""
        self.clock.look()
        pruned = self.by_age() if age else Pruned()
        if age:
            pruned.add(self.old_engines())
        pruned.add(self.to_floor())
        self.pruned.add(pruned)
        self.last_pass = self.now()
        self._measure()
        if pruned.photos or pruned.results or pruned.thumbs or pruned.records:
            self.log.info(
                "pruned",
                photos=pruned.photos,
                mb=round(pruned.photo_bytes / 1e6, 1),
                results=pruned.results,
                thumbnails=pruned.thumbs,
                records=pruned.records,
                free_gb=round(self.kept.get("free_bytes", 0) / 1e9, 2),
            )
        if self.kept.get("below_floor"):
            self.log.warning("disk_below_floor", **{k: self.kept[k] for k in ("free_bytes", "floor_bytes", "largest")})
        return pruned

    def _measure(self) -> None:
        photos = self._photos_oldest_first()
        size = 0
        for _, f in photos:
            try:
                size += f.stat().st_size
            except OSError:
                pass
        u = self.usage(self.root)
        floor = floor_bytes(self.section, u.total)
        engines = store_bytes(self.store) if self.store is not None else None
        labels = _files_in(self.root / "trainer" / "samples")
        self.kept = {
            "photos": len(photos),
            "photo_bytes": size,
            **({"engines": engines[0], "engine_bytes": engines[1]} if engines else {}),
            **({"trainer_photos": labels[0], "trainer_bytes": labels[1]} if labels[0] else {}),
            "oldest_photo_day": photos[0][0].isoformat() if photos else None,
            "free_bytes": u.free,
            "floor_bytes": floor,
            "below_floor": u.free < floor,
        }
        if u.free < floor:  # nothing more of ours may go: say what holds the disk
            sizes = {}
            for name in ("queue", "processed", "engines", "trainer", "web", "results.sqlite", "alerts.sqlite"):
                p = self.root / name
                sizes[name] = (
                    p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.exists() else 0
                )
            self.kept["largest"] = sorted(((n, b) for n, b in sizes.items() if b), key=lambda kv: -kv[1])[:3]

    def status(self) -> dict:
        """What is kept, what was pruned since start, the floor: for ``status``, the Health page and ``/metrics``."""
        s = self.section
        return {
            "enabled": s.enabled,
            "photo_days": s.photo_days,
            "result_days": s.result_days,
            **self.kept,
            "pruned_photos": self.pruned.photos,
            "pruned_bytes": self.pruned.photo_bytes,
            "pruned_results": self.pruned.results,
            "pruned_thumbnails": self.pruned.thumbs,
            "pruned_records": self.pruned.records,
            "pruned_engines": self.pruned.engines,
            "pruned_engine_bytes": self.pruned.engine_bytes,
            "engine_versions": s.engine_versions,
            "last_pass": self.last_pass,
            "clock_jumps": [j._asdict() for j in self.clock.jumps[-5:]],
            "clock_note": self.clock.note(),
        }

    # ---- the thread -----------------------------------------------------------------
    def _run(self) -> None:
        next_age = time.monotonic() + 10.0  # not in the way of the start
        while not self._stop.wait(0 if self.last_pass is None else max(0.0, min(self.floor_every_s, next_age - time.monotonic()))):
            age = time.monotonic() >= next_age
            try:
                self.run_once(age=age)
            except Exception as exc:  # noqa: BLE001 - a disk error: log, try again next time
                self.log.warning("retention_pass_failed", error=repr(exc)[:300])
                self.last_pass = self.now()
            if age:
                next_age = time.monotonic() + self.section.interval_s
