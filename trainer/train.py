"""Supervised training from a folder of class folders, published to the engine store."""

from __future__ import annotations

import copy
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from edge_agent.log import get_logger
from edge_agent.preprocess import DEFAULT_SPEC, PreprocessSpec
from engines.errors import EdgeAgentError
from engines.store import StoreVersion
from trainer.augment import Augment
from trainer.batchnorm import batchnorm_photos, recompute_batchnorm
from trainer.calibrate import calibrate, expected_calibration_error
from trainer.data import DatasetError, TensorDataset, scan_folder, stratified_split
from trainer.models import Classifier, build_model, count_parameters, logits_on
from trainer.photos import INFERENCE_BATCH
from trainer.publish import publish_model

__all__ = [
    "NoTrainingDevice",
    "TrainSettings",
    "evaluate",
    "fit",
    "lr_schedule",
    "recalibrate",
    "scored",
    "train_supervised",
    "training_device",
]


class NoTrainingDevice(EdgeAgentError, RuntimeError):
    """Training was asked to run on a device torch does not have here (no CUDA GPU, or no such device at all)."""


@dataclass
class TrainSettings:
    epochs: int = 80
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 1e-4
    warmup_epochs: int = 3
    label_smoothing: float = 0.1
    patience: int = 20  # epochs without a better validation top-1 before stopping
    seed: int = 20251120
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    threads: int | None = None
    int8: bool = True
    swa_epochs: int = 0  # average the weights of the last N epochs (Stochastic Weight Averaging); 0 = off
    init: str | None = None  # "STORE" or "STORE:VERSION": start from those weights instead of scratch
    calibrate: bool = True  # fold a softmax temperature fitted on the validation split into the model
    head_epochs: int = 0  # train only the head for the first N epochs (a pretrained backbone: its features stay put)
    freeze_batchnorm: bool = False  # keep BatchNorm's running statistics (a pretrained network's) while training
    device: str = "cpu"  # where training runs: "cpu", or "cuda" on a machine with an NVIDIA GPU (the model comes back on the CPU)


def training_device(name: str) -> torch.device:
    """The torch device ``name`` ("cpu", "cuda", "cuda:1"), checked to exist here before any photo is decoded."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise NoTrainingDevice(f"device {name!r}: not a torch device ({exc}); use cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NoTrainingDevice(
            f"device {name!r}: torch {torch.__version__} sees no CUDA GPU on this machine; train on the CPU (--device cpu, the default)"
        )
    if device.type not in ("cpu", "cuda"):
        raise NoTrainingDevice(f"device {name!r}: training runs on cpu or cuda")
    return device


@dataclass
class Evaluation:
    top1: float
    loss: float
    per_class: list[float]
    confusion: list[list[int]]
    ece: float | None = None  # expected calibration error of the softmax

    def summary(self, classes: list[str]) -> dict:
        return {
            "top1": round(self.top1, 4),
            "loss": round(self.loss, 4),
            **({"ece": round(self.ece, 4)} if self.ece is not None else {}),
            "per_class_top1": {c: round(a, 4) for c, a in zip(classes, self.per_class)},
        }


@torch.no_grad()
def evaluate(model: Classifier, x: torch.Tensor, y: torch.Tensor, batch: int = INFERENCE_BATCH) -> Evaluation:
    """Top-1, mean cross-entropy, per-class recall, confusion matrix (rows: truth) and calibration error, computed
    on the device the model is on (the photos go there a batch at a time)."""
    return scored(logits_on(model, x, batch), y)


def scored(logits: torch.Tensor, y: torch.Tensor) -> Evaluation:
    """The :class:`Evaluation` of a model's ``logits`` [N, classes] on photos labelled ``y`` (:func:`evaluate`'s
    figures, for logits a caller already has)."""
    k = logits.shape[1]
    logits = logits.float()
    confusion = torch.zeros(k, k, dtype=torch.long)
    pred = logits.argmax(1)
    confusion.index_put_((y, pred), torch.ones_like(pred), accumulate=True)
    n = max(len(y), 1)
    loss = F.cross_entropy(logits, y, reduction="sum").item() if len(y) else 0.0
    per_class = (confusion.diag().float() / confusion.sum(1).clamp(min=1).float()).tolist()
    ece = expected_calibration_error(logits, y) if len(y) else None
    return Evaluation(confusion.diag().sum().item() / n, loss / n, per_class, confusion.tolist(), ece)


def fit(
    model: Classifier,
    train: TensorDataset,
    val: TensorDataset,
    settings: TrainSettings,
    progress: bool = True,
    batches=None,
    checkpoint: str | os.PathLike | None = None,
    watch: dict | None = None,
    bn_x: torch.Tensor | None = None,
    spec: PreprocessSpec = DEFAULT_SPEC,
) -> tuple[Classifier, dict]:
    """Train with Adam, warm-up + cosine learning rate and early stopping on validation top-1.

    ``batches(indices, generator)`` makes a training batch from photo indices (default: :class:`Augment` on the
    stored tensors). With ``checkpoint`` (a file), the whole state is saved after every epoch and a run that finds
    it resumes after its last epoch. ``watch`` (name -> (x, y)) is evaluated each epoch for the history only; it
    never chooses anything. Training runs on ``settings.device`` (the model comes back on the CPU). ``bn_x``: the
    clean training photos for the SWA model's BatchNorm statistics (default ``train.x``). Returns the best model (by
    validation top-1, then loss) and a history dict.
    """
    from tqdm import tqdm

    log = get_logger("trainer")
    gen = torch.Generator().manual_seed(settings.seed)
    torch.manual_seed(settings.seed)
    device = training_device(settings.device)
    model.to(device).to(memory_format=torch.channels_last)  # Lite0's training step at 256 px about 30 % faster on a CPU
    eval_batch = INFERENCE_BATCH if device.type == "cpu" else 256  # a GPU's memory is not the retrain's 1.5 GB
    if batches is None:
        augment = Augment(spec=spec)
        batches = lambda idx, g: augment(train.x[idx], g)  # noqa: E731
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    steps_per_epoch = max(1, math.ceil(len(train) / settings.batch_size))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_schedule(settings.epochs * steps_per_epoch, settings.warmup_epochs * steps_per_epoch, settings.swa_epochs * steps_per_epoch)
    )
    best_key, best_state, best_epoch, history = (-1.0, 0.0), None, -1, []
    swa = torch.optim.swa_utils.AveragedModel(model) if settings.swa_epochs > 0 else None
    swa_from = settings.epochs - settings.swa_epochs
    start = 0
    if checkpoint is not None and Path(checkpoint).exists():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        gen.set_state(saved["gen"])
        if swa is not None and saved.get("swa") is not None:
            swa.load_state_dict(saved["swa"])
        best_key, best_state, best_epoch, history = (tuple(saved["best_key"]), saved["best_state"], saved["best_epoch"], saved["history"])
        start = len(history)
        log.info("resumed", checkpoint=str(checkpoint), epoch=start)
    bar = tqdm(range(start, settings.epochs), desc="train", unit="epoch", disable=not progress, dynamic_ncols=True)
    for epoch in bar:
        model.keep_batchnorm = settings.freeze_batchnorm  # the pretrained statistics, as at inference; affine terms learn
        model.train()
        _train_head_only(model, epoch < settings.head_epochs)
        order = torch.randperm(len(train), generator=gen)
        t0, running = time.perf_counter(), 0.0
        for i in range(0, len(order), settings.batch_size):
            idx = order[i : i + settings.batch_size]
            if len(idx) < 2:  # BatchNorm needs two samples
                continue
            xb = batches(idx, gen).to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(model(xb), train.y[idx].to(device), label_smoothing=settings.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            running += loss.item() * len(idx)
        if swa is not None and epoch >= swa_from:
            swa.update_parameters(model)
        ev = evaluate(model, val.x, val.y, eval_batch)
        row = {
            "epoch": epoch + 1,
            "train_loss": round(running / max(len(train), 1), 4),
            "val_top1": round(ev.top1, 4),
            "val_loss": round(ev.loss, 4),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        for name, (wx, wy) in (watch or {}).items():
            row[f"{name}_top1"] = round(evaluate(model, wx, wy, eval_batch).top1, 4)
        history.append(row)
        key = (ev.top1, -ev.loss)
        if key > best_key:
            best_key, best_state, best_epoch = key, copy.deepcopy(model.state_dict()), epoch
        bar.set_postfix(loss=row["train_loss"], val=row["val_top1"], best=round(best_key[0], 4))
        log.info("epoch", **row, best_val_top1=round(best_key[0], 4))
        if checkpoint is not None:
            state = {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "gen": gen.get_state(),
                "swa": swa.state_dict() if swa is not None else None,
                "best_key": best_key,
                "best_state": best_state,
                "best_epoch": best_epoch,
                "history": history,
            }
            torch.save(state, f"{checkpoint}.tmp")
            os.replace(f"{checkpoint}.tmp", checkpoint)
        if epoch - best_epoch >= settings.patience:
            log.info("early_stop", epoch=epoch + 1, best_epoch=best_epoch + 1)
            break
    _train_head_only(model, False)
    info = {"epochs_run": len(history), "best_epoch": best_epoch + 1, "history": history}
    if best_state is not None:
        model.load_state_dict(best_state)
    model.cpu().to(memory_format=torch.contiguous_format)  # as every other network in the trainer holds its weights
    if swa is not None:
        swa.cpu().to(memory_format=torch.contiguous_format)
    if swa is not None and swa.n_averaged.item() > 0:
        averaged = _swa_model(swa, train.x if bn_x is None else bn_x, settings.batch_size)
        ev = evaluate(averaged, val.x, val.y)
        info["swa"] = {
            "epochs_averaged": int(swa.n_averaged.item()),
            "val_top1": round(ev.top1, 4),
            "best_single_val_top1": round(best_key[0], 4),
        }
        log.info("swa", **info["swa"])
        if (ev.top1, -ev.loss) >= best_key:  # chosen by validation, like any checkpoint
            info["selected"] = "swa"
            return averaged, info
    info["selected"] = f"epoch {best_epoch + 1}"
    return model, info


def _train_head_only(model: Classifier, head_only: bool) -> None:
    """Freeze everything but ``model.head`` (no gradient is computed through the backbone), or unfreeze it all."""
    head = {id(p) for p in model.head.parameters()}
    for p in model.parameters():
        p.requires_grad_(not head_only or id(p) in head)


def lr_schedule(total: int, warmup: int = 0, swa: int = 0, floor: float = 0.25):
    """Learning-rate factor per step: linear warm-up, then cosine to 0 - or, with ``swa`` averaging steps at
    the end, cosine to ``floor``, held there while the weights are averaged."""
    floor = floor if swa > 0 else 0.0
    end = total - swa

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if step >= end:
            return floor
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, end - warmup)))

    return factor


def _swa_model(swa, x: torch.Tensor, batch_size: int) -> Classifier:
    """The averaged weights as a plain model, with BatchNorm statistics recomputed on the training photos ``x``."""
    return recompute_batchnorm(copy.deepcopy(swa.module), x, batch_size)


def _initial_weights(spec: str, classes: list[str]) -> tuple[Classifier, dict]:
    """Weights of a store version ("STORE" or "STORE:VERSION"); its classes must be the data's."""
    from engines.store import EngineStore
    from trainer.publish import load_weights

    root, _, version = spec.partition(":")
    opened = EngineStore(root).open(version or None)
    if opened.classes != classes:
        raise DatasetError(f"--init {spec}: its classes differ from the data's class folders")
    return load_weights(opened).train(), {
        "store": str(Path(root).resolve()),
        "version": opened.name,
        "onnx_sha256": opened.manifest["files"]["model.onnx"]["sha256"],
    }


def train_supervised(
    data_dir: str | os.PathLike,
    store_dir: str | os.PathLike,
    settings: TrainSettings | None = None,
    spec: PreprocessSpec = DEFAULT_SPEC,
    progress: bool = True,
) -> StoreVersion:
    """Train a fresh model on ``data_dir`` and publish it (ONNX, INT8, weights) to ``store_dir``."""
    settings = settings or TrainSettings()
    log = get_logger("trainer", data=str(data_dir))
    if settings.threads:
        torch.set_num_threads(settings.threads)
    folder, sets, skipped = _load_splits(data_dir, settings.seed, settings.test_fraction, settings.val_fraction, spec, log)
    init_info = None
    if settings.init:
        model, init_info = _initial_weights(settings.init, folder.classes)
    else:
        model = build_model(len(folder.classes))
    model, fit_info = fit(model, sets["train"], sets["val"], settings, progress, spec=spec)
    scaling = calibrate(model, sets["val"].x, sets["val"].y).summary() if settings.calibrate else None
    metrics = _held_out_metrics(model, sets, folder.classes) | ({"calibration": scaling} if scaling else {})
    log.info("trained", val_top1=metrics["val"]["top1"], test_top1=metrics.get("test", {}).get("top1"))
    training = {
        "kind": "supervised",
        "data": str(Path(data_dir).resolve()),
        "classes": folder.counts(),
        "split": {
            "seed": settings.seed,
            "test_fraction": settings.test_fraction,
            "val_fraction": settings.val_fraction,
            **{f"{name}_photos": len(ds) for name, ds in sets.items()},
        },
        "skipped_photos": len(skipped),
        "settings": asdict(settings),
        "parameters": count_parameters(model),
        "epochs_run": fit_info["epochs_run"],
        "best_epoch": fit_info["best_epoch"],
        "selected": fit_info["selected"],
        "swa": fit_info.get("swa"),
        "torch": torch.__version__,
        "host": platform.node(),
        "init": init_info,
    }
    return publish_model(
        model, folder.classes, store_dir, spec=spec, metrics=metrics, training=training, **_int8_inputs(sets, settings.int8)
    )


def recalibrate(
    data_dir: str | os.PathLike, store_dir: str | os.PathLike, version: str | None = None, batchnorm: bool = False
) -> StoreVersion:
    """Fold a temperature into a published version and publish the result as a new version (its child).
    With ``batchnorm``, first set its BatchNorm statistics to the exact ones over its training split (composed as it
    was trained, for a field-trained release; :mod:`trainer.batchnorm`: versions published before they were exact
    averaged per-batch statistics).

    The temperature is fitted on the validation split the version was trained with, recomputed from
    ``data_dir`` and the manifest's split (seed and fractions), so the photos are ones it was never trained
    on. For models published before ``calibrate`` existed, such as one trained with label smoothing, whose
    softmax rarely reaches the pseudo-label threshold however right it is."""
    from engines.store import EngineStore
    from trainer.publish import load_weights

    log = get_logger("trainer", data=str(data_dir))
    opened = EngineStore(store_dir).open(version)
    split = opened.manifest.get("training", {}).get("split")
    if not split:
        raise DatasetError(f"{opened.name}: its manifest records no training split, so its validation photos are unknown")
    spec = PreprocessSpec.from_manifest(opened.manifest["preprocess"])
    folder, sets, _ = _load_splits(data_dir, split["seed"], split["test_fraction"], split["val_fraction"], spec, log)
    if folder.classes != opened.classes:
        raise DatasetError(f"{data_dir}: its class folders differ from {opened.name}'s classes")
    model = load_weights(opened)
    how = None
    if batchnorm:  # a field-trained release: over composed passes of its training photos (trainer.batchnorm)
        bn_x, how = batchnorm_photos(
            opened.manifest.get("training", {}), sets["train"].samples, sets["train"].x[:0], split["seed"], spec=spec
        )
        if bn_x is None:
            bn_x, how = sets["train"].x, f"exact statistics over the {len(sets['train'])} training photos"
        recompute_batchnorm(model, bn_x)
    scaling = calibrate(model, sets["val"].x, sets["val"].y)
    if scaling.skipped:
        raise DatasetError(f"cannot calibrate {opened.name}: {scaling.skipped}")
    metrics = {**opened.manifest.get("metrics", {}), **_held_out_metrics(model, sets, folder.classes), "calibration": scaling.summary()}
    log.info("recalibrated", parent=opened.name, **scaling.summary())
    return publish_model(
        model,
        folder.classes,
        store_dir,
        spec=spec,
        metrics=metrics,
        parent=opened.name,
        training={**opened.manifest.get("training", {}), "recalibrated_from": opened.name, **({"batchnorm": how} if how else {})},
        **_int8_inputs(sets, "int8" in opened.manifest["artifacts"]),
    )


def _load_splits(data_dir, seed: int, test_fraction: float, val_fraction: float, spec: PreprocessSpec, log):
    """The class folders, their seeded test/val/train split as tensors, and the photos that could not be decoded."""
    folder = scan_folder(data_dir)
    splits = stratified_split(folder.samples, {"test": test_fraction, "val": val_fraction}, seed)
    t0 = time.perf_counter()
    sets = {name: TensorDataset(items, spec) for name, items in splits.items()}
    skipped = [s for ds in sets.values() for s in ds.skipped]
    for path, why in skipped:
        log.warning("photo_skipped", photo=path, reason=why)
    if len(sets["train"]) == 0:
        raise DatasetError(f"{data_dir}: no decodable training photos")
    if len(sets["val"]) == 0:
        raise DatasetError(f"{data_dir}: too few photos for a validation split")
    log.info(
        "data_loaded",
        classes=len(folder.classes),
        **{name: len(ds) for name, ds in sets.items()},
        skipped=len(skipped),
        seconds=round(time.perf_counter() - t0, 1),
    )
    return folder, sets, skipped


def _held_out_metrics(model: Classifier, sets: dict, classes: list[str]) -> dict:
    metrics = {"val": evaluate(model, sets["val"].x, sets["val"].y).summary(classes)}
    if len(sets["test"]):
        test = evaluate(model, sets["test"].x, sets["test"].y)
        metrics["test"] = test.summary(classes) | {"confusion": test.confusion}
    return metrics


def _int8_inputs(sets: dict, int8: bool) -> dict:
    """publish_model's INT8 arguments: 256 training photos (seeded) to calibrate on, the test photos to compare on."""
    held_out = sets["test"] if len(sets["test"]) else sets["val"]
    train = sets["train"]
    photos = train.x[torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:256]].numpy() if int8 else None
    return {"calibration": photos, "held_out": (held_out.x.numpy(), held_out.y.numpy())}
