"""A device in a new field, learning from an expert's few labels: arms over seeds, field and lab side by side.

``python -m benchmarks.field_loop --out DIR [--field apple-orchard] [--arms device random none] [--seeds 1 2 3]
[--k 10] [--budget 100] [--mode fast|full] [--days N] [--day-size 100] [--store DIR]``

Protocol. The field folder's photos (``../shared/data/field/<field>``, exact duplicates kept once) are split per seed,
stratified: 25 % held out as the field test, the rest shuffled and streamed in days of 100. The device starts from
the shipped model with the shipped configuration (nothing set but the state directory). Each day it classifies the
day's photos with the daemon's own code (:class:`edge_agent.labelling.LabelQueuer`: the label policy, per-class trust
from the expert's checks, the spool); the expert then labels ``K`` photos of the review pool with their true class:
``device``, the first K as ``edge-agent review list`` ranks them; ``random``, K at random from the same pool;
``none``, no labels. At most ``--budget`` labels in all. What is queued is handed to the trainer, which retrains when
:meth:`trainer.service.TrainerService` would (``retrain_threshold`` new samples or ``expert_threshold`` new expert
labels) with :func:`trainer.retrain.retrain`: the lab gate, the field check on the held-back expert labels, publishing.

``fast`` runs the daemon's and trainer's functions in this process (the idle inference thread's too: the review pool
answered again, pseudo-labels found wrong withdrawn, those trust now covers made; since 2026-12-07 a pseudo-label is
recorded as delivered, so the withdrawal reaches the trainer's store as it does over the hand-off); ``full`` runs the real ``edge-agent run`` and
``edge-trainer serve`` on one state directory, drops the day's photos into its inbox and labels through
``edge-agent review list/label`` (``device`` arm only). After each day: the field test top-1 and the lab top-1 of the
engine in service (as the device runs it; lab: the shipped model's validation split, which no retrain trains or is
gated on), the day's pseudo-labels and their precision (how many of them, and how many right, came from the review
pool: in full mode photos of earlier days only; and the delivered ones withdrawn that day), expert labels so far,
versions published and refused; in
``fast`` mode also each candidate the field check judged, scored with the version in service on the held-out field
photos (torch FP32), to show whether the check's few held-back photos refuse candidates that are better.
``--store DIR`` (fast mode) starts from that store's current version instead of the shipped one: a release candidate
measured before it ships (it must be trained on the shipped model's split, whose gate and replay photos it is given).
Writes ``DIR/<arm>/seed-<N>/report.json``; a run with a report is not run again. ``--report`` then writes
``DIR/summary.json``, ``summary.md`` and ``field-top1.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from unittest import mock

from benchmarks._loop_report import markdown, plot, summarise
from benchmarks._loop_verdicts import day_verdicts, fill_verdicts
from benchmarks._sets import config_sets, with_sets

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"

__all__ = ["LoopSettings", "split_field", "run", "starting_store", "store_root", "summarise"]


@dataclass
class LoopSettings:
    field: str = "apple-orchard"
    arm: str = "device"  # device | device-labels-only (no unlabelled photos) | random | none
    seed: int = 1
    k: int = 10
    budget: int = 100
    day_size: int = 100
    test_fraction: float = 0.25
    days: int | None = None  # None: every full day of the stream
    mode: str = "fast"
    data: str = str(SHARED / "field")
    lab: str = str(SHARED / "plantvillage")
    overrides: dict | None = None  # fast mode: configuration changed from the shipped one, {section: {key: value}}
    store: str | None = None  # fast mode: a store whose current version stands in for the shipped model


def store_root(path: str | None) -> Path:
    """The store a run starts from: ``path`` (checked once by :func:`starting_store`) or the shipped one."""
    from edge_agent.config import default_store_path

    return default_store_path() if path is None else Path(path)


def starting_store(path: str | None) -> Path:
    """:func:`store_root`, refused unless it opens and was trained on the shipped model's split (checked once, at the
    command line)."""
    from engines.store import EngineStore

    root = store_root(path)
    if path is None:
        return root
    try:
        version = EngineStore(root).open()
    except Exception as e:  # noqa: BLE001 - any reason it cannot serve ends the run before any work
        raise SystemExit(f"--store {root}: no version to start from ({e}); give the store a release wrote (its --out)") from e
    split, shipped = (json.loads(p.read_text()) if p.is_file() else None for p in (version.path / "split.json", _shipped_split()))
    if split != shipped:  # the retrain's gate and replay photos are the shipped split's: another split would leak
        raise SystemExit(f"--store {root}: {version.name} was not trained on the shipped model's split; release it with the same seed")
    return root


def _shipped_split() -> Path:
    from edge_agent.config import default_store_path
    from engines.store import EngineStore

    return EngineStore(default_store_path()).open().path / "split.json"


def split_field(root: Path, classes: list[str], seed: int, test_fraction: float) -> tuple[list, list]:
    """(test, stream): (path, class index) pairs, stratified by class, the stream shuffled across classes."""
    rng = random.Random(seed)
    test, stream, seen = [], [], set()
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name in classes):
        photos = []
        for path in sorted(folder.iterdir()):
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            if sha not in seen:
                seen.add(sha)
                photos.append((path, classes.index(folder.name)))
        rng.shuffle(photos)
        cut = round(len(photos) * test_fraction)
        test += photos[:cut]
        stream += photos[cut:]
    rng.shuffle(stream)
    return test, stream


def _served(store, cfg, version: str | None = None):
    """``version`` (the store's current by default) opened as the daemon serves it, once its precision is checked here."""
    from edge_agent._truth import precision_check
    from engines.loader import open_engine

    engine = open_engine(store, cfg.engine, version, check_photos=precision_check)
    engine.wait_checked()
    return engine


class _Measure:
    """Top-1 of a store's engine in service on the field test and the lab photos, as the device runs it."""

    def __init__(self, cfg, test: list, lab: list) -> None:
        self.cfg = cfg
        self.photos = {"field": test, "lab": lab}
        self._sets: dict = {}  # per input spec: what the engine in service is given (a new lineage may differ)

    def _tensors(self, spec) -> dict:
        import numpy as np

        from edge_agent.preprocess import preprocess_file

        key = json.dumps(spec.to_manifest(), sort_keys=True)
        if key not in self._sets:
            self._sets = {
                key: {
                    name: (np.stack([preprocess_file(p, spec) for p, _ in photos]), [y for _, y in photos])
                    for name, photos in self.photos.items()
                    if photos
                }
            }
        return self._sets[key]

    def predictions(self, store, version: str | None = None) -> tuple[list[str], dict]:
        """``version``'s classes and, per set of photos, its answers as the device gives them and the true classes."""
        from edge_agent.classifier import Classifier
        from edge_agent.preprocess import PreprocessSpec

        clf = Classifier.configured(_served(store, self.cfg, version), self.cfg)
        try:
            serving = store.open(version)
            sets = self._tensors(PreprocessSpec.from_manifest(serving.manifest["preprocess"]))
            return list(serving.classes), {
                name: ([p for i in range(0, len(x), 64) for p in clf.predict_tensors(x[i : i + 64])], y) for name, (x, y) in sets.items()
            }
        finally:
            clf.engine.close()

    def __call__(self, store, version: str | None = None) -> dict:
        """Field and lab top-1 of ``version`` (the store's current by default)."""
        classes, sets = self.predictions(store, version)
        return {name: round(sum(classes.index(p.label) == t for p, t in zip(preds, y)) / len(y), 4) for name, (preds, y) in sets.items()}

    def field_top1(self, model, spec) -> float:
        """Held-out field top-1 of a torch ``model`` (FP32) given ``spec``'s input."""
        import torch

        from trainer.verdict_fit import logits_of

        x, y = self._tensors(spec)["field"]
        return round(float((logits_of(model, torch.from_numpy(x)).argmax(1) == y).mean()), 4)


@dataclass
class _Answer:
    """A classified photo as :class:`edge_agent.labelling.LabelQueuer` reads it."""

    sha256: str
    photo_id: str
    data: bytes
    prediction: object
    ext: str = ".jpg"
    origin: None = None


@contextlib.contextmanager
def _term_labels(truth: dict[str, int]):
    """While a retrain runs: how many of the labels its unlabelled term gave pool photos were right (the benchmark
    knows each photo's class; the trainer does not), filled into the dict yielded."""
    from trainer.loop import second_candidate

    real, seen = second_candidate.teach, {}

    def teach(*a, **k):
        term = real(*a, **k)
        if term.data is not None:
            known = [(truth.get(i), int(y)) for i, y in zip(term.data.sample_ids, term.data.y.tolist()) if truth.get(i) is not None]
            seen.update(taken_known=len(known), taken_right=sum(t == y for t, y in known))
        return term

    with mock.patch.object(second_candidate, "teach", teach):
        yield seen


@contextlib.contextmanager
def _judged(measure: _Measure, spec):
    """While a retrain runs: each candidate the field check judges, its held-out field top-1 and the version in
    service's (torch, FP32), and the check's decision, appended to the list yielded; whether the check, on its few
    held-back photos, refuses candidates that are better on the benchmark's held-out photos (the trainer never sees them)."""
    from trainer import retrain as retrain_mod

    real, seen = retrain_mod.field_gate, []

    def field_gate(candidate, previous, *a, **k):
        decision = real(candidate, previous, *a, **k)
        seen.append(
            {
                "candidate": measure.field_top1(candidate, spec),
                "in_service": measure.field_top1(previous, spec),
                "passed": decision.publish,
                "photos": decision.metrics.get("field_photos"),  # the held-back photos it was judged on
            }
        )
        return decision

    with mock.patch.object(retrain_mod, "field_gate", field_gate):
        yield seen


class _FastDevice:
    """The daemon's labelling, the expert and the trainer, in this process."""

    def __init__(self, s: LoopSettings, out: Path, truth: dict[str, int], measure: _Measure | None = None) -> None:
        from edge_agent.config import parse_config
        from edge_agent.golden import GoldenSet
        from edge_agent.labelling import LabelQueuer
        from edge_agent.results import ResultsDB
        from edge_agent.review.withdraw import Withdrawals
        from edge_agent.spool import PhotoSpool
        from engines.store import EngineStore
        from trainer.loop.unlabelled_pool import UnlabelledPool
        from trainer.samples import SampleStore

        self.s, self.truth, self.measure = s, truth, measure
        self.state = out / "state"
        shutil.rmtree(self.state, ignore_errors=True)
        # the shipped configuration; the labels-only arm without the unlabelled photos, to measure what they add
        off = {"trainer": {"unlabelled_term": False}, "handoff": {"unlabelled_per_day": 0}}
        self.cfg = parse_config(with_sets(off if s.arm == "device-labels-only" else {}, s.overrides))
        self.store = EngineStore(shutil.copytree(store_root(s.store), self.state / "engines"))
        self.db = ResultsDB(self.state / "results.sqlite")
        self.spool = PhotoSpool(self.state / "queue", self.cfg.labels.max_spool_mb << 20)
        self.queuer = LabelQueuer(self.db, self.spool, self.cfg.labels)
        self.withdrawals = Withdrawals(self.db, self.cfg.labels)
        self.samples = SampleStore(self.state / "trainer")
        tc = self.cfg.trainer
        self.unlabelled = UnlabelledPool(self.state / "trainer", tc.unlabelled_pool, tc.unlabelled_pool_mb << 20)
        self.rng = random.Random(s.seed)
        self.expert_labels = 0
        self.day_started = time.time()
        #: the version the device serves and its golden photos, kept as the daemon's pipeline keeps them (never saved)
        self.serving = self.store.current()
        self.golden = GoldenSet(self.state / "golden.npz")

    def classify(self, photos: list) -> list[tuple[str, str, str]]:
        """The day's photos through the daemon's policy; (sha256, kind queued or '', label) per photo."""
        import numpy as np

        from edge_agent.classifier import Classifier
        from edge_agent.ledger_rows import ResultRow
        from edge_agent.preprocess import preprocess_bytes

        clf = Classifier.configured(_served(self.store, self.cfg), self.cfg)
        try:
            datas = [Path(p).read_bytes() for p, _ in photos]
            x = np.stack([preprocess_bytes(d, clf.spec) for d in datas])  # as the engine in service's manifest says
            preds = [p for i in range(0, len(x), 16) for p in clf.predict_tensors(x[i : i + 16])]
            index = {c: i for i, c in enumerate(clf.engine.classes)}
            for t, p in zip(x, preds):
                if p.verdict == "confident":
                    self.golden.add(t, index[p.label])
        finally:
            clf.engine.close()
        answers = [_Answer(hashlib.sha256(d).hexdigest(), hashlib.sha256(d).hexdigest()[:16], d, p) for d, p in zip(datas, preds)]
        queued = self.queuer.queue(answers)
        rows = [
            ResultRow(
                a.sha256,
                a.photo_id,
                None,
                "inbox",
                p.label,
                p.confidence,
                [list(t) for t in p.top_k],
                p.engine_version,
                {},
                verdict=p.verdict,
            )
            for a, p in zip(answers, preds)
        ]
        kept = {a.sha256: (p.engine_version, p.distances.tobytes()) for a, p in zip(answers, preds) if p.distances is not None}
        self.db.commit(rows, queued.entries, kept)
        return [(a.sha256, queued.kinds.get(a.sha256, ""), a.prediction.label) for a in answers]

    def ask_expert(self) -> int:
        from edge_agent.review.queue import label_photo, to_ask

        k = min(self.s.k, self.s.budget - self.expert_labels)
        if self.s.arm == "none" or k <= 0:
            return 0
        if self.s.arm.startswith("device") and self.cfg.labels.reanswer_pool:
            self._answer_pool_again()
        if self.s.arm.startswith("device"):
            # (the day's K as one day's budget: the order the whole pool is listed in does not depend on it but for
            # ask_order = "typical", whose clusters are as many as the labels given plus a day's questions)
            chosen = [it.entry.sha256 for it in to_ask(self.db, self.s.k, everything=True, policy=self.cfg.labels)[:k]]
        else:
            pool = sorted(e.sha256 for e, *_ in self.db.review_pool())
            chosen = self.rng.sample(pool, min(k, len(pool)))
        classes = self.store.open().classes
        for sha in chosen:
            label_photo(self.db, self.state / "queue", self.cfg.labels.max_spool_mb << 20, classes, sha, classes[self.truth[sha]])
        self.expert_labels += len(chosen)
        return len(chosen)

    def _answer_pool_again(self) -> None:
        """The review pool answered again by the engine in service, as the daemon's idle inference thread does after a
        swap (:mod:`edge_agent.review.reanswer`), before the expert is asked."""
        from edge_agent.classifier import Classifier
        from edge_agent.review.reanswer import PoolAnswers

        clf = Classifier.configured(_served(self.store, self.cfg), self.cfg)
        try:
            answers = PoolAnswers(self.db, 16)
            while answers.due(clf.engine.engine_version):
                answers.run(clf)
        finally:
            clf.engine.close()

    def hand_over(self) -> None:
        """What the sender would deliver: every queued pseudo-label and expert label, into the trainer's store
        (a pseudo-label recorded as delivered, as the sender records it); every delivered pseudo-label withdrawn since,
        out of it (as the trainer's receiver takes it back); then the day's share of unlabelled review-pool photos,
        into the trainer's unlabelled pool."""
        from edge_agent.handoff.sender import sample_header
        from edge_agent.handoff.unlabelled import choose

        for e in self.db.queued_for_delivery(10**6):
            self.samples.add(sample_header(e, e.file), Path(e.file).read_bytes())
            self.unlabelled.discard(e.sha256)
            self.db.remove_queued_entry(e, lambda e=e: self.spool.remove(Path(e.file)), delivered=True)
        for sha, label, version in self.db.withdrawals_due(10**6):
            gone = self.samples.withdraw(sha, label, version)
            if gone is not None:
                self.unlabelled.keep_withdrawn(gone)
            self.db.confirm_withdrawn(sha)
        per_day = self.cfg.handoff.unlabelled_per_day
        # each benchmark day is one local day's share: its days pass in minutes, so counted from local midnight every
        # day after the first would find the share already spent (as every loop run before 2026-11-28 did)
        sent = self.db.unlabelled_sent_since(self.day_started)
        for e, verdict in choose(self.db.unlabelled_candidates(4 * per_day), sent, per_day):
            self.unlabelled.add(sample_header(e, e.file) | {"kind": "unlabelled", "verdict": verdict}, Path(e.file).read_bytes())
            self.db.mark_unlabelled_sent(e.sha256, e.label or "", verdict)

    def retrain_if_due(self) -> dict | None:
        from edge_agent.preprocess import PreprocessSpec
        from trainer.field_check import too_few_to_judge
        from trainer.retrain import retrain
        from trainer.service import enough_new

        tc = self.cfg.trainer
        if not enough_new(self.samples.counts(), tc):
            return None
        waiting = too_few_to_judge(self.samples.all(), tc.field_check_every, tc.field_check_min)
        if waiting:  # as the service does: no retrain spent on a candidate the field check could not judge
            return {"published": None, "reason": waiting, "skipped": True}
        spec = PreprocessSpec.from_manifest(self.store.open().manifest["preprocess"])
        judging = _judged(self.measure, spec) if self.measure else contextlib.nullcontext([])
        with _term_labels(self.truth) as taken, judging as judged:
            r = retrain(self.cfg, self.store, self.samples, self.state / "trainer" / "strategy")
        gate = r.metrics.get("gate", {})
        if r.metrics.get("unlabelled") and taken:
            r.metrics["unlabelled"].update(taken)
        swap = self.adopt(r.published) if r.published else None
        return {
            "published": r.published,
            "swap": swap,
            "reason": r.reason,
            "seconds": round(r.seconds, 1),
            "lab_gate": {k: gate.get(k) for k in ("candidate_top1", "current_top1")},
            "field_check": gate.get("field"),
            "field_batchnorm": r.metrics.get("field_batchnorm"),
            "unlabelled": r.metrics.get("unlabelled"),
            "judged": judged,
        }

    def adopt(self, version: str) -> dict:
        """The daemon's hot-swap check on a published ``version`` against the one serving and its golden photos; a
        refused version is taken out of service again (``current`` back to the one serving), as the daemon keeps
        serving it. Returns what the check measured, or ``refused`` with the reason."""
        from edge_agent.hotswap import SwapRefused, verify_candidate

        new = _served(self.store, self.cfg, version)
        try:
            golden = self.golden.photos()
            measured = verify_candidate(new, self.store.read_manifest(self.serving), self.serving, golden, self.cfg.hotswap.min_agreement)
        except SwapRefused as exc:
            self.store.set_current(self.serving)
            return {"refused": str(exc)}
        finally:
            new.close()
        self.serving = version
        self.golden.restart()  # golden labels come from the engine in service
        return measured

    def withdraw(self) -> None:
        """The pseudo-labels the expert's labels found wrong taken back, as the daemon's idle inference thread does
        before it makes new ones (:mod:`edge_agent.review.withdraw`): those queued return to the review pool, those
        delivered are marked to withdraw from the trainer (:meth:`hand_over`)."""
        taken = self.withdrawals.run()
        if taken is not None and taken.found:
            self.queuer.recount()

    def pool_to_pseudo(self) -> list[tuple[str, str, str]]:
        """The review pool's photos trust now covers made pseudo-labels, as the daemon's idle inference thread does
        after the expert's labels (:mod:`edge_agent.review.trusted_pool`); (sha256, "pseudo", class) of each."""
        from edge_agent.review.trusted_pool import TrustedPool

        made = TrustedPool(self.db, self.queuer).run(self.serving)
        return [(e.sha256, "pseudo", e.label or "") for e in made]

    def day(self, photos: list) -> dict:
        self.day_started = time.time()
        outcome = self.classify(photos)
        experts = self.ask_expert()
        self.withdraw()
        from_pool = self.pool_to_pseudo() if self.s.arm.startswith("device") else []
        self.hand_over()
        return {"outcome": outcome, "from_pool": from_pool, "expert": experts, "retrain": self.retrain_if_due()}

    def close(self) -> None:
        self.samples.close()
        self.unlabelled.close()
        self.db.close()


class _FullDevice:
    """``edge-agent run`` and ``edge-trainer serve`` on one state directory, no configuration; the expert on the CLI."""

    def __init__(self, s: LoopSettings, out: Path, truth: dict[str, int]) -> None:
        from edge_agent.config import parse_config
        from engines.store import EngineStore

        self.s, self.truth, self.out = s, truth, out
        self.state = out / "state"
        shutil.rmtree(self.state, ignore_errors=True)
        (self.state / "inbox").mkdir(parents=True)
        self.procs = {}
        for name, argv in (("daemon", ["-m", "edge_agent", "run"]), ("trainer", ["-m", "trainer", "--log-format", "json", "serve"])):
            log = open(out / f"{name}.log", "ab")
            self.procs[name] = subprocess.Popen(
                [sys.executable, *argv, "--state-dir", str(self.state)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO
            )
        self._wait(lambda: (self.state / "engines").is_dir() and self._status("status.json"), "the daemon to start", 120)
        self.store = EngineStore(self.state / "engines")
        self.cfg = parse_config({})  # what the services run with: no configuration file
        self.sent = 0
        self.expert_labels = 0
        self.pseudo_seen: set[str] = set()  # pseudo-labels the trainer's store held at the end of an earlier day

    def _status(self, rel: str) -> dict:
        try:
            return json.loads((self.state / rel).read_text())
        except (OSError, ValueError):
            return {}

    def _wait(self, cond, what: str, timeout: float = 1800) -> None:
        from benchmarks._procs import wait_for

        wait_for(cond, what, self.procs, timeout, self.out)

    def _cli(self, *args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "edge_agent", *args, "--state-dir", str(self.state)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout

    def _rows(self, sql: str, db: str = "results.sqlite") -> list:
        from edge_agent.results import query_readonly

        return query_readonly(self.state / db, sql)

    def day(self, photos: list) -> dict:
        from trainer.service import enough_new

        staging = self.state / "inbox" / ".staging"
        staging.mkdir(exist_ok=True)
        day = self.state / "inbox" / f"day{self.sent // self.s.day_size + 1:03d}"
        day.mkdir()
        for i, (p, _) in enumerate(photos):  # whole files only, as a camera app writes them
            shutil.copy(p, staging / f"{self.sent + i:05d}.jpg")
            (staging / f"{self.sent + i:05d}.jpg").rename(day / f"{self.sent + i:05d}.jpg")
        self.sent += len(photos)
        self._wait(lambda: (self._rows("SELECT COUNT(*) FROM results") or [[0]])[0][0] >= self.sent, "the day's results")
        shas = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p, _ in photos]
        kinds = dict(self._rows("SELECT sha256, kind FROM label_queue"))
        said = dict(self._rows("SELECT sha256, label FROM results"))
        k = min(self.s.k, self.s.budget - self.expert_labels)
        asked = [json.loads(line) for line in self._cli("review", "list", "--all", "--json").splitlines()][:k] if k > 0 else []
        classes = self.store.open().classes
        for item in asked:
            self._cli("review", "label", item["photo_id"], classes[self.truth[item["sha256"]]])
        self.expert_labels += len(asked)
        before = self._status("trainer/status.json").get("last_retrain")
        self._wait(lambda: not self._rows("SELECT 1 FROM label_queue WHERE kind IN ('pseudo', 'expert') LIMIT 1"), "the hand-over")
        handed = time.time()
        tc = self.cfg.trainer

        def settled() -> bool:  # the trainer has seen the day's samples and has nothing left to do; the daemon swapped
            t = self._status("trainer/status.json")
            if t.get("updated", 0) < handed + 1 or t.get("state") != "idle" or t.get("retraining"):
                return False
            due = enough_new(t.get("samples", {}), tc) and not t.get("waiting_for_field_check")
            current = self.store.current()
            return (not due or t.get("last_retrain") != before) and (self.serving == current or current in self._refused())

        self._wait(settled, "the trainer to finish and the daemon to swap or refuse")
        # a pseudo-label may have left the daemon's queue before it was read: the trainer's store says what it got
        pseudo = dict(self._rows("SELECT id, label FROM samples WHERE kind = 'pseudo'", "trainer/samples.sqlite"))
        kinds |= dict.fromkeys(pseudo, "pseudo")
        # photos of earlier days the daemon made pseudo-labels while they waited in the review pool (trust earned since)
        from_pool = [(sha, "pseudo", label) for sha, label in pseudo.items() if sha not in self.pseudo_seen and sha not in set(shas)]
        self.pseudo_seen |= set(pseudo)
        trainer = self._status("trainer/status.json")
        retrain = None
        if trainer.get("last_retrain") and trainer["last_retrain"] != before:
            retrain = {"published": trainer["last_retrain"].get("published"), "reason": trainer["last_retrain"].get("reason")}
            if retrain["published"] in (refused := self._refused()):
                retrain["swap"] = {"refused": refused[retrain["published"]]}
        elif waiting := trainer.get("waiting_for_field_check"):
            retrain = {"published": None, "reason": waiting, "skipped": True}
        outcome = [(sha, kinds.get(sha, ""), pseudo.get(sha) or said.get(sha, "")) for sha in shas]
        return {"outcome": outcome, "from_pool": from_pool, "expert": len(asked), "retrain": retrain}

    @property
    def serving(self) -> str:
        """The version the daemon serves (its status file)."""
        return self._status("status.json").get("engine", {}).get("engine_version") or self.store.current()

    def _refused(self) -> dict[str, str]:
        """The versions the daemon's hot swap refused, with the reason."""
        return self._status("status.json").get("hotswap", {}).get("refused") or {}

    def close(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait(60)


def _withdrawn_since(db: Path, since: float) -> int:
    """Delivered pseudo-labels the daemon withdrew since ``since`` (:mod:`edge_agent.review.withdraw`)."""
    from edge_agent.results import query_readonly

    rows = query_readonly(db, "SELECT COUNT(*) FROM pseudo_sent WHERE withdrawn >= ?", (since,))
    return int(rows[0][0]) if rows else 0


def _pseudo_counts(day: dict, classes: list[str], truth: dict[str, int]) -> dict:
    """A day's pseudo-labels (its photos made so, and the review pool's made so that day), how many right, and how
    many of them, and of them right, came from the pool."""
    from_pool = [(sha, label) for sha, _, label in day.get("from_pool", [])]
    pseudo = [(sha, label) for sha, kind, label in day["outcome"] if kind == "pseudo"] + from_pool
    right = sum(classes.index(label) == truth[sha] for sha, label in pseudo)
    return {
        "pseudo_labels": len(pseudo),
        "pseudo_right": right,
        "pseudo_precision": round(right / len(pseudo), 4) if pseudo else None,
        "pseudo_from_pool": len(from_pool),
        "pseudo_from_pool_right": sum(classes.index(label) == truth[sha] for sha, label in from_pool),
    }


def run(s: LoopSettings, out: Path) -> dict:
    """One arm and seed; writes and returns ``out/report.json``."""
    from edge_agent.config import parse_config
    from engines.store import EngineStore
    from trainer.data import recorded_split

    out.mkdir(parents=True, exist_ok=True)
    shipped = EngineStore(store_root(s.store)).open()
    classes = list(shipped.classes)
    test, stream = split_field(Path(s.data) / s.field, classes, s.seed, s.test_fraction)
    lab = [(x.path, x.label) for x in recorded_split(shipped, s.lab)["val"]]
    sha_of = {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p, _ in stream}  # each photo read and hashed once
    truth = {sha_of[p]: y for p, y in stream}
    measure = _Measure(parse_config({}), test, lab)
    days = len(stream) // s.day_size if s.days is None else s.days
    device = _FastDevice(s, out, truth, measure) if s.mode == "fast" else _FullDevice(s, out, truth)
    t0 = time.time()
    report = {"settings": asdict(s), "classes": classes, "test_photos": len(test), "lab_photos": len(lab), "days": []}
    try:
        report["start"] = {"engine": device.store.current(), **measure(device.store)}
        print(f"{s.arm} seed {s.seed}: start {report['start']}", file=sys.stderr, flush=True)
        for d in range(days):
            photos = stream[d * s.day_size : (d + 1) * s.day_size]
            started = time.time()
            r = device.day(photos)
            verdicts = day_verdicts(device.state / "results.sqlite", [sha_of[p] for p, _ in photos], truth, classes, device.cfg.labels)
            row = {
                "day": d + 1,
                **_pseudo_counts(r, classes, truth),
                "pseudo_withdrawn": _withdrawn_since(device.state / "results.sqlite", started),
                "to_review": sum(kind == "review" for _, kind, _ in r["outcome"]),
                "expert_labels": device.expert_labels,
                "verdicts": verdicts,
                "retrain": r["retrain"],
                "engine": device.serving,
                **measure(device.store, device.serving),
                "wall_s": round(time.time() - t0, 1),
            }
            report["days"].append(row)
            print(
                json.dumps(
                    {k: v for k, v in row.items() if k != "retrain"}
                    | {"published": (r["retrain"] or {}).get("published"), "reason": (r["retrain"] or {}).get("reason")}
                ),
                file=sys.stderr,
                flush=True,
            )
    finally:
        device.close()
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _filled(report: dict, state: Path) -> bool:
    """A run's days given their verdicts from its kept state (:func:`benchmarks._loop_verdicts.fill_verdicts`)."""
    from edge_agent.config import parse_config

    s = report["settings"]
    if all("verdicts" in row for row in report["days"]) or not (state / "results.sqlite").is_file():
        return False
    classes = report["classes"]
    _, stream = split_field(Path(s["data"]) / s["field"], classes, s["seed"], s["test_fraction"])
    truth = {hashlib.sha256(Path(p).read_bytes()).hexdigest(): y for p, y in stream}
    return fill_verdicts(report, state, stream, truth, parse_config(with_sets({}, s.get("overrides") or {})).labels)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.field_loop", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--field", default="apple-orchard")
    ap.add_argument("--arms", nargs="+", default=["device", "random", "none"], choices=["device", "device-labels-only", "random", "none"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--budget", type=int, default=100)
    ap.add_argument("--days", type=int, default=None)
    ap.add_argument("--day-size", type=int, default=100, help="photos a day (a small field, e.g. the corn field's 137 streamed: 30)")
    ap.add_argument("--mode", choices=["fast", "full"], default="fast")
    ap.add_argument("--data", default=str(SHARED / "field"))
    ap.add_argument("--report", action="store_true", help="only summarise the runs already in --out")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="fast mode: a configuration value (TOML) other than the shipped one",
    )
    ap.add_argument(
        "--store", default=None, help="fast mode: start from this store's current version (a release candidate), not the shipped one"
    )
    args = ap.parse_args(argv)
    overrides = config_sets(args.set)
    if overrides and args.mode == "full":
        ap.error("--set: full mode runs the services as a new user does, with no configuration")
    if args.store and args.mode == "full":
        ap.error("--store: full mode runs the services as a new user does, with the shipped model")
    store = str(starting_store(args.store)) if args.store else None  # refused before any run
    out = Path(args.out)
    reports: dict[str, list[dict]] = {}
    for arm in args.arms:
        for seed in args.seeds:
            run_dir = out / f"{arm}-{args.mode}" / f"seed-{seed}"
            if (run_dir / "report.json").exists():
                report = json.loads((run_dir / "report.json").read_text())
                if _filled(report, run_dir / "state"):
                    (run_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
                reports.setdefault(arm, []).append(report)
            elif not args.report:
                s = LoopSettings(
                    args.field,
                    arm,
                    seed,
                    args.k,
                    args.budget,
                    args.day_size,
                    days=args.days,
                    mode=args.mode,
                    data=args.data,
                    overrides=overrides,
                    store=store,
                )
                reports.setdefault(arm, []).append(run(s, run_dir))
    if reports:
        summary = summarise(reports)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        cmd = "python -m benchmarks.field_loop " + " ".join(argv if argv is not None else sys.argv[1:])
        (out / "summary.md").write_text(markdown(summary, cmd))
        plot(summary, out / "field-top1.png", args.day_size)
        print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
