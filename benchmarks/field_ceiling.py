"""How many true field labels the shipped model needs to reach a field top-1: one retrain per label count.

``python -m benchmarks.field_ceiling --out DIR [--field apple-orchard] [--labels 90 300 900] [--seed 1] [--set SECTION.KEY=VALUE ...]
[--size N] [--store DIR] [--crops Apple] [--choose first|margin|spread|draw|typical|typical-logits|typical-distances]``

The field loop (:mod:`benchmarks.field_loop`) gives the trainer at most 100 expert labels over nine days. This asks
what more would buy: the shipped model, retrained once by :func:`trainer.retrain.retrain` with the shipped
configuration on the first N photos of the loop's field stream (same seed, same split) labelled with their true class,
all of them trained on (``field_check_every = 0``: no field check to hold any back; the lab gate still decides), then
measured as the loop measures (the held-out field test and the lab validation split, as the device runs the engine).
``--set`` changes the retrain's configuration (``trainer.distill=0``); ``--size N`` first republishes the shipped
weights at input side N (a new lineage, as a release at another size would be) and retrains that; the report records
both. ``--store DIR`` starts from that store's current version instead of the shipped one (a release candidate
trained on the shipped model's split). ``--choose`` says which N stream photos the expert labels: ``first`` (the
stream's first N, in the order the seed shuffled it: a random draw), ``margin`` (the daemon's review order,
:func:`edge_agent.review.rank.rank`, over the photos the engine in service is not sure of, then the rest), ``spread``
(the same with ``order = "draw"``: those photos in a fixed random order, spread over the classes the engine names),
``draw`` (the same without the spreading: ``[labels] ask_order = "draw"``) or
``typical`` (the stream's pooled features, by the engine in service's torch weights, cut into N clusters by k-means;
from each the photo most typical of it: the least mean distance to its nearest neighbours there, as TypiClust,
Hacohen et al. 2022, picks for a small budget) or ``typical-logits`` / ``typical-distances`` (the same on the logits, or
the square roots of the per-class distances of the verdict's second output, that the engine in service returns as the
device runs it: what a daemon has of every photo).
Writes ``DIR/report.json`` and ``DIR/report.md``; a label count already in the report is not run again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from pathlib import Path

from benchmarks._sets import config_sets, with_sets
from benchmarks.field_loop import SHARED, _Measure, _served, split_field, starting_store, store_root

__all__ = ["chosen", "resized", "retrain_on"]

#: The rules ``--choose`` names.
CHOICES = ("first", "margin", "spread", "draw", "typical", "typical-logits", "typical-distances")


def resized(store, size: int):
    """The store's current version republished at input side ``size`` (a new lineage; the same weights and split)."""
    import dataclasses

    from edge_agent.preprocess import PreprocessSpec
    from trainer.publish import load_weights, publish_model

    v = store.open()
    spec = dataclasses.replace(PreprocessSpec.from_manifest(v.manifest["preprocess"]), size=size)
    split = json.loads((v.path / "split.json").read_text()) if (v.path / "split.json").is_file() else None
    return publish_model(
        load_weights(v), list(v.classes), store.root, spec=spec, split=split, new_lineage=True, training=v.manifest.get("training")
    )


def _described(rule: str, x, v, store, cfg):
    """What the typical rule ``rule`` clusters, a row a photo of ``x``: the torch weights' pooled features
    (``typical``), or what the engine in service returns as the device runs it (its logits, or the square roots of
    the verdict's per-class distances)."""
    import numpy as np

    if rule == "typical":
        import torch

        from trainer.models import features_of
        from trainer.publish import load_weights

        return features_of(load_weights(v), torch.from_numpy(x)).numpy().astype(np.float64)
    from edge_agent.classifier import Classifier
    from edge_agent.review.typical import rows_of

    clf = Classifier.configured(_served(store, cfg, None), cfg)
    try:
        out = [clf.engine.infer_with_distance(x[i : i + 64]) for i in range(0, len(x), 64)]
    finally:
        clf.engine.close()
    if rule == "typical-logits":
        return np.concatenate([logits for logits, _ in out]).astype(np.float64)
    if out[0][1] is None:
        raise SystemExit(f"--choose typical-distances: {v.name}'s verdict is not on the features (it returns no distances)")
    return rows_of(np.concatenate([d for _, d in out]))


def chosen(rule: str, stream: list, n: int, store, cfg, seed: int) -> list:
    """The ``n`` photos of ``stream`` the expert labels under ``rule`` (:data:`CHOICES`)."""
    import numpy as np

    if rule == "first" or n >= len(stream):
        return stream[:n]
    from edge_agent.preprocess import PreprocessSpec, preprocess_file

    v = store.open()
    spec = PreprocessSpec.from_manifest(v.manifest["preprocess"])
    x = np.stack([preprocess_file(p, spec) for p, _ in stream])
    if rule.startswith("typical"):
        from edge_agent.review.typical import typical

        return [stream[i] for i in typical(_described(rule, x, v, store, cfg), n, seed)]
    from edge_agent.classifier import Classifier
    from edge_agent.review.rank import Candidate, rank

    clf = Classifier.configured(_served(store, cfg, None), cfg)
    try:
        preds = [p for i in range(0, len(x), 64) for p in clf.predict_tensors(x[i : i + 64])]
    finally:
        clf.engine.close()
    at = {str(path): i for i, (path, _) in enumerate(stream)}  # a photo's id: its path (a seed's draw is its own)
    pool = [Candidate(str(stream[i][0]), p.top_k) for i, p in enumerate(preds) if p.verdict != "confident"]
    kw = {"margin": {}, "spread": {"order": "draw"}, "draw": {"order": "draw", "class_penalty": 0.0}}[rule]
    order = [at[c.id] for c in rank(pool, **kw)]
    asked = set(order)
    order += [i for i in range(len(stream)) if i not in asked]
    return [stream[i] for i in order[:n]]


def retrain_on(
    n: int,
    field: str,
    seed: int,
    work: Path,
    sets: dict | None = None,
    size: int | None = None,
    source: str | None = None,
    crops: list[str] | None = None,
    choose: str = "first",
) -> dict:
    """The shipped model (or ``source``'s current version; at input side ``size``, default its own) retrained on ``n``
    true-labelled stream photos: field and lab top-1 of what is in service (and with ``crops``, the field's top-1
    of its answers restricted to those crops, as ``[classify] crops`` restricts the daemon's)."""
    from edge_agent.config import parse_config
    from edge_agent.handoff.sender import sample_header
    from edge_agent.ledger_rows import QueueEntry
    from engines.store import EngineStore
    from trainer.data import recorded_split
    from trainer.retrain import retrain
    from trainer.samples import SampleStore

    shutil.rmtree(work, ignore_errors=True)
    store = EngineStore(shutil.copytree(store_root(source), work / "engines"))
    if size is not None and size != store.open().manifest["preprocess"]["size"]:
        resized(store, size)
    shipped = store.open()
    classes = list(shipped.classes)
    test, stream = split_field(SHARED / "field" / field, classes, seed, 0.25)
    lab = [(x.path, x.label) for x in recorded_split(shipped, str(SHARED / "plantvillage"))["val"]]
    cfg = parse_config(with_sets({"trainer": {"field_check_every": 0}}, sets))
    samples = SampleStore(work / "trainer")
    for path, y in chosen(choose, stream, n, store, parse_config({}), seed):  # as the expert's labels arrive
        data = Path(path).read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        entry = QueueEntry(sha, sha[:16], "expert", classes[y], 1.0, shipped.name, str(path), len(data))
        samples.add(sample_header(entry, entry.file), data)
    t0 = time.time()
    r = retrain(cfg, store, samples, work / "trainer" / "strategy")
    samples.close()
    measured = _Measure(parse_config({}), test, lab)(store)
    seconds = round(time.time() - t0, 1)  # (the retrain and its measurement, as before --crops)
    if crops:
        measured["field_crops"] = _Measure(parse_config({"classify": {"crops": crops}}), test, [])(store)["field"]
    return {"labels": n, "published": r.published, "reason": r.reason, "seconds": seconds, **measured}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.field_ceiling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--field", default="apple-orchard")
    ap.add_argument("--labels", nargs="+", type=int, default=[90, 300, 900])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="A retrain configuration value (TOML) other than the shipped one.",
    )
    ap.add_argument("--size", type=int, default=None, help="Republish the shipped weights at this input side first (a multiple of 32).")
    ap.add_argument("--store", default=None, help="Start from this store's current version (a release candidate), not the shipped one.")
    ap.add_argument("--crops", default="", help="Also measure the field with [classify] crops (comma-separated, e.g. 'Apple').")
    ap.add_argument("--choose", choices=CHOICES, default="first", help="Which stream photos the expert labels (see above).")
    args = ap.parse_args(argv)
    crops = [c for c in args.crops.split(",") if c]
    sets = config_sets(args.set)  # first: a malformed one is refused before any work
    source = str(starting_store(args.store)) if args.store else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    if earlier and (earlier.get("sets", {}), earlier.get("size"), earlier.get("store"), earlier.get("choose", "first")) != (
        sets,
        args.size,
        source,
        args.choose,
    ):
        raise SystemExit(
            f"{path} was measured with --set {earlier.get('sets', {})} --size {earlier.get('size')} --store {earlier.get('store')}"
            f" --choose {earlier.get('choose', 'first')}:"
            " give another --out"
        )
    rows = earlier.get("rows", [])
    for n in args.labels:
        if any(r["labels"] == n for r in rows):
            continue
        rows.append(retrain_on(n, args.field, args.seed, out / "work", sets, args.size, source, crops, args.choose))
        print(json.dumps(rows[-1]), flush=True)
        path.write_text(
            json.dumps(
                {
                    "field": args.field,
                    "seed": args.seed,
                    "sets": sets,
                    "size": args.size,
                    "store": source,
                    "choose": args.choose,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
    shutil.rmtree(out / "work", ignore_errors=True)
    lines = [
        f"# Field labels the shipped model needs ({args.field}, seed {args.seed})\n",
        *([f"Retrain configuration changed: {json.dumps(sets)}\n"] if sets else []),
        *([f"Started from {source}'s current version, not the shipped model\n"] if source else []),
        *([f"The expert's photos chosen by the rule `{args.choose}`, not the stream's first\n"] if args.choose != "first" else []),
        *([f"The shipped weights republished at input side {args.size} px first (a new lineage)\n"] if args.size else []),
        f"| true field labels trained on | published | field top-1 |{f' field top-1, crops {args.crops} |' if crops else ''} lab top-1 | seconds |",
        f"|---|---|---|{'---|' if crops else ''}---|---|",
    ]
    lines += [
        f"| {r['labels']} | {r['published'] or 'refused: ' + r['reason']} | {r['field']:.3f} |"
        + (f" {r['field_crops']:.3f} |" if crops and "field_crops" in r else " - |" if crops else "")
        + f" {r['lab']:.3f} | {r['seconds']} |"
        for r in sorted(rows, key=lambda r: r["labels"])
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
