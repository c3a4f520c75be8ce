"""Field simulation: does learning from the field's own photos help?

The seed's self-training protocol on real photos. Splits (stratified, seeded; exact duplicate photos
dropped first): test 10 %, validation 10 %, a labelled pool of 20 % of the rest, and the remainder
streamed in days of ``day_size`` photos, shuffled across classes as a field would see them.

* **Supervised only**: the model trained on the labelled pool (validation for early stopping),
  published as the store's first version; its test top-1 is the baseline.
* **Each day**: the engine in service classifies the day's photos; the daemon's label policy
  (:func:`edge_agent.labelling.decide`, ``pseudo_threshold`` = ``review_threshold`` = ``tau``) makes a
  pseudo-label of what it queues so, under its class's cap (per engine version); once ``retrain_at`` new
  samples have arrived the trainer retrains (:func:`trainer.service.retrain`: labelled cross-entropy plus
  the ramped, confidence-weighted pseudo-label loss, the gate, publishing). The day ends with the test
  top-1 of the engine in service, the pseudo-labels accepted and their precision against the truth.

``python -m benchmarks.simulate --data DIR --out DIR [--mode full]`` (research, not part of the product:
it lives beside the other benchmarks). ``fast`` runs those pieces in one process (the same classifier, sample store and retrain function);
``full`` drives the real ``edge-agent run`` and ``edge-trainer serve`` processes: photos copied into the
inbox, pseudo-labels handed over ZeroMQ, engines hot-swapped.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from benchmarks._procs import wait_for
from edge_agent.classifier import Classifier
from edge_agent.config import parse_config
from edge_agent.labelling import decide
from edge_agent.log import get_logger
from edge_agent.preprocess import preprocess_file
from edge_agent.results import query_readonly
from edge_agent.review.rank import Candidate, rank
from engines.loader import open_engine
from engines.store import EngineStore
from trainer.calibrate import calibrate, calibration_error
from trainer.data import Sample, TensorDataset, scan_folder, stratified_split
from trainer.models import build_model
from trainer.publish import publish_model
from trainer.samples import SampleStore
from trainer.service import retrain
from trainer.train import TrainSettings, fit

__all__ = ["SimSettings", "Split", "split_photos", "simulate"]


@dataclass
class SimSettings:
    mode: str = "fast"  # fast | full
    days: int | None = None  # None: every full day the stream holds
    day_size: int = 100
    test_fraction: float = 0.1
    val_fraction: float = 0.1
    labelled_fraction: float = 0.2
    tau: float = 0.9
    cap: int = 500
    retrain_at: int = 200
    epochs: int = 200  # supervised baseline: 100 left it under-trained (validation top-1 0.66 vs 0.76 at 200)
    patience: int = 200
    # No label smoothing for the baseline: smoothing 0.1 over 23 classes caps the trained softmax near 0.90,
    # right at tau, so almost nothing would ever be confident enough to become a pseudo-label.
    label_smoothing: float = 0.0
    swa_epochs: int = 20  # baseline: average the last N epochs' weights (kept only if validation prefers it)
    calibrate: bool = True  # temperature scaling on the validation split, for the baseline and every retrain
    recheck: bool = True  # retrains score the pseudo-labels again with the engine in service ([trainer] recheck_pseudo)
    retrain_epochs: int = 15
    retrain_lr: float = 2e-3  # every recorded arm ran with it, with or without experts (the service: 5e-4 without)
    interpolate: float = 1.0  # likewise (the service chooses the step of a retrain on pseudo-labels alone: trainer.step)
    strategy: str = "rehearsal"
    expert_per_day: int = 0  # an expert labels this many photos a day from the review pool (fast mode)
    expert_choice: str = "device"  # device: the review queue's ranking; random: at random from the same pool
    expert_budget: int = 100  # most expert labels in the whole run
    threads: int = 2
    seed: int = 20251120
    baseline_from: str | None = None  # an earlier simulation's folder: reuse its baseline (same data and seed)
    day_timeout_s: float = 1800.0  # full mode: longest wait for one day's photos, hand-over and retrain


@dataclass
class Split:
    classes: list[str]
    test: list[Sample]
    val: list[Sample]
    labelled: list[Sample]
    stream: list[Sample]
    duplicates: int = 0
    truth: dict[str, int] = field(default_factory=dict)  # sha256 -> class index

    def sizes(self) -> dict:
        return {
            "test": len(self.test),
            "val": len(self.val),
            "labelled": len(self.labelled),
            "stream": len(self.stream),
            "duplicates_dropped": self.duplicates,
        }


#: Every simulation so far classified in FP32; the figures compare only if it stays so.
FP32 = {"type": "onnxruntime", "precision": "fp32"}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def split_photos(data: str | os.PathLike, s: SimSettings) -> Split:
    """The protocol's splits; photos whose bytes repeat (PlantVillage has some) are kept once."""
    folder = scan_folder(data)
    seen: dict[str, int] = {}
    unique = []
    for sample in folder.samples:
        sha = _sha(Path(sample.path))
        if sha not in seen:
            seen[sha] = sample.label
            unique.append(sample)
    parts = stratified_split(unique, {"test": s.test_fraction, "val": s.val_fraction}, s.seed)
    pool = stratified_split(parts["train"], {"labelled": s.labelled_fraction}, s.seed + 1)
    stream = sorted(pool["train"], key=lambda x: str(x.path))
    random.Random(s.seed).shuffle(stream)
    return Split(folder.classes, parts["test"], parts["val"], pool["labelled"], stream, len(folder.samples) - len(unique), seen)


THRESHOLDS = (0.5, 0.8, 0.9, 0.95, 0.97, 0.99)


class _Evaluator:
    """Test top-1 of a store version through the daemon's own classifier (ONNX Runtime CPU)."""

    def __init__(self, store: EngineStore, test: list[Sample]) -> None:
        self.store = store
        self.x = np.stack([preprocess_file(t.path) for t in test])
        self.y = np.array([t.label for t in test])

    def classifier(self, version: str | None = None, top_k: int = 1, confident: float = 0.9) -> Classifier:
        """``version`` as the daemon classifies with it, a ``confident`` verdict from softmax ``confident`` up."""
        engine = open_engine(self.store, parse_config({"engine": FP32}).engine, version)
        return Classifier(engine, top_k=top_k, confident_probability=confident)

    def threshold_sweep(self, version: str, photos: list[Sample], classes: list[str], taus=THRESHOLDS) -> dict:
        """Precision and count of pseudo-labels ``version`` would give the whole stream at each threshold (what
        raising ``[labels] pseudo_threshold`` buys in precision and costs in pseudo-labels), and its expected
        calibration error on those photos."""
        chunks = (np.stack([preprocess_file(t.path) for t in photos[i : i + 64]]) for i in range(0, len(photos), 64))
        preds = self._predict(version, chunks)
        right = np.array([p.label == classes[t.label] for p, t in zip(preds, photos)])
        conf = np.array([p.confidence for p in preds])
        rows = []
        for tau in taus:
            keep = conf >= tau
            rows.append(
                {
                    "tau": tau,
                    "accepted": int(keep.sum()),
                    "share": round(float(keep.mean()), 4),
                    "precision": round(float(right[keep].mean()), 4) if keep.any() else None,
                }
            )
        return {"rows": rows, "ece": round(calibration_error(torch.from_numpy(conf), torch.from_numpy(right)), 4)}

    def _predict(self, version: str, batches) -> list:
        """Predictions of ``version`` for an iterable of preprocessed batches (made lazily: bounded memory)."""
        clf = self.classifier(version)
        try:
            return [p for x in batches for p in clf.predict_tensors(x)]
        finally:
            clf.engine.close()

    def __call__(self, version: str, classes: list[str]) -> tuple[float, list[list[int]]]:
        preds = self._predict(version, (self.x[i : i + 64] for i in range(0, len(self.x), 64)))
        index = {c: i for i, c in enumerate(classes)}
        pred = np.array([index[p.label] for p in preds])
        confusion = np.zeros((len(classes), len(classes)), int)
        np.add.at(confusion, (self.y, pred), 1)
        return float((pred == self.y).mean()), confusion.tolist()


def _train_baseline(split: Split, store_dir: Path, s: SimSettings, log) -> None:
    torch.set_num_threads(s.threads)
    val = TensorDataset(split.val)
    if s.baseline_from:
        from trainer.publish import load_weights

        earlier = EngineStore(Path(s.baseline_from) / "store").open("v0001")
        report = json.loads((Path(s.baseline_from) / "report.json").read_text())
        if earlier.classes != split.classes or report["split"] != split.sizes() or report["settings"]["seed"] != s.seed:
            raise ValueError(f"--baseline-from {s.baseline_from}: made from other data, splits or seed")
        model, training = (load_weights(earlier), {**earlier.manifest.get("training", {}), "reused_from": str(s.baseline_from)})
        earlier_calibration = earlier.manifest.get("metrics", {}).get("calibration")
        log.info("baseline_reused", source=str(s.baseline_from))
    else:
        settings = TrainSettings(
            epochs=s.epochs, patience=s.patience, seed=s.seed, int8=False, label_smoothing=s.label_smoothing, swa_epochs=s.swa_epochs
        )
        model, info = fit(build_model(len(split.classes)), TensorDataset(split.labelled), val, settings, progress=sys.stderr.isatty())
        training = {"kind": "simulation-baseline", "labelled": len(split.labelled)}
        earlier_calibration = None
        log.info("baseline_trained", labelled=len(split.labelled), epochs_run=info["epochs_run"], best_epoch=info["best_epoch"])
    metrics = {}
    if earlier_calibration:  # already folded in: a second fit would find T = 1 and hide the first
        metrics["calibration"] = earlier_calibration
    elif s.calibrate:
        metrics["calibration"] = calibrate(model, val.x, val.y).summary()
        log.info("baseline_calibrated", **metrics["calibration"])
    from engines.signing import load_or_create_key

    # signed like any version a trainer publishes; the simulated daemon trusts this key (see _config)
    publish_model(
        model,
        split.classes,
        store_dir,
        training=training,
        metrics=metrics,
        signing_key=load_or_create_key(store_dir.parent / "signing.key"),
    )


def _class_folders(split: Split, samples: list[Sample], root: Path) -> Path:
    """Photos as <Class>/<photo> folders, the layout the trainer reads."""
    for sample in samples:
        dst = root / split.classes[sample.label] / Path(sample.path).name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sample.path, dst)
    return root


def _config(s: SimSettings, out: Path, labelled: Path, validation: Path) -> dict:
    """One configuration for both modes (and both processes in ``full``)."""
    return {
        "store": {"path": str(out / "store"), "trusted_keys": [str(out / "signing.pub")]},
        "engine": FP32,
        "labels": {"pseudo_threshold": s.tau, "review_threshold": s.tau, "trust_confidence": s.tau, "per_class_cap": s.cap},
        "inbox": {"settle_s": 0.5, "rescan_interval_s": 5.0},
        "hotswap": {"poll_s": 1.0},
        "log": {"format": "json"},
        "trainer": {
            "labelled_data": str(labelled),
            "validation_data": str(validation),
            "retrain_threshold": s.retrain_at,
            "epochs": s.retrain_epochs,
            "strategy": s.strategy,
            "threads": s.threads,
            "nice": 0,
            "int8": False,
            "seed": s.seed,
            "calibrate": s.calibrate,
            "recheck_pseudo": s.recheck,
            "gate_tolerance": 0.005,  # the strict gate every earlier simulation used, so their figures compare
            "distill": 0.0,  # as every simulation so far (the expert arms among them) ran; the service's default is 1.0
            # the recorded arms' settings unless asked otherwise, with and without expert labels alike
            "lr": s.retrain_lr,
            "interpolate": s.interpolate,
            "pseudo_only_lr": s.retrain_lr,
            "pseudo_only_steps": [s.interpolate],
        },
    }


class _FastField:
    """Daemon and trainer in this process: classify, queue, retrain when due."""

    def __init__(self, cfg: dict, s: SimSettings, out: Path, evaluate: _Evaluator) -> None:
        self.cfg = parse_config(cfg)
        self.s = s
        self.store = EngineStore(out / "store")
        self.samples = SampleStore(out / "fast" / "trainer")
        self.strategy_dir = out / "fast" / "trainer" / "strategy"
        self.evaluate = evaluate
        self.counts: dict[str, dict[str, int]] = {}  # engine version -> label -> queued (the daemon's cap)
        self.review: dict[str, tuple[Sample, list]] = {}  # the review pool: sha256 -> (photo, top-k when it arrived)
        self.expert_labels = 0
        self.rng = random.Random(s.seed)

    def _ask_expert(self, classes: list[str], truth: dict[str, int]) -> int:
        """The expert labels the day's photos from the review pool, chosen as the daemon ranks them or at random."""
        k = min(self.s.expert_per_day, self.s.expert_budget - self.expert_labels, len(self.review))
        if k <= 0:
            return 0
        if self.s.expert_choice == "device":
            chosen = [c.id for c in rank((Candidate(sha, top_k) for sha, (_, top_k) in self.review.items()), k)]
        else:
            chosen = self.rng.sample(sorted(self.review), k)
        for sha in chosen:
            photo, _ = self.review.pop(sha)
            header = {
                "id": sha,
                "kind": "expert",
                "label": classes[truth[sha]],
                "confidence": 1.0,
                "engine_version": self.store.current(),
                "ext": ".jpg",
            }
            self.samples.add(header, Path(photo.path).read_bytes())
        self.expert_labels += k
        return k

    def day(self, photos: list[Sample], classes: list[str] | None = None, truth: dict[str, int] | None = None) -> dict:
        version = self.store.current()
        clf = self.evaluate.classifier(version, top_k=3, confident=self.cfg.labels.pseudo_threshold)
        try:
            x = np.stack([preprocess_file(p.path) for p in photos])
            preds = clf.predict_tensors(x)
        finally:
            clf.engine.close()
        counts = self.counts.setdefault(version, {})
        for photo, p in zip(photos, preds):
            kind = decide(p.verdict, p.confidence, self.cfg.labels)  # the daemon's own policy
            if kind == "pseudo" and counts.get(p.label, 0) < self.s.cap:
                data = Path(photo.path).read_bytes()
                header = {
                    "id": hashlib.sha256(data).hexdigest(),
                    "kind": "pseudo",
                    "label": p.label,
                    "confidence": p.confidence,
                    "engine_version": p.engine_version,
                    "ext": ".jpg",
                }
                if self.samples.add(header, data):
                    counts[p.label] = counts.get(p.label, 0) + 1
            elif kind == "review" and self.s.expert_per_day:
                self.review[hashlib.sha256(Path(photo.path).read_bytes()).hexdigest()] = (photo, [list(t) for t in p.top_k])
        if self.s.expert_per_day:
            self._ask_expert(classes, truth)
        if self.samples.counts()["new"] < self.s.retrain_at:
            return {}
        result = retrain(self.cfg, self.store, self.samples, self.strategy_dir)
        return {"published": result.published, "reason": result.reason, "seconds": round(result.seconds, 1)}

    def pseudo_labels(self) -> dict[str, str]:
        return {x.id: x.label for x in self.samples.all() if x.kind == "pseudo"}

    def trained_pseudo_labels(self) -> dict[str, str]:
        """The pseudo-labels the last retrain trained on (after the recheck), id -> class."""
        return json.loads(self.samples.get_state("last_retrain_pseudo") or "{}")

    def close(self) -> None:
        self.samples.close()


class _FullField:
    """The real daemon and trainer processes on one state directory."""

    def __init__(self, cfg: dict, s: SimSettings, out: Path, evaluate: _Evaluator) -> None:
        from edge_agent.config_toml import sections_toml

        self.s = s
        self.root = out / "full"
        self.state = self.root / "state"
        self.inbox = self.state / "inbox"
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.store = EngineStore(out / "store")
        config = self.root / "edge-agent.toml"
        config.write_text(sections_toml(cfg))
        self.procs = {}
        for name, argv in (
            ("daemon", ["-m", "edge_agent", "run", "--config", str(config), "--state-dir", str(self.state)]),
            ("trainer", ["-m", "trainer", "--log-format", "json", "serve", "--config", str(config), "--state-dir", str(self.state)]),
        ):
            log = open(self.root / f"{name}.log", "ab")
            self.procs[name] = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT)
        self.sent = 0
        self._wait(lambda: bool(self._json(self.state / "status.json")), "the daemon to start")

    @staticmethod
    def _json(path: Path) -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    def _wait(self, cond, what: str) -> None:
        wait_for(cond, what, self.procs, self.s.day_timeout_s, self.root)

    expert_labels = 0

    def day(self, photos: list[Sample], classes: list[str] | None = None, truth: dict[str, int] | None = None) -> dict:
        day_dir = self.inbox / f"day{self.sent // self.s.day_size + 1:03d}"
        staging = self.inbox / ".staging"
        staging.mkdir(exist_ok=True)
        for i, p in enumerate(photos):  # copied next door, then renamed in: whole files only, like a camera app
            tmp = staging / f"{self.sent + i:05d}.jpg"
            shutil.copy(p.path, tmp)
        day_dir.mkdir()
        for i, _ in enumerate(photos):
            os.rename(staging / f"{self.sent + i:05d}.jpg", day_dir / f"{self.sent + i:05d}.jpg")
        self.sent += len(photos)
        results = self.state / "results.sqlite"
        self._wait(lambda: (query_readonly(results, "SELECT COUNT(*) FROM results") or [[0]])[0][0] >= self.sent, "the day's results")
        self._wait(lambda: not query_readonly(results, "SELECT 1 FROM label_queue WHERE kind = 'pseudo' LIMIT 1"), "the hand-over")
        before = self._trainer().get("last_retrain")

        def settled() -> bool:
            t = self._trainer()
            if t.get("state") != "idle" or t.get("samples", {}).get("new", 0) >= self.s.retrain_at:
                return False  # training, or due to start
            d = self._json(self.state / "status.json")
            return d.get("engine", {}).get("engine_version") == self.store.current()

        time.sleep(1.5)  # the trainer looks at its samples every 0.5 s
        self._wait(settled, "the trainer to finish and the daemon to swap")
        last = self._trainer().get("last_retrain")
        if last is None or last == before:
            return {}
        return {"published": last["published"], "reason": last["reason"], "seconds": round(last["seconds"], 1)}

    def _trainer(self) -> dict:
        return self._json(self.state / "trainer" / "status.json")

    def pseudo_labels(self) -> dict[str, str]:
        return dict(query_readonly(self.state / "trainer" / "samples.sqlite", "SELECT id, label FROM samples WHERE kind = 'pseudo'"))

    def trained_pseudo_labels(self) -> dict[str, str]:
        rows = query_readonly(self.state / "trainer" / "samples.sqlite", "SELECT value FROM state WHERE key = 'last_retrain_pseudo'")
        return json.loads(rows[0][0]) if rows else {}

    def close(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def simulate(data: str | os.PathLike, out: str | os.PathLike, s: SimSettings, progress=lambda msg: None) -> dict:
    """Run the simulation; writes ``report.json``, ``report.md`` and plots into ``out`` and returns the report."""
    t0 = time.perf_counter()
    out = Path(out)
    if (out / "store").exists():
        raise FileExistsError(f"{out} holds an earlier simulation; give an empty or new --out")
    out.mkdir(parents=True, exist_ok=True)
    log = get_logger("trainer.simulate", mode=s.mode)
    split = split_photos(data, s)
    days = [split.stream[i : i + s.day_size] for i in range(0, len(split.stream) - s.day_size + 1, s.day_size)]
    if s.days is not None:
        if s.days > len(days):
            raise ValueError(f"--days {s.days}: the stream holds {len(split.stream)} photos, {len(days)} full days of {s.day_size}")
        days = days[: s.days]
    if not days:
        raise ValueError(f"{data}: too few photos for one day of {s.day_size} after the labelled and held-out splits")
    if s.expert_per_day and s.mode != "fast":
        raise ValueError("--expert-per-day: the expert arms run in fast mode only")
    log.info("split", **split.sizes(), days=len(days))
    progress(f"split {split.sizes()}; training the supervised baseline on {len(split.labelled)} labelled photos")
    _train_baseline(split, out / "store", s, log)
    store = EngineStore(out / "store")
    evaluate = _Evaluator(store, split.test)
    baseline = store.current()
    supervised_top1, confusion = evaluate(baseline, split.classes)
    log.info("supervised", top1=round(supervised_top1, 4), engine_version=baseline)
    sweep = evaluate.threshold_sweep(baseline, split.stream, split.classes)
    # The trainer replays the whole labelled pool and gates on the validation split: photos the baseline
    # chose its checkpoint with but never trained on (gating on photos it had trained on would favour it).
    cfg = _config(s, out, _class_folders(split, split.labelled, out / "labelled"), _class_folders(split, split.val, out / "validation"))
    field_ = (_FullField if s.mode == "full" else _FastField)(cfg, s, out, evaluate)
    rows, accepted_before = [], set()
    try:
        for n, photos in enumerate(days, 1):
            t_day = time.perf_counter()
            experts_before = field_.expert_labels
            retrained = field_.day(photos, split.classes, split.truth)
            pseudo = field_.pseudo_labels()
            new = {k: v for k, v in pseudo.items() if k not in accepted_before}
            accepted_before |= set(new)
            correct = sum(split.classes[split.truth[k]] == v for k, v in new.items())
            version = store.current()
            top1, confusion = evaluate(version, split.classes)
            rows.append(
                {
                    "day": n,
                    "photos": len(photos),
                    "accepted": len(new),
                    "accepted_correct": correct,
                    "precision": round(correct / len(new), 4) if new else None,
                    "cumulative_accepted": len(pseudo),
                    "expert_labels": field_.expert_labels - experts_before,
                    "test_top1": round(top1, 4),
                    "engine_version": version,
                    "retrain": retrained or None,
                    "seconds": round(time.perf_counter() - t_day, 1),
                }
            )
            log.info("day", **{k: v for k, v in rows[-1].items() if k != "retrain"}, retrain=json.dumps(retrained or None))
            progress(
                f"day {n}/{len(days)}: top-1 {top1:.4f}, {len(new)} pseudo-labels accepted ({rows[-1]['precision']}), engine {version}"
            )
        trained = field_.trained_pseudo_labels()
    finally:
        field_.close()
    trained_right = sum(split.classes[split.truth[k]] == v for k, v in trained.items())
    accepted = sum(r["accepted"] for r in rows)
    correct = sum(r["accepted_correct"] for r in rows)
    report = {
        "mode": s.mode,
        "data": str(Path(data).resolve()),
        "classes": len(split.classes),
        "split": split.sizes(),
        "settings": asdict(s),
        "supervised_top1": round(supervised_top1, 4),
        "supervised_engine_version": baseline,
        "ssl_top1": rows[-1]["test_top1"],
        "ssl_engine_version": rows[-1]["engine_version"],
        "gain_points": round((rows[-1]["test_top1"] - supervised_top1) * 100, 2) + 0.0,
        "pseudo_labels_accepted": accepted,
        "expert_labels": field_.expert_labels,
        "pseudo_label_precision": round(correct / accepted, 4) if accepted else None,
        # what the last retrain trained on: the pseudo-labels it kept after the recheck, with the labels it gave them
        "pseudo_labels_trained": len(trained),
        "trained_pseudo_label_precision": round(trained_right / len(trained), 4) if trained else None,
        "days": rows,
        "threshold_sweep": {"engine_version": baseline, "photos": len(split.stream), **sweep},
        "calibration": {v: store.read_manifest(v).get("metrics", {}).get("calibration") for v in store.versions()},
        "confusion": {"classes": split.classes, "matrix": confusion},
        "wall_s": round(time.perf_counter() - t0, 1),
        "machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}",
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    from benchmarks.simreport import write_markdown, write_plots

    write_markdown(report, out / "report.md")
    write_plots(report, out)
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    from edge_agent.log import configure_logging
    from edge_agent.trainer_config import STRATEGY_CONFIGS

    m = argparse.ArgumentParser(prog="python -m benchmarks.simulate", description=__doc__.split("\n\n")[0])
    m.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    m.add_argument("--data", required=True, help="folder of <Class name>/<photo> folders")
    m.add_argument("--out", required=True, help="new folder for report.json, report.md, plots, the store and state")
    m.add_argument(
        "--mode",
        choices=["fast", "full"],
        default="fast",
        help="fast: one process; full: the real daemon and trainer processes (inbox, ZeroMQ, hot swaps)",
    )
    m.add_argument("--days", type=int, default=None, help="days to stream (default: every full day the data holds)")
    m.add_argument("--day-size", type=int, default=100, help="photos per day")
    m.add_argument("--epochs", type=int, default=200, help="supervised baseline: epochs")
    m.add_argument("--swa-epochs", type=int, default=20, help="supervised baseline: average the last N epochs (SWA); 0 = off")
    m.add_argument("--retrain-epochs", type=int, default=15, help="epochs per retrain")
    m.add_argument(
        "--retrain-lr",
        type=float,
        default=2e-3,
        help="retrain learning rate, every retrain (default 2e-3, as every recorded arm ran; the service uses 5e-4 without expert labels)",
    )
    m.add_argument(
        "--interpolate",
        type=float,
        default=1.0,
        help="retrain WiSE-FT interpolation, every retrain (default 1, as the recorded arms ran; the service chooses the step of a retrain without expert labels on the gate photos)",
    )
    m.add_argument(
        "--label-smoothing",
        type=float,
        default=0.0,
        help="baseline training (default 0: smoothing caps confidences near tau, starving the pseudo-label queue)",
    )
    m.add_argument("--tau", type=float, default=0.9, help="pseudo-label confidence threshold (the protocol's is 0.9)")
    m.add_argument("--retrain-at", type=int, default=200, help="retrain once this many new pseudo-labels arrived")
    m.add_argument("--strategy", choices=STRATEGY_CONFIGS, default="rehearsal", help="[trainer.strategy] type, with its default options")
    m.add_argument(
        "--expert-per-day",
        type=int,
        default=0,
        metavar="K",
        help="an expert labels K photos a day from the review pool (photos below tau), fast mode (default 0: none)",
    )
    m.add_argument(
        "--expert-choice",
        choices=["device", "random"],
        default="device",
        help="device: the review queue's ranking (edge-agent review list); random: K at random from the same pool",
    )
    m.add_argument("--expert-budget", type=int, default=100, help="most expert labels in the whole run")
    m.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    m.add_argument("--seed", type=int, default=20251120)
    m.add_argument(
        "--no-calibrate",
        action="store_true",
        help="publish models as trained, without the softmax temperature fitted on the validation split",
    )
    m.add_argument(
        "--no-recheck",
        action="store_true",
        help="retrains train on the pseudo-labels as received, without the engine in service looking again ([trainer] recheck_pseudo)",
    )
    m.add_argument("--baseline-from", metavar="DIR", help="reuse the supervised baseline of an earlier simulation (same data and seed)")
    args = m.parse_args(argv)
    configure_logging(args.log_level, "auto")
    settings = SimSettings(
        mode=args.mode,
        days=args.days,
        day_size=args.day_size,
        epochs=args.epochs,
        retrain_epochs=args.retrain_epochs,
        retrain_lr=args.retrain_lr,
        interpolate=args.interpolate,
        retrain_at=args.retrain_at,
        tau=args.tau,
        strategy=args.strategy,
        threads=args.threads,
        seed=args.seed,
        label_smoothing=args.label_smoothing,
        swa_epochs=args.swa_epochs,
        patience=args.epochs,
        baseline_from=args.baseline_from,
        calibrate=not args.no_calibrate,
        recheck=not args.no_recheck,
        expert_per_day=args.expert_per_day,
        expert_choice=args.expert_choice,
        expert_budget=args.expert_budget,
    )
    try:
        report = simulate(args.data, args.out, settings, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except (ValueError, FileExistsError, TimeoutError, RuntimeError) as exc:
        print(f"benchmarks.simulate: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {
                k: report[k]
                for k in (
                    "supervised_top1",
                    "ssl_top1",
                    "gain_points",
                    "pseudo_label_precision",
                    "trained_pseudo_label_precision",
                    "wall_s",
                )
            }
        )
    )
    print(f"report: {Path(args.out) / 'report.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
