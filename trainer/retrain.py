"""One retrain: fine-tune the engine in service on what the field taught it, gate, calibrate, publish.

The engine in service (its torch weights) is fine-tuned with the configured strategy on the replayed true
labels (:mod:`trainer.labelled`) + every expert label (weight ``expert_weight``) + every pseudo-label received so
far (checked again by the engine in service, :mod:`trainer.recheck`), at most ``labels_per_retrain`` of them, the new
ones first (:mod:`trainer.loop.label_budget`); the candidate is gated on photos it never
trained on: the lab gate photos and, once the expert has labelled any photo, the expert labels held back as the field
check set (:mod:`trainer.field_check`, which also decides whether BatchNorm statistics adapted to the field's photos
are kept); if it passes both it is calibrated, exported, published atomically and announced. Samples are marked
with the generation that used them only after the decision (a refused candidate marks them too, so the next
retrain waits for new ones), so a trainer stopped or killed mid-way retrains on the same samples when it comes back.
While an upgrade's release waits beside the farm's own version (:mod:`trainer.loop.release_adoption`), the retrain
starts from the release instead, and its candidate must also be no worse on the field check than the version in
service.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from edge_agent.config import AppConfig, TrainerSection
from edge_agent.log import get_logger
from edge_agent.preprocess import ImageRejected, PreprocessSpec, preprocess_file
from engines.store import EngineStore
from trainer import photos
from trainer._memory import PhaseMemory
from trainer.calibrate import calibrate
from trainer.continual import balance_pseudo, learning_rate, train_generation
from trainer.field_check import FieldDecision, adapt_batchnorm, field_gate, held_back, judging_photos
from trainer.gate import gate
from trainer.labelled import empty_generation, labelled_sources, load_labelled
from trainer.lineage import adopt_strategy_state, lineage_root
from trainer.loop import label_budget
from trainer.loop.gate_logits import GateLogits, photos_digest
from trainer.loop.lab_steps import with_lab_steps
from trainer.loop.release_adoption import against_serving, lineage_base, settle_pending
from trainer.loop.second_candidate import with_unlabelled
from trainer.models import features_of
from trainer.publish import load_weights, publish_model
from trainer.recheck import recheck
from trainer.samples import Sample, SampleStore
from trainer.step import choose_step
from trainer.stop import check
from trainer.strategies.base import Generation, get_strategy
from trainer.verdict_fit import fit_verdict_for

__all__ = ["RetrainResult", "retrain", "balance_pseudo", "settle_published"]


@dataclass
class RetrainResult:
    published: str | None
    reason: str
    metrics: dict
    samples: int
    seconds: float


def _received(
    samples: list[Sample], classes: list[str], expert_weight: float, exclude: set[str], should_stop, spec: PreprocessSpec
) -> tuple[Generation, list[str], list[str]]:
    """Expert labels (true, weight ``expert_weight``) and pseudo-labels (weight: their confidence), leaving out the
    photos in ``exclude`` (the gate's and the field check's); grows ``classes`` for new expert classes. Returns the data, the ids of
    every sample considered, and the new classes."""
    xs, ys, ws, ps, ids, used = [], [], [], [], [], []
    new_classes = []
    for s in samples:
        check(should_stop, "while reading samples")
        ids.append(s.id)
        if s.id in exclude:
            continue  # the same bytes as a gate photo: training on it would flatter the candidate
        if s.label not in classes:
            if s.kind != "expert":
                continue  # a pseudo-label can only name a known class
            classes.append(s.label)
            new_classes.append(s.label)
        try:
            x = preprocess_file(s.file, spec)
        except (ImageRejected, OSError):
            continue
        xs.append(photos.photo(x))
        ys.append(classes.index(s.label))
        pseudo = s.kind == "pseudo"
        ws.append(float(s.confidence) if pseudo else expert_weight)
        ps.append(pseudo)
        used.append(s.id)
    if not xs:
        return empty_generation(), ids, new_classes
    return Generation(photos.stack(xs), torch.tensor(ys), torch.tensor(ws), torch.tensor(ps), used), ids, new_classes


def _field_check(samples: list[Sample], check_ids: set[str], classes: list[str], should_stop, spec: PreprocessSpec) -> Generation:
    """The held-back expert labels as photos and class indices (a class no engine has yet is left out)."""
    xs, ys, ids = [], [], []
    for s in samples:
        if s.id not in check_ids or s.label not in classes:
            continue
        check(should_stop, "while reading the field check set")
        try:
            xs.append(photos.photo(preprocess_file(s.file, spec)))
        except (ImageRejected, OSError):
            continue
        ys.append(classes.index(s.label))
        ids.append(s.id)
    return Generation(photos.stack(xs), torch.tensor(ys), sample_ids=ids) if xs else empty_generation()


def _recheck_pseudo(teacher, received: Generation, tau: float, should_stop) -> tuple[Generation, dict]:
    """The received samples with every pseudo-label scored again by ``teacher`` (:mod:`trainer.recheck`):
    relabelled with its class and confidence, or left out where it is below ``tau``."""
    rows = received.pseudo.nonzero().squeeze(1)
    checked = recheck(teacher, received.x[rows], tau, should_stop=should_stop)
    summary = checked.summary(received.y[rows])
    y, weight, keep = received.y.clone(), received.weight.clone(), torch.ones(len(received), dtype=torch.bool)
    y[rows], weight[rows], keep[rows] = checked.labels, checked.confidence, checked.keep
    return Generation(received.x, y, weight, received.pseudo, received.sample_ids).subset(keep), summary


def settle_published(store: EngineStore, samples: SampleStore) -> dict[str, str | None]:
    """Samples left pending by a publish that was stopped: marked with the version whose manifest records their tag,
    or new again where none does (:meth:`trainer.samples.SampleStore.settle_pending`)."""

    def published_with(tag: str) -> str | None:
        for name in reversed(store.versions()):
            if store.read_manifest(name).get("training", {}).get("sample_batch") == tag:
                return name
        return None

    return samples.settle_pending(published_with)


def _both(lab, on_field: FieldDecision):
    """The lab gate's decision and the field check's, as one: published only if both pass; each one's figures."""
    if not lab.publish:
        reason = lab.reason
    elif not on_field.publish:
        reason = on_field.reason
    else:
        reason = lab.reason if not on_field.metrics.get("field_photos") else f"{lab.reason}; {on_field.reason}"
    lab.publish, lab.reason = lab.publish and on_field.publish, reason
    lab.metrics = {**lab.metrics, "field": {"publish": on_field.publish, "reason": on_field.reason, **on_field.metrics}}
    return lab


def _recorded(tc: TrainerSection, lr: float, interpolate: float) -> dict:
    """What the manifest records of how a candidate was trained."""
    keys = (
        "epochs",
        "batch_size",
        "weight_decay",
        "pseudo_lambda",
        "ramp_epochs",
        "seed",
        "swa_epochs",
        "distill",
        "distill_photos",
        "distill_temperature",
        "distill_from",
    )
    return {**tc.model_dump(include=set(keys)), "lr": lr, "interpolate": interpolate}


def _root(store: EngineStore, version) -> str:
    """The first version of ``version``'s lineage (following ``parent`` while the store still holds it)."""
    return lineage_root(store, version.name)


def _tracked(progress, memory: PhaseMemory):
    """``progress`` that also tells ``memory`` which phase the retrain is in."""

    def tell(phase: str, **info) -> None:
        memory.enter(phase)
        progress(phase, **info)

    return tell


def retrain(
    cfg: AppConfig,
    store: EngineStore,
    samples: SampleStore,
    strategy_dir: Path,
    announce=lambda v: None,
    should_stop=lambda: False,
    signing_key=None,
    progress=lambda phase, **info: None,
) -> RetrainResult:
    """Run one retrain. Raises :class:`trainer.stop.Stopped` (nothing marked, nothing published) once
    ``should_stop()`` is true. ``signing_key`` signs the published version (daemons serve only signed ones).
    ``progress(phase, **info)`` is told each step (for the trainer's status while it works)."""
    t0 = time.perf_counter()
    memory = PhaseMemory()
    memory.enter("opening the engines")
    progress = _tracked(progress, memory)
    tc = cfg.trainer
    log = get_logger("trainer.retrain", strategy=tc.strategy.type)
    torch.set_num_threads(tc.threads)
    serving = store.open()
    base = lineage_base(store)  # an upgrade's release waiting beside the farm's own version: learn on its lineage
    current = store.open(base) if base else serving
    previous = load_weights(current)
    serving_model = previous if base is None else load_weights(serving)
    spec = PreprocessSpec.from_manifest(current.manifest["preprocess"])  # every photo as the daemon gives it to this engine
    classes = list(current.classes)
    sources = labelled_sources(cfg, classes)
    progress("reading photos")
    labelled = load_labelled(sources, should_stop, spec)
    dropped, freed = samples.drop_old_pseudo(tc.pseudo_per_class)  # a season's pseudo-labels: the newest of each class
    if dropped:
        log.info("pseudo_labels_deleted", deleted=dropped, mb=round(freed / 1e6, 1), kept_per_class=tc.pseudo_per_class)
    stored = samples.all()
    check_ids = held_back(stored, tc.field_check_every)
    expert_labels = sum(1 for s in stored if s.kind == "expert")
    never = labelled.gate_ids | check_ids
    # A season's labels: at most labels_per_retrain, the new ones first (the others wait for a later retrain's draw)
    _, waiting = label_budget.choose([s for s in stored if s.id not in never], tc.labels_per_retrain, seed=f"{tc.seed}/{len(stored)}")
    if waiting:
        log.info("labels_waiting", waiting=len(waiting), labels_per_retrain=tc.labels_per_retrain)
    received, ids, new_classes = _received(stored, classes, tc.expert_weight, never | waiting, should_stop, spec)
    field = _field_check(stored, check_ids, classes, should_stop, spec)
    if base is not None:  # the bare release against the farm's version: no worse on the field, it serves at once
        bare = against_serving(
            serving, serving_model, previous, field, stored, expert_labels, tc.field_check_every, tc.field_check_min, should_stop
        )
        log.info("release_against_serving", release=current.name, serving=serving.name, publish=bare.publish, reason=bare.reason)
        if bare.publish:
            store.set_current(current.name)
            settle_pending(store)
            announce(current.name)
            serving, serving_model = current, previous
    train, val = labelled.train, labelled.val
    if len(val) == 0:  # nothing could ever be published: say so, and keep the samples for when there is
        return RetrainResult(
            None, "no validation photos: cannot check the candidate", {"labelled": sources.describe()}, len(ids), time.perf_counter() - t0
        )
    rechecked = None
    if tc.recheck_pseudo and received.pseudo.any():
        received, rechecked = _recheck_pseudo(previous, received, cfg.labels.pseudo_threshold, should_stop)
        log.info("pseudo_labels_rechecked", teacher=current.name, **rechecked)
    received.weight = received.weight * balance_pseudo(received.y, received.pseudo)
    samples.set_state(
        "last_retrain_pseudo", json.dumps({i: classes[int(y)] for i, y, p in zip(received.sample_ids, received.y, received.pseudo) if p})
    )
    data = train + received
    counts = {
        "labelled": len(train),
        "expert": int((~received.pseudo).sum()),
        "pseudo": int(received.pseudo.sum()),
        "left_out_as_gate_photos": sum(1 for i in ids if i in labelled.gate_ids),
        "field_check": len(field),
        "waiting": len(waiting),  # past [trainer] labels_per_retrain: left for a later retrain's draw
    }
    log.info("retrain_started", parent=current.name, validation=len(val), new_classes=new_classes, labelled_from=sources.origin, **counts)
    if len(data) < 2:
        return RetrainResult(None, "not enough data to train on", {}, len(ids), time.perf_counter() - t0)
    adopt_strategy_state(store, _root(store, current), classes, strategy_dir, log)  # after an upgrade to a new release
    strategy = get_strategy(tc.strategy.type)(strategy_dir / tc.strategy.type, tc.strategy, seed=tc.seed)
    # Something new to learn (an expert's labels, a new class): the full step. Pseudo-labels alone: a cautious one.
    learning = counts["expert"] > 0 or bool(new_classes)
    lr, interpolate = (learning_rate(previous, tc), tc.interpolate) if learning else (learning_rate(previous, tc, pseudo_only=True), 1.0)
    root_name = _root(store, current)
    root = previous if root_name == current.name else load_weights(store.open(root_name))
    # The weights a candidate learns from (and is distilled towards): the engine in service's, or with start_from =
    # "root" and something to learn, the lineage's first version's; either way it is gated against the one in service.
    start = root if learning and tc.start_from == "root" else previous
    started_from = root_name if start is root else current.name
    teacher = root if learning and tc.distill_from == "root" else start  # whose answers the `distill` term keeps
    distilled_towards = root_name if teacher is root else started_from
    log.info(
        "retrain_step",
        kind="expert labels or new classes" if learning else "pseudo-labels only",
        start=started_from,
        distilled_towards=distilled_towards,
        lr=lr,
        interpolate=interpolate if learning else tc.pseudo_only_steps,
    )
    progress("training", epoch=0, epochs=tc.epochs)
    candidate, used = train_generation(
        start,
        data,
        strategy,
        tc,
        lr,
        interpolate,
        num_classes=len(classes),
        should_stop=should_stop,
        batchnorm=learning,
        on_epoch=lambda e, n: progress("training", epoch=e, epochs=n),
        spec=spec,
        teacher=teacher,
    )
    unlabelled = None
    if tc.unlabelled_term and learning and len(field) >= tc.field_check_min:
        if len(field) < tc.unlabelled_field_min:
            unlabelled = {
                "field_photos": len(field),
                "kept": False,
                "reason": f"the field check holds {len(field)} of the {tc.unlabelled_field_min} photos the unlabelled term waits for",
            }
        else:
            progress("learning from unlabelled photos")
            candidate, used, unlabelled = with_unlabelled(
                candidate,
                used,
                start,
                data,
                strategy,
                tc,
                lr,
                interpolate,
                len(classes),
                field,
                spec,
                samples.root,
                set(ids),
                should_stop,
                teacher=teacher,
            )
        log.info("unlabelled_term", **{k: v for k, v in unlabelled.items() if not k.endswith("by_class")})
    del data  # a copy of the photos trained on (``used`` holds what the candidate saw): not held through the gate
    step = None
    if not learning:  # how far to move: chosen on the gate photos' log-loss (trainer.step)
        progress("choosing the step")
        bn_x = None if candidate.keep_batchnorm else used.x
        candidate, step = choose_step(candidate, previous, tc.pseudo_only_steps, bn_x, val.x, val.y, should_stop, seed=tc.seed)
        log.info("step_chosen", **step.summary())
    check(should_stop, "before the gate")
    variants = [candidate]
    adapted = None
    if len(field) >= tc.field_check_min and (~received.pseudo).any():
        progress("adapting to the field")
        bn_model, adapted = adapt_batchnorm(candidate, received.x, field.x, field.y, should_stop)
        log.info("field_batchnorm", **adapted)
        if adapted["kept"]:
            variants = [bn_model, candidate]  # the lab gate may still refuse the adapted statistics: then without them
    progress("gate")
    judged_before = (current.manifest.get("training") or {}).get("field_check_ids")
    judges, judged_on = judging_photos(field, judged_before, tc.field_check_judges_on, tc.field_check_min)
    kept = GateLogits(samples.root, photos_digest(val.x))  # the stored versions' logits on these photos, run once
    current_logits = kept.of(current, previous, val.x)
    root_logits = current_logits if root is previous else kept.of(store.open(root_name), root, val.x)
    steps = tc.lab_steps if learning else []  # a pseudo-label retrain has chosen its step already
    lab_bn_x = None if variants[-1].keep_batchnorm else used.x
    for lab_step, candidate in with_lab_steps(variants, previous, steps, lab_bn_x, should_stop):
        check(should_stop, "at the gate")
        val_features = features_of(candidate, val.x)  # once: the gate's, the calibration's and the verdict's
        with torch.no_grad():
            val_logits = candidate.head(val_features)
        decision = gate(
            candidate,
            previous,
            val.x,
            val.y,
            classes,
            tc.gate_tolerance,
            tc.gate_max_class_drop,
            root=root,
            candidate_logits=val_logits,
            current_logits=current_logits,
            root_logits=root_logits,
            root_tolerance=tc.lab_drift_max,
        )
        on_field = field_gate(candidate, previous, judges.x, judges.y, expert_labels, tc.field_check_every, tc.field_check_min)
        on_field.metrics["field_judged_on"] = judged_on
        if lab_step is not None:
            decision.metrics["lab_step"] = lab_step
        if steps and (lab_step is not None or not decision.publish):  # each variant the steps are measured against
            log.info(
                "lab_step_tried",
                step=1.0 if lab_step is None else lab_step,
                lab=decision.reason,
                top1=decision.metrics.get("candidate_top1"),
            )
        if decision.publish and (on_field.publish or lab_step is not None or candidate is variants[-1]):
            break  # what the lab gate passes, the field check judges as it is
    if adapted is not None:
        adapted["published_with"] = adapted["kept"] and candidate is variants[0]
    decision = _both(decision, on_field)
    if decision.publish and serving.name != current.name:
        progress("checking against the version in service")
        rival = against_serving(
            serving, serving_model, candidate, field, stored, expert_labels, tc.field_check_every, tc.field_check_min, should_stop
        )
        decision.metrics["against_serving"] = {"version": serving.name, "publish": rival.publish, **rival.metrics}
        if not rival.publish:
            decision.publish, decision.reason = False, rival.reason
    metrics = {"gate": {"publish": decision.publish, "reason": decision.reason, **decision.metrics}, "samples": counts}
    if adapted is not None:
        metrics["field_batchnorm"] = adapted
    if unlabelled is not None:
        metrics["unlabelled"] = unlabelled
    if rechecked:
        metrics["pseudo_recheck"] = rechecked
    if step is not None:
        metrics["step"] = step.summary()
    log.info("gate", publish=decision.publish, reason=decision.reason, **decision.metrics)
    if not decision.publish:
        kept.prune()
        samples.mark_used(stored, f"refused:{int(time.time())}")
        metrics["memory"] = memory.summary()
        log.info("retrain_memory", **metrics["memory"])
        return RetrainResult(None, decision.reason, metrics, len(ids), time.perf_counter() - t0)
    progress("calibrating")
    if tc.calibrate:  # before the strategy keeps its anchor: the next retrain starts from the published weights
        metrics["calibration"] = calibrate(candidate, val.x, val.y, logits=val_logits).summary()
        log.info("calibrated", **metrics["calibration"])
    check(should_stop, "before publishing")
    training = {
        "kind": "continual",
        "strategy": tc.strategy.model_dump(),
        "settings": _recorded(tc, lr, interpolate),
        "lab_step": lab_step,  # the step back towards the version in service the lab gate passed ([trainer] lab_steps)
        "started_from": started_from,
        "distilled_towards": distilled_towards,
        "field_check_ids": sorted(field.sample_ids),  # the held-back photos that chose it ([trainer] field_check_judges_on)
        "samples": counts,
        "expert_weight": tc.expert_weight,
        "labelled": sources.describe(),
        "new_classes": new_classes,
        "pseudo_recheck": rechecked,
        "torch": torch.__version__,
    }
    calib = train.x if len(train) else received.x
    truth = ~used.pseudo  # the verdict's class statistics from true labels only, its thresholds from the gate photos
    on = (current.manifest.get("verdict") or {}).get("on", "logits")  # a retrain measures the distance where its parent did
    verdict, known = None, None
    if len(val) >= 10 and truth.any():
        known = features_of(candidate, used.x[truth])  # once: the verdict's statistics and the rehearsal memory's choice
        verdict = fit_verdict_for(
            candidate, used.x[truth], used.y[truth], val.x, spec, on=on, train_features=known, held_features=val_features
        )
    # The samples are marked pending with a tag the manifest records, before the publish makes the version visible:
    # a trainer stopped anywhere after it finds them settled on its next start (settle_published), never retrained.
    progress("publishing")
    tag = f"{current.name}-{time.time_ns()}"
    samples.mark_pending(stored, tag)
    try:
        version = publish_model(
            candidate,
            classes,
            store.root,
            metrics=metrics,
            training={**training, "sample_batch": tag},
            parent=current.name,
            calibration=calib[:256].numpy() if tc.int8 and len(calib) else None,  # stored photos: decoded a batch at a time
            held_out=(val.x.numpy(), val.y.numpy()),
            should_stop=should_stop,
            signing_key=signing_key,
            verdict=None if verdict is None else verdict.section,
            distance=None if verdict is None else verdict.distance,
            spec=spec,
        )
    except BaseException:
        settle_published(store, samples)
        raise
    samples.mark_used(stored, version.name)
    with torch.no_grad():
        kept.keep(version, candidate.head(val_features))  # calibrated, as published: the next retrain's version in service
    kept.prune()
    settle_pending(store)  # the release's lineage serves now
    progress("keeping the strategy's memory")
    del labelled, train, val, received, field, calib  # the photos the strategy does not keep, before it reads more
    strategy.after(candidate, used, features=known)  # only once published: a stopped or refused candidate leaves no trace
    announce(version.name)
    metrics["memory"] = memory.summary()  # after the publish: the version's manifest leaves it out, the result has it
    log.info("retrain_memory", **metrics["memory"])
    log.info("retrain_published", engine_version=version.name, parent=current.name, seconds=round(time.perf_counter() - t0, 1))
    return RetrainResult(version.name, decision.reason, metrics, len(ids), time.perf_counter() - t0)
