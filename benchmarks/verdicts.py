"""Why the verdict is what it is: ways of deciding `confident`, compared on lab, field and unknown-disease photos.

``python -m benchmarks.verdicts --out benchmarks/results/field`` takes the shipped model's FP32 logits (ONNX Runtime)
for its validation photos (where every threshold below is fitted), its test photos, the field photos and the unknown
disease, and for each rule reports the share of photos marked confident and how often those are right:

- softmax >= 0.9 alone (what the daemon did before verdicts);
- energy (log-sum-exp of the logits) at least its 3rd percentile on the validation photos, with softmax >= 0.9;
- the shipped verdict: Mahalanobis distance of the logits to the nearest class mean within the 97th percentile of
  the validation photos' distances, with softmax >= 0.9 (:mod:`edge_agent.verdict`).

Writes ``verdicts.md`` and ``verdicts.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.field import SHARED, field_sets
from edge_agent.classifier import softmax
from edge_agent.config import default_store_path, parse_config
from edge_agent.preprocess import ImageRejected, PreprocessSpec, preprocess_file
from edge_agent.verdict import Judge, VerdictSpec
from engines.loader import open_engine
from engines.store import EngineStore

__all__ = ["main"]


def _logits(engine, photos) -> tuple[np.ndarray, np.ndarray, list, np.ndarray | None]:
    """The engine's logits, the photos as given to it, their labels, and its distances (a verdict on the features)."""
    spec = PreprocessSpec.from_manifest(engine.version.manifest["preprocess"])
    xs, truth = [], []
    for path, label in photos:
        try:
            xs.append(preprocess_file(path, spec))
        except ImageRejected:
            continue
        truth.append(label)
    x = np.stack(xs)
    parts = [engine.infer_with_distance(x[i : i + 32]) for i in range(0, len(x), 32)]
    logits = np.concatenate([z for z, _ in parts]).astype(np.float64)
    return logits, x, truth, None if parts[0][1] is None else np.concatenate([d for _, d in parts])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.verdicts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--store", default=str(default_store_path()))
    args = ap.parse_args(argv)
    from trainer.data import recorded_split

    version = EngineStore(args.store).open()
    engine = open_engine(args.store, parse_config({"engine": {"precision": "fp32"}}).engine)
    sets = field_sets(version, SHARED / "plantvillage", SHARED / "field")
    sets["val"] = [(s.path, version.classes[s.label]) for s in recorded_split(version, SHARED / "plantvillage")["val"]]
    data = {name: _logits(engine, photos) for name, photos in sets.items()}
    spec = VerdictSpec.from_manifest(version.manifest)
    lse = lambda z: np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)  # noqa: E731
    energy_floor = float(np.quantile(lse(data["val"][0]), 0.03))
    pre = PreprocessSpec.from_manifest(version.manifest["preprocess"])
    shipped = Judge(spec, 0.9, pre.mean, pre.std)
    softmax_only = Judge(None, 0.9, pre.mean, pre.std)

    def rules(z, x, d):
        p = softmax(z)
        sure = np.array([v.verdict == "confident" for v in softmax_only.judge(z, p, x)])
        return {
            "softmax >= 0.9": sure,
            "softmax >= 0.9 and energy": sure & (lse(z) >= energy_floor),
            "softmax >= 0.9 and distance (shipped)": np.array([v.verdict == "confident" for v in shipped.judge(z, p, x, distances=d)]),
        }

    table = {}
    for name, (z, x, truth, d) in data.items():
        right = np.array([t is not None and version.classes[i] == t for i, t in zip(z.argmax(1), truth)])
        for rule, conf in rules(z, x, d).items():
            row = table.setdefault(rule, {})
            row[name] = {
                "share_confident": round(float(conf.mean()), 4),
                "confident_top1": round(float(right[conf].mean()), 4) if conf.any() and truth[0] is not None else None,
            }
    lines = [
        f"# Ways to decide `confident`: {version.name}, FP32",
        "",
        f"`python -m benchmarks.verdicts --out DIR`; thresholds fitted on the {len(data['val'][2])} validation photos only.",
        "",
        "| rule | lab test: confident / right when confident | field: confident / right | unknown disease: confident |",
        "|---|---|---|---|",
    ]
    for rule, row in table.items():
        lines.append(
            f"| {rule} | {row['lab']['share_confident']} / {row['lab']['confident_top1']} | "
            f"{row['field']['share_confident']} / {row['field']['confident_top1']} | {row['unknown']['share_confident']} |"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verdicts.json").write_text(json.dumps(table, indent=1) + "\n")
    (out / "verdicts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
