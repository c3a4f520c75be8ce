"""The shipped model's release, reproducible end to end: fine-tune, calibrate, build INT8, sign, write.

``edge-trainer release --data ../shared/data/plantvillage --key ../shared/release/edge-agent-release.key --out DIR``
(``make release``) fine-tunes the ImageNet-pretrained EfficientNet-Lite0 (:mod:`trainer.models`) on the lab photos,
the whole network with its ImageNet BatchNorm statistics kept, checkpointing every epoch into ``--work`` so an
interrupted run resumes; then (unless frozen) BatchNorm statistics over the training photos, a fitted temperature, the verdict's statistics (:mod:`trainer.verdict_fit`),
ONNX + INT8, the photo lists of the split (``split.json``), and a store at ``--out`` signed with the release key.
:data:`LEAFNET5_RELEASE` is v1000's recipe (LeafNet5 from scratch with field augmentation), kept as the reference.
Field photos are never read here except by ``--watch-field``, which records them in the history and chooses nothing.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from edge_agent.log import get_logger
from edge_agent.preprocess import PreprocessSpec
from engines.errors import EdgeAgentError
from trainer.data import scan_folder, stratified_split
from trainer.fieldaug import BN_PASSES, FieldAugSettings, FieldComposer, load_lab_photos
from trainer.train import TrainSettings

__all__ = [
    "LEAFNET5_RELEASE",
    "RELEASE_VERSION",
    "ReleaseKeyMissing",
    "ReleaseSettings",
    "finish_release",
    "release",
    "release_key",
    "reuse_training",
    "train_release",
]


class ReleaseKeyMissing(EdgeAgentError, FileNotFoundError):
    """The release signing key file named is not there (a release is never signed with a key made on the spot)."""


def release_key(key_path: str | os.PathLike | None):
    """The release signing key at ``key_path`` (None: an unsigned store), loaded, never made."""
    from engines.signing import load_or_create_key

    if key_path is None:
        return None
    if not Path(key_path).is_file():
        raise ReleaseKeyMissing(f"{key_path}: no release key there (the project's is ../shared/release/edge-agent-release.key)")
    return load_or_create_key(Path(key_path))  # it exists: loaded, never made


#: Releases are numbered apart from a device's own versions (which count up from the release they started on):
#: v1000 was LeafNet5's release, v2000 EfficientNet-Lite0's, above every version a v1000 device made; v3000 is v2000's
#: training with the verdict measured on the network's features (``verdict = "features"``); v4000 is Lite0 trained at
#: 256 px for 8 epochs (docs/model.md: the input side the field's labels teach best, and the lab target).
RELEASE_VERSION = "v4000"


@dataclass
class ReleaseSettings(TrainSettings):
    """:class:`~trainer.train.TrainSettings` with the release's values, and the architecture (recorded in its manifest)."""

    arch: str = "efficientnet-lite0"
    size: int = 256  # input side, a multiple of 32: 256 is the orchard photos' own (192 until v3000: docs/model.md)
    pretrained: bool = True  # start from the registry's checked ImageNet weights
    augmentation: str = "flips"  # "flips": flips only; "lab": flips, rotation, colour, zoom (trainer.augment); "field": FieldComposer
    zoom: tuple[float, float] | None = (0.8, 1.3)  # "lab" only: the random scale range
    epochs: int = 8  # 3 until v3000: validation rose until epoch 6-8 (docs/model.md)
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup_epochs: int = 1
    head_epochs: int = 0  # the new head alone first (1 was measured: docs/model.md)
    freeze_batchnorm: bool = True  # ImageNet's BatchNorm statistics kept: lab photos' own cost the field (docs/model.md)
    patience: int = 10_000  # no early stop: the schedule runs to its end
    swa_epochs: int = 0
    threads: int | None = 2
    verdict: str = "features"  # the space the verdict's distance is measured on: "features" or "logits" (trainer.verdict_fit)

    @property
    def spec(self) -> PreprocessSpec:
        """The preprocessing this architecture and input size need (recorded in the manifest)."""
        from trainer.models import data_config

        return data_config(self.arch, self.size)


#: v1000's recipe: LeafNet5 from scratch, 128 px, field augmentation, 55 epochs with SWA over the last 8.
LEAFNET5_RELEASE = ReleaseSettings(
    arch="LeafNet5",
    size=128,
    pretrained=False,
    augmentation="field",
    zoom=None,
    epochs=55,
    batch_size=64,
    lr=2e-3,
    weight_decay=5e-4,
    warmup_epochs=2,
    head_epochs=0,
    freeze_batchnorm=False,
    swa_epochs=8,
    verdict="logits",
)


def split_photos(data_dir: str | os.PathLike, settings: ReleaseSettings):
    """The class folders and their seeded test / val / train split."""
    folder = scan_folder(data_dir)
    return folder, stratified_split(folder.samples, {"test": settings.test_fraction, "val": settings.val_fraction}, settings.seed)


#: The release's field augmentation, every part on.
_FIELD_AUG = FieldAugSettings()


def train_release(
    data_dir: str | os.PathLike,
    work: str | os.PathLike,
    settings: ReleaseSettings | None = None,
    watch: dict | None = None,
    progress: bool = True,
    augmentation: FieldAugSettings | None | str = "settings",
    loaded: tuple | None = None,
):
    """Train the release model (resuming from ``work/checkpoint.pt``); returns (model, fit info, folder, splits).
    ``augmentation``: the field augmentation's settings, None for the lab photos with :class:`trainer.augment.Augment`
    only, or "settings" for what ``settings.augmentation`` says. ``loaded``: (folder, photos) already decoded at
    ``settings.spec`` (a sweep over training seeds on one split), else the split is made and decoded here."""
    from trainer.augment import Augment
    from trainer.data import TensorDataset
    from trainer.models import build_model
    from trainer.train import fit, training_device

    settings = settings or ReleaseSettings()
    training_device(settings.device)  # a missing GPU stops the release before the photos are decoded
    log = get_logger("release")
    torch.set_num_threads(settings.threads or torch.get_num_threads())
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    if augmentation == "settings":
        augmentation = _FIELD_AUG if settings.augmentation == "field" else None
    spec = settings.spec
    if loaded is None:
        folder, splits = split_photos(data_dir, settings)
        t0 = time.perf_counter()
        photos = {name: load_lab_photos(items, spec) for name, items in splits.items()}
        log.info("photos_loaded", **{k: len(v.samples) for k, v in photos.items()}, seconds=round(time.perf_counter() - t0, 1))
    else:
        folder, photos = loaded
    train = photos["train"]
    val_ds = TensorDataset.of(photos["val"].samples, *photos["val"].tensors(spec))
    model = build_model(len(folder.classes), settings.arch, pretrained=settings.pretrained).to(memory_format=torch.channels_last)
    if augmentation is None:
        train_ds = TensorDataset.of(train.samples, *train.tensors(spec))
        train_ds.x = train_ds.x.to(settings.device)  # flips and the rest run where the network does
        augment = (
            Augment(max_degrees=0, brightness=0, contrast=0, noise_std=0, spec=spec)
            if settings.augmentation == "flips"
            else Augment(spec=spec, zoom=settings.zoom)
        )
        batches = lambda idx, g: augment(train_ds.x[idx], g).contiguous(memory_format=torch.channels_last)  # noqa: E731
        bn_x = train_ds.x.cpu()
    else:
        composer = FieldComposer.of(train, augmentation, spec)
        train_ds = TensorDataset.of(train.samples, None, torch.tensor([s.label for s in train.samples]))
        batches, bn_x = (
            (lambda idx, g: composer(idx, g).contiguous(memory_format=torch.channels_last)),
            composer.sample(BN_PASSES, settings.seed),
        )
    done = _finished_training(work / "trained.pt", settings)
    if done is not None:  # trained already (here, or elsewhere by the same recipe: `--device cuda` on a GPU machine)
        model.load_state_dict(done["state_dict"])
        info = {**done["info"], "trained_on": _trained_on(done["info"], done["settings"])}
        log.info("training_reused", file=str(work / "trained.pt"), trained_on=info["trained_on"])
    else:
        model, info = fit(
            model, train_ds, val_ds, settings, progress=progress, batches=batches, checkpoint=work / "checkpoint.pt", watch=watch, bn_x=bn_x
        )
        info["train_seconds"] = round(sum(h["seconds"] for h in info["history"]), 1)  # every epoch, across resumed runs
        info["trained_on"] = settings.device
    info["bn_x"] = bn_x
    info["augmentation"] = asdict(augmentation) if augmentation is not None else None
    model = model.to(memory_format=torch.contiguous_format)
    torch.save(
        {
            "state_dict": model.state_dict(),
            "arch": settings.arch,
            "classes": folder.classes,
            "info": {k: v for k, v in info.items() if k != "bn_x"},
            "settings": asdict(settings),
        },
        work / "trained.pt",
    )
    return model, info, folder, photos


#: Settings that change where or how fast training runs, or what is done after it, not what it trains.
_PLACE_ONLY = ("device", "threads", "verdict")


def _trained_on(record: dict, settings: dict) -> str:
    """Where a finished training ran: its own record, else (a file or manifest from before it was recorded) its settings."""
    return record.get("trained_on", settings.get("device", "cpu"))


def _finished_training(path: Path, settings: ReleaseSettings) -> dict | None:
    """``work/trained.pt`` when it holds a finished training of this very recipe (else None: train)."""
    if not path.is_file():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    same = {k: v for k, v in saved.get("settings", {}).items() if k not in _PLACE_ONLY}
    wanted = {k: v for k, v in asdict(settings).items() if k not in _PLACE_ONLY}
    if same != wanted:
        get_logger("release").warning("trained_ignored", file=str(path), reason="its recipe differs from this release's: training again")
        return None
    return saved


def reuse_training(version_dir: str | os.PathLike, work: str | os.PathLike, settings: ReleaseSettings) -> Path:
    """Write ``work/trained.pt`` from an earlier release of this very recipe (its verified weights, the temperature it
    folded in taken out again, its training record), so the release finishes without training again: v3000 is v2000's
    training finished with the verdict on the features. Raises ValueError where the recipes differ."""
    from engines.store import EngineStore
    from trainer.publish import load_weights

    version_dir = Path(version_dir)
    version = EngineStore(version_dir.parent).open(version_dir.name)
    m = version.manifest
    recorded = {k: v for k, v in m.get("training", {}).get("settings", {}).items() if k not in _PLACE_ONLY}
    wanted = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(settings).items() if k not in _PLACE_ONLY}
    if m.get("training", {}).get("kind") != "release" or recorded != wanted:
        differ = sorted(k for k in recorded.keys() | wanted.keys() if recorded.get(k) != wanted.get(k)) or ["kind"]
        raise ValueError(f"{version_dir}: not a release of this recipe (differs in {', '.join(differ)}): train instead")
    model = load_weights(version)
    calibration = m.get("metrics", {}).get("calibration") or {}
    if calibration.get("temperature") and not calibration.get("skipped"):  # finish_release folds it in again
        with torch.no_grad():
            model.head.weight.mul_(calibration["temperature"])
            model.head.bias.mul_(calibration["temperature"])
    info = {k: m["training"][k] for k in ("epochs_run", "selected", "swa", "history", "train_seconds")}
    info["reused_from"] = version.name
    info["trained_on"] = _trained_on(m["training"], m["training"]["settings"])
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    path = work / "trained.pt"
    torch.save(
        {"state_dict": model.state_dict(), "arch": settings.arch, "classes": m["classes"], "info": info, "settings": asdict(settings)}, path
    )
    get_logger("release").info("training_reused_from", version=version.name, file=str(path))
    return path


def finish_release(
    model,
    info: dict,
    folder,
    photos: dict,
    out: str | os.PathLike,
    key_path: str | os.PathLike | None,
    settings: ReleaseSettings,
    version: str = RELEASE_VERSION,
):
    """Exact BatchNorm statistics, a fitted temperature, the verdict's statistics, metrics, ONNX + INT8, the split
    and the signature: the store at ``out`` (made; must not hold a version yet) with the release as its current."""
    from trainer.batchnorm import recompute_batchnorm
    from trainer.calibrate import calibrate
    from trainer.data import TensorDataset
    from trainer.models import count_parameters
    from trainer.publish import publish_model
    from trainer.train import _held_out_metrics
    from trainer.verdict_fit import fit_verdict_for, outputs_of, verdicts_of

    log = get_logger("release")
    key = release_key(key_path)
    spec = settings.spec
    sets = {name: TensorDataset.of(p.samples, *p.tensors(spec)) for name, p in photos.items()}
    bn_x = info.pop("bn_x")
    if not settings.freeze_batchnorm:  # frozen: the pretrained statistics it was trained with stay
        recompute_batchnorm(model, bn_x)  # over the (composed) training photos
    scaling = calibrate(model, sets["val"].x, sets["val"].y)
    metrics = _held_out_metrics(model, sets, folder.classes) | {"calibration": scaling.summary()}
    fitted = fit_verdict_for(model, sets["train"].x, sets["train"].y, sets["val"].x, spec, on=settings.verdict)
    test_x, test_y = sets["test"].x, sets["test"].y.numpy()
    test_logits, test_d = outputs_of(model, test_x, fitted.distance)
    v = np.array(verdicts_of(fitted.section, folder.classes, test_logits, test_x.numpy(), spec, distances=test_d))
    right = test_logits.argmax(1) == test_y
    metrics["verdict"] = {
        "test_photos": int(len(v)),
        **{f"share_{k}": round(float((v == k).mean()), 4) for k in ("confident", "unsure", "unknown")},
        "confident_top1": round(float(right[v == "confident"].mean()), 4) if (v == "confident").any() else None,
    }
    log.info("release_metrics", test_top1=metrics["test"]["top1"], val_top1=metrics["val"]["top1"], **metrics["verdict"])
    root = Path(folder.root)
    split = {name: sorted(str(Path(s.path).relative_to(root)) for s in p.samples) for name, p in photos.items()}
    training = {
        "kind": "release",
        "data": root.name,
        "classes": folder.counts(),
        "split": {
            "seed": settings.seed,
            "test_fraction": settings.test_fraction,
            "val_fraction": settings.val_fraction,
            **{f"{name}_photos": len(p.samples) for name, p in photos.items()},
            "files": "split.json",
        },
        "settings": asdict(settings),
        "augmentation": info.get("augmentation", asdict(FieldAugSettings())),
        "pretrained": _pretrained_record(settings),
        "parameters": count_parameters(model),
        "epochs_run": info["epochs_run"],
        "selected": info["selected"],
        "swa": info.get("swa"),
        "batchnorm": (
            "frozen: the pretrained network's statistics, kept while fine-tuning"
            if settings.freeze_batchnorm
            else f"exact over {BN_PASSES} composed passes of the {len(photos['train'].samples)} training photos"
            if info.get("augmentation", True)
            else f"exact over the {len(photos['train'].samples)} training photos"
        ),
        "train_seconds": info.get("train_seconds"),
        "trained_on": info["trained_on"],  # where the epochs ran: "cuda" for a GPU training finished here
        **({"training_of": info["reused_from"]} if info.get("reused_from") else {}),
        "history": info["history"],
        "torch": torch.__version__,
    }
    calib = sets["train"].x[torch.randperm(len(sets["train"].x), generator=torch.Generator().manual_seed(0))[:256]].numpy()
    return publish_model(
        model,
        folder.classes,
        out,
        spec=spec,
        metrics=metrics,
        training=training,
        calibration=calib,
        held_out=(test_x.numpy(), test_y),
        signing_key=key,
        verdict=fitted.section,
        distance=fitted.distance,
        split=split,
        version=version,
    )


def release(
    data_dir,
    out,
    key_path,
    work,
    settings: ReleaseSettings | None = None,
    progress: bool = True,
    watch_field: str | os.PathLike | None = None,
):
    """The whole release (:func:`train_release`, then :func:`finish_release`); returns the published version.
    ``watch_field``: a field-photo folder evaluated after every epoch for the training history only."""
    settings = settings or ReleaseSettings()
    t0 = time.perf_counter()
    release_key(key_path)  # a missing key stops the release before a photo is decoded, not after hours of training
    watch = field_watch(watch_field, scan_folder(data_dir).classes, settings.spec) if watch_field else None
    model, info, folder, photos = train_release(data_dir, work, settings, watch=watch, progress=progress)
    version = finish_release(model, info, folder, photos, out, key_path, settings)
    get_logger("release").info("release_done", version=version.name, seconds=round(time.perf_counter() - t0, 1))
    return version


def field_watch(field_dir: str | os.PathLike, classes: list[str], spec: PreprocessSpec | None = None) -> dict:
    """Field photos whose folder names a class, as (x, y) preprocessed with ``spec``, for the training history only."""
    from edge_agent.preprocess import DEFAULT_SPEC, preprocess_file

    xs, ys = [], []
    for sub in ("apple-orchard", "corn-field"):
        for cls_dir in sorted((Path(field_dir) / sub).iterdir()):
            if cls_dir.name in classes:
                for f in sorted(cls_dir.iterdir()):
                    xs.append(preprocess_file(f, spec or DEFAULT_SPEC))
                    ys.append(classes.index(cls_dir.name))
    return {"field": (torch.from_numpy(np.stack(xs)), torch.tensor(ys))}


def _pretrained_record(settings: ReleaseSettings) -> dict | None:
    """What the release started from: the weights' package, file and sha256 (None: trained from scratch)."""
    from trainer.models import ARCHS

    w = ARCHS[settings.arch].weights
    if not settings.pretrained or w is None:
        return None
    return {"package": w.package, "file": w.file, "sha256": w.sha256, "source": w.source}
