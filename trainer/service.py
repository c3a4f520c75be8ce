"""``edge-trainer serve``: receive labels, retrain when enough are new (:mod:`trainer.retrain`), announce.

The service checks at start-up that its gate has validation photos (:mod:`trainer.labelled`); without any,
no candidate could ever be published, so it starts no retrain and says so in the log and in its status.
A retrain that fails or is refused is not repeated on the same samples: the next waits for new ones.
SIGTERM or SIGINT during a retrain abandons the candidate within a training step and exits; every
received sample stays stored and unmarked, so the next start retrains on them.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict
from pathlib import Path

from edge_agent.backup_schedule import BackupSchedule
from edge_agent.config import AppConfig, TrainerSection
from edge_agent.engine_keep import prune_engines
from edge_agent.handoff.protocol import LOST_ASKED
from edge_agent.instance import hold_state
from edge_agent.ledger_check import EVERY_S, LedgerCheck
from edge_agent.log import get_logger
from edge_agent.state import handoff_link, resolve_store, trainer_state_dir, write_status
from edge_agent.trust import trainer_key_path
from edge_agent.upgrade import pending_release
from engines.prune import store_bytes
from engines.signing import load_or_create_key
from engines.store import StoreError
from trainer._child import RetrainDamaged, RetrainDiskFull, retrain_in_child
from trainer.field_check import too_few_to_judge
from trainer.labelled import labelled_sources
from trainer.loop.room import RoomWatch
from trainer.loop.stored_photos import StoredPhotos
from trainer.loop.unlabelled_pool import UnlabelledPool
from trainer.receiver import Receiver
from trainer.retrain import RetrainResult, balance_pseudo, retrain, settle_published
from trainer.rollout import Rollout
from trainer.samples import SampleStore
from trainer.stop import Stopped
from trainer.transfer import EngineServer

__all__ = ["TrainerService", "enough_new", "retrain", "RetrainResult", "balance_pseudo", "trainer_state_dir"]


def enough_new(counts: dict, tc: TrainerSection) -> bool:
    """Enough has arrived since the last retrain to start one: ``retrain_threshold`` new samples or ``expert_threshold``
    new expert labels (``counts`` as :meth:`trainer.samples.SampleStore.counts` gives them)."""
    return counts.get("new", 0) >= tc.retrain_threshold or counts.get("new_expert", 0) >= tc.expert_threshold


class TrainerService:
    def __init__(self, cfg: AppConfig, state_dir: Path) -> None:
        self.cfg = cfg
        self.state_dir = state_dir
        self.root = trainer_state_dir(cfg, state_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = get_logger("trainer.service", state_dir=str(self.root))
        self._held = hold_state(self.root, "trainer")  # one trainer a state directory, before its files are opened
        self.samples = SampleStore(self.root, recover="lossless")  # (the file's owner: no retrain runs yet)
        if self.samples.recovered:
            self.log.error("samples_recovered", what=self.samples.recovered)
        #: Photos whose labels a salvage lost: the heartbeats ask the devices to say them again (until each is stored).
        self.lost = self.samples.lost_ids()
        if self.lost:
            self.log.warning("labels_asked_again", photos=len(self.lost), of="the devices that hold them (a salvage lost them)")
        self.signing_key = load_or_create_key(trainer_key_path(cfg, state_dir), remake_unfinished=True)  # daemons here trust it
        self.store = resolve_store(cfg, state_dir)
        self._sign_unsigned_versions()
        for tag, version in settle_published(self.store, self.samples).items():  # a publish stopped last time
            self.log.info("pending_samples_settled", tag=tag, published=version or "no: the samples are new again")
        link = handoff_link(cfg, state_dir)
        new_classes = not link.endpoint.startswith("tcp://") or cfg.trainer.fleet_new_classes
        tc = cfg.trainer
        self.unlabelled = UnlabelledPool(self.root, tc.unlabelled_pool, tc.unlabelled_pool_mb << 20)
        if self.unlabelled.recovered:
            self.log.warning("unlabelled_pool_recovered", what=self.unlabelled.recovered)
        self.stored_photos = StoredPhotos(self.samples, self.unlabelled, cfg.handoff.photo_side, self.log)
        self.receiver = Receiver(
            self.samples, cfg.handoff, link, new_classes=new_classes, classes=self._classes, describe=self._describe, pool=self.unlabelled
        )
        # a staged rollout is for devices elsewhere: a daemon on this machine shares the store and takes each version at once
        rollout = Rollout(cfg.rollout, self.root / "rollout.json") if link.transfer.startswith("tcp://") else None
        self.server = EngineServer(self.store, link, rollout=rollout, parallel=cfg.handoff.transfer_parallel)
        self._stop = threading.Event()
        self.state = "idle"
        self.last: RetrainResult | None = None
        self.started = time.time()
        self.blocked: str | None = None  # why no retrain can be published, if none can
        #: Retrains since the start, by outcome (the web process's /metrics reads them from the status file).
        self.retrains = {"published": 0, "refused": 0, "failed": 0}
        self.labelled: dict = {}
        self._hold: int | None = None  # after a failed retrain: the sample count it failed on
        self.room = RoomWatch(self.store, self.log)  # a retrain starts only where its version fits on the disk
        self._plan: tuple = ((), {})
        self._field_wait: tuple[tuple, str | None] = ((), None)  # ((sample count, corrections), why no candidate could be judged yet)
        self._release_tried = -1  # the sample count a retrain of an upgrade's pending release last ran on
        self.retraining: dict | None = None  # while a retrain runs: its phase (and epoch)
        self.backups: BackupSchedule | None = None
        self.damaged: str | None = None  # a damaged page met in this trainer's files while it runs (it then stops, status 1)
        self._classes_of: tuple[str | None, list[str]] = (None, [])  # the current version and its classes

    def _sign_unsigned_versions(self) -> None:
        """Versions in this trainer's store from before versions were signed (its own, or a model the user trained):
        signed once their files verify, so the daemon on this state directory keeps serving them after an upgrade.
        A version someone else signed is left as it is."""
        from engines.signing import SIGNATURE, sign_version
        from engines.store import StoreError

        for version in self.store.versions():
            vdir = self.store.root / version
            if (vdir / SIGNATURE).exists():
                continue
            try:
                self.store.open(version)
            except StoreError as exc:
                self.log.warning("unsigned_version_left_unsigned", engine_version=version, reason=str(exc))
                continue
            sign_version(vdir, self.signing_key)
            self.log.info("signed_existing_version", engine_version=version, key=self.signing_key.public_hex[:16])

    def _start_backups(self) -> None:
        """With ``[backup] dir``: a trainer on a machine of its own backs up its state there as the daemon does (its
        signing key above all, which every device of the fleet trusts)."""
        if self.cfg.backup.dir:
            self.backups = BackupSchedule(self.cfg, self.state_dir, defer=self._daemon_takes_backups, on_damaged=self._backup_found_damage)
            self.backups.start()

    def _backup_found_damage(self, name: str, exc: BaseException) -> None:
        """A backup read a damaged page in this trainer's labels or pool (:meth:`_found_damage`)."""
        if name.startswith("trainer/"):
            self._found_damage(exc, name)

    def _found_damage(self, exc: BaseException, name: str = "trainer/samples.sqlite") -> None:
        """A damaged page in this trainer's files (met by its backup, its daily read, or asked by the daemon's backup):
        it stops (status 1), so its next start (systemd's) keeps what can be read, or says how to get the labels back."""
        self.damaged = f"{name}: {exc}"
        self.request_stop()

    def _daemon_takes_backups(self) -> str | None:
        """Why this trainer leaves the backups to the daemon: it shares the state directory (the daemon's backup holds
        the trainer's state too), else None."""
        if (self.state_dir / "results.sqlite").exists():
            return "the daemon on this state directory takes its backups (the trainer's state is in them)"
        return None

    @property
    def request_file(self) -> Path:
        return self.root / "retrain.request"

    @property
    def status_file(self) -> Path:
        return self.root / "status.json"

    def request_stop(self, *_a) -> None:
        self._stop.set()

    def check_validation(self) -> str | None:
        """Why no retrain could be published (no validation photos for the engine's classes), or None."""
        try:
            classes = self.store.open(verify=False).classes
        except Exception as exc:  # no engine yet, or an unreadable one: the retrain will say more
            return f"no engine in the store: {exc}"
        sources = labelled_sources(self.cfg, classes)
        self.labelled = sources.describe()
        if sources.val:
            return None
        return (
            "no validation photos: no candidate could be checked, so no retrain starts. Set [trainer] "
            "validation_data (or labelled_data) to a folder of <Class>/<photo> the model never trained on"
            + ("" if self.cfg.trainer.shipped_data else ", or turn [trainer] shipped_data back on")
            + (f" ({'; '.join(sources.problems)})" if sources.problems else "")
        )

    def status(self) -> dict:
        counts = self.samples.counts()
        return {
            "pid": os.getpid(),
            "updated": time.time(),
            "uptime_s": round(time.time() - self.started, 1),
            "state": self.state,
            "samples": counts,
            "pseudo_deleted": int(self.samples.get_state("pseudo_deleted", "0") or 0),
            "pseudo_withdrawn": int(self.samples.get_state("pseudo_withdrawn", "0") or 0),
            "pseudo_per_class": self.cfg.trainer.pseudo_per_class,
            "labels_corrected": self.samples.corrections,
            "retrain_threshold": self.cfg.trainer.retrain_threshold,
            "blocked": self.blocked,
            "labelled": self.labelled,
            "waiting_for_new_samples": self._hold is not None,
            "waiting_for_room": self.room.reason,
            "waiting_for_field_check": self._field_wait[1],
            "next_publish": self._next_publish(counts),
            "receiver": dict(self.receiver.counters),
            "store_problem": self.receiver.store_problem,
            "unlabelled_pool": self.unlabelled.summary(),
            "reducing_photos": self.stored_photos.status(),
            "daemons_seen": len(self.receiver.peers),
            "fleet": self.server.fleet(dict(self.receiver.by_device)),
            "handshakes_refused": self.server.handshakes_refused()[:20],
            "rollout": self.server.rollout_state(),
            "transfer": dict(self.server.counters),
            "last_retrain": asdict(self.last) if self.last else None,
            "retrains": dict(self.retrains),
            "store": str(self.store.root),
            "engines": self._engines(),
            "retraining": self.retraining,
            "release_pending": pending_release(self.store),
            "backup": self.backups.status() if self.backups is not None else None,
        }

    def _next_publish(self, counts: dict) -> dict:
        """What the next publish waits for (the samples read again only when their counts changed)."""
        from trainer.loop.next_publish import plan

        key = (tuple(sorted(counts.items())), self.samples.corrections)
        if self._plan[0] != key:
            self._plan = (key, plan(self.samples.all(), counts, self.cfg.trainer).as_dict())
        out = dict(self._plan[1])
        if self.state == "training":
            out["sentence"] = "retraining now: " + out["sentence"] if out["waiting_for"] != "nothing" else "retraining now"
        return out

    def _describe(self) -> dict:
        """What a heartbeat tells the devices: this trainer's state (that it cannot store their labels, first), the
        version in service and when it was published."""
        state = self.receiver.problem_state or ("waiting for room: disk full" if self.room.reason else self.state[:32])
        said = {"state": state, "stores_labels": self.receiver.store_problem is None, "waits_for_room": self.room.reason is not None}
        if self.lost:
            asked = sorted(self.lost)[:LOST_ASKED]
            self.lost -= {i for i in asked if self.samples.has(i)}  # said again since: asked no more
            if asked := [i for i in asked if i in self.lost]:
                said["lost"] = ",".join(asked)
        try:
            version = self.store.current()
            published = (self.store.root / version / "manifest.json").stat().st_mtime
        except (StoreError, OSError):
            return said
        return {**said, "version": version, "published": round(published, 1)}

    def _classes(self) -> list[str]:
        """The classes of the engine in service (read again only when the current version changes)."""
        current = self.store.current()
        if self._classes_of[0] != current:
            self._classes_of = (current, list(self.store.open(current, verify=False).classes))
        return self._classes_of[1]

    def _announce(self, version: str) -> None:
        """A version was published: wake the daemons on this machine and offer it to every connected daemon."""
        self.receiver.announce(version)
        self.server.announce(version)

    def _progress(self, phase: str, **info) -> None:
        self.retraining = {"phase": phase, "since": (self.retraining or {}).get("since", time.time()), **info}

    def _status_while_training(self, done: threading.Event) -> None:
        """Status stays fresh while a retrain runs (its phase and epoch): the trainer is "training", never "down"."""
        while not done.wait(2.0):
            try:
                self._write_status()
            except Exception as exc:  # noqa: BLE001 - a full disk: the next write may work; the retrain goes on
                self.log.warning("status_write_failed", error=repr(exc))

    def _write_status(self) -> None:
        write_status(self.status_file, self.status())

    def _due(self) -> bool:
        counts = self.samples.counts()
        total = counts["pseudo"] + counts["expert"]
        if pending_release(self.store) and self._release_tried != total:  # an upgrade's release: learn on it at once
            self._release_tried = total
            return True
        if self._hold is not None and total <= self._hold:
            return False  # the last retrain failed on exactly these samples: wait for new ones
        self._hold = None
        tc = self.cfg.trainer
        if not enough_new(counts, tc):
            return False
        key = (total, self.samples.corrections)
        if self._field_wait[0] != key:  # read the samples again only when new ones have arrived, or a label was corrected
            self._field_wait = (key, too_few_to_judge(self.samples.all(), tc.field_check_every, tc.field_check_min))
        return self._field_wait[1] is None  # else a candidate could not be published: no retrain spent on it

    def _start_now(self, requested: bool) -> bool:
        """Whether a retrain starts now: asked for, or due and not blocked, and the disk has room for its version."""
        return self.room.check() is None and (requested or (self._due() and not self.blocked))

    def _retrain_once(self) -> None:
        self.blocked = self.check_validation()
        if self.blocked:
            self.log.warning("retrain_not_started", reason=self.blocked)
            self.last = RetrainResult(None, self.blocked, {}, 0, 0.0)
            return
        self.state = "training"
        self._write_status()
        self.log.info("retrain_due", **self.samples.counts())
        self.retraining = {"phase": "starting", "since": time.time()}
        heartbeat, before = threading.Event(), self.last
        threading.Thread(target=self._status_while_training, args=(heartbeat,), name="trainer-status", daemon=True).start()
        try:
            self.last = retrain_in_child(  # its memory goes back to the system when it ends
                self.cfg,
                self.store.root,
                self.root,
                self.root / "strategy",
                trainer_key_path(self.cfg, self.state_dir),
                announce=self._announce,
                progress=self._progress,
                should_stop=self._stop.is_set,
            )
            self.room.succeeded()
        except Stopped as exc:
            self.log.info("retrain_abandoned", reason=str(exc), samples_kept=self.samples.counts())
        except RetrainDamaged as exc:  # a page a card rotted: this trainer's next start keeps what can be read
            self.log.error("retrain_failed", error=str(exc), next="the trainer stops: its next start keeps the labels that can be read")
            self.last = RetrainResult(None, f"failed: a damaged page in the trainer's files: {exc}", {}, 0, 0.0)
            self.damaged = str(exc)
            self.request_stop()
        except RetrainDiskFull as exc:  # not the samples' fault: the next retrain waits for room, not for new ones
            self.room.failed_for_room()
            self.log.error("retrain_failed", error=str(exc), next="starts again once the disk has room")
            self.last = RetrainResult(None, f"failed: the disk is full: {exc}", {}, 0, 0.0)
        except Exception as exc:
            counts = self.samples.counts()
            self._hold = counts["pseudo"] + counts["expert"]
            self.log.error("retrain_failed", error=repr(exc), next="waits for new samples")
            self.last = RetrainResult(None, f"failed: {exc!r}", {}, 0, 0.0)
        finally:
            heartbeat.set()
            self.state = "idle"
            self.retraining = None
            if self.last is not None and self.last is not before:
                outcome = "published" if self.last.published else ("failed" if self.last.reason.startswith("failed") else "refused")
                self.retrains[outcome] += 1
                if self.last.published:
                    self._prune_engines()

    def _engines(self) -> dict:
        """The store's versions and bytes, the rule that keeps them and how many were deleted in all."""
        held, size = store_bytes(self.store)
        keep = self.cfg.retention.engine_versions if self.cfg.retention.enabled else 0
        return {"versions": held, "bytes": size, "keep": keep, "deleted": len(self.store.pruned())}

    def _prune_engines(self) -> None:
        """Delete the store's old retrains as the daemon's retention does (a store of its own, or one the daemon on this
        state directory shares: the versions it serves and checks against stay)."""
        if self.cfg.retention.enabled:
            prune_engines(self.store, self.cfg.retention.engine_versions, self.state_dir, [self.store.current()], log=self.log)

    def run(self) -> int:
        self.blocked = self.check_validation()
        self.receiver.start()
        self.server.start()
        self._start_backups()
        files = [self.root / "samples.sqlite", self.root / "unlabelled.sqlite"]  # (both read whole at the start)
        self.records_check = LedgerCheck(files, lambda exc, path: self._found_damage(exc, f"trainer/{path.name}"), first_s=EVERY_S)
        self.records_check.start()
        self.log.info("serving", store=str(self.store.root), threshold=self.cfg.trainer.retrain_threshold, labelled=self.labelled)
        if self.blocked:
            self.log.warning("no_validation_photos", reason=self.blocked)
        next_status = 0.0
        while not self._stop.is_set():
            requested = self.request_file.exists()
            if self._start_now(requested):
                self.request_file.unlink(missing_ok=True)
                self._retrain_once()
            if (self.receiver.store_problem or {}).get("damaged"):  # a page a card rotted, met storing a label
                self.damaged = self.receiver.store_problem["error"]
                break  # (no ack was sent: the device keeps the label and sends it again to the next start)
            self.stored_photos.step()  # between retrains, never during one
            if time.monotonic() >= next_status:
                if self.blocked and not self.state == "training":
                    self.blocked = self.check_validation()  # the user may have added photos since
                self._write_status()
                next_status = time.monotonic() + 2.0
            self._stop.wait(0.5)
        self.receiver.stop()
        self.server.stop()
        self.records_check.stop()
        if self.backups is not None:
            self.backups.stop()
        self._write_status()
        self.samples.close()
        self.unlabelled.close()
        if self._held is not None:
            self._held.close()
        self.log.info("stopped")
        if self.damaged:
            self.log.error(
                "stopped_for_damaged_file",
                error=self.damaged,
                then="start it again (systemd does, 30 s on): its start keeps what can be read",
            )
            return 1
        return 0
