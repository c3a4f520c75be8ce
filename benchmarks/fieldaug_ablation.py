"""Which parts of the field augmentation help in the field: the release's training, one part off at a time.

``python -m benchmarks.fieldaug_ablation --out DIR [--epochs 8] [--variants full lab ...]``

Each variant trains the release's network (:class:`trainer.release.ReleaseSettings`, LeafNet5) on the same lab
training split with a short schedule (``--epochs``, the last fifth averaged), then sets exact BatchNorm statistics over
its own training distribution and is measured on the release's validation split (lab, never trained on) and on every
``apple-orchard`` + ``corn-field`` photo (field, never trained on); field top-1 after each epoch is in the history.
The schedule is a fraction of the release's 55 epochs, so the figures rank the parts; they are not the release's.
Writes ``DIR/ablation.json`` and ``DIR/ablation.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"

#: name -> FieldAugSettings overrides (None: no field augmentation, the lab reference).
VARIANTS = {
    "full": {},
    "lab": None,
    "no-backgrounds": {"lab_background": 1.0},
    "no-light": {"color": 0.0, "shadow": 0.0},
    "no-degradation": {"blur": 0.0, "noise_std": 0.0, "jpeg": 0.0},
    "no-occluder-or-scale": {"occluder": 0.0, "scale": (1.0, 1.0)},
}


def run(name: str, epochs: int, work: Path, data: Path, watch: dict) -> dict:
    from trainer.fieldaug import FieldAugSettings
    from trainer.release import ReleaseSettings, train_release
    from trainer.train import evaluate

    overrides = VARIANTS[name]
    augmentation = None if overrides is None else FieldAugSettings(**overrides)
    settings = ReleaseSettings(epochs=epochs, swa_epochs=max(2, epochs // 5), warmup_epochs=1)
    t0 = time.perf_counter()
    model, info, folder, photos = train_release(data, work / name, settings, watch=watch, progress=False, augmentation=augmentation)
    if info["selected"] != "swa":  # the averaged model has its exact statistics already; a single epoch's are running ones
        from trainer.batchnorm import recompute_batchnorm

        recompute_batchnorm(model, info["bn_x"])
    vx, vy = photos["val"].tensors()
    fx, fy = watch["field"]
    return {
        "variant": name,
        "augmentation": overrides,
        "epochs": epochs,
        "seconds": round(time.perf_counter() - t0),
        "lab_val_top1": round(evaluate(model, vx, vy).top1, 4),
        "field_top1": round(evaluate(model, fx, fy).top1, 4),
        "history": [{k: h[k] for k in ("epoch", "val_top1", "field_top1") if k in h} for h in info["history"]],
    }


def report(rows: list[dict]) -> str:
    lines = [
        "# Field augmentation, one part off at a time",
        "",
        "`python -m benchmarks.fieldaug_ablation --out DIR --epochs N --variants ...`: LeafNet5, one seed, a short schedule "
        "(the release trains 55 epochs): the figures rank the parts, they are not the release's. Lab: the release's "
        "validation split (672 photos, never trained on); field: every apple-orchard + corn-field photo (1,382).",
        "",
        "| variant | epochs | lab val top-1 | field top-1 | field top-1 after each epoch, best (running statistics) | minutes |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["epochs"], list(VARIANTS).index(r["variant"]))):
        best = max((h.get("field_top1", 0) for h in r["history"]), default=0)
        lines.append(
            f"| {r['variant']} | {r['epochs']} | {r['lab_val_top1']:.3f} | {r['field_top1']:.3f} | {best:.3f} | {r['seconds'] / 60:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fieldaug_ablation", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--data", default=str(SHARED / "plantvillage"))
    ap.add_argument("--field", default=str(SHARED / "field"))
    ap.add_argument("--work", default=None, help="checkpoints (default DIR/work): an interrupted run resumes")
    args = ap.parse_args(argv)

    from trainer.data import scan_folder
    from trainer.release import field_watch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else out / "work"
    watch = field_watch(args.field, scan_folder(args.data).classes)
    done = out / "ablation.json"
    rows = json.loads(done.read_text()) if done.exists() else []
    for name in args.variants:
        if any(r["variant"] == name and r["epochs"] == args.epochs for r in rows):
            continue
        rows.append(run(name, args.epochs, work, Path(args.data), watch))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "history"}), flush=True)
        done.write_text(json.dumps(rows, indent=1))
        (out / "ablation.md").write_text(report(rows))
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
