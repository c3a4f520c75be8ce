"""Hot swap: follow the store's ``current`` version without dropping a photo.

A watcher thread wakes on an engine announcement (ZeroMQ) or every ``poll_s``
seconds, and when ``current`` names another version it loads that version off
the hot path and verifies it:

1. every file's sha256 (the store refuses a tampered file);
2. the same input spec and preprocessing as the running engine, or else a new lineage (below);
3. the new engine knows every class the running one knows, by name (a head may grow; a release may reorder);
4. a smoke inference gives finite logits of the right shape;
5. on the recent confident photos ("golden" photos, kept by the pipeline, and
   kept across restarts in ``<state>/golden.npz`` for the engine that labelled
   them) the new engine agrees with the old one on at least ``min_agreement``, in
   all and on each class two or more of them were labelled; where it does not, the truth decides: it is adopted
   only if it is right on at least ``min_agreement`` of the shipped labelled lab photos of its classes and wrong on
   no class's every photo (:mod:`edge_agent._truth`), since the golden photos are the old engine's answers and a
   retrain that learnt a new field disagrees with them where the old engine was sure and wrong.

A retrain (a version whose ``parent`` is the engine it replaces) keeps its parent's head: output i keeps the parent's
class name i, unless its manifest's ``renames`` (old name -> new name, signed with the rest) says it meant it. So a
version with two classes swapped or one renamed is refused even when no golden photo shows those classes.

A version an **operator** chose (``edge-agent engine rollback``, the page, the API: the store's pin names it, or it is
older than the one serving, which only a rollback does) is checked by 1 and 4 only: the version left behind is the
suspect, and its golden photos and class list are no reference. A rollback therefore always happens once its files and
signature verify, at the swap and after a restart alike.

A **new lineage** is a version that takes other input than the engine it replaces (another input size or
normalisation: a new release on another architecture, v2000's EfficientNet-Lite0 after v1000's LeafNet5) and does
not descend from it (its manifest's ``parent`` is not that engine). The golden photos are stored as tensors of the
old input, so they cannot be shown to it: it is verified by checks 1, 3 and 4 (files and signature, every class
kept by name, a smoke inference) and adopted without the agreement check, which is recorded as not comparable.
A version that takes other input than its own parent is refused: a retrain never changes its parent's input.

Only then is it handed to the pipeline, which switches between two batches, so
no photo is seen by a half-loaded engine and each result records the version
that produced it. A version that fails is refused (logged once) and the old
engine keeps running; ``edge-agent engine rollback`` moves ``current`` back and
the watcher follows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from edge_agent._truth import judge_on_truth, precision_check
from edge_agent.classifier import Classifier
from edge_agent.log import get_logger
from edge_agent.pipeline import Pipeline
from edge_agent.worker import Worker
from engines.base import BackendConfig, Engine
from engines.errors import EdgeAgentError
from engines.loader import open_engine
from engines.store import EngineStore, StoreError

__all__ = ["EngineWatcher", "SwapRefused", "class_renames", "operator_chosen", "smoke_test", "verify_candidate"]


class SwapRefused(EdgeAgentError):
    """A new engine version failed verification."""


def verify_candidate(
    new: Engine, reference: dict, reference_name: str, golden: list[tuple[np.ndarray, int]], min_agreement: float, chosen: bool = False
) -> dict:
    """Checks 2-5 above against ``reference`` (the manifest of the version ``reference_name`` whose place it takes,
    and whose classes label ``golden``); returns what was measured, raises :class:`SwapRefused`. The one check for
    every way a version comes to serve: a hot swap (reference: the engine running) and a start
    (:func:`edge_agent.trust.open_trusted`; reference: the version that labelled the golden photos).

    ``chosen``: an operator put this version in service (:func:`operator_chosen`: a rollback). Then only the smoke
    inference runs here (files and signature were checked when it was opened): the version being left behind is
    the suspect, so neither its golden photos nor its class list are a reference."""
    if chosen:
        smoke_test(new)
        return {"golden": 0, "rollback": f"chosen by an operator over {reference_name}: its golden photos are not a reference"}
    nm = new.version.manifest
    new_lineage = nm["input"] != reference["input"] or nm["preprocess"] != reference["preprocess"]
    descendant = nm.get("parent") == reference_name
    if new_lineage and descendant:
        raise SwapRefused(f"input or preprocessing differs from its parent {reference_name} (a retrain keeps its parent's input)")
    renames = class_renames(nm)
    names = [renames.get(c, c) for c in reference["classes"]]  # the reference's classes as this version calls them
    index = {c: i for i, c in enumerate(new.classes)}
    dropped = [c for c, n in zip(reference["classes"], names) if n not in index]
    if dropped:
        raise SwapRefused(f"class list is not an extension of {reference_name}'s (it lacks {', '.join(dropped[:3])})")
    if descendant:  # a retrain keeps its parent's head: output i is the parent's class i, new classes after
        moved = [(i, c, new.classes[i]) for i, c in enumerate(names) if new.classes[i] != c]
        if moved:
            i, was, now = moved[0]
            raise SwapRefused(
                f"output {i} is {now!r} here but {was!r} in its parent {reference_name} ({len(moved)} outputs renamed or "
                "swapped; a version that means it lists them in its manifest's 'renames')"
            )
    smoke_test(new)
    if new_lineage:  # the golden photos are tensors of the old input: nothing to compare them with
        return {"golden": 0, "lineage": f"new: its input differs from {reference_name}'s, golden photos not comparable"}
    measured = {"golden": len(golden)}
    if golden:
        if any(not 0 <= label < len(reference["classes"]) for _, label in golden):
            raise SwapRefused(f"golden photos name classes {reference_name} does not have")
        x = np.stack([g for g, _ in golden])
        labels = np.array([label for _, label in golden])
        right = new.infer(x).argmax(1) == np.array([index[names[label]] for label in labels])
        agreement = float(np.mean(right))
        measured["agreement"] = round(agreement, 3)
        doubt = None
        if agreement < min_agreement:
            doubt = f"agrees with {reference_name} on {agreement:.0%} of {len(golden)} golden photos (< {min_agreement:.0%})"
        for label in np.unique(labels):  # a swap of two classes hides in the whole when the golden photos are of others
            mine = labels == label
            if not doubt and mine.sum() >= MIN_CLASS_GOLDEN and (share := float(np.mean(right[mine]))) < min_agreement:
                doubt = (
                    f"agrees with {reference_name} on {share:.0%} of the {int(mine.sum())} golden photos it labelled "
                    f"{reference['classes'][label]!r} (< {min_agreement:.0%})"
                )
        if doubt:  # the golden photos are the old engine's answers, not the truth: labelled photos decide
            truth = judge_on_truth(new, min_agreement)
            if truth is None:
                raise SwapRefused(f"{doubt}, and no labelled photo of its classes to settle it")
            if not truth["passed"]:
                wrong = f"; every photo of {', '.join(truth['classes_all_wrong'][:3])} wrong" if truth["classes_all_wrong"] else ""
                raise SwapRefused(f"{doubt}, and right on {truth['right']:.0%} of {truth['photos']} labelled lab photos{wrong}")
            measured["truth"] = truth
            measured["golden_overruled"] = doubt
    return measured


#: Golden photos of one class that make its own agreement a check (fewer: only the whole counts).
MIN_CLASS_GOLDEN = 2


def class_renames(manifest: dict) -> dict[str, str]:
    """The classes a version says it renamed (its manifest's ``renames``: old name -> new name; empty when none)."""
    renames = manifest.get("renames") or {}
    if not isinstance(renames, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in renames.items()):
        raise SwapRefused("its manifest's 'renames' is not a map of class name to class name")
    return renames


def operator_chosen(store: EngineStore, version: str, reference_name: str) -> bool:
    """Whether an operator put ``version`` in service in place of ``reference_name``: the pin of a rollback names it,
    or it is older than the version it replaces (offers never move a device back: only a rollback does)."""
    pin = store.pin() or {}
    return pin.get("version") == version or int(version[1:]) < int(reference_name[1:])


def smoke_test(engine: Engine) -> None:
    """One all-zero photo gives finite logits, one per class of the manifest (a network that does not match its
    manifest's class list fails here); raises :class:`SwapRefused`."""
    shape = engine.version.manifest["input"]["shape"]
    out = engine.infer(np.zeros((1, int(shape[1]), int(shape[2]), int(shape[3])), np.float32))
    if out.shape != (1, len(engine.classes)) or not np.isfinite(out).all():
        raise SwapRefused(f"smoke inference gave {out.shape} / non-finite logits for {len(engine.classes)} classes")


class EngineWatcher(Worker):
    thread_name = "hotswap"
    join_timeout_s = 10.0

    def __init__(
        self,
        store: EngineStore,
        engine_config: BackendConfig,
        pipeline: Pipeline,
        make_classifier: Callable[[Engine], Classifier],
        poll_s: float = 5.0,
        min_agreement: float = 0.5,
        trust=None,
        refused: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.trust = trust
        self.store = store
        self.engine_config = engine_config
        self.pipeline = pipeline
        self.make_classifier = make_classifier
        self.poll_s = poll_s
        self.min_agreement = min_agreement
        self.log = get_logger("hotswap", store=str(store.root))
        self.refused: dict[str, str] = dict(refused or {})
        self._refused_sig = {v: self._signature_stamp(v) for v in self.refused}
        self.swaps = 0
        self._wake = threading.Event()
        #: Since when the engine in service serves, the counters then, and what the swap to it measured.
        self.serving_since = time.time()
        self._counters_then = (0, 0)
        self.swap_measured: dict = {}
        #: The ``current`` pointer's mtime (ns) when the last look began (None before the first).
        self.looked: int | None = None

    def serving_report(self) -> dict:
        """How the engine in service has done since it began serving (a trainer's staged rollout judges canaries by
        it): since (epoch s), photos classified, inference errors, and its agreement with the engine before it on
        the golden photos, or its share right on the labelled photos where those overruled them (-1: not measured,
        e.g. served since the start)."""
        processed, errors = self._counters_then
        return {
            "since": round(self.serving_since, 1),
            "photos": max(0, self.pipeline.counters["processed"] - processed),
            "errors": max(0, self.pipeline.counters["inference_errors"] - errors),
            "agreement": float((self.swap_measured.get("truth") or {}).get("right", self.swap_measured.get("agreement", -1.0))),
        }

    def _signature_stamp(self, version: str) -> tuple:
        """A refused version is looked at again once this changes: a trainer signing its older versions, or making
        its key, after this daemon started (:meth:`engines.signing.TrustedKeys.stamp`), or an operator putting it in
        service again (``current`` rewritten by a rollback)."""
        return (self.trust.stamp(self.store.root / version) if self.trust is not None else None, self._pointer_stamp())

    def _pointer_stamp(self) -> int | None:
        """When the store's ``current`` pointer was last written (ns), None if it cannot be read."""
        try:
            return (self.store.root / "current").stat().st_mtime_ns
        except OSError:
            return None

    def announce(self, version: str) -> None:
        """A new version was announced: look now instead of at the next poll."""
        self._wake.set()

    def _on_stop(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.check()
            except Exception as exc:  # keep watching; the running engine is untouched
                self.log.error("hotswap_error", error=repr(exc))

    def check(self) -> bool:
        """Swap to the store's current version if it is new and verifies; True if swapped. Afterwards
        :attr:`looked` holds the stamp of the ``current`` pointer this look decided on (an operator's rollback waits
        for it: :mod:`edge_agent.rollback`)."""
        pointer = self._pointer_stamp()
        try:
            return self._check()
        finally:
            self.looked = pointer

    def _check(self) -> bool:
        try:
            target = self.store.current()
        except StoreError as exc:
            self.log.warning("store_unreadable", error=str(exc))
            return False
        old = self.pipeline.classifier.engine
        if target == old.engine_version:
            return False
        if target in self.refused:
            if self._signature_stamp(target) == self._refused_sig.get(target):
                return False
            del self.refused[target]  # newly signed: try it again
        t0 = time.perf_counter()
        new = None
        try:
            new = open_engine(self.store, self.engine_config, target, trust=self.trust, check_photos=precision_check)
            chosen = operator_chosen(self.store, target, old.engine_version)
            golden = self.pipeline.golden.photos()
            measured = verify_candidate(new, old.version.manifest, old.engine_version, golden, self.min_agreement, chosen)
        except Exception as exc:  # TamperedError, EngineError, SwapRefused...
            if new is not None:
                new.close()
            self.refused[target] = str(exc)
            self._refused_sig[target] = self._signature_stamp(target)
            self.log.error("engine_refused", candidate=target, running=old.engine_version, reason=str(exc))
            return False
        self.pipeline.swap_classifier(self.make_classifier(new))
        deadline = time.monotonic() + 30
        while self.pipeline.classifier.engine is not new and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.02)  # the pipeline takes it between batches (immediately when idle)
        if self.pipeline.classifier.engine is new:
            old.close()
        self.swaps += 1
        self.serving_since, self.swap_measured = time.time(), measured
        self._counters_then = (self.pipeline.counters["processed"], self.pipeline.counters["inference_errors"])
        self.log.info(
            "engine_swapped",
            previous=old.engine_version,
            engine_version=target,
            verify_ms=round((time.perf_counter() - t0) * 1000, 1),
            **measured,
        )
        return True
