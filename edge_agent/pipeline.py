"""The photo pipeline: decode workers -> micro-batching inference -> one sink.

Every stage is joined by a bounded queue, so a slow stage pushes back on the
sources instead of growing memory. The sink makes a photo's outcome durable in
this order: label-queue file (fsynced) -> one SQLite transaction with the
result and the queue index -> only then the inbox file is moved, deleted or
left. A crash at any point therefore either repeats the work (the ledger turns
the repeat into a no-op) or finds it done; nothing is lost or counted twice.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import queue
import shutil
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from edge_agent.classifier import Classifier, Prediction
from edge_agent.golden import load_golden, save_golden
from edge_agent.labelqueue import Origin, PhotoSpool, QueueFull, SpoolItem
from edge_agent.log import display_name, get_logger
from edge_agent.imageheader import ImageRejected, ImageTruncated
from edge_agent.preprocess import preprocess_bytes, read_limited
from edge_agent.results import QueueEntry, ResultRow, ResultsDB
from edge_agent.worker import spawn

__all__ = ["Job", "Pipeline", "PipelineSettings", "LabelPolicy", "move_out"]

_STOP = object()


@dataclass
class Job:
    """One photo on its way through the pipeline."""

    source: str
    path: Path | None = None  # the inbox file; None for camera frames
    data: bytes | None = None
    detected: float = field(default_factory=time.time)
    sha256: str = ""
    tensor: np.ndarray | None = None
    prediction: Prediction | None = None
    error: str | None = None
    duplicate: bool = False
    timings: dict = field(default_factory=dict)
    ext: str = ".jpg"
    origin: Origin | None = None  # the inbox file as read, when the queue may hard-link it

    @property
    def photo_id(self) -> str:
        return self.sha256[:16] if self.sha256 else "-"

    @property
    def name(self) -> str:
        """The photo's path as text a log or the database takes (non-UTF-8 bytes escaped), or its source."""
        return display_name(self.path) if self.path is not None else self.source


@dataclass
class PipelineSettings:
    max_batch: int = 8
    max_wait_ms: float = 20.0
    decode_workers: int = 2
    queue_size: int = 32
    after: str = "move"  # move | delete | leave
    idle_trim_s: float = 1.0  # idle this long: the engine returns cached memory


@dataclass
class LabelPolicy:
    pseudo_threshold: float = 0.9
    per_class_cap: int = 500
    review_threshold: float = 0.9


class Pipeline:
    """Runs photos from :meth:`submit` to a committed result (or quarantine)."""

    def __init__(
        self,
        classifier: Classifier,
        db: ResultsDB,
        spool: PhotoSpool,
        state_dir: Path,
        settings: PipelineSettings,
        policy: LabelPolicy,
        on_done: Callable[[Job], None] | None = None,
        on_retry: Callable[[Job], None] | None = None,
        retry_incomplete: Callable[[Job], bool] | None = None,
    ) -> None:
        self.classifier = classifier
        self.db = db
        self.spool = spool
        self.settings = settings
        self.policy = policy
        self.processed_dir = state_dir / "processed"
        self.quarantine_dir = state_dir / "quarantine"
        self.on_done = on_done or (lambda job: None)
        self.on_retry = on_retry or (lambda job: None)
        self.retry_incomplete = retry_incomplete or (lambda job: False)
        self.log = get_logger("pipeline")
        n = settings.queue_size
        self._decode_q: queue.Queue = queue.Queue(n)
        self._infer_q: queue.Queue = queue.Queue(n)
        self._sink_q: queue.Queue = queue.Queue(n)
        self._lock = threading.Lock()
        self._in_flight = 0
        self.counters = {
            "processed": 0,
            "quarantined": 0,
            "duplicates": 0,
            "queued_pseudo": 0,
            "queued_review": 0,
            "queue_full_skips": 0,
            "sink_errors": 0,
            "batches": 0,
        }
        #: Increases whenever a photo finishes; the watchdog watches it.
        self.progress = 0
        self.last_progress = time.monotonic()
        self.last_errors: deque = deque(maxlen=10)
        self.queue_full = False
        self._pseudo_counts: dict[str, dict[str, int]] = {}  # engine version -> label -> queued
        self._golden: deque = deque(maxlen=16)  # (tensor, class index) of recent confident photos
        self.golden_file = state_dir / "golden.npz"  # kept across restarts, so a swap right after a start is checked too
        self._golden_saved = True
        self._load_golden()
        self._threads: list[threading.Thread] = []
        self._swap: Classifier | None = None
        self._closed = False
        self._day_dir: Path | None = None

    # ---- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        for i in range(self.settings.decode_workers):
            self._spawn(self._decode_loop, f"decode-{i}")
        self._spawn(self._infer_loop, "infer")
        self._spawn(self._sink_loop, "sink")

    def _spawn(self, target, name: str) -> None:
        self._threads.append(spawn(target, name))

    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def depths(self) -> dict[str, int]:
        return {"decode": self._decode_q.qsize(), "infer": self._infer_q.qsize(), "sink": self._sink_q.qsize()}

    def submit(self, job: Job, timeout: float | None = None) -> bool:
        """Queue a photo; blocks while the pipeline is full (back-pressure). False on timeout."""
        with self._lock:
            if self._in_flight == 0:  # idle until now: the stall clock starts with this photo
                self.last_progress = time.monotonic()
            self._in_flight += 1
        try:
            self._decode_q.put(job, timeout=timeout)
        except queue.Full:
            with self._lock:
                self._in_flight -= 1
            return False
        return True

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted photo is finished; True if it got there in time."""
        deadline = time.monotonic() + timeout
        while self._in_flight > 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        return self._in_flight == 0

    def stop(self) -> None:
        """Stop the stages; after a drain timeout a stuck stage is abandoned (its threads are daemons)."""
        for _ in range(self.settings.decode_workers):
            try:
                self._decode_q.put(_STOP, timeout=1.0)
            except queue.Full:
                break
        for t in self._threads:
            t.join(timeout=5)
        self._save_golden()
        self._closed = True  # anything a stuck stage finishes later stays in the inbox for the next start

    def swap_classifier(self, classifier: Classifier) -> None:
        """Use ``classifier`` from the next batch on (never mid-batch; at once when idle)."""
        self._swap = classifier

    def _apply_swap(self) -> None:
        if self._swap is not None:
            self.classifier, self._swap = self._swap, None
            self._golden.clear()  # golden labels come from the engine in service
            self._golden_saved = False

    def golden(self) -> list[tuple[np.ndarray, int]]:
        """Recent confident photos (preprocessed) with the running engine's class index."""
        return list(self._golden)

    def _save_golden(self) -> None:
        """Write the golden photos with the engine version they were labelled by; once per change."""
        golden = list(self._golden)
        if self._golden_saved or not golden:
            return
        try:
            save_golden(self.golden_file, golden, self.classifier.engine.engine_version)
            self._golden_saved = True
        except OSError as exc:  # a full disk: the check just starts empty after the next restart
            self.log.warning("golden_save_failed", error=str(exc))

    def _load_golden(self) -> None:
        """Golden photos of the engine now in service from before a restart; anything else is ignored."""
        try:
            found = load_golden(self.golden_file, self.classifier.spec.size)
        except ValueError as exc:  # truncated or tampered: not worth refusing to start over
            self.log.warning("golden_file_ignored", file=str(self.golden_file), error=str(exc))
            return
        if found is not None and found[0] == self.classifier.engine.engine_version:
            self._golden.extend(found[1])

    def _counts(self, engine_version: str) -> dict[str, int]:
        if engine_version not in self._pseudo_counts:
            self._pseudo_counts[engine_version] = dict(self.db.pseudo_counts(engine_version))
        return self._pseudo_counts[engine_version]

    # ---- stages -------------------------------------------------------------
    def _decode_loop(self) -> None:
        while True:
            job = self._decode_q.get()
            if job is _STOP:
                self._infer_q.put(_STOP)
                return
            try:
                self._decode(job)
            except Exception as exc:  # never let one photo kill a worker
                job.error = f"internal error while decoding: {exc!r}"
                self._sink_q.put(job)

    def _decode(self, job: Job) -> None:
        if job.error is not None:  # refused by the source (e.g. a symlink out of the inbox)
            self._sink_q.put(job)
            return
        spec = self.classifier.spec
        t0 = time.perf_counter()
        try:
            if job.data is None:
                job.origin = self._origin(job.path)
                job.data = read_limited(job.path, spec)
                job.ext = job.path.suffix.lower() or ".jpg"
            job.sha256 = hashlib.sha256(job.data).hexdigest()
            job.timings["read"] = round((time.perf_counter() - t0) * 1000, 3)
            if self.db.has(job.sha256):
                job.duplicate = True
                self._sink_q.put(job)
                return
            t1 = time.perf_counter()
            job.tensor = preprocess_bytes(job.data, spec)
            job.timings["preprocess"] = round((time.perf_counter() - t1) * 1000, 3)
        except ImageTruncated as exc:
            if self.retry_incomplete(job):
                self._finish(job, retried=True)
                return
            job.error = str(exc)
            self._sink_q.put(job)
            return
        except ImageRejected as exc:
            job.error = str(exc)
            self._sink_q.put(job)
            return
        self._infer_q.put(job)

    def _origin(self, path: Path) -> Origin | None:
        """The file's identity before reading it, when the label queue may link it: only a regular file
        that the daemon moves or deletes afterwards (with "leave" the owner may still change it in place)."""
        if self.settings.after == "leave":
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None  # read_limited says why
        return Origin(path, st.st_ino, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None

    def _infer_loop(self) -> None:
        stops = 0
        max_wait = self.settings.max_wait_ms / 1000
        trimmed = True
        while True:
            try:
                first = self._infer_q.get(timeout=self.settings.idle_trim_s)
            except queue.Empty:
                self._apply_swap()
                if not trimmed:  # idle: hand the engine's cached memory back once, keep the golden photos
                    trimmed = True
                    self._save_golden()
                    try:
                        self.classifier.engine.trim()
                    except Exception as exc:
                        self.log.warning("trim_failed", error=repr(exc))
                continue
            trimmed = False
            if first is _STOP:
                stops += 1
                if stops == self.settings.decode_workers:
                    self._sink_q.put(_STOP)
                    return
                continue
            batch = [first]
            deadline = time.monotonic() + max_wait
            while len(batch) < self.settings.max_batch:
                remaining = deadline - time.monotonic()
                try:
                    item = self._infer_q.get(timeout=max(remaining, 0)) if remaining > 0 else self._infer_q.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    self._infer_q.put(item)  # handle after this batch
                    break
                batch.append(item)
            self._apply_swap()
            try:
                preds = self.classifier.predict_tensors(np.stack([j.tensor for j in batch]))
            except Exception as exc:
                self.log.error("inference_failed", error=repr(exc), batch=len(batch))
                self.last_errors.append({"time": time.time(), "error": f"inference failed: {exc!r}"})
                for j in batch:
                    j.tensor = None
                    self._finish(j, retried=True)
                continue
            self.counters["batches"] += 1
            index = {c: i for i, c in enumerate(self.classifier.engine.classes)}
            for j, p in zip(batch, preds):
                j.prediction = p
                if p.verdict == "confident":
                    self._golden.append((j.tensor, index[p.label]))
                    self._golden_saved = False
                j.tensor = None
                j.timings["infer"] = p.timings_ms["infer"]
                j.timings["batch"] = len(batch)
                self._sink_q.put(j)

    def _sink_loop(self) -> None:
        while True:
            job = self._sink_q.get()
            if job is _STOP:
                return
            jobs = [job]
            while len(jobs) < 64:
                try:
                    nxt = self._sink_q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._sink_q.put(nxt)
                    break
                jobs.append(nxt)
            if self._closed:
                continue
            try:
                self._sink(jobs)
            except Exception as exc:  # disk full, database locked...: keep the photos for a retry
                self.counters["sink_errors"] += 1
                self.last_errors.append({"time": time.time(), "error": f"could not store results: {exc!r}"})
                self.log.error("sink_failed", error=repr(exc), photos=len(jobs))
                self._pseudo_counts.clear()  # recounted from the database
                for j in jobs:
                    self._finish(j, retried=True)
                time.sleep(1.0)

    # ---- the sink -------------------------------------------------------------
    def _label_decision(self, job: Job) -> tuple[str | None, str]:
        """Only a ``confident`` verdict becomes a pseudo-label; ``unknown`` always goes to review (a new class may be
        born there), and so does ``unsure`` below the review threshold or refused ``confident`` for its distance."""
        p = job.prediction
        if p.verdict == "confident" and p.confidence >= self.policy.pseudo_threshold:
            if self._counts(p.engine_version).get(p.label, 0) >= self.policy.per_class_cap:
                return None, "class cap reached"
            return "pseudo", ""
        if p.verdict == "unknown" or p.confidence < self.policy.review_threshold or p.confidence >= self.policy.pseudo_threshold:
            return "review", ""  # the last: sure by the softmax, but too far from the training photos to be trusted
        return None, ""

    def _sink(self, jobs: list[Job]) -> None:
        results, entries, queued_kind = [], [], {}
        classified = [j for j in jobs if j.prediction is not None and not j.duplicate and j.error is None]
        wanted = []
        for j in classified:
            kind, _ = self._label_decision(j)
            if kind is not None:
                wanted.append((j, kind))
                if kind == "pseudo":  # count now, so a batch of one class cannot overshoot the cap
                    counts = self._counts(j.prediction.engine_version)
                    counts[j.prediction.label] = counts.get(j.prediction.label, 0) + 1
        if wanted:
            try:  # one durability barrier for the batch's queue files, before the commit that lists them
                files = self.spool.put_many([SpoolItem(kind, j.sha256, j.data, j.ext, j.origin) for j, kind in wanted])
            except QueueFull as exc:
                files, reason = [None] * len(wanted), str(exc)
            else:
                reason = "label queue quota reached"
            skipped = [(j, kind) for (j, kind), f in zip(wanted, files) if f is None]
            for j, kind in skipped:
                if kind == "pseudo":
                    self._counts(j.prediction.engine_version)[j.prediction.label] -= 1
            if skipped:
                self.counters["queue_full_skips"] += len(skipped)
                if not self.queue_full:
                    self.log.warning("label_queue_full", reason=reason, policy="predictions continue, queuing paused")
            self.queue_full = bool(skipped)
            for (j, kind), f in zip(wanted, files):
                if f is None:
                    continue
                p = j.prediction
                entries.append(QueueEntry(j.sha256, j.photo_id, kind, p.label, p.confidence, p.engine_version, str(f), len(j.data)))
                queued_kind[j.sha256] = kind
        now = time.time()
        for j in classified:
            p = j.prediction
            j.timings["total"] = round((now - j.detected) * 1000, 3)
            results.append(
                ResultRow(j.sha256, j.photo_id, j.name if j.path else None, j.source, p.label, p.confidence,
                          [list(t) for t in p.top_k], p.engine_version, j.timings, now, p.verdict)
            )
        inserted = self.db.commit(results, entries) if results or entries else []
        late_dupes = {id(j) for j, ok in zip(classified, inserted) if not ok}
        for j in jobs:
            if j.error is not None:
                self._quarantine(j)
            elif j.duplicate or id(j) in late_dupes:
                if id(j) in late_dupes and queued_kind.get(j.sha256) == "pseudo":
                    self._counts(j.prediction.engine_version)[j.prediction.label] -= 1
                self.counters["duplicates"] += 1
                self.log.info("duplicate_photo", photo=j.name, photo_id=j.photo_id, action=self.settings.after)
                self._finalize_file(j)
                self._finish(j)
            else:
                p = j.prediction
                kind = queued_kind.get(j.sha256)
                if kind == "pseudo":
                    self.counters["queued_pseudo"] += 1
                elif kind == "review":
                    self.counters["queued_review"] += 1
                self.counters["processed"] += 1
                self.log.info(
                    "classified",
                    photo=j.name,
                    photo_id=j.photo_id,
                    label=p.label,
                    confidence=round(p.confidence, 4),
                    verdict=p.verdict,
                    engine_version=p.engine_version,
                    timings_ms=j.timings,
                    **({"queued": kind} if kind else {}),
                )
                self._finalize_file(j)
                self._finish(j)

    def _finalize_file(self, job: Job) -> None:
        if job.path is None or self.settings.after == "leave":
            return
        try:
            if self.settings.after == "delete":
                job.path.unlink(missing_ok=True)
            else:
                day_dir = self.processed_dir / datetime.now().strftime("%Y-%m-%d")
                if day_dir != self._day_dir:
                    day_dir.mkdir(parents=True, exist_ok=True)
                    self._day_dir = day_dir
                move_out(job.path, day_dir)
        except OSError as exc:  # the photo stays in the inbox; a rescan finds it again (as a duplicate: no second result)
            self._day_dir = None  # someone may have removed processed/: make it again next time
            self.last_errors.append({"time": time.time(), "error": f"could not move {job.name}: {exc}"})
            self.log.error("finalize_failed", photo=job.name, error=str(exc))

    def _quarantine(self, job: Job) -> None:
        moved_to = None
        try:
            name = job.path.name if job.path is not None else f"{job.source.replace('/', '_')}-{int(job.detected)}{job.ext}"
            if len(os.fsencode(name)) > 180:  # room for "-N" and ".reason.json" under the 255-byte name limit
                name = os.fsdecode(os.fsencode(name)[:120]) + f"-{job.photo_id if job.sha256 else int(job.detected)}{Path(name).suffix[:10]}"
            dst = _free_name(self.quarantine_dir / name)
            dst.parent.mkdir(parents=True, exist_ok=True)
            reason = {"photo": job.name, "reason": job.error, "source": job.source, "time": time.time()}
            dst.with_name(dst.name + ".reason.json").write_text(json.dumps(reason, indent=2) + "\n")
            if job.path is not None:
                if job.path.exists() or job.path.is_symlink():
                    shutil.move(str(job.path), dst)
            elif job.data is not None:
                dst.write_bytes(job.data)
            moved_to = str(dst)
        except OSError as exc:
            self.last_errors.append({"time": time.time(), "error": f"could not quarantine {job.name}: {exc}"})
        try:
            self.db.add_quarantine(job.name, moved_to, job.error or "", job.source)
        except Exception as exc:
            self.log.error("quarantine_record_failed", photo=job.name, error=repr(exc))
        self.counters["quarantined"] += 1
        self.last_errors.append({"time": time.time(), "photo": job.name, "error": job.error})
        self.log.warning("quarantined", photo=job.name, photo_id=job.photo_id, reason=job.error, moved_to=moved_to)
        self._finish(job)

    def _finish(self, job: Job, retried: bool = False) -> None:
        job.data = None
        with self._lock:
            self._in_flight -= 1
            self.progress += 1
            self.last_progress = time.monotonic()
        (self.on_retry if retried else self.on_done)(job)


#: link(2) errors meaning "no hard link here" (FAT, fs.protected_hardlinks for another user's file, link limit).
_NO_LINK = {errno.EPERM, errno.EACCES, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}


def move_out(src: Path, folder: Path) -> Path:
    """Move ``src`` into ``folder`` under a free name (``name-1.ext``... if taken); returns where it went.

    On the same filesystem this is link + unlink rather than rename: inotify then reports a deletion, which the
    folder source does not subscribe to, instead of a rename out of the inbox, which watchdog holds for half a
    second (and scans for on every later rename in) to pair it with a rename in that never comes. A name already
    linked to ``src`` (a crash between the two steps) is reused. No hard links there: rename; another
    filesystem: copy and delete."""
    for dst in _names(folder / src.name):
        try:
            os.link(src, dst, follow_symlinks=False)
        except FileExistsError:
            if _same_file(src, dst):
                break
            continue
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                dst = _free_name(dst)
                shutil.move(str(src), dst)
                return dst
            if exc.errno in _NO_LINK:
                dst = _free_name(dst)
                os.rename(src, dst)
                return dst
            raise
        break
    os.unlink(src)
    return dst


def _same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _names(path: Path):
    """``path``, then ``name-1.ext``, ``name-2.ext``...; OSError once they run out."""
    yield path
    for i in range(1, 100000):
        yield path.with_name(f"{path.stem}-{i}{path.suffix}")
    raise OSError(f"no free name for {path}")


def _free_name(path: Path) -> Path:
    """The first of :func:`_names` that does not exist."""
    return next(p for p in _names(path) if not p.exists())
