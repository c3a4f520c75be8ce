"""``edge-trainer``: the learning side's command line."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _train(args: argparse.Namespace) -> int:
    from trainer.data import DatasetError
    from trainer.train import TrainSettings, train_supervised

    settings = TrainSettings(
        seed=args.seed, int8=not args.no_int8, threads=args.threads, batch_size=args.batch_size
    )
    if args.epochs is not None:
        settings.epochs = args.epochs
    if args.patience is not None:
        settings.patience = args.patience
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-trainer", description="Train and publish edge-agent models.")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="auto", choices=["auto", "json", "console"])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="supervised training from a folder of class folders")
    t.add_argument("--data", required=True, help="folder of <Class name>/<photo> folders")
    t.add_argument("--store", required=True, help="engine store to publish to (created if missing)")
    t.add_argument("--epochs", type=int, default=None, help="maximum epochs (default 80)")
    t.add_argument("--patience", type=int, default=None, help="early-stopping patience in epochs (default 20)")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--seed", type=int, default=20251120, help="seed for the split, initialisation and augmentation")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    t.add_argument("--no-int8", action="store_true", help="skip the INT8 ONNX Runtime variant")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    from edge_agent.log import configure_logging

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
