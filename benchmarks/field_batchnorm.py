"""BatchNorm statistics moved towards unlabelled field photos (AdaBN), by how far: does a device's unlabelled stream
alone lift an engine in the field?

``python -m benchmarks.field_batchnorm --out DIR [--seeds 1 2 3] [--photos 100 600] [--alphas 0 0.25 0.5 0.75 1]
[--store DIR --version V] [--lab-photos 300]``

EfficientNet-Lite releases keep ImageNet's BatchNorm statistics (docs/model.md), so in the field every layer
normalises with statistics of neither the lab nor the field. Li et al. (2016, AdaBN) replace them with the target
domain's, which needs no label. For each seed and field folder (apple orchard, corn field), the folder is split as
``benchmarks.field_loop`` splits it (a quarter held out, by class); the first N photos of the stream, unlabelled, give
every layer's statistics (:func:`trainer.batchnorm.recompute_batchnorm`), and the engine's are moved a fraction alpha
of the way towards them (:func:`benchmarks.wise_ft.mix`; only the statistics differ, 1 = AdaBN). Top-1 in eager
FP32 on the held-out photos and on ``--lab-photos`` of the version's lab test split (drawn once, seed 0). The
adapted statistics are the orchard stream's for the lab figure. Nothing here is chosen on the held-out photos: every
ratio is reported. Writes ``DIR/field_batchnorm.json`` and ``DIR/field_batchnorm.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path

import torch

from benchmarks.field_loop import SHARED, split_field
from benchmarks.seeds import mean_sd
from benchmarks.wise_ft import mix, tensors, top1

__all__ = ["adapted_statistics", "main", "report_md"]

FOLDERS = ("apple-orchard", "corn-field")


def adapted_statistics(model: torch.nn.Module, x: torch.Tensor) -> dict:
    """``model``'s state with every BatchNorm layer's statistics recomputed over ``x`` (un-augmented, float32)."""
    from trainer.batchnorm import recompute_batchnorm

    return recompute_batchnorm(copy.deepcopy(model), x, batch_size=32).state_dict()


def _mean_sd(values: list[float]) -> str:
    return "{:.3f} +- {:.3f}".format(*mean_sd(values))


def report_md(result: dict) -> str:
    """The table: one row per (folder, stream photos, alpha), mean +- sd over the seeds."""
    rows = result["rows"]
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        f"# BatchNorm statistics towards unlabelled field photos: {result['version']}",
        "",
        f"`{result['command']}`; {result['seconds']} s. Eager FP32 top-1, mean +- sd over seeds {seeds}; alpha 0 is the "
        "engine as it is, 1 is AdaBN (the stream's statistics alone).",
        "",
        "| field | stream photos (unlabelled) | alpha | held-out field | lab |",
        "|---|---|---|---|---|",
    ]
    keys = sorted({(r["field"], r["photos"], r["alpha"]) for r in rows}, key=lambda k: (FOLDERS.index(k[0]), k[1], k[2]))
    for folder, n, alpha in keys:
        same = [r for r in rows if (r["field"], r["photos"], r["alpha"]) == (folder, n, alpha)]
        lab = [r["lab"] for r in same if r.get("lab") is not None]
        lines.append(
            f"| {folder} ({same[0]['held_out']} held out) | {n} | {alpha} | {_mean_sd([r['top1'] for r in same])} | "
            f"{_mean_sd(lab) if lab else '-'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.field_batchnorm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--store", type=Path, default=None, help="engine store (default: the shipped one)")
    ap.add_argument("--version", default=None, help="the version to adapt (default: the store's current)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--photos", type=int, nargs="+", default=[100, 600], help="unlabelled stream photos the statistics are computed over")
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    ap.add_argument("--fields", nargs="+", default=list(FOLDERS), choices=FOLDERS)
    ap.add_argument("--lab-photos", type=int, default=300, help="lab test photos measured (0: none)")
    ap.add_argument("--data", type=Path, default=SHARED)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    from edge_agent.config import default_store_path
    from edge_agent.preprocess import PreprocessSpec
    from engines.store import EngineStore
    from trainer.data import DatasetError, recorded_split
    from trainer.publish import load_weights

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    version = EngineStore(args.store or default_store_path()).open(args.version)
    classes, spec = list(version.classes), PreprocessSpec.from_manifest(version.manifest["preprocess"])
    model = load_weights(version)
    as_is = {k: v.clone() for k, v in model.state_dict().items()}  # load_state_dict writes into the model's own tensors
    lab_x = lab_y = None
    if args.lab_photos:
        try:
            test = recorded_split(version, args.data / "plantvillage")["test"]
        except (DatasetError, KeyError) as exc:  # a version that records no split: the lab figure is left out, never guessed
            print(f"lab left out: {version.name} records no lab split ({exc!r})", flush=True)
        else:
            drawn = random.Random(0).sample(test, min(args.lab_photos, len(test)))
            lab_x, lab_y = tensors([s.path for s in drawn], spec), torch.tensor([s.label for s in drawn])
    rows = []
    for seed in args.seeds:
        for folder in args.fields:
            held_out, stream = split_field(args.data / "field" / folder, classes, seed, 0.25)
            x, y = tensors([p for p, _ in held_out], spec), torch.tensor([c for _, c in held_out])
            for n in args.photos:
                adapted = adapted_statistics(model, tensors([p for p, _ in stream[:n]], spec))
                for alpha in args.alphas:
                    model.load_state_dict(mix(as_is, adapted, alpha))
                    row = {"seed": seed, "field": folder, "held_out": len(held_out), "photos": min(n, len(stream)), "alpha": alpha}
                    row["top1"] = round(top1(model, x, y), 4)
                    if lab_x is not None and folder == FOLDERS[0]:
                        row["lab"] = round(top1(model, lab_x, lab_y), 4)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            model.load_state_dict(as_is)
    command = "python -m benchmarks.field_batchnorm " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {"version": version.name, "command": command, "seconds": round(time.perf_counter() - t0), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "field_batchnorm.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "field_batchnorm.md").write_text(report_md(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
