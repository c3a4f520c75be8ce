"""Whether the verdict's distance test is better measured on the network's penultimate features than on its logits.

``python -m benchmarks.verdict_features --out DIR [--store S] [--version V] [--quantiles 0.8 0.97 0.99] [--rank 32]``

The verdict (:mod:`edge_agent.verdict`) calls an answer ``confident`` where the softmax reaches the pseudo-label
threshold (0.9) *and* the logits lie within ``confident_distance`` of a class mean (squared Mahalanobis, one shared
covariance). Lee et al. (2018) measure that distance on hidden features instead; the issue asked whether these serve
better. This takes one version's FP32 ONNX model with its pooled features (the input of the final linear layer)
exposed as a second output, and its recorded split: class means and covariances are fitted on the training photos,
every threshold on the validation photos only, and the rules are scored on the lab test photos, the field photos
(apple orchard, corn field) and the unknown apple disease:

- the shipped rule, with the manifest's own statistics and threshold;
- for each quantile q of the validation photos' distances: logits with the shared covariance; features (1,280-d for
  Lite0) with the covariance shrunk 20 % towards its average variance; features with the covariance kept in its
  ``rank`` largest within-class directions and one average variance for the rest
  (:func:`trainer.verdict_fit.class_means_and_precision`).

``unknown by distance`` is the share beyond 1.5 times the validation photos' 99.5 % quantile (the product's
``unknown_distance``). The image checks are left out (every rule shares them). Nothing here changes the product:
it measures whether serving the features is worth a second engine output. Writes ``verdict-features.md`` and
``.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from benchmarks.field import SHARED, field_sets
from edge_agent.classifier import softmax
from edge_agent.config import default_store_path, parse_config
from edge_agent.preprocess import ImageRejected, PreprocessSpec, preprocess_file
from edge_agent.verdict import DISTANCE_OUTPUT, Judge, VerdictSpec
from engines.store import EngineStore

__all__ = ["distances", "feature_session", "main", "rules", "score", "wilson"]

FIELD_PARTS = ("apple-orchard", "corn-field")


def feature_session(onnx_path: Path, threads: int = 2):
    """An ONNX Runtime session over the model with the final linear layer's input exposed; (session, its name)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(onnx_path))
    first = model.graph.output[0].name  # the logits (a second output, the verdict's distances, comes after them)
    linear = [n for n in model.graph.node if n.op_type in ("Gemm", "MatMul") and first in n.output]
    if not linear:
        raise SystemExit(f"{onnx_path}: no final linear layer (Gemm or MatMul) to take the features from")
    name = linear[-1].input[0]
    model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]), name


def _embed(session, feature: str, spec: PreprocessSpec, photos, classes: list[str]) -> dict:
    xs, logits, features, model_d, truth = [], [], [], [], []
    names = [o.name for o in session.get_outputs()]
    wanted = [names[0], feature, *([DISTANCE_OUTPUT] if DISTANCE_OUTPUT in names else [])]

    def flush():
        if xs:
            z, f, *d = session.run(wanted, {session.get_inputs()[0].name: np.stack(xs)})
            logits.append(z.astype(np.float64))
            features.append(f.reshape(len(f), -1).astype(np.float64))
            model_d.extend(x.astype(np.float64) for x in d)
            xs.clear()

    for path, label in photos:
        try:
            xs.append(preprocess_file(path, spec))
        except ImageRejected:
            continue
        truth.append(classes.index(label) if label in classes else -1)
        if len(xs) == 64:
            flush()
    flush()
    out = {"logits": np.concatenate(logits), "features": np.concatenate(features), "truth": np.array(truth)}
    if model_d:  # the version's own verdict on the features: the model's distances to every class
        out["distance"] = np.concatenate(model_d)
    return out


def distances(means: np.ndarray, precision: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Squared Mahalanobis distance of each row of ``x`` to its nearest mean (the product's :class:`Judge`)."""
    spec = VerdictSpec(means, precision, math.inf, math.inf, 0.0, 0.0, 1.0, 0.0)
    return Judge(spec, 1.0, 0.0, 1.0).distances(x)


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson interval of a share of ``hits`` in ``n``."""
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return ((centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n))


def rules(data: dict, manifest: dict, quantiles: list[float], rank: int) -> dict[str, tuple[dict[str, np.ndarray], float, float]]:
    """Per rule: (each set's distances, the confident threshold, the unknown threshold); see the module docstring."""
    from trainer.verdict_fit import class_means_and_precision

    k = len(manifest["classes"])
    train = data["train"]
    spaces = {
        "logits": ("logits", class_means_and_precision(train["logits"], train["truth"], k)),
        "features, shrunk covariance": ("features", class_means_and_precision(train["features"], train["truth"], k, 0.2)),
        f"features, top {rank} directions + one variance": (
            "features",
            class_means_and_precision(train["features"], train["truth"], k, rank=rank),
        ),
    }
    out = {}
    scored = {name: s for name, s in data.items() if name != "train"}  # the training photos only fit the means
    shipped = VerdictSpec.from_manifest(manifest)
    if shipped is not None and shipped.on == "features":
        d = {name: s["distance"].min(1) for name, s in scored.items()}
        out["features, the model's own distances and the manifest's threshold (shipped)"] = (
            d,
            shipped.confident_distance,
            shipped.unknown_distance,
        )
    elif shipped is not None:
        d = {name: distances(shipped.means, shipped.precision, s["logits"]) for name, s in scored.items()}
        out["logits, the manifest's statistics and threshold (shipped)"] = (d, shipped.confident_distance, shipped.unknown_distance)
    for space, (key, (means, precision)) in spaces.items():
        d = {name: distances(means, precision, s[key]) for name, s in scored.items()}
        unknown = float(np.quantile(d["val"], 0.995) * 1.5)
        for q in quantiles:
            out[f"{space}, {q:g} quantile"] = (d, float(np.quantile(d["val"], q)), unknown)
    return out


def score(data: dict, rule: tuple, sure: float) -> dict:
    """Each scored set's confident share (with its 95 % interval), right when confident, and unknown by distance."""
    d, limit, unknown = rule
    row = {}
    for name in ("lab", *FIELD_PARTS, "field", "unknown"):
        s = data[name]
        confident = (softmax(s["logits"]).max(1) >= sure) & (d[name] <= limit)
        right = s["logits"].argmax(1) == s["truth"]
        n, hits = len(confident), int(confident.sum())
        row[name] = {
            "photos": n,
            "confident": round(hits / n, 4) if n else None,
            "confident_95": [round(v, 4) for v in wilson(hits, n)],
            "right_when_confident": round(float(right[confident].mean()), 4) if hits and (s["truth"] >= 0).all() else None,
            "confident_photos": hits,
            "unknown_by_distance": round(float((d[name] > unknown).mean()), 4) if n else None,
        }
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.verdict_features", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--store", default=str(default_store_path()))
    ap.add_argument("--version", default=None, help="The version to measure (default: the store's current one).")
    ap.add_argument("--quantiles", type=float, nargs="+", default=[0.8, 0.97, 0.99])
    ap.add_argument("--rank", type=int, default=32, help="Within-class directions kept by the low-rank covariance.")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    from trainer.data import recorded_split

    version = EngineStore(args.store).open(args.version) if args.version else EngineStore(args.store).open()
    spec = PreprocessSpec.from_manifest(version.manifest["preprocess"])
    sure = parse_config({}).labels.pseudo_threshold
    session, feature = feature_session(Path(args.store) / version.name / "model.onnx", args.threads)
    sets = field_sets(version, SHARED / "plantvillage", SHARED / "field")
    for part in FIELD_PARTS:
        sets[part] = [(p, label) for p, label in sets["field"] if p.parent.parent.name == part]
    split = recorded_split(version, SHARED / "plantvillage")
    for name in ("train", "val"):
        sets[name] = [(s.path, version.classes[s.label]) for s in split[name]]
    data = {}
    for name, photos in sets.items():
        data[name] = _embed(session, feature, spec, photos, version.classes)
        print(f"{name}: {len(data[name]['truth'])} photos", file=sys.stderr, flush=True)
    table = {rule: score(data, values, sure) for rule, values in rules(data, version.manifest, args.quantiles, args.rank).items()}

    def cell(r, name):
        c = r[name]
        right = "-" if c["right_when_confident"] is None else f"{c['right_when_confident']:.3f}"
        return f"{c['confident']:.3f} / {right} ({c['confident_photos']})"

    lines = [
        f"# The verdict's distance on logits or on features: {version.name}, FP32",
        "",
        f"`python -m benchmarks.verdict_features --out DIR --version {version.name} --rank {args.rank}`: means and covariances "
        f"from the {len(data['train']['truth'])} training photos, thresholds from the {len(data['val']['truth'])} validation "
        f"photos only; `confident` = softmax >= {sure} and distance within the threshold. Feature width: "
        f"{data['train']['features'].shape[1]}.",
        "",
        "| distance, threshold | lab test: confident [95 %] / right (photos) | field: confident / right | orchard | corn | "
        "unknown disease: confident | unknown by distance: lab / field / unknown disease |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule, r in table.items():
        lo, hi = r["lab"]["confident_95"]
        lines.append(
            f"| {rule} | {r['lab']['confident']:.3f} [{lo:.3f}-{hi:.3f}] / {r['lab']['right_when_confident']} "
            f"({r['lab']['confident_photos']}) | {cell(r, 'field')} | {cell(r, 'apple-orchard')} | {cell(r, 'corn-field')} | "
            f"{r['unknown']['confident']:.3f} | {r['lab']['unknown_by_distance']} / {r['field']['unknown_by_distance']} / "
            f"{r['unknown']['unknown_by_distance']} |"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verdict-features.json").write_text(json.dumps({"version": version.name, "sure": sure, "rules": table}, indent=1) + "\n")
    (out / "verdict-features.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
