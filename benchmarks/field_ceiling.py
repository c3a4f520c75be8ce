"""How many true field labels the shipped model needs to reach a field top-1: one retrain per label count.

``python -m benchmarks.field_ceiling --out DIR [--field apple-orchard] [--labels 90 300 900] [--seed 1] [--set SECTION.KEY=VALUE ...]
[--size N] [--store DIR] [--crops Apple]``

The field loop (:mod:`benchmarks.field_loop`) gives the trainer at most 100 expert labels over nine days. This asks
what more would buy: the shipped model, retrained once by :func:`trainer.retrain.retrain` with the shipped
configuration on the first N photos of the loop's field stream (same seed, same split) labelled with their true class,
all of them trained on (``field_check_every = 0``: no field check to hold any back; the lab gate still decides), then
measured as the loop measures (the held-out field test and the lab validation split, as the device runs the engine).
``--set`` changes the retrain's configuration (``trainer.distill=0``); ``--size N`` first republishes the shipped
weights at input side N (a new lineage, as a release at another size would be) and retrains that; the report records
both. ``--store DIR`` starts from that store's current version instead of the shipped one (a release candidate
trained on the shipped model's split).
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
from benchmarks.field_loop import SHARED, _Measure, split_field, starting_store, store_root

__all__ = ["resized", "retrain_on"]


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


def retrain_on(
    n: int,
    field: str,
    seed: int,
    work: Path,
    sets: dict | None = None,
    size: int | None = None,
    source: str | None = None,
    crops: list[str] | None = None,
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
    for path, y in stream[:n]:  # as the expert's labels arrive from the daemon's queue
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
    args = ap.parse_args(argv)
    crops = [c for c in args.crops.split(",") if c]
    sets = config_sets(args.set)  # first: a malformed one is refused before any work
    source = str(starting_store(args.store)) if args.store else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    if earlier and (earlier.get("sets", {}), earlier.get("size"), earlier.get("store")) != (sets, args.size, source):
        raise SystemExit(
            f"{path} was measured with --set {earlier.get('sets', {})} --size {earlier.get('size')} --store {earlier.get('store')}:"
            " give another --out"
        )
    rows = earlier.get("rows", [])
    for n in args.labels:
        if any(r["labels"] == n for r in rows):
            continue
        rows.append(retrain_on(n, args.field, args.seed, out / "work", sets, args.size, source, crops))
        print(json.dumps(rows[-1]), flush=True)
        path.write_text(
            json.dumps({"field": args.field, "seed": args.seed, "sets": sets, "size": args.size, "store": source, "rows": rows}, indent=2)
            + "\n"
        )
    shutil.rmtree(out / "work", ignore_errors=True)
    lines = [
        f"# Field labels the shipped model needs ({args.field}, seed {args.seed})\n",
        *([f"Retrain configuration changed: {json.dumps(sets)}\n"] if sets else []),
        *([f"Started from {source}'s current version, not the shipped model\n"] if source else []),
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
