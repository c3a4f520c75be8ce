"""The photo pipeline: decode workers -> micro-batching inference -> one sink.

Every stage is joined by a bounded queue, so a slow stage pushes back on the
sources instead of growing memory. The sink makes a photo's outcome durable in
this order: label-queue file (fsynced, :mod:`edge_agent.labelling`) -> one
SQLite transaction with the result and the queue index -> only then the inbox
file is moved, deleted or left (:mod:`edge_agent.inbox_files`). A crash at any
point therefore either repeats the work (the ledger turns the repeat into a
no-op) or finds it done; nothing is lost or counted twice.
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge_agent._pipeline_idle import IdleWork
from edge_agent.capture import Capture, read_capture
from edge_agent.capture_place import Place
from edge_agent.capture_time import CLOCK_WINDOW
from edge_agent.classifier import Classifier, Prediction
from edge_agent.config import LabelsSection, PipelineSection
from edge_agent.golden import GoldenSet
from edge_agent.imageheader import ImageRejected, ImageTruncated
from edge_agent.inbox_files import After, InboxFiles
from edge_agent.labelling import LabelQueuer
from edge_agent.latency import LatencyHistograms
from edge_agent.ledger_rows import ResultRow
from edge_agent.log import display_name, get_logger
from edge_agent.plants import plant_of
from edge_agent.preprocess import preprocess_bytes, read_limited
from edge_agent.results import ResultsDB
from edge_agent.review.reanswer import PoolAnswers
from edge_agent.review.trusted_pool import TrustedPool
from edge_agent.review.withdraw import Withdrawals
from edge_agent.spool import Origin, PhotoSpool
from edge_agent.storage_errors import FAILING_DISK, disk_problem
from edge_agent.worker import spawn

__all__ = ["READ_ONLY_WAIT_S", "STOP_JOIN_S", "Job", "Pipeline"]

_STOP = object()

#: Seconds the stages together get to end once stopped (after the drain): a stage stuck in inference is abandoned then.
STOP_JOIN_S = 5.0

#: How long the inference thread waits for a photo between batches of the review pool it answers again.
POOL_WAIT_S = 0.05
#: Seconds the sink waits before it tries again to store results on a state directory whose disk is mounted read-only
#: (a failing SD card): the photos are kept for then, and the stages wait behind it instead of classifying the inbox
#: again every few seconds for nothing.
READ_ONLY_WAIT_S = 60.0
#: What a photo that cannot leave a read-only inbox is told (the hardened systemd unit opens only the folders
#: ``install-systemd`` was given).
_READ_ONLY_INBOX = (
    " (the inbox is read-only to the daemon: under systemd, run sudo edge-agent install-systemd again to open [inbox] path "
    "to it, then restart edge-agent)"
)


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
    capture: Capture = Capture()  # when and where the photo was taken, from its EXIF (edge_agent.capture)
    place: Place | None = None  # where a fixed camera stands ([camera] place): its frames' place

    @property
    def photo_id(self) -> str:
        return self.sha256[:16] if self.sha256 else "-"

    @property
    def name(self) -> str:
        """The photo's path as text a log or the database takes (non-UTF-8 bytes escaped), or its source."""
        return display_name(self.path) if self.path is not None else self.source


class Pipeline(IdleWork):
    """Runs photos from :meth:`submit` to a committed result (or quarantine)."""

    def __init__(
        self,
        classifier: Classifier,
        db: ResultsDB,
        spool: PhotoSpool,
        state_dir: Path,
        settings: PipelineSection,
        policy: LabelsSection,
        after: After = "move",
        on_done: Callable[[Job], None] | None = None,
        on_retry: Callable[[Job], None] | None = None,
        retry_incomplete: Callable[[Job], bool] | None = None,
        inbox: Path | None = None,
    ) -> None:
        """``inbox``: where the folder source watches (a photo in a subfolder of it belongs to that plant)."""
        self.classifier = classifier
        self.inbox = inbox
        self.db = db
        self.spool = spool
        self.settings = settings
        self.files = InboxFiles(state_dir, after)
        self.labels = LabelQueuer(db, spool, policy)
        #: The review pool answered again by the engine in service while idle (``[labels] reanswer_pool``).
        self.pool_answers = PoolAnswers(db, settings.max_batch) if policy.reanswer_pool else None
        self._pool_answered = 0
        self._pool_warned: str | None = None  # the error the pool's pseudo-labels last met (said once)
        #: The review pool's photos that trust now covers, made pseudo-labels while idle.
        self.trusted_pool = TrustedPool(db, self.labels)
        #: Pseudo-labels taken back when the expert finds a sure answer of their class by their engine wrong.
        self.withdrawals = Withdrawals(db, policy)
        self.on_done = on_done or (lambda job: None)
        self.on_retry = on_retry or (lambda job: None)
        self.retry_incomplete = retry_incomplete or (lambda job: False)
        self.log = get_logger("pipeline")
        n = settings.queue_size
        self._decode_q: queue.Queue = queue.Queue(n)
        self._infer_q: queue.Queue = queue.Queue(n)
        self._sink_q: queue.Queue = queue.Queue(n)
        self._broke_lock = threading.Lock()
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
            "inference_errors": 0,
            "batches": 0,
        }
        #: Increases whenever a photo finishes; the watchdog watches it.
        self.progress = 0
        self.last_progress = time.monotonic()
        self.last_errors: deque = deque(maxlen=10)
        self.camera_clocks: deque = deque(maxlen=CLOCK_WINDOW)  # Capture.ahead of the latest photos with a zoned time
        self.latency = LatencyHistograms()
        #: Recent confident photos, kept across restarts, so a swap right after a start is checked too (hotswap.py).
        self.state_dir = state_dir
        self.golden = GoldenSet(state_dir / "golden.npz")
        self.golden.load(classifier.engine.engine_version, classifier.spec.size)
        self._threads: list[threading.Thread] = []
        self._swap: Classifier | None = None
        self._closed = False

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
    def ledger_damaged(self) -> str | None:
        """What SQLite said of a damaged page of the ledger, once this or another part met it (:meth:`ResultsDB.damaged`):
        nothing more is tried, the photos stay in the inbox, and the daemon stops so its next start sets it aside."""
        return self.db.damage_seen

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
        deadline = time.monotonic() + STOP_JOIN_S  # one deadline for every stage: a stuck one costs it once, not each
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self.golden.save(self.classifier.engine.engine_version)
        self._closed = True  # anything a stuck stage finishes later stays in the inbox for the next start

    def swap_classifier(self, classifier: Classifier) -> None:
        """Use ``classifier`` from the next batch on (never mid-batch; at once when idle)."""
        self._swap = classifier

    def _apply_swap(self) -> None:
        if self._swap is not None:
            self.classifier, self._swap = self._swap, None
            self.golden.restart()  # golden labels come from the engine in service

    @property
    def queue_full(self) -> bool:
        """The label queue's quota stopped the last batch from queuing."""
        return self.labels.full

    # ---- stages -------------------------------------------------------------
    def _decode_loop(self) -> None:
        while True:
            job = self._decode_q.get()
            if job is _STOP:
                self._infer_q.put(_STOP)
                return
            if self.ledger_damaged is not None:  # the daemon is stopping: the photos wait in the inbox
                self._finish(job, retried=True)
                continue
            try:
                self._decode(job)
            except Exception as exc:  # never let one photo kill a worker
                if self._ledger_broke(exc):  # (the exactly-once check read a damaged page): not the photo's fault
                    self._finish(job, retried=True)
                    continue
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
            job.capture = read_capture(job.data, job.detected)
            if job.capture.place is None and job.place is not None:  # a fixed camera's frame: where it stands
                job.capture = job.capture._replace(place=job.place)
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
        if self.files.after == "leave":
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None  # read_limited says why
        return Origin(path, st.st_ino, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None

    def _infer_loop(self) -> None:
        stops = 0
        max_wait = self.settings.max_wait_ms / 1000
        trimmed = False  # the start-up's loading and warm-up leave memory to hand back too
        while True:
            try:
                first = self._infer_q.get(timeout=POOL_WAIT_S if self._pool_due() else self.settings.idle_trim_s)
            except queue.Empty:
                self._apply_swap()
                if self._answer_pool():
                    trimmed = False  # (trimmed once the pool is done)
                    continue
                self._pool_to_pseudo()
                if not trimmed:  # idle: hand the engine's cached memory back once, keep the golden photos
                    trimmed = True
                    self.golden.save(self.classifier.engine.engine_version)
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
                self.counters["inference_errors"] += 1
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
                    self.golden.add(j.tensor, index[p.label])
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
            if self.ledger_damaged is not None:  # the daemon is stopping: the photos wait in the inbox
                for j in jobs:
                    self._finish(j, retried=True)
                continue
            try:
                self._sink(jobs)
            except Exception as exc:  # disk full, database locked...: keep the photos for a retry
                if self._ledger_broke(exc):
                    for j in jobs:
                        self._finish(j, retried=True)
                    continue
                self.counters["sink_errors"] += 1
                self.last_errors.append({"time": time.time(), "error": f"could not store results: {exc!r}"})
                frozen = disk_problem(self.state_dir)  # read-only or failing: a minute between tries, not a second
                self.log.error("sink_failed", error=repr(exc), photos=len(jobs), **({"problem": frozen} if frozen else {}))
                self.labels.recount()
                for j in jobs:
                    self._finish(j, retried=True)
                time.sleep(READ_ONLY_WAIT_S if frozen else 1.0)

    def _ledger_broke(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a page of the ledger is damaged or its disk fails (:meth:`ResultsDB.damaged`); the
        first time, say so."""
        with self._broke_lock:  # (the decode workers meet it together: the disk's probe takes a moment)
            first = self.db.damage_seen is None
            if not self.db.damaged(exc):
                return False
        if first and self.db.disk_fails:  # (SQLite calls a ledger on a disk that fails every read "malformed")
            self.last_errors.append({"time": time.time(), "error": FAILING_DISK})
            self.log.error("state_disk_failing", error=repr(exc), problem=FAILING_DISK, then="the daemon stops")
        elif first:
            self.last_errors.append({"time": time.time(), "error": f"the results database is damaged: {exc!r}"})
            self.log.error("ledger_damaged", error=repr(exc), then="the daemon stops; its next start sets the ledger aside")
        return True

    # ---- the sink: queue the labels, commit, then the files ----------------------------
    def _sink(self, jobs: list[Job]) -> None:
        classified = [j for j in jobs if j.prediction is not None and not j.duplicate and j.error is None]
        queued = self.labels.queue(classified)
        self.counters["queue_full_skips"] += queued.skipped
        inserted = self._commit(classified, queued.entries)
        late_dupes = {id(j) for j, ok in zip(classified, inserted) if not ok}
        for j in jobs:
            if j.error is not None:
                self._quarantine(j)
            elif j.duplicate or id(j) in late_dupes:
                if id(j) in late_dupes:
                    self.labels.not_committed(j, queued.kinds.get(j.sha256))
                self._duplicate(j)
            else:
                self._classified(j, queued.kinds.get(j.sha256))

    def _commit(self, classified: list[Job], entries) -> list[bool]:
        """One transaction for the batch's results and queue rows; per photo, whether its row is new."""
        now = time.time()
        results = []
        for j in classified:
            p = j.prediction
            j.timings["total"] = round((now - j.detected) * 1000, 3)
            self.latency.observe(j.timings)
            results.append(
                ResultRow(
                    j.sha256,
                    j.photo_id,
                    j.name if j.path else None,
                    j.source,
                    p.label,
                    p.confidence,
                    [list(t) for t in p.top_k],
                    p.engine_version,
                    j.timings,
                    now,
                    p.verdict,
                    plant_of(j.path, self.inbox) if self.inbox is not None else None,
                    p.verdict_reason,
                    j.capture.taken,
                    *(j.capture.place or (None, None)),
                )
            )
        pooled = {q.sha256 for q in entries if q.kind == "review"}  # (the only photos whose distances are kept)
        kept = {
            j.sha256: (j.prediction.engine_version, j.prediction.distances.tobytes())
            for j in classified
            if j.sha256 in pooled and j.prediction.distances is not None
        }
        return self.db.commit(results, entries, kept) if results or entries else []

    def _classified(self, job: Job, kind: str | None) -> None:
        p = job.prediction
        if job.capture.ahead is not None:
            self.camera_clocks.append(job.capture.ahead)
        if kind is not None:
            self.counters[f"queued_{kind}"] += 1
        self.counters["processed"] += 1
        self.log.info(
            "classified",
            photo=job.name,
            photo_id=job.photo_id,
            label=p.label,
            confidence=round(p.confidence, 4),
            verdict=p.verdict,
            engine_version=p.engine_version,
            timings_ms=job.timings,
            **({"queued": kind} if kind else {}),
        )
        self._leave_inbox(job)
        self._finish(job)

    def _duplicate(self, job: Job) -> None:
        self.counters["duplicates"] += 1
        self.log.info("duplicate_photo", photo=job.name, photo_id=job.photo_id, action=self.files.after)
        self._leave_inbox(job)
        self._finish(job)

    def _leave_inbox(self, job: Job) -> None:
        if job.path is None:
            return
        try:
            self.files.finish(job.path)
        except OSError as exc:  # the photo stays in the inbox; a rescan finds it again (as a duplicate: no second result)
            hint = _READ_ONLY_INBOX if exc.errno == errno.EROFS else ""
            self.last_errors.append({"time": time.time(), "error": f"could not move {job.name}: {exc}{hint}"})
            self.log.error("finalize_failed", photo=job.name, error=str(exc) + hint)

    def _quarantine(self, job: Job) -> None:
        moved_to = None
        name = job.path.name if job.path is not None else f"{job.source.replace('/', '_')}-{int(job.detected)}{job.ext}"
        reason = {"photo": job.name, "reason": job.error, "source": job.source, "time": time.time()}
        try:
            tag = job.photo_id if job.sha256 else str(int(job.detected))
            moved_to = str(self.files.quarantine(name, tag, reason, job.path, job.data))
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
