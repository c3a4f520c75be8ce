"""Retrains on the field-trained release: which photos its candidates' BatchNorm statistics come from.

``python -m benchmarks.retrain_batchnorm --out DIR [--seeds 0 1 2]``

The release (v1000) was trained on composed field-like batches and its BatchNorm statistics describe them; a retrain
fine-tunes it on clean photos (replayed lab photos, received ones) and recomputes them over those. Recomputing them
over clean photos *without* training costs v1000 about 5 points, so is that a problem for retrains? For each seed,
each scenario and each way (``clean``: the photos the candidate trained on, what the trainer does; ``composed``:
:func:`trainer.batchnorm.batchnorm_photos`, composed passes of the replayed lab photos plus the received ones, patched
in for the measurement), one :func:`trainer.retrain.retrain` from the shipped store with the default settings:

- ``pseudo``: 150 photos of the release's validation split, handed over as pseudo-labels where v1000's softmax is
  at least 0.9 (what a daemon would send); measured on the other half of that split;
- ``expert``: 10 expert-labelled apple-orchard field photos per apple class (40); measured on the other
  apple-orchard and all corn-field photos.

Each candidate's gate decision, and v1000's and the candidate's top-1 (FP32) on lab and field photos neither
trained on: the gate's own photos (the shipped test split) are never used to measure. Writes
``DIR/retrain_batchnorm.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


def _field(sub: str, classes: list[str]) -> list[tuple[Path, int]]:
    return [
        (p, classes.index(d.name)) for d in sorted((SHARED / "field" / sub).iterdir()) if d.name in classes for p in sorted(d.iterdir())
    ]


def _scenario(name: str, seed: int, v1000, classes: list[str]) -> tuple[list[dict], list, list]:
    """The samples to hand over (header + path) and the lab and field photos to measure on."""
    import numpy as np
    import torch

    from edge_agent.preprocess import preprocess_file
    from trainer.data import recorded_split
    from trainer.publish import load_weights

    rng = random.Random(seed)
    lab = list(recorded_split(v1000, SHARED / "plantvillage")["val"])
    rng.shuffle(lab)
    apple = _field("apple-orchard", classes)
    corn = _field("corn-field", classes)
    if name == "pseudo":
        source, lab_measure = lab[:150], lab[150:]
        model = load_weights(v1000)
        with torch.no_grad():
            p = torch.softmax(model(torch.from_numpy(np.stack([preprocess_file(s.path) for s in source]))), 1)
        conf, pred = p.max(1)
        samples = [
            {"path": s.path, "kind": "pseudo", "label": classes[int(k)], "confidence": float(c)}
            for s, c, k in zip(source, conf, pred)
            if c >= 0.9
        ]
        return samples, [(s.path, s.label) for s in lab_measure], apple + corn
    rng.shuffle(apple)
    picked, rest, per = [], [], {}
    for path, y in apple:
        if per.get(y, 0) < 10:
            picked.append((path, y))
            per[y] = per.get(y, 0) + 1
        else:
            rest.append((path, y))
    samples = [{"path": path, "kind": "expert", "label": classes[y], "confidence": 1.0} for path, y in picked]
    return samples, [(s.path, s.label) for s in lab], rest + corn


def _top1(model, photos) -> float:
    import numpy as np
    import torch

    from edge_agent.preprocess import preprocess_file
    from trainer.train import evaluate

    x = torch.from_numpy(np.stack([preprocess_file(p) for p, _ in photos]))
    return round(evaluate(model, x, torch.tensor([y for _, y in photos])).top1, 4)


def _compose(cfg, v1000, classes: list[str], handed: list[dict], seed: int) -> None:
    """Patch the retrain so its candidate's BatchNorm statistics come from :func:`trainer.batchnorm.batchnorm_photos`."""
    import functools

    import numpy as np
    import torch

    import trainer.retrain as retrain_mod
    from edge_agent.preprocess import preprocess_file
    from trainer.batchnorm import batchnorm_photos
    from trainer.labelled import labelled_sources

    received = torch.from_numpy(np.stack([preprocess_file(s["path"]) for s in handed]))
    bn_x, _ = batchnorm_photos(v1000.manifest["training"], labelled_sources(cfg, classes).train, received, seed)
    train_generation, choose_step = retrain_mod.train_generation, retrain_mod.choose_step
    retrain_mod.train_generation = functools.partial(train_generation, bn_x=bn_x)
    retrain_mod.choose_step = lambda trained, previous, steps, _x, *a, **k: choose_step(trained, previous, steps, bn_x, *a, **k)


def run_one(work: Path, scenario: str, way: str, seed: int) -> dict:
    import trainer.retrain as retrain_mod
    from edge_agent.config import default_store_path, parse_config
    from engines.store import EngineStore
    from trainer.publish import load_weights
    from trainer.samples import SampleStore

    state = work / f"{scenario}-{way}-seed{seed}"
    if state.exists():
        shutil.rmtree(state)
    shutil.copytree(default_store_path(), state / "engines")
    cfg = parse_config({"trainer": {"seed": seed, "int8": False}})
    store = EngineStore(state / "engines")
    v1000 = store.open()
    classes = list(v1000.classes)
    handed, lab, field = _scenario(scenario, seed, v1000, classes)
    samples = SampleStore(state / "trainer")
    for s in handed:
        data = Path(s["path"]).read_bytes()
        samples.add(
            {
                "id": hashlib.sha256(data).hexdigest(),
                "ext": Path(s["path"]).suffix,
                "kind": s["kind"],
                "label": s["label"],
                "confidence": s["confidence"],
                "engine_version": v1000.name,
            },
            data,
        )
    originals = retrain_mod.train_generation, retrain_mod.choose_step
    if way == "composed":
        _compose(cfg, v1000, classes, handed, seed)
    try:
        result = retrain_mod.retrain(cfg, store, samples, state / "trainer" / "strategy")
    finally:
        retrain_mod.train_generation, retrain_mod.choose_step = originals
        samples.close()
    row = {
        "scenario": scenario,
        "way": way,
        "seed": seed,
        "handed_over": len(handed),
        "published": result.published,
        "gate": {k: result.metrics.get("gate", {}).get(k) for k in ("publish", "reason", "candidate_top1", "current_top1")},
        "seconds": round(result.seconds, 1),
    }
    parent = load_weights(v1000)
    row["v1000"] = {"lab": _top1(parent, lab), "field": _top1(parent, field)}
    if result.published:
        cand = load_weights(store.open(result.published))
        row["candidate"] = {"lab": _top1(cand, lab), "field": _top1(cand, field)}
    return row


def report(rows: list[dict]) -> str:
    lines = [
        "# Retrains on v1000: BatchNorm statistics over clean or composed lab photos",
        "",
        "`python -m benchmarks.retrain_batchnorm --out DIR`; FP32; change in top-1 from v1000, points, mean +- sd over seeds "
        "(only published candidates; the gate's own photos are never used to measure).",
        "",
        "| scenario | BatchNorm over | published | lab change | field change | gate reasons |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in ("pseudo", "expert"):
        for way in ("clean", "composed"):
            rs = [r for r in rows if r["scenario"] == scenario and r["way"] == way]
            if not rs:
                continue
            pub = [r for r in rs if r.get("candidate")]

            def change(key, pub=pub):
                d = [100 * (r["candidate"][key] - r["v1000"][key]) for r in pub]
                return f"{statistics.mean(d):+.1f} +- {statistics.stdev(d):.1f}" if len(d) > 1 else (f"{d[0]:+.1f}" if d else "-")

            reasons = "; ".join(sorted({str(r["gate"]["reason"]) for r in rs}))
            lines.append(f"| {scenario} | {way} | {len(pub)} of {len(rs)} | {change('lab')} | {change('field')} | {reasons} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.retrain_batchnorm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--scenarios", nargs="+", default=["pseudo", "expert"])
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        for scenario in args.scenarios:
            for way in ("clean", "composed"):
                row = run_one(out / "work", scenario, way, seed)
                print(json.dumps(row), flush=True)
                rows.append(row)
                (out / "retrain_batchnorm.json").write_text(json.dumps(rows, indent=1))
                (out / "retrain_batchnorm.md").write_text(report(rows))
    shutil.rmtree(out / "work", ignore_errors=True)
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
