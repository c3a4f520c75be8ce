"""The release's fine-tuning recipe swept over architectures, input sizes, augmentations, schedules and seeds.

``python -m benchmarks.recipe_sweep --out DIR [--device cuda] [--variants lite0:192:flips:3 ...] [--seeds 20251120 1 2]``

Each variant is ``arch:size:augmentation:epochs[:lr]`` (arch ``lite0``/``lite1``/``lite2`` or a registry name) and
trains exactly as the release does (:func:`trainer.release.train_release`: its split, its settings otherwise, the
checkpoint chosen by lab validation top-1), once per seed; the split stays the release's (its own seed), the seed
moves training only. After every epoch the lab test and the field photos (apple orchard + corn field) are scored for
the history; they choose nothing. Each trained network is also mixed with its ImageNet start (WiSE-FT,
:mod:`benchmarks.wise_ft`) at the ratios of ``--alphas``. Runs go seed by seed (every variant's first seed first), and
none starts once ``--budget`` seconds have passed, so a lent GPU's time bounds the sweep, not the other way round.
Writes ``DIR/runs.jsonl`` (a line a run, as it ends), ``DIR/summary.md`` (mean +- sd over seeds) and, with
``--keep``, the ``trained.pt`` of the variant best on lab validation at the release's seed (``make release`` finishes
a release from it: :func:`trainer.release.train_release` reuses a finished training of its own recipe).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.field_loop import SHARED
from benchmarks.wise_ft import mix, probe_start

__all__ = ["main", "parse_variant"]

_ARCH = {"lite0": "efficientnet-lite0", "lite1": "efficientnet-lite1", "lite2": "efficientnet-lite2"}


def parse_variant(text: str) -> dict:
    """``arch:size:augmentation:epochs[:lr]`` as :class:`~trainer.release.ReleaseSettings` overrides."""
    parts = text.split(":")
    if len(parts) not in (4, 5):
        raise SystemExit(f"--variants {text!r}: expected arch:size:augmentation:epochs[:lr], e.g. lite0:192:flips:3")
    arch, size, aug, epochs = parts[:4]
    out = {"arch": _ARCH.get(arch, arch), "size": int(size), "augmentation": aug, "epochs": int(epochs)}
    if len(parts) == 5:
        out["lr"] = float(parts[4])
    return out


def _split_field(field: tuple[torch.Tensor, torch.Tensor], classes: list[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The field photos as a whole and by place (the apple classes are the orchard's, the corn ones the field's)."""
    x, y = field
    apple = torch.tensor([classes[int(i)].startswith("Apple") for i in y])
    return {"field": (x, y), "orchard": (x[apple], y[apple]), "corn": (x[~apple], y[~apple])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.recipe_sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--plantvillage", type=Path, default=SHARED / "plantvillage")
    ap.add_argument("--field", type=Path, default=SHARED / "field")
    ap.add_argument("--variants", nargs="+", default=["lite0:192:flips:3"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[20251120, 1, 2], help="training seeds (the first: the release's)")
    ap.add_argument("--alphas", type=float, nargs="*", default=[0.5, 0.75], help="WiSE-FT mixing ratios scored for each run")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="threads decoding photos")
    ap.add_argument("--budget", type=float, default=float("inf"), help="start no run after this many seconds")
    ap.add_argument("--limit", type=int, default=None, help="photos per split (a smoke test; the figures mean nothing then)")
    ap.add_argument("--work", type=Path, default=None, help="the runs' checkpoints (default: DIR/work; removed at the end)")
    ap.add_argument("--keep", action="store_true", help="copy the best variant's trained.pt (release seed) into --out")
    ap.add_argument("--summarise", type=Path, nargs="+", default=None, help="only write DIR/summary.md from these runs.jsonl files")
    args = ap.parse_args(argv)
    if args.summarise:
        runs = [json.loads(line) for f in args.summarise for line in f.read_text().splitlines() if line.strip()]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.md").write_text(
            summary_md(
                runs, "python -m benchmarks.recipe_sweep --out " + str(args.out) + " --summarise " + " ".join(map(str, args.summarise))
            )
        )
        return 0
    from edge_agent.log import configure_logging
    from trainer.fieldaug import load_lab_photos
    from trainer.release import ReleaseSettings, field_watch, split_photos, train_release
    from trainer.train import evaluate

    configure_logging("warning")
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or args.out / "work"
    torch.backends.cudnn.benchmark = args.device.startswith("cuda")  # fixed input sizes: let cuDNN pick its kernels
    variants = [(v, parse_variant(v)) for v in args.variants]
    base = ReleaseSettings(device=args.device, threads=None)
    folder, splits = split_photos(args.plantvillage, base)
    if args.limit:
        splits = {k: v[: args.limit] for k, v in splits.items()}
    data: dict[tuple, dict] = {}  # (arch, size) -> decoded photos, field sets, the WiSE-FT start

    def photos_for(arch: str, size: int) -> dict:
        key = (arch, size)
        if key not in data:
            spec = ReleaseSettings(arch=arch, size=size).spec
            t = time.perf_counter()
            photos = {name: load_lab_photos(items, spec, workers=args.workers) for name, items in splits.items()}
            field = field_watch(args.field, folder.classes, spec)["field"]
            if args.limit:
                field = (field[0][: args.limit * 4], field[1][: args.limit * 4])
            train_x, train_y = photos["train"].tensors(spec)
            start = probe_start(arch, len(folder.classes), train_x, train_y, args.device) if args.alphas else None
            sets = {"val": photos["val"].tensors(spec), "test": photos["test"].tensors(spec), **_split_field(field, folder.classes)}
            data[key] = {"photos": photos, "sets": sets, "start": start}
            print(f"[{time.perf_counter() - t0:.0f} s] {arch} {size} px: photos and start in {time.perf_counter() - t:.0f} s", flush=True)
        return data[key]

    def scores(model, sets: dict) -> dict:
        model = model.to(args.device)
        got = {name: round(evaluate(model, x, y, batch=64).top1, 4) for name, (x, y) in sets.items()}
        model.cpu()
        return got

    runs: list[dict] = []
    log = (args.out / "runs.jsonl").open("a")
    for seed in args.seeds:
        for name, overrides in variants:
            elapsed = time.perf_counter() - t0
            if elapsed > args.budget:
                print(f"[{elapsed:.0f} s] budget spent: {name} seed {seed} not run", flush=True)
                continue
            d = photos_for(overrides["arch"], overrides["size"])
            settings = ReleaseSettings(**{**asdict(base), **overrides, "seed": seed})
            run_dir = work / f"{name.replace(':', '-')}-s{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            t = time.perf_counter()
            watch = {"test": d["sets"]["test"], "field": d["sets"]["field"]}
            model, info, _, _ = train_release(
                args.plantvillage, run_dir, settings, watch=watch, progress=False, loaded=(folder, d["photos"])
            )
            row = {"variant": name, "seed": seed, "seconds": round(time.perf_counter() - t, 1), "device": args.device}
            row["selected"] = info["selected"]
            row["history"] = info["history"]
            row["final"] = scores(model, d["sets"])
            if d["start"] is not None:
                tuned, start = model.state_dict(), d["start"].state_dict()
                for a in args.alphas:
                    model.load_state_dict(mix(start, tuned, a))
                    row[f"wise_{a}"] = scores(model, d["sets"])
            runs.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            f = row["final"]
            print(
                f"[{time.perf_counter() - t0:.0f} s] {name} seed {seed}: val {f['val']:.3f} test {f['test']:.3f} field {f['field']:.3f} "
                f"(orchard {f['orchard']:.3f}, corn {f['corn']:.3f}); "
                + "; ".join(f"wise {a}: test {row[f'wise_{a}']['test']:.3f} field {row[f'wise_{a}']['field']:.3f}" for a in args.alphas)
                + f"; {row['seconds']:.0f} s",
                flush=True,
            )
    command = "python -m benchmarks.recipe_sweep " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "summary.md").write_text(summary_md(runs, command))
    print((args.out / "summary.md").read_text(), flush=True)
    if args.keep and runs:
        first = [r for r in runs if r["seed"] == args.seeds[0]]
        best = max(first or runs, key=lambda r: r["final"]["val"])
        shutil.copy(work / f"{best['variant'].replace(':', '-')}-s{best['seed']}" / "trained.pt", args.out / "trained.pt")
        print(f"kept {best['variant']} seed {best['seed']} (lab validation {best['final']['val']:.3f}) as {args.out / 'trained.pt'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _ms(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}" if values else "-"
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}"


def summary_md(runs: list[dict], command: str) -> str:
    """Mean +- sd over seeds per variant: lab validation / test and field, fine-tuned and each WiSE-FT ratio all its runs scored."""
    lines = [
        "# The release's recipe, swept",
        "",
        f"`{command}`",
        "",
        "Variant `arch:size:augmentation:epochs[:lr]`; checkpoint chosen by lab validation; mean +- sd over the seeds run; "
        "field = apple orchard + corn field (never used to choose anything).",
        "",
        "| variant | seeds | weights | lab validation | lab test | field | orchard | corn | s a run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == name]
        for col in ["final"] + sorted(set.intersection(*({k for k in r if k.startswith("wise_")} for r in mine))):
            vals = {k: [r[col][k] for r in mine] for k in ("val", "test", "field", "orchard", "corn")}
            lines.append(
                f"| {name} | {len(mine)} | {'fine-tuned' if col == 'final' else 'WiSE-FT a=' + col[5:]} | "
                + " | ".join(_ms(vals[k]) for k in ("val", "test", "field", "orchard", "corn"))
                + f" | {statistics.mean(r['seconds'] for r in mine):.0f} |"
            )
    lines += ["", "Per epoch (seed by seed): lab validation / lab test / field top-1.", ""]
    for r in runs:
        hist = ", ".join(f"{h['val_top1']:.3f}/{h.get('test_top1', 0):.3f}/{h.get('field_top1', 0):.3f}" for h in r["history"])
        lines.append(f"- {r['variant']} seed {r['seed']}: {hist} (selected {r['selected']})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
