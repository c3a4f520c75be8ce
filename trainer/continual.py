"""One training loop for every strategy: labelled cross-entropy + ramped, confidence-weighted pseudo-label NLL.

``loss = mean(weight * CE(true labels)) + pseudo_lambda * ramp(epoch) * mean(confidence * NLL(pseudo)) + strategy.penalty``,
with ``weight`` 1 for labelled photos and ``[trainer] expert_weight`` for an expert's labels,
with ``ramp`` the sigmoid-shaped ramp-up exp(-5 (1 - t)^2) over the first ``ramp_epochs`` epochs
(Laine & Aila, 2017), and augmentation on training batches only.

A batch goes through the network ``[trainer] micro_batch`` photos at a time, each part's loss scaled by its share of
the batch and the gradients summed before the step: where every BatchNorm layer keeps its statistics (EfficientNet-Lite
by default) a photo's loss does not depend on the others in its batch, so the step is the whole batch's (to float
rounding) for the activations of a part. Where BatchNorm normalises by the batch (LeafNet), the whole batch goes at once.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from edge_agent.log import get_logger
from edge_agent.preprocess import DEFAULT_SPEC, PreprocessSpec
from edge_agent.trainer_config import TrainerSection
from trainer.augment import Augment
from trainer.loop.consistency import Consistency
from trainer.models import ARCHS, Classifier
from trainer.step import at_step
from trainer.stop import check, checked_inside
from trainer.strategies.base import Generation, Strategy
from trainer.strategies.lwf import distill_loss
from trainer.train import lr_schedule

__all__ = ["balance_pseudo", "epoch_rows", "hold", "learning_rate", "micro_batch", "ramp", "train_generation"]


def ramp(epoch: int, ramp_epochs: int) -> float:
    """0 -> 1 over ``ramp_epochs`` epochs, sigmoid-shaped; 1 afterwards."""
    if ramp_epochs <= 0 or epoch >= ramp_epochs:
        return 1.0
    t = epoch / ramp_epochs
    return math.exp(-5.0 * (1.0 - t) ** 2)


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


def _drawn(data: Generation, per_class: int) -> list[torch.Tensor]:
    """The rows of ``data`` every epoch takes, then each class's replayed rows where ``per_class`` of them are drawn."""
    if per_class <= 0 or not data.replayed.any():
        return [torch.arange(len(data))]
    replayed = torch.nonzero(data.replayed).flatten()
    return [torch.nonzero(~data.replayed).flatten()] + [replayed[data.y[replayed] == c] for c in torch.unique(data.y[replayed])]


def epoch_rows(data: Generation, per_class: int, gen: torch.Generator) -> torch.Tensor:
    """One epoch's rows in random order: every row, but of the replayed photos only ``per_class`` of each class, drawn
    afresh each epoch (``[trainer] replay_per_epoch``; 0: every row)."""
    parts = _drawn(data, per_class)
    if len(parts) == 1:
        return torch.randperm(len(data), generator=gen)
    rows = torch.cat([parts[0]] + [p[torch.randperm(len(p), generator=gen)[:per_class]] for p in parts[1:]])
    return rows[torch.randperm(len(rows), generator=gen)]


def _rows_per_epoch(data: Generation, per_class: int) -> int:
    parts = _drawn(data, per_class)
    return len(parts[0]) + sum(min(len(p), per_class) for p in parts[1:])


def _entry_of(model: Classifier):
    """``model``'s registry entry (an architecture the registry does not name retrains as LeafNet does)."""
    return ARCHS.get(model.arch) or ARCHS["LeafNet"]


def hold(model: Classifier, settings: TrainerSection) -> int:
    """Freeze what ``[trainer]`` ``frozen_blocks`` and ``batchnorm`` say a retrain of ``model`` leaves as it is (-1 and
    auto: its registry entry's choice); returns how many parameters still learn."""
    entry = _entry_of(model)
    blocks = settings.frozen_blocks if settings.frozen_blocks >= 0 else entry.retrain_frozen_blocks
    keep = settings.batchnorm == "keep" or (settings.batchnorm == "auto" and entry.retrain_keep_batchnorm)
    return model.freeze(blocks, keep)


def micro_batch(model: Classifier, settings: TrainerSection) -> int:
    """Photos ``model`` is given at once in a training step: ``[trainer] micro_batch`` where no BatchNorm layer
    normalises by the batch, else (or with 0) the whole ``batch_size``."""
    batch_statistics = any(m.training for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    if settings.micro_batch == 0 or batch_statistics:
        return settings.batch_size
    return min(settings.micro_batch, settings.batch_size)


def _loss_terms(
    model, teacher, strategy, settings, x, y, pseudo, conf, w: float, counts: tuple[int, int, int], shared: bool = False
) -> dict:
    """The batch's loss terms over one part of it (photos ``x``): each term's sum over the part divided by the
    batch's count, so the parts' terms add up to the whole batch's. With ``shared``, the teacher goes on from the
    student's held blocks' output instead of running its own copy of them."""
    n, n_true, n_pseudo = counts
    h = model.held(x)  # the blocks training holds, once: two thirds of a forward pass of Lite0 at 256 px
    logits = model.forward_held(h)
    share = len(x) / n
    terms = {}
    if (~pseudo).any():
        terms["ce"] = (conf[~pseudo] * F.cross_entropy(logits[~pseudo], y[~pseudo], reduction="none")).sum() / n_true
    if pseudo.any() and w > 0:
        nll = F.cross_entropy(logits[pseudo], y[pseudo], reduction="none")
        terms["pseudo"] = settings.pseudo_lambda * w * (conf[pseudo] * nll).sum() / n_pseudo
    if settings.distill > 0:
        with torch.no_grad():
            taught = teacher.forward_held(h, model.frozen_blocks) if shared else teacher(x)
        per_photo = distill_loss(logits, taught, settings.distill_temperature)
        if settings.distill_photos == "agreeing":  # the teacher's answer where the label corrects it is what is unlearnt
            per_photo = per_photo * (taught.argmax(1) == y)
        terms["distill"] = settings.distill * per_photo.sum() / n
    terms["penalty"] = share * strategy.penalty(model, x, logits)  # a mean over photos, or of the weights alone: both add up
    return terms


def learning_rate(model: Classifier, settings: TrainerSection, pseudo_only: bool = False) -> float:
    """A retrain's peak learning rate: ``[trainer]`` ``lr`` (``pseudo_only_lr`` on pseudo-labels alone), or where it
    is 0 the architecture's own (a quarter of it on pseudo-labels alone)."""
    base = _entry_of(model).retrain_lr
    if pseudo_only:
        return settings.pseudo_only_lr or base / 4
    return settings.lr or base


def train_generation(
    previous: Classifier,
    data: Generation,
    strategy: Strategy,
    settings: TrainerSection,
    lr: float,
    interpolate: float = 1.0,
    num_classes: int | None = None,
    should_stop=lambda: False,
    batchnorm: bool = True,
    bn_x: torch.Tensor | None = None,
    on_epoch=lambda epoch, epochs: None,
    spec: PreprocessSpec = DEFAULT_SPEC,
    consistency: Consistency | None = None,
    teacher: Classifier | None = None,
) -> tuple[Classifier, Generation]:
    """Train a candidate from ``previous`` on ``data`` at peak learning rate ``lr`` (growing the head to ``num_classes``
    if more), with ``[trainer]`` ``settings`` (epochs, batch size, SWA, distillation, ramp). Its BatchNorm statistics
    are recomputed on ``bn_x`` (default: the data) unless ``batchnorm`` is false (the caller does it:
    :mod:`trainer.step`); otherwise its weights are ``interpolate`` of the way from ``previous``
    (:func:`trainer.step.at_step`). With ``consistency``, each step also learns from photos nobody labelled
    (:mod:`trainer.loop.consistency`). The ``distill`` term keeps it close to ``teacher``'s answers (default:
    ``previous``'s).

    Returns the candidate and the data it saw (with any replay). Call ``strategy.after(candidate, data)``
    only once the candidate is accepted, so a refused candidate leaves no trace in the strategy's state.
    """
    log = get_logger("trainer.continual", strategy=strategy.type)
    torch.manual_seed(settings.seed)
    gen = torch.Generator().manual_seed(settings.seed)
    own_teacher = teacher is not None and teacher is not previous
    previous = copy.deepcopy(previous).eval()
    model = copy.deepcopy(previous)
    teacher = copy.deepcopy(teacher).eval() if own_teacher else previous
    if num_classes and num_classes > model.num_classes:
        model.grow_head(num_classes)
    learning = hold(model, settings)
    shared = settings.distill > 0 and model.same_blocks(teacher, model.frozen_blocks)
    # channels-last weights: the same training to float rounding, a training step of Lite0 about 20 % faster on a CPU
    model.to(memory_format=torch.channels_last)
    teacher.to(memory_format=torch.channels_last)
    log.info(
        "generation_layers",
        frozen_blocks=model.frozen_blocks,
        keep_batchnorm=model.keep_batchnorm,
        learning_parameters=learning,
        teacher_shares_held_blocks=shared,
    )
    data = strategy.before(model, previous, data)
    # in the normalisation of the model's own preprocessing
    augment = Augment(spec=spec, zoom=tuple(settings.zoom) if settings.zoom else None)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=settings.weight_decay)
    # There is no validation set to pick a checkpoint with (the gate's photos stay unseen), so the candidate is
    # the last epoch's weights after a cosine decay to zero - or, with swa_epochs, the average of the last
    # epochs' weights (Stochastic Weight Averaging), the same kind of solution as an SWA-trained model in service
    # (in the field simulation the two gave candidates within the gate's noise of each other).
    steps = math.ceil(_rows_per_epoch(data, settings.replay_per_epoch) / settings.batch_size)
    swa_epochs = min(settings.swa_epochs, settings.epochs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule(max(1, settings.epochs * steps), swa=swa_epochs * steps))
    swa = torch.optim.swa_utils.AveragedModel(model) if swa_epochs > 0 else None
    model.train()
    micro = micro_batch(model, settings)
    # Asked to stop, it stops within one layer's forward pass or one part's backward pass (SIGTERM: within 5 s).
    with checked_inside((model, teacher), should_stop, "while training"):
        for epoch in range(settings.epochs):
            model.train()
            w = ramp(epoch, settings.ramp_epochs)
            order = epoch_rows(data, settings.replay_per_epoch, gen)
            totals = {"ce": 0.0, "pseudo": 0.0, "penalty": 0.0, "distill": 0.0, "consistency": 0.0}
            for i in range(0, len(order), settings.batch_size):
                idx = order[i : i + settings.batch_size]
                if len(idx) < 2:
                    continue
                x = augment(data.x[idx], gen).contiguous(memory_format=torch.channels_last)
                y, pseudo, conf = data.y[idx], data.pseudo[idx], data.weight[idx]
                counts = (len(idx), int((~pseudo).sum()), int(pseudo.sum()))
                opt.zero_grad(set_to_none=True)
                for j in range(0, len(idx), micro):
                    check(should_stop, "while training")  # a part at a time: a whole batch takes seconds on a busy CPU
                    part = slice(j, j + micro)
                    terms = _loss_terms(model, teacher, strategy, settings, x[part], y[part], pseudo[part], conf[part], w, counts, shared)
                    check(should_stop, "while training")  # and before its backward pass: as long again
                    sum(terms.values()).backward()
                    for k, v in terms.items():
                        totals[k] += float(v.detach())
                if consistency is not None:
                    drawn = consistency.draw(len(idx), gen)
                    totals["consistency"] += consistency.loss(model, drawn, gen, counts[1], micro, should_stop=should_stop)
                opt.step()
                sched.step()
            if swa is not None and epoch >= settings.epochs - swa_epochs:
                swa.update_parameters(model)
            on_epoch(epoch + 1, settings.epochs)
            log.info("generation_epoch", epoch=epoch + 1, ramp=round(w, 3), **{k: round(v, 3) for k, v in totals.items()})
    if swa is not None:
        model = copy.deepcopy(swa.module)
    for network in (model, previous):  # as every other network in the trainer holds its weights
        network.to(memory_format=torch.contiguous_format)
    if not batchnorm:  # the caller chooses the step and recomputes the statistics (trainer.step)
        return model.eval(), data
    return at_step(model, previous, interpolate, None if model.keep_batchnorm else data.x if bn_x is None else bn_x), data
