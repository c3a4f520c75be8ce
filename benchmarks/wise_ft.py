"""Weight-space ensembles of a fine-tuned release and its pretrained start (WiSE-FT): lab and field top-1 by mixing ratio.

``python -m benchmarks.wise_ft --out DIR [--store DIR] [--alphas 0 0.25 0.5 0.75 1]``

Fine-tuning on one-leaf lab photos trades the ImageNet features' generality for the lab (v2000: field top-1 0.23
after its first epoch, 0.14 after its third). Wortsman et al. (2022) found that averaging the weights of the
fine-tuned network and its start (``(1 - a) * start + a * fine-tuned``) keeps most of the fine-tuned accuracy and
much of the start's robustness to a shift. The start here is the ImageNet backbone with a linear head fitted on the
release's own training photos' frozen features (the release's head is not one the start has). Both ends keep
ImageNet's BatchNorm statistics (v2000 froze them), so every tensor is mixed. Top-1 by mixing ratio on the release's
validation and test photos (its ``split.json``) and on the field photos (apple orchard + corn field; never used to
choose anything here). Eager torch, FP32. Writes ``DIR/wise_ft.json`` and ``DIR/wise_ft.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.field import SHARED, field_sets
from edge_agent.config import default_store_path
from edge_agent.preprocess import PreprocessSpec, preprocess_file
from engines.store import EngineStore

__all__ = ["frozen_features", "linear_probe", "main", "mix", "probe_start", "tensors", "top1"]


def tensors(paths: list[Path], spec: PreprocessSpec) -> torch.Tensor:
    """The photos as one batch, preprocessed as the daemon does with ``spec``."""
    return torch.from_numpy(np.stack([preprocess_file(p, spec) for p in paths]))


@torch.no_grad()
def frozen_features(model, x: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """Penultimate features of ``x`` (on the CPU), computed on the device the model is on."""
    model.eval()
    dev = next(model.parameters()).device
    return torch.cat([model.features(x[i : i + batch].to(dev).float()).cpu() for i in range(0, len(x), batch)])


@torch.no_grad()
def top1(model, x: torch.Tensor, y: torch.Tensor, batch: int = 64) -> float:
    """``model``'s top-1 on ``x`` against ``y`` (eval mode, on the device it is on)."""
    model.eval()
    dev = next(model.parameters()).device
    pred = torch.cat([model(x[i : i + batch].to(dev).float()).argmax(1).cpu() for i in range(0, len(x), batch)])
    return float((pred == y).float().mean())


def linear_probe(features: torch.Tensor, labels: torch.Tensor, classes: int, decay: float = 1e-3) -> torch.nn.Linear:
    """A multinomial logistic-regression head on frozen features (L-BFGS, L2 ``decay``)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(features.shape[1], classes)
    opt = torch.optim.LBFGS(head.parameters(), lr=1, max_iter=300, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(features), labels) + decay * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return head


def probe_start(arch: str, classes: int, train_x: torch.Tensor, train_y: torch.Tensor, device: str = "cpu"):
    """WiSE-FT's start: the architecture's ImageNet backbone with a linear probe fitted on ``train_x``'s frozen features."""
    from trainer.models import build_model

    start = build_model(classes, arch, pretrained=True).to(device)
    head = linear_probe(frozen_features(start, train_x), train_y, classes)
    start.head.load_state_dict(head.state_dict())
    return start.cpu()


def mix(start: dict, tuned: dict, alpha: float) -> dict:
    """``(1 - alpha) * start + alpha * tuned`` for every floating-point tensor; integer ones (counters) from ``tuned``."""
    return {k: ((1 - alpha) * start[k] + alpha * v) if v.is_floating_point() else v for k, v in tuned.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.wise_ft", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--store", type=Path, default=None, help="engine store (default: the shipped one)")
    ap.add_argument("--version", default=None, help="the fine-tuned version (default: the store's current)")
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.25, 0.4, 0.5, 0.6, 0.75, 1.0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    from trainer.data import recorded_split
    from trainer.models import build_model
    from trainer.publish import load_weights

    torch.set_num_threads(args.threads)
    store = EngineStore(args.store or default_store_path())
    version = store.open(args.version)
    spec = PreprocessSpec.from_manifest(version.manifest["preprocess"])
    lab = SHARED / "plantvillage"
    split = recorded_split(version, lab)
    t0 = time.perf_counter()
    tuned = load_weights(version)
    train_x = tensors([s.path for s in split["train"]], spec)
    start = probe_start(version.manifest["model"]["arch"], len(version.classes), train_x, torch.tensor([s.label for s in split["train"]]))
    del train_x
    print(f"probe fitted in {time.perf_counter() - t0:.0f} s", flush=True)
    sets = {
        "lab validation": [(s.path, s.label) for s in split["val"]],
        "lab test": [(s.path, s.label) for s in split["test"]],
        "field": [(p, version.classes.index(c)) for p, c in field_sets(version, lab, SHARED / "field")["field"]],
    }
    data = {name: (tensors([p for p, _ in rows], spec), torch.tensor([y for _, y in rows])) for name, rows in sets.items()}
    start_sd, tuned_sd = start.state_dict(), tuned.state_dict()
    rows = []
    for alpha in args.alphas:
        model = build_model(len(version.classes), version.manifest["model"]["arch"])
        model.load_state_dict(mix(start_sd, tuned_sd, alpha))
        row = {"alpha": alpha, **{name: round(top1(model, x, y), 4) for name, (x, y) in data.items()}}
        rows.append(row)
        print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"version": version.name, "photos": {k: len(v) for k, v in sets.items()}, "seconds": round(time.perf_counter() - t0)}
    (args.out / "wise_ft.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = [
        f"# WiSE-FT: {version.name} mixed with its ImageNet start (linear probe head)",
        "",
        f"`python -m benchmarks.wise_ft --out {args.out}`; photos: {meta['photos']}; {meta['seconds']} s on {args.threads} threads.",
        "",
        "| alpha (0 = start, 1 = fine-tuned) | lab validation | lab test | field |",
        "|---|---|---|---|",
        *(f"| {r['alpha']} | {r['lab validation']:.3f} | {r['lab test']:.3f} | {r['field']:.3f} |" for r in rows),
    ]
    (args.out / "wise_ft.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
