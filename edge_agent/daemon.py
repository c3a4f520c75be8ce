"""``edge-agent run``: the long-running service.

Start-up order: state directories -> engine (verified) -> results database ->
pipeline -> sources -> READY=1 -> the workers no photo waits on (retention,
alerts, hot swap, hand-off and engine transfer), so READY=1 comes as soon as a
photo dropped in the inbox would be classified. The main loop then checks health every half
second: WATCHDOG=1 is sent only while the pipeline is alive and either making
progress or idle with nothing in flight; a stuck pipeline stops the pings, and
systemd restarts the service. SIGTERM/SIGINT stop the sources, let photos in
flight finish (up to ``drain_timeout_s``) and exit 0; unfinished photos stay in
the inbox for the next start.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent._daemon_status import DaemonStatus
from edge_agent.board import BoardSensors
from edge_agent.capture_place import Place, parse_place
from edge_agent.classifier import Classifier
from edge_agent.config import AppConfig, default_store_path
from edge_agent.log import get_logger
from edge_agent.pipeline import Job, Pipeline
from edge_agent.preprocess import load_decoder
from edge_agent.results import ResultsDB
from edge_agent.seeding import or_older_releases, seed_serving, start_seed_rest, unseeded
from edge_agent.sources.folder import Arrival, FolderSource
from edge_agent.spool import PhotoSpool
from edge_agent.state import StateLayout, device_name, handoff_link, inbox_dir, resolve_store_or_shipped
from edge_agent.storage_errors import FAILING_DISK
from edge_agent.systemd import Notifier
from edge_agent.trust import daemon_trust, open_trusted
from edge_agent.upgrade import adopt_shipped_signatures
from engines.base import Engine
from engines.store import EngineStore

if TYPE_CHECKING:  # imported where they start: the camera's OpenCV only with a camera, the rest after READY=1
    from edge_agent.handoff.sender import Sender
    from edge_agent.hotswap import EngineWatcher
    from edge_agent.sources.camera import CameraSource
    from edge_agent.transfer.fetcher import EngineFetcher

__all__ = ["Daemon"]


class Daemon(DaemonStatus):
    def __init__(
        self, cfg: AppConfig, state_dir: Path, inbox: Path | None = None, notifier: Notifier | None = None, engine: Engine | None = None
    ) -> None:
        self.cfg = cfg
        self.state = StateLayout(state_dir)
        self.inbox = inbox or inbox_dir(cfg, state_dir)
        self.notifier = notifier or Notifier()
        self._engine = engine
        self.log = get_logger("daemon", state_dir=str(state_dir))
        self._stop = threading.Event()
        self.started = time.time()
        self.pipeline: Pipeline | None = None
        self.folder: FolderSource | None = None
        self.camera: CameraSource | None = None
        self._camera_place: Place | None = None  # [camera] place: where its frames were taken
        self.sender: Sender | None = None
        self.fetcher: EngineFetcher | None = None
        self.watcher: EngineWatcher | None = None
        self.alerts = None
        self.retention = None
        self.backups = None
        self.ledger_check = None
        self._held = None  # the state directory's lock (edge_agent.instance), held while this daemon runs
        self._said_again: set[str] = set()  # photos whose labels the trainer asked for again (each once a run)
        self.store_note: str | None = None
        self._pool_missing: set[str] = set()  # review pool photos whose copies were gone at the last pass (drop_lost)
        self._seed_after_ready = False  # a first start: <state>/engines is seeded just after READY=1
        self._results_before_start = 0
        self.board = BoardSensors()
        self.healthy = False
        self.watchdog_sent = 0
        self._status_trouble: str | None = None
        self._clock_behind = False  # whether photos from phones say this device's clock is behind (logged when it changes)

    # ---- set-up -------------------------------------------------------------
    def _setup(self) -> None:
        from edge_agent.instance import hold_state

        cfg = self.cfg
        self.state.create()
        self._held = hold_state(self.state.root)  # one daemon a state directory (kept open until the process ends)
        if cfg.inbox.enabled and not self.inbox.exists():
            self.inbox.mkdir(parents=True)
            os.chmod(self.inbox, 0o2770)  # the service's group may drop photos (setgid keeps the group)
        t0 = time.perf_counter()
        self.trust = daemon_trust(cfg, self.state.root)
        self._seed_after_ready = unseeded(cfg, self.state.root)
        if self._seed_after_ready:  # a first start serves the package's store as it is: nothing is copied before READY=1
            self.store = EngineStore(default_store_path())
        else:
            self.store, self.store_note = resolve_store_or_shipped(cfg, self.state.root)
            if self.store_note:
                self.log.error("state_disk_full", problem=self.store_note)
            if self.trust is not None:
                adopt_shipped_signatures(self.store, default_store_path(), self.log)
        engine, self._refused_at_start = self._engine, {}
        if engine is None:
            engine, self._refused_at_start = or_older_releases(
                self.store,
                default_store_path(),
                self.log,
                lambda: open_trusted(
                    self.store, cfg.engine, self.trust, self.log, self.state.root / "golden.npz", cfg.hotswap.min_agreement
                ),
            )
        self.classifier = self._make_classifier(engine)
        self.log.info("engine_loaded", **engine.describe(), ms=round((time.perf_counter() - t0) * 1000, 1))
        queue_bytes = self._open_ledger()
        self.spool = PhotoSpool(self.state.queue, cfg.labels.max_spool_mb << 20, queue_bytes)
        if moved := self.db.relocate_queue(self.state.queue):
            self.log.warning("queue_relocated", photos=moved, folder=str(self.state.queue))
        self.pipeline = Pipeline(
            self.classifier,
            self.db,
            self.spool,
            self.state.root,
            cfg.pipeline,
            cfg.labels,
            cfg.inbox.after,
            on_done=self._done,
            on_retry=self._retry,
            retry_incomplete=self._retry_incomplete,
            inbox=self.inbox,
        )
        self.pipeline.start()
        if cfg.inbox.enabled:
            self.folder = FolderSource(self.inbox, cfg.inbox, self._arrived)
            self.folder.start()
        if cfg.camera.enabled:
            from edge_agent.sources.camera import CameraSource

            self._camera_place = parse_place(cfg.camera.place) if cfg.camera.place else None
            self.camera = CameraSource(cfg.camera, self._frame)
            self.camera.start()
            self.camera.first_attempt.wait(15)  # READY only after the camera was tried once

    def _start_workers(self) -> None:
        """The workers that run beside the pipeline and that no photo waits on, started once READY=1 is sent."""
        load_decoder()  # OpenCV, before the first photo needs it
        if self._seed_after_ready:
            self._seed_state_store()
        start_seed_rest(self.store, default_store_path(), self.log)  # a first start's older shipped releases
        if self.cfg.retention.enabled:
            from edge_agent.retention import Retention

            own = self.store.root.resolve() != default_store_path().resolve()  # never the package's own store
            self.retention = Retention(
                self.cfg.retention,
                self.state.root,
                self.db,
                store=self.store if own else None,
                serving=lambda: self.pipeline.classifier.engine.engine_version,
                engine_cache=getattr(self.cfg.engine, "cache_dir", ""),
            )
            self.retention.start()
        if self.cfg.backup.dir:
            from edge_agent.backup_schedule import BackupSchedule

            self.backups = BackupSchedule(self.cfg, self.state.root, on_damaged=self._backup_found_damage)
            self.backups.start()
        from edge_agent.ledger_check import EVERY_S, FIRST_S, LedgerCheck

        self.ledger_check = LedgerCheck(
            self.state.db, lambda exc, path: self.db.damaged(exc), first_s=EVERY_S if self.db.read_whole else FIRST_S
        )
        self.ledger_check.start()
        self._start_alerts()
        self._start_learning_links()

    def _say_labels_again(self, ids: list[str]) -> None:
        """The trainer lost the labels of ``ids`` (a rotted page): each this device's expert gave, of a photo still kept,
        is queued again (once a run), as `review label` would."""
        from edge_agent.review.queue import LabelError, label_photo

        asked = [sha for sha in ids if sha not in self._said_again]
        if not asked:
            return
        self._said_again.update(asked)
        given, again = self.db.expert_labels(), 0
        for sha in asked:
            if sha not in given:
                continue  # (another device's photo, or a label only the trainer had)
            try:
                label_photo(self.db, self.state.queue, self.cfg.labels.max_spool_mb << 20, [], sha, given[sha], new_class=True)
                again += 1
            except (LabelError, OSError, sqlite3.Error) as exc:  # its photo pruned since, a full disk: said, not retried
                self.log.warning("label_not_said_again", photo=sha[:16], error=str(exc))
        if again:
            self.log.info("labels_said_again", photos=again, why="the trainer lost them")

    def _release_state(self) -> None:
        """Let another daemon start on this state directory (:func:`edge_agent.instance.hold_state`)."""
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def _backup_found_damage(self, name: str, exc: BaseException) -> None:
        """A backup read a damaged page in ``name``: the ledger's stops the daemon, whose next start keeps every row
        that can still be read; the alert outbox's is set aside at once; a trainer on this state directory is asked to
        read its files whole (it then stops for its next start to keep them)."""
        if name == "results.sqlite":
            self.db.damaged(exc)  # (the main loop sees it within 0.5 s)
        elif name == "alerts.sqlite" and self.alerts is not None:
            self.alerts.renew_if_damaged(exc)
        elif name.startswith("trainer/"):
            from edge_agent.ledger_check import ask_to_read
            from edge_agent.state import trainer_state_dir

            ask_to_read(trainer_state_dir(self.cfg, self.state.root))

    def _seed_state_store(self) -> None:
        """A first start's ``<state>/engines``, given the release serving (:func:`edge_agent.seeding.seed_serving`): the
        store the hot swap, the hand-off and rollbacks use from here on; where the disk cannot take it, the package's
        store goes on serving and the status says what to free."""
        self.store, self.store_note = seed_serving(self.cfg, self.state.root, self.classifier.engine.engine_version)
        if self.store_note:
            self.log.error("state_disk_full", problem=self.store_note)

    def _reindex_queue(self) -> str:
        """After a ledger was replaced: every photo in the label queue's folders whose entry was lost with it goes back
        in the queue, for the expert's review (its label was lost), so none is lost. Returns what was done, for status."""
        import re

        from edge_agent.ledger_rows import QueueEntry

        entries = []
        for kind in ("pseudo", "review", "expert"):
            for f in sorted((self.state.queue / kind).glob("*")):
                if f.is_file() and re.fullmatch(r"[0-9a-f]{64}", f.stem) and self.db.queue_entry(f.stem) is None:
                    entries.append(QueueEntry(f.stem, f.stem[:16], "review", None, None, None, str(f), f.stat().st_size))
        if not entries:
            return ""
        self.db.commit([], entries)
        return f"; {len(entries)} photos found in the label queue were queued again for the expert's review (their labels were lost)"

    def _make_classifier(self, engine: Engine) -> Classifier:
        """The pipeline's classifier over ``engine``, at start and at each hot swap; the daemon's log lines name that
        engine from here on (a line after a swap or a rollback once named the version the daemon started on)."""
        self.log = self.log.bind(engine_version=engine.engine_version)
        return Classifier.configured(engine, self.cfg)

    def _start_alerts(self) -> None:
        cfg = self.cfg
        if not (cfg.alerts.enabled or cfg.mqtt.host or cfg.webhooks):
            return
        from edge_agent import __version__
        from edge_agent.alerts.worker import AlertWorker
        from edge_agent.class_notes import PAGE_NOTES, notes_or_shipped

        self.alerts = AlertWorker(
            cfg.alerts,
            cfg.mqtt,
            cfg.webhooks,
            self.state.db,
            self.state.root,
            device_name(cfg),
            __version__,
            crops=cfg.classify.crops,
            num_classes=lambda: len(self.pipeline.classifier.engine.classes),  # the one serving, after any swap
            sure=cfg.labels.pseudo_threshold,
            start_after=self._results_before_start,
            plant_max_photos=cfg.classify.plant_max_photos,
            visit_gap_s=cfg.classify.plant_visit_gap_s,
            notes=notes_or_shipped(cfg.web.class_notes, self.state.root / PAGE_NOTES, self.log),
        )
        self.alerts.start()

    def _start_learning_links(self) -> None:
        from edge_agent.handoff.sender import Sender
        from edge_agent.hotswap import EngineWatcher
        from edge_agent.transfer.fetcher import EngineFetcher

        cfg = self.cfg
        self.watcher = EngineWatcher(
            self.store,
            cfg.engine,
            self.pipeline,
            self._make_classifier,
            cfg.hotswap.poll_s,
            cfg.hotswap.min_agreement,
            trust=self.trust,
            refused=self._refused_at_start,
        )
        self.watcher.start()
        if cfg.handoff.enabled:
            link, name = handoff_link(cfg, self.state.root), device_name(cfg)
            self.sender = Sender(
                self.db, self.spool, cfg.handoff, link, device=name, on_engine=self.watcher.announce, on_lost=self._say_labels_again
            )
            self.sender.start()
            self.fetcher = EngineFetcher(
                self.store,
                self.trust,
                cfg.handoff,
                link,
                name,
                serving=lambda: self.pipeline.classifier.engine.engine_version,
                queue_depth=self.db.queue_length,
                on_installed=self.watcher.announce,
                refused_here=lambda: dict(self.watcher.refused),
                report=self.watcher.serving_report,
            )
            self.fetcher.start()

    # ---- source -> pipeline glue ------------------------------------------------
    def _arrived(self, arrival: Arrival) -> None:
        job = Job(source="inbox", path=arrival.path, error=arrival.refused)
        while not self.pipeline.submit(job, timeout=0.5):
            if self._stop.is_set():
                self.folder.release(arrival.path)
                return

    def _frame(self, name: str, data: bytes) -> None:
        if not self.pipeline.submit(Job(source=name, data=data, place=self._camera_place), timeout=1.0):
            self.log.warning("frame_dropped", source=name, reason="pipeline full")

    def _done(self, job: Job) -> None:
        if job.path is not None and self.folder is not None:
            # Still there although it should have moved (a file the daemon may not move or delete): recorded once
            # (finalize_failed, or the quarantine row), then not offered again unless it changes.
            stuck = self.cfg.inbox.after != "leave" and os.path.lexists(job.path)
            self.folder.release(job.path, keep=self.cfg.inbox.after == "leave" or stuck)

    def _retry(self, job: Job) -> None:
        if job.path is not None and self.folder is not None and not self._stop.is_set():
            self.folder.retry(job.path)
        elif job.path is not None and self.folder is not None:
            self.folder.release(job.path)

    def _retry_incomplete(self, job: Job) -> bool:
        return job.path is not None and self.folder is not None and self.folder.recently_modified(job.path)

    def _open_ledger(self) -> int:
        """Open the ledger (set aside where damaged: :meth:`ResultsDB.open_or_recover`) and read where its results and
        its queue end; returns the queue's bytes. A ledger closed whole is not read whole first, so a page a card rotted
        since is met here: the ledger is then read whole, and set aside, instead of the start failing at every try."""
        processed = self.state.root / "processed"
        expected = processed.is_dir() and any(processed.iterdir())
        self.db, self.ledger_note = ResultsDB.open_or_recover(self.state.db, expected=expected)
        try:
            self.db.last_result_id(), self.db.queue_bytes()
        except sqlite3.DatabaseError as exc:
            if not self.db.damaged(exc) or self.db.disk_fails:  # (a failing disk: the command says so, in one line)
                raise
            self.db.close()
            self.log.error("ledger_damaged", error=repr(exc), then="read whole, and set aside")
            self.db, self.ledger_note = ResultsDB.open_or_recover(self.state.db, expected=expected)
        if self.ledger_note:
            self.ledger_note += self._reindex_queue()
            self.log.error("ledger_set_aside", note=self.ledger_note)
        self._results_before_start = self.db.last_result_id()  # alerts start after READY=1 and from here
        return self.db.queue_bytes()

    # ---- health, status ------------------------------------------------------------
    def check_health(self) -> bool:
        p = self.pipeline
        sources_ok = all(
            s.alive()
            for s in (
                self.folder,
                self.camera,
                self.sender,
                self.fetcher,
                self.watcher,
                self.alerts,
                self.retention,
                self.backups,
                self.ledger_check,
            )
            if s is not None
        )
        stalled = p.in_flight > 0 and time.monotonic() - p.last_progress > self.cfg.daemon.stall_timeout_s
        healthy = p.alive() and sources_ok and not stalled
        if healthy != self.healthy:
            (self.log.info if healthy else self.log.error)(
                "health_changed", healthy=healthy, pipeline_alive=p.alive(), sources_ok=sources_ok, stalled=stalled, in_flight=p.in_flight
            )
        self.healthy = healthy
        return healthy

    # ---- main loop ----------------------------------------------------------------
    def request_stop(self, *_args) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def run(self) -> int:
        t0 = time.perf_counter()
        with self.notifier.starting("starting: opening the engine (a Jetson's first start builds its TensorRT plan: minutes)"):
            try:
                self._setup()
            except BaseException:
                self._release_state()
                raise
        self.check_health()
        self.notifier.ready(f"ready, engine {self.classifier.engine.engine_version}")
        ready_ms = round((time.perf_counter() - t0) * 1000, 1)
        self._start_workers()
        self.log.info(
            "ready",
            inbox=str(self.inbox) if self.folder else None,
            camera=self.cfg.camera.source if self.camera else None,
            startup_ms=ready_ms,
            workers_ms=round((time.perf_counter() - t0) * 1000 - ready_ms, 1),
        )
        if not self.cfg.classify.crops:
            self.log.info(
                "crops_not_set",
                hint='say which crops grow here ([classify] crops = ["Apple", "Corn_(maize)"]): answers and alerts are then '
                "about those only; until then alerts follow the crops the expert labels",
            )
        next_status = next_prune = 0.0
        while not self._stop.is_set():
            if self.check_health():
                self.notifier.watchdog()
                self.watchdog_sent += 1
            if time.monotonic() >= next_status:
                self._write_status()
                next_status = time.monotonic() + self.cfg.daemon.status_interval_s
            full = self.pipeline is not None and self.pipeline.queue_full
            if time.monotonic() >= next_prune or (full and time.monotonic() >= next_prune - 55.0):
                self._prune_review_pool()  # every minute, every 5 s while the queue's quota turns photos away
                next_prune = time.monotonic() + 60.0
            if self.db.damage_seen is not None:  # met by the pipeline or the hand-off (ResultsDB.damaged)
                self.request_stop()  # a damaged page: the next start (systemd's, 5 s on) sets the ledger aside
            self._stop.wait(0.5)
        return self._shutdown()

    def _prune_review_pool(self) -> None:
        from edge_agent.review.queue import drop_lost, prune_pool

        try:
            labels = self.cfg.labels
            lost, self._pool_missing = drop_lost(self.db, self.state.queue, labels, self._pool_missing)
            if lost:
                self.log.warning("review_photos_lost", photos=lost, why="their copies in the review pool are gone: not asked about")
            dropped = prune_pool(self.db, self.spool, labels.review_pool, labels, max_bytes=labels.review_pool_bytes)
        except Exception as exc:  # a locked database: try again next time
            if isinstance(exc, sqlite3.DatabaseError) and self.db.damaged(exc):  # the main loop stops the daemon for it
                self.log.error("ledger_damaged", error=repr(exc), met_by="the review pool's pruning")
                return
            self.log.warning("review_pool_prune_failed", error=repr(exc))
            return
        if dropped:
            self.log.info("review_pool_pruned", dropped=dropped, kept=self.cfg.labels.review_pool)

    def _shutdown(self) -> int:
        self.notifier.stopping()
        self.log.info("stopping", in_flight=self.pipeline.in_flight)
        for s in (self.folder, self.camera, self.watcher, self.retention, self.backups, self.ledger_check):
            if s is not None:
                s.stop()
        drained = self.pipeline.drain(self.cfg.daemon.drain_timeout_s)
        if not drained:
            self.log.warning("drain_timeout", left_in_inbox=self.pipeline.in_flight)
        self.pipeline.stop()
        if self.fetcher is not None:
            self.fetcher.stop()
        if self.sender is not None:
            self.sender.stop()
        self._write_status()
        self.pipeline.classifier.engine.close()  # a check of its precision still running stops before its next batch
        if self.alerts is not None:
            self.alerts.stop()
        self.board.close()
        self.db.close()
        self._release_state()
        self.log.info("stopped", drained=drained, **self.pipeline.counters)
        if self.db.damage_seen is not None:
            if self.db.disk_fails:  # not the ledger's fault: its next start fails with the disk, or finds it whole
                self.log.error("stopped_for_failing_disk", error=self.db.damage_seen, problem=FAILING_DISK)
                return 1
            self.log.error(
                "stopped_for_damaged_ledger",
                error=self.db.damage_seen,
                then="start it again (systemd does, 5 s on): the start reads the ledger whole and keeps every row that can still "
                "be read in a new one, the damaged one kept beside",
            )
            return 1
        return 0
