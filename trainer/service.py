"""``edge-trainer serve``: receive labels, retrain when enough are new, gate, publish, announce.

One retrain: the engine in service (its torch weights) is fine-tuned with the
configured strategy on the labelled data's training split + every expert label
+ every pseudo-label received so far; the candidate is gated on the labelled
data's validation split (never trained on); if it passes it is exported,
published atomically to the shared store and announced. Samples are marked
with the generation that first used them only after the decision, so a trainer
killed mid-way retrains on the same samples when it comes back.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from edge_agent.config import AppConfig
from edge_agent.daemon import curve_keys, handoff_endpoints, resolve_store
from edge_agent.log import get_logger
from edge_agent.preprocess import ImageRejected, preprocess_file
from engines.durable import atomic_write
from engines.store import EngineStore
from trainer.calibrate import calibrate
from trainer.continual import ContinualSettings, train_generation
from trainer.data import TensorDataset, scan_folder, stratified_split
from trainer.gate import gate
from trainer.publish import load_weights, publish_model
from trainer.receiver import Receiver, ReceiverSettings
from trainer.recheck import recheck
from trainer.samples import SampleStore
from trainer.strategies.base import Generation, get_strategy

__all__ = ["TrainerService", "retrain", "RetrainResult", "trainer_state_dir"]


def trainer_state_dir(cfg: AppConfig, state_dir: Path) -> Path:
    return Path(cfg.trainer.state_dir).expanduser() if cfg.trainer.state_dir else state_dir / "trainer"


@dataclass
class RetrainResult:
    published: str | None
    reason: str
    metrics: dict
    samples: int
    seconds: float


def _labelled(cfg: AppConfig, classes: list[str]) -> tuple[Generation, Generation]:
    """(train, validation) from [trainer] labelled_data (and validation_data), with the engine's class indices."""
    empty = Generation(torch.zeros(0, 3, 128, 128), torch.zeros(0, dtype=torch.long))

    def load(folder_path: str) -> list:
        folder = scan_folder(folder_path)
        remap = {i: classes.index(name) for i, name in enumerate(folder.classes) if name in classes}
        return [type(s)(s.path, remap[s.label]) for s in folder.samples if s.label in remap]

    def tensors(samples: list) -> Generation:
        if not samples:
            return empty
        ds = TensorDataset(samples)
        return Generation(ds.x, ds.y)

    tc = cfg.trainer
    train = load(tc.labelled_data) if tc.labelled_data else []
    if tc.validation_data:
        return tensors(train), tensors(load(tc.validation_data))
    if not train:
        return empty, empty
    parts = stratified_split(train, {"val": tc.val_fraction}, tc.seed)
    return tensors(parts["train"]), tensors(parts["val"])


def _received(samples: SampleStore, classes: list[str]) -> tuple[Generation, list[str], list[str]]:
    """Expert labels (true, weight 1) and pseudo-labels (weight: their confidence); grows ``classes`` for new
    expert classes."""
    xs, ys, ws, ps, ids = [], [], [], [], []
    new_classes = []
    for s in samples.all():
        if s.label not in classes:
            if s.kind != "expert":
                continue  # a pseudo-label can only name a known class
            classes.append(s.label)
            new_classes.append(s.label)
        try:
            x = preprocess_file(s.file)
        except ImageRejected:
            continue
        xs.append(torch.from_numpy(x))
        ys.append(classes.index(s.label))
        pseudo = s.kind == "pseudo"
        ws.append(float(s.confidence) if pseudo else 1.0)
        ps.append(pseudo)
        ids.append(s.id)
    if not xs:
        return Generation(torch.zeros(0, 3, 128, 128), torch.zeros(0, dtype=torch.long)), ids, new_classes
    return Generation(torch.stack(xs), torch.tensor(ys), torch.tensor(ws), torch.tensor(ps), ids), ids, new_classes


def _recheck_pseudo(teacher, received: Generation, tau: float) -> tuple[Generation, dict]:
    """The received samples with every pseudo-label scored again by ``teacher`` (:mod:`trainer.recheck`):
    relabelled with its class and confidence, or left out where it is below ``tau``."""
    rows = received.pseudo.nonzero().squeeze(1)
    checked = recheck(teacher, received.x[rows], tau)
    summary = checked.summary(received.y[rows])
    y, weight, keep = received.y.clone(), received.weight.clone(), torch.ones(len(received), dtype=torch.bool)
    y[rows], weight[rows], keep[rows] = checked.labels, checked.confidence, checked.keep
    return Generation(received.x, y, weight, received.pseudo, received.sample_ids).subset(keep), summary


def balance_pseudo(labels: torch.Tensor, pseudo: torch.Tensor) -> torch.Tensor:
    """Per-row factor that keeps the easy classes from dominating the pseudo-labels.

    A model is confident mostly on the classes it already knows well, so their pseudo-labels pile up and
    a retrain drifts towards them until harder classes' recall collapses (self-training's confirmation
    bias). A class with more pseudo-labels than the median class is down-weighted to the median's total
    weight; rarer classes are left as they are (never up-weighted: few pseudo-labels may be wrong ones).
    True labels keep factor 1."""
    factor = torch.ones(len(labels))
    if not pseudo.any():
        return factor
    classes, counts = labels[pseudo].unique(return_counts=True)
    median = counts.float().median()
    for c, n in zip(classes.tolist(), counts.tolist()):
        factor[pseudo & (labels == c)] = min(1.0, float(median) / n)
    return factor


def retrain(cfg: AppConfig, store: EngineStore, samples: SampleStore, strategy_dir: Path, announce=lambda v: None) -> RetrainResult:
    t0 = time.perf_counter()
    tc = cfg.trainer
    log = get_logger("trainer.retrain", strategy=tc.strategy)
    torch.set_num_threads(tc.threads)
    current = store.open()
    previous = load_weights(current)
    classes = list(current.classes)
    received, ids, new_classes = _received(samples, classes)
    rechecked = None
    if tc.recheck_pseudo and received.pseudo.any():
        received, rechecked = _recheck_pseudo(previous, received, cfg.labels.pseudo_threshold)
        log.info("pseudo_labels_rechecked", teacher=current.name, **rechecked)
    received.weight = received.weight * balance_pseudo(received.y, received.pseudo)
    samples.set_state("last_retrain_pseudo", json.dumps(
        {i: classes[int(y)] for i, y, p in zip(received.sample_ids, received.y, received.pseudo) if p}
    ))
    train, val = _labelled(cfg, classes)
    data = train + received
    log.info("retrain_started", parent=current.name, labelled=len(train), received=len(received), validation=len(val), new_classes=new_classes)
    if len(data) < 2:
        return RetrainResult(None, "not enough data to train on", {}, len(ids), time.perf_counter() - t0)
    options = {
        "ewc_lambda": tc.ewc_lambda, "temperature": tc.lwf_temperature, "per_class": tc.rehearsal_per_class,
        "selection": tc.rehearsal_selection, "seed": tc.seed,
    }
    strategy = get_strategy(tc.strategy)(strategy_dir / tc.strategy, **options)
    settings = ContinualSettings(tc.epochs, tc.batch_size, tc.lr, 1e-4, tc.pseudo_lambda, tc.ramp_epochs, tc.seed, tc.swa_epochs)
    candidate, used = train_generation(previous, data, strategy, settings, num_classes=len(classes))
    decision = gate(candidate, previous, val.x, val.y, classes, tc.gate_tolerance, tc.gate_max_class_drop)
    metrics = {"gate": {"publish": decision.publish, "reason": decision.reason, **decision.metrics}}
    if rechecked:
        metrics["pseudo_recheck"] = rechecked
    log.info("gate", publish=decision.publish, reason=decision.reason, **decision.metrics)
    if not decision.publish:
        samples.mark_used(ids, f"refused:{int(time.time())}")
        return RetrainResult(None, decision.reason, metrics, len(ids), time.perf_counter() - t0)
    if tc.calibrate:  # before the strategy keeps its anchor: the next retrain starts from the published weights
        metrics["calibration"] = calibrate(candidate, val.x, val.y).summary()
        log.info("calibrated", **metrics["calibration"])
    strategy.after(candidate, used)
    counts = {"labelled": len(train), "expert": int((~received.pseudo).sum()), "pseudo": int(received.pseudo.sum())}
    training = {
        "kind": "continual", "strategy": tc.strategy, "settings": asdict(settings), "samples": counts,
        "new_classes": new_classes, "pseudo_recheck": rechecked, "torch": torch.__version__,
    }
    calib = train.x if len(train) else received.x
    version = publish_model(
        candidate, classes, store.root, metrics=metrics, training=training, parent=current.name,
        calibration=calib[:256].numpy() if tc.int8 and len(calib) else None,
        held_out=(val.x.numpy(), val.y.numpy()) if len(val) else None,
    )
    samples.mark_used(ids, version.name)
    announce(version.name)
    log.info("retrain_published", engine_version=version.name, parent=current.name, seconds=round(time.perf_counter() - t0, 1))
    return RetrainResult(version.name, decision.reason, metrics, len(ids), time.perf_counter() - t0)


class TrainerService:
    def __init__(self, cfg: AppConfig, state_dir: Path) -> None:
        self.cfg = cfg
        self.state_dir = state_dir
        self.root = trainer_state_dir(cfg, state_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = get_logger("trainer.service", state_dir=str(self.root))
        self.samples = SampleStore(self.root)
        self.store = resolve_store(cfg, state_dir)
        endpoint, announce = handoff_endpoints(cfg, state_dir)
        h = cfg.handoff
        self.receiver = Receiver(self.samples, ReceiverSettings(endpoint, announce, h.heartbeat_s, h.max_payload_mb << 20, curve_keys(cfg)))
        self._stop = threading.Event()
        self.state = "idle"
        self.last: RetrainResult | None = None
        self.started = time.time()

    @property
    def request_file(self) -> Path:
        return self.root / "retrain.request"

    @property
    def status_file(self) -> Path:
        return self.root / "status.json"

    def request_stop(self, *_a) -> None:
        self._stop.set()

    def status(self) -> dict:
        return {
            "pid": os.getpid(), "updated": time.time(), "uptime_s": round(time.time() - self.started, 1), "state": self.state,
            "samples": self.samples.counts(), "retrain_threshold": self.cfg.trainer.retrain_threshold,
            "receiver": dict(self.receiver.counters), "daemons_seen": len(self.receiver.peers),
            "last_retrain": asdict(self.last) if self.last else None, "store": str(self.store.root),
        }

    def _write_status(self) -> None:
        atomic_write(self.status_file, (json.dumps(self.status(), indent=2) + "\n").encode(), durable=False)

    def run(self) -> int:
        if self.cfg.trainer.nice:
            os.nice(self.cfg.trainer.nice)  # inference first
        self.receiver.start()
        self.log.info("serving", store=str(self.store.root), threshold=self.cfg.trainer.retrain_threshold)
        next_status = 0.0
        while not self._stop.is_set():
            due = self.samples.counts()["new"] >= self.cfg.trainer.retrain_threshold
            if due or self.request_file.exists():
                self.request_file.unlink(missing_ok=True)
                self.state = "training"
                self._write_status()
                try:
                    self.last = retrain(self.cfg, self.store, self.samples, self.root / "strategy", self.receiver.announce)
                except Exception as exc:
                    self.log.error("retrain_failed", error=repr(exc))
                    self.last = RetrainResult(None, f"failed: {exc!r}", {}, 0, 0.0)
                self.state = "idle"
            if time.monotonic() >= next_status:
                self._write_status()
                next_status = time.monotonic() + 2.0
            self._stop.wait(0.5)
        self.receiver.stop()
        self._write_status()
        self.samples.close()
        return 0
