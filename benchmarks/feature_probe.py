"""What a backbone's frozen features know of the field: a linear probe on N true field labels, by backbone and input size.

``python -m benchmarks.feature_probe --out DIR [--field apple-orchard] [--labels 30 90 300] [--seeds 1 2 3]
[--backbones v3000 v3000:256 efficientnet-lite0:192 efficientnet-lite1:256 efficientnet-lite2:256]``

The loop's target (field top-1 0.85 with 100 expert labels) is out of reach of one retrain of the shipped model (0.72
with 90 labels, 0.84 with 300: ``benchmarks.field_ceiling``). This asks whether another starting point would carry more
of the field in its features: a bigger EfficientNet-Lite, a larger input (the orchard photos are 256 px), or the
ImageNet weights before the lab fine-tuning. Each backbone's pooled features of the field photos, frozen; a
multinomial logistic regression (``benchmarks.wise_ft.linear_probe``) fitted on the first N photos of the field loop's
stream (same seed, same split as ``benchmarks.field_loop``) with their true class; top-1 on the held-out field test.
``NAME`` is a version of the shipped store (its fine-tuned network; ``NAME:SIZE`` at another input side), ``ARCH:SIZE``
the registry's ImageNet weights. A probe is not a retrain: it ranks starting points, it does not say what a retrain
from them reaches. Writes ``DIR/feature_probe.json`` and ``DIR/feature_probe.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.field_loop import SHARED, split_field
from benchmarks.wise_ft import frozen_features, linear_probe, tensors

__all__ = ["backbone", "main", "probe"]


def _named(name: str) -> tuple[str, int | None]:
    """``NAME[:SIZE]`` as (name, size or None)."""
    arch, _, size = name.partition(":")
    return arch, int(size) if size else None


def backbone(name: str):
    """``(network, preprocessing)`` for ``NAME[:SIZE]`` (a shipped version) or ``ARCH:SIZE`` (ImageNet weights)."""
    from edge_agent.config import default_store_path
    from edge_agent.preprocess import PreprocessSpec
    from engines.store import EngineStore
    from trainer.models import ARCHS, build_model, data_config
    from trainer.publish import load_weights

    arch, size = _named(name)
    if arch in ARCHS:
        return build_model(38, arch, pretrained=True), data_config(arch, size)
    version = EngineStore(default_store_path()).open(arch)
    spec = PreprocessSpec.from_manifest(version.manifest["preprocess"])
    return load_weights(version), dataclasses.replace(spec, size=size) if size else spec


def probe(features: dict, test: list, stream: list, n: int) -> float:
    """Top-1 on ``test`` of a linear probe fitted on the first ``n`` photos of ``stream`` (``features``: path -> vector)."""
    x = torch.stack([features[p] for p, _ in stream[:n]])
    head = linear_probe(x, torch.tensor([y for _, y in stream[:n]]), 38)
    with torch.no_grad():
        pred = head(torch.stack([features[p] for p, _ in test])).argmax(1)
    return float((pred == torch.tensor([y for _, y in test])).float().mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.feature_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--field", default="apple-orchard")
    ap.add_argument("--labels", type=int, nargs="+", default=[30, 90, 300])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument(
        "--backbones",
        nargs="+",
        default=[
            "v3000",
            "v3000:256",
            "efficientnet-lite0:192",
            "efficientnet-lite0:256",
            "efficientnet-lite1:256",
            "efficientnet-lite2:256",
        ],
    )
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from edge_agent.config import default_store_path
    from engines.store import EngineStore
    from trainer.models import ARCHS, data_config

    classes = list(EngineStore(default_store_path()).open("v3000").classes)
    for arch, size in map(_named, args.backbones):  # a size the registry refuses is said before an hour of features
        if arch in ARCHS:
            data_config(arch, size)
    splits = {s: split_field(SHARED / "field" / args.field, classes, s, 0.25) for s in args.seeds}
    photos = sorted({p for test, stream in splits.values() for p, _ in test + stream})
    rows = []
    for name in args.backbones:
        t0 = time.perf_counter()
        model, spec = backbone(name)
        model.eval()
        feats = {}
        for i in range(0, len(photos), 64):
            chunk = photos[i : i + 64]
            feats.update(zip(chunk, frozen_features(model, tensors(chunk, spec))))
        seconds = time.perf_counter() - t0
        for n in args.labels:
            tops = [probe(feats, *splits[s], n) for s in args.seeds]
            rows.append(
                {"backbone": name, "size": spec.size, "labels": n, "top1": [round(t, 4) for t in tops], "feature_seconds": round(seconds)}
            )
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "feature_probe.json").write_text(json.dumps({"field": args.field, "seeds": args.seeds, "rows": rows}, indent=1) + "\n")
    sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
    lines = [
        f"# Linear probes on frozen features: {args.field}, held-out field test",
        "",
        f"`python -m benchmarks.feature_probe --out DIR --field {args.field} --labels {' '.join(map(str, args.labels))} --seeds "
        f"{' '.join(map(str, args.seeds))} --backbones {' '.join(args.backbones)}`; mean +- sd over the seeds (each seed its own "
        "split and stream, as benchmarks.field_loop draws them).",
        "",
        "| backbone (weights) | input | " + " | ".join(f"{n} labels" for n in args.labels) + " | features of every photo |",
        "|---|---|" + "---|" * len(args.labels) + "---|",
    ]
    for name in args.backbones:
        mine = [r for r in rows if r["backbone"] == name]
        what = "ImageNet" if name.partition(":")[0] in ARCHS else "fine-tuned on the lab photos"
        cells = [f"{statistics.mean(r['top1']):.3f} +- {sd(r['top1']):.3f}" for r in mine]
        lines.append(
            f"| {name.partition(':')[0]} ({what}) | {mine[0]['size']} px | " + " | ".join(cells) + f" | {mine[0]['feature_seconds']} s |"
        )
    (args.out / "feature_probe.md").write_text("\n".join(lines) + "\n")
    print((args.out / "feature_probe.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
