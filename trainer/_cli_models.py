"""``edge-trainer sign``, ``release``, ``train`` and ``calibrate``: building the shipped model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_commands"]


def _sign(args: argparse.Namespace) -> int:
    """Sign an existing store version with a key (release use: the shipped model and the project's key)."""
    from engines.signing import TrustedKeys, load_or_create_key, sign_version
    from engines.store import EngineStore

    key = load_or_create_key(args.key)
    store = EngineStore(args.store)
    version = store.open(args.version)  # the files must match the manifest before it is vouched for
    sign_version(version.path, key)
    TrustedKeys({key.public_hex: "this key"}).check(version.path)
    print(f"signed {store.root}/{version.name} with {key.public_hex}")
    return 0


def _release(args: argparse.Namespace) -> int:
    """Train, calibrate, build INT8, sign and write the shipped model's store (the release; resumable)."""
    import shutil
    import time

    from engines.store import EngineStore
    from trainer.release import ReleaseSettings, release

    out = Path(args.out)
    staging = out.with_name(f".{out.name}.release-tmp")
    shutil.rmtree(staging, ignore_errors=True)
    chosen = {"epochs": args.epochs, "augmentation": args.augmentation, "head_epochs": args.head_epochs, "lr": args.lr, "size": args.size}
    chosen["freeze_batchnorm"] = args.freeze_batchnorm
    chosen["device"] = args.device
    settings = ReleaseSettings(**{k: v for k, v in chosen.items() if v is not None})
    t0 = time.perf_counter()
    if args.training_from:
        from trainer.release import reuse_training

        reuse_training(args.training_from, args.work, settings)
    version = release(args.data, staging, args.key, args.work, settings, progress=sys.stderr.isatty(), watch_field=args.watch_field)
    if out.exists():  # earlier releases stay loadable beside the new one (a device may pin one)
        for old in EngineStore(out).versions():
            if old != version.name:
                shutil.copytree(out / old, staging / old)
        shutil.rmtree(out)
    staging.rename(out)
    m = version.manifest
    print(
        f"{out}/{version.name}: test top-1 {m['metrics']['test']['top1']}, {m['metrics']['verdict']['share_confident']:.3f} "
        f"of test photos confident ({m['metrics']['verdict']['confident_top1']} of those right); "
        f"{time.perf_counter() - t0:.0f} s in all, {m['training']['train_seconds']:.0f} s of training"
    )
    return 0


def _train(args: argparse.Namespace) -> int:
    from trainer.data import DatasetError
    from trainer.train import TrainSettings, train_supervised

    settings = TrainSettings(seed=args.seed, int8=not args.no_int8, threads=args.threads, batch_size=args.batch_size)
    if args.epochs is not None:
        settings.epochs = args.epochs
    if args.patience is not None:
        settings.patience = args.patience
    if args.lr is not None:
        settings.lr = args.lr
    settings.init = args.init
    settings.swa_epochs = args.swa_epochs
    settings.calibrate = not args.no_calibrate
    try:
        version = train_supervised(args.data, args.store, settings, progress=not args.no_progress)
    except DatasetError as exc:
        print(f"edge-trainer: bad dataset: {exc}", file=sys.stderr)
        return 2
    m = version.manifest["metrics"]
    line = f"published {version.name} to {args.store}: val top-1 {m['val']['top1']:.4f}"
    if "test" in m:
        line += f", test top-1 {m['test']['top1']:.4f} on {version.manifest['training']['split']['test_photos']} held-out photos"
    if "int8" in m:
        line += f", INT8 agreement {m['int8']['top1_agreement_with_fp32']:.4f}"
    print(line)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from trainer.data import DatasetError
    from trainer.train import recalibrate

    try:
        version = recalibrate(args.data, args.store, args.version, batchnorm=args.batchnorm)
    except DatasetError as exc:
        print(f"edge-trainer: cannot calibrate: {exc}", file=sys.stderr)
        return 2
    c = version.manifest["metrics"]["calibration"]
    print(
        f"published {version.name} (from {version.manifest['parent']}) to {args.store}: temperature {c['temperature']:.3f}, "
        f"validation ECE {c['ece_before']:.3f} -> {c['ece_after']:.3f} on {c['photos']} photos"
    )
    return 0


def add_commands(sub, parents: list) -> None:
    """Register the model-building commands on the ``edge-trainer`` subparsers."""
    sg = sub.add_parser("sign", parents=parents, help="sign a store version with a key (release use)")
    sg.add_argument("--key", required=True, help="secret key file (*.key; made if missing, its .pub beside it)")
    sg.add_argument("--store", required=True)
    sg.add_argument("--version", help="default: the current version")
    sg.set_defaults(func=_sign)
    r = sub.add_parser("release", parents=parents, help="train and write the shipped model's store, signed (make release)")
    r.add_argument("--data", required=True, help="the lab photos (../shared/data/plantvillage)")
    r.add_argument("--key", required=True, help="the project's release key (../shared/release/edge-agent-release.key)")
    r.add_argument("--out", default="edge_agent/default_store", help="the store to write (replaced once the release is done)")
    r.add_argument("--work", default="train-work/release", help="checkpoints: a run that finds one resumes from it")
    r.add_argument("--epochs", type=int, default=None, help="training epochs (default: the release's 8)")
    r.add_argument("--augmentation", choices=["lab", "flips", "field"], default=None, help="training augmentation (default: the release's)")
    r.add_argument("--head-epochs", type=int, default=None, help="epochs training the new head alone first (default: the release's)")
    r.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the release's)")
    r.add_argument(
        "--freeze-batchnorm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep the pretrained BatchNorm statistics while fine-tuning",
    )
    r.add_argument("--size", type=int, default=None, help="input side, a multiple of 32 (default: the release's 256)")
    r.add_argument("--device", default=None, help="where training runs: cpu (default), or cuda on a machine with an NVIDIA GPU")
    r.add_argument(
        "--training-from",
        default=None,
        help="a store version of an earlier release of the same recipe whose training is reused instead of training again",
    )
    r.add_argument(
        "--watch-field",
        default=None,
        help="field photos (../shared/data/field) scored after every epoch, for the training history only: they never choose anything",
    )
    r.set_defaults(func=_release)
    t = sub.add_parser("train", parents=parents, help="supervised training from a folder of class folders")
    t.add_argument("--data", required=True, help="folder of <Class name>/<photo> folders")
    t.add_argument("--store", required=True, help="engine store to publish to (created if missing)")
    t.add_argument("--epochs", type=int, default=None, help="maximum epochs (default 80)")
    t.add_argument("--patience", type=int, default=None, help="early-stopping patience in epochs (default 20)")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-3)")
    t.add_argument(
        "--swa-epochs", type=int, default=0, help="average the weights of the last N epochs (SWA); kept only if validation prefers it"
    )
    t.add_argument("--init", metavar="STORE[:VERSION]", help="start from a store version's weights (same classes) instead of scratch")
    t.add_argument("--seed", type=int, default=20251120, help="seed for the split, initialisation and augmentation")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    t.add_argument("--no-int8", action="store_true", help="skip the INT8 ONNX Runtime variant")
    t.add_argument(
        "--no-calibrate",
        action="store_true",
        help="publish the model as trained, without the softmax temperature fitted on the validation split",
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=_train)
    c = sub.add_parser(
        "calibrate", parents=parents, help="fold a softmax temperature, fitted on a version's validation photos, into a new version"
    )
    c.add_argument("--data", required=True, help="the folder of <Class name>/<photo> folders the version was trained on")
    c.add_argument("--store", required=True, help="engine store holding the version; the calibrated child is published there")
    c.add_argument("--version", help="version to calibrate (default: current)")
    c.add_argument(
        "--batchnorm",
        action="store_true",
        help="first set its BatchNorm statistics to the exact ones over its training split (versions published "
        "before they were exact, such as the shipped v0001, averaged per-batch statistics)",
    )
    c.set_defaults(func=_calibrate)
