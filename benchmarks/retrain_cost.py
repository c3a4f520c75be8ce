"""One on-device retrain of the shipped model on an expert's labels of field photos: wall time, peak memory, and the
field and lab top-1 of the engine in service before and after it, over seeds.

``python -m benchmarks.retrain_cost --out DIR [--labels 100] [--seeds 1 2 3] [--field apple-orchard] [--store DIR]
[--unlabelled N [--no-term]] [--then N] [--set SECTION.KEY=VALUE ...]``

Per seed: the field's photos are split stratified (25 % held out as the field test); ``--labels`` of the rest, drawn
stratified at random, are the expert's labels, stored in a fresh state directory's sample store as the daemon's
hand-off would, and ``--unlabelled`` of the rest in its unlabelled pool; the trainer's defaults (the shipped replay and gate photos, the field check on every 4th expert
label, INT8) and :func:`trainer._child.retrain_in_child`, as ``edge-trainer serve`` runs it, retrain once. Peak
memory is the retrain child's maximum resident set (each seed in its own process). Before and after: the engine in
service through :class:`edge_agent.classifier.Classifier` (as the daemon runs it) on the field test and on the
release's lab test photos (its ``split.json``; never trained or gated on). ``--then N``: N more labels (drawn as the
first) arrive after the first retrain and a second one runs, as the next day of a season would (its figures under
``then``). Writes ``DIR/seed-N.json`` and ``DIR/summary.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"

__all__ = ["one_seed", "summarise"]


def _split(field: Path, seed: int, labels: int) -> tuple[list, list, list]:
    """(test, labelled, unlabelled): 25 % of each class held out, then ``labels`` of the rest stratified at random;
    the rest after them, shuffled (the photos nobody labelled)."""
    rng = random.Random(seed)
    test, rest = [], []
    for cls in sorted(d for d in field.iterdir() if d.is_dir()):
        photos = sorted(cls.glob("*.jpg"))
        rng.shuffle(photos)
        cut = len(photos) // 4
        test += [(p, cls.name) for p in photos[:cut]]
        rest.append([(p, cls.name) for p in photos[cut:]])
    per = [labels // len(rest) + (1 if i < labels % len(rest) else 0) for i in range(len(rest))]
    unlabelled = [x for group, n in zip(rest, per) for x in group[n:]]
    rng.shuffle(unlabelled)
    return test, [x for group, n in zip(rest, per) for x in group[:n]], unlabelled


def _fill_pool(root: Path, store_root: Path, photos: list) -> None:
    """The photos in the trainer's unlabelled pool, each with the engine in service's answer, as a daemon hands them."""
    from edge_agent.classifier import Classifier
    from edge_agent.config import parse_config
    from engines.loader import open_engine
    from trainer.loop.unlabelled_pool import UnlabelledPool

    pool = UnlabelledPool(root, len(photos), 1 << 40)
    with open_engine(store_root, parse_config({}).engine) as engine:
        clf = Classifier(engine)
        for p, _ in photos:
            data, answer = p.read_bytes(), clf.predict_file(p)
            header = {"id": hashlib.sha256(data).hexdigest(), "kind": "unlabelled", "label": answer.label, "verdict": answer.verdict}
            pool.add(
                {**header, "confidence": answer.confidence, "engine_version": engine.version.name, "ext": p.suffix, "device": "farm"}, data
            )
    pool.close()


def _top1(store_root: Path, photos: list) -> float:
    from edge_agent.classifier import Classifier
    from edge_agent.config import parse_config
    from engines.loader import open_engine

    with open_engine(store_root, parse_config({}).engine) as engine:
        clf = Classifier(engine)
        return round(sum(clf.predict_file(p).label == c for p, c in photos) / len(photos), 4)


def one_seed(
    seed: int,
    labels: int,
    field: Path,
    lab: Path,
    shipped_store: Path | None = None,
    unlabelled: int = 0,
    term: bool = True,
    keep: Path | None = None,
    precision: float | None = None,
    sets: dict | None = None,
    then: int = 0,
) -> dict:
    """Set up a state directory, measure, retrain once, measure again (``sets``: configuration sections that
    differ from the shipped ones, as :func:`benchmarks._sets.config_sets` reads them)."""
    from benchmarks._sets import with_sets
    from edge_agent.config import default_store_path, parse_config
    from edge_agent.log import configure_logging
    from edge_agent.state import seed_store
    from engines.signing import load_or_create_key
    from engines.store import EngineStore
    from trainer._child import retrain_in_child
    from trainer.data import recorded_split

    configure_logging("warning", "console")
    test, labelled, rest = _split(field, seed, labels)
    more = [x for x in _split(field, seed, labels + then)[1] if x not in labelled]  # the same draw, carried on
    with tempfile.TemporaryDirectory(prefix="retrain-cost-") as tmp:
        state = Path(tmp)
        seed_store(shipped_store or default_store_path(), state / "engines")
        store = EngineStore(state / "engines")
        shipped = store.open()
        lab_test = [(s.path, shipped.classes[s.label]) for s in recorded_split(shipped, lab)["test"]]
        before = {"field": _top1(store.root, test), "lab": _top1(store.root, lab_test), "version": shipped.name}
        _label(state, labelled, shipped.name)
        _fill_pool(state / "trainer", store.root, rest[:unlabelled])
        sections = {
            "daemon": {"state_dir": str(state)},
            "store": {"require_signature": False},
            "trainer": {"unlabelled_term": term, **({"unlabelled_precision": precision} if precision else {})},
        }
        cfg = parse_config(with_sets(sections, sets))
        load_or_create_key(state / "trainer" / "signing.key")

        def once():
            t0 = time.perf_counter()
            result = retrain_in_child(
                cfg,
                store.root,
                state / "trainer",
                state / "trainer" / "strategy",
                state / "trainer" / "signing.key",
                announce=lambda v: None,
                progress=lambda *a, **k: None,
                should_stop=lambda: False,
            )
            after = {"field": _top1(store.root, test), "lab": _top1(store.root, lab_test), "version": store.current()}
            return result, time.perf_counter() - t0, after

        result, seconds, after = once()
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        second = None
        if more:
            _label(state, more, store.current())
            result2, seconds2, after2 = once()
            second = {
                "labels_added": len(more),
                "after": after2,
                "published": result2.published,
                "reason": result2.reason,
                "retrain_seconds": round(seconds2, 1),
                "peak_rss_mb_both": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
                "samples": result2.metrics.get("samples"),
                "gate": result2.metrics.get("gate"),
            }
        if keep is not None:  # the store after the retrain, for other benchmarks (benchmarks.plants --store)
            shutil.copytree(store.root, keep, dirs_exist_ok=True)
    return {
        "seed": seed,
        "labels": len(labelled),
        "field_test_photos": len(test),
        "lab_test_photos": len(lab_test),
        "before": before,
        "after": after,
        "published": result.published,
        "reason": result.reason,
        "retrain_seconds": round(seconds, 1),
        "retrain_peak_rss_mb": round(peak_mb),
        "gate": result.metrics.get("gate"),
        "samples": result.metrics.get("samples"),  # what it trained on (expert, pseudo, waiting past labels_per_retrain)
        "unlabelled": result.metrics.get("unlabelled"),
        "memory": result.metrics.get("memory"),  # the retrain's own record: peak RSS by the end of each phase
        "unlabelled_pool": unlabelled,
        "sets": sets or {},
        "then": second,
    }


def _label(state: Path, photos: list, version: str) -> None:
    """``photos`` stored in the trainer's sample store as expert labels, as the daemon's hand-off would."""
    from trainer.samples import SampleStore

    samples = SampleStore(state / "trainer")
    for p, cls in photos:
        data = p.read_bytes()
        header = {"id": hashlib.sha256(data).hexdigest(), "kind": "expert", "label": cls, "confidence": 1.0}
        samples.add({**header, "engine_version": version, "ext": p.suffix}, data)
    samples.close()


def summarise(out: Path) -> str:
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("seed-*.json"))]

    def ms(values: list[float]) -> str:
        return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"

    r0 = runs[0]
    lines = [
        "# One retrain on an expert's field labels" + (", then a second after more arrive" if r0.get("then") else ""),
        "",
        f"`python -m benchmarks.retrain_cost --out {out} --labels {r0['labels']}"
        + (f" --unlabelled {r0['unlabelled_pool']}" if r0.get("unlabelled_pool") else "")
        + "".join(f" --set {section}.{k}={json.dumps(v)}" for section, kv in r0.get("sets", {}).items() for k, v in kv.items())
        + f"`; {len(runs)} seeds, mean +- sd; "
        f"field test: {r0['field_test_photos']} held-out photos; lab: the release's {r0['lab_test_photos']} test photos.",
        "",
        "| | before | after |",
        "|---|---|---|",
        f"| field top-1 | {ms([r['before']['field'] for r in runs])} | {ms([r['after']['field'] for r in runs])} |",
        f"| lab top-1 | {ms([r['before']['lab'] for r in runs])} | {ms([r['after']['lab'] for r in runs])} |",
        "",
        f"Published: {sum(bool(r['published']) for r in runs)} of {len(runs)}. Retrain wall time "
        f"{ms([r['retrain_seconds'] for r in runs])} s, peak RSS {max(r['retrain_peak_rss_mb'] for r in runs)} MB (2 CPU cores).",
    ]
    thens = [r["then"] for r in runs if r.get("then")]
    if thens:
        lines[2] = lines[2].replace("`;", f" --then {thens[0]['labels_added']}`;", 1)
        waiting = [t["samples"].get("waiting", 0) for t in thens]
        lines += [
            "",
            f"Then {thens[0]['labels_added']} more labels and a second retrain: field top-1 {ms([t['after']['field'] for t in thens])}, "
            f"lab top-1 {ms([t['after']['lab'] for t in thens])}; published {sum(bool(t['published']) for t in thens)} of {len(thens)}; "
            f"trained on {ms([t['samples']['expert'] for t in thens])} expert labels ({ms(waiting)} waiting); "
            f"wall time {ms([t['retrain_seconds'] for t in thens])} s, peak RSS of both {max(t['peak_rss_mb_both'] for t in thens)} MB.",
        ]
    phases = [r["memory"]["by_phase"] for r in runs if r.get("memory")]
    if phases:
        lines += ["", "Peak RSS (MB) the retrain had reached by the end of each phase (the retrain's own record, seed by seed):", ""]
        lines += [f"- {', '.join(f'{k} {v}' for k, v in by_phase.items())}" for by_phase in phases]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--labels", type=int, default=100)
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--field", default="apple-orchard")
    ap.add_argument("--data", default=str(SHARED / "field"))
    ap.add_argument("--lab", default=str(SHARED / "plantvillage"))
    ap.add_argument("--store", default=None, help="Engine store to start from (default: the shipped one).")
    ap.add_argument("--unlabelled", type=int, default=0, help="Photos nobody labelled in the trainer's unlabelled pool.")
    ap.add_argument("--no-term", action="store_true", help="[trainer] unlabelled_term = false.")
    ap.add_argument("--keep", default=None, help="Copy each seed's store after the retrain to DIR/seed-N-engines.")
    ap.add_argument("--precision", type=float, default=None, help="[trainer] unlabelled_precision (default: the trainer's).")
    ap.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="A configuration value (TOML) other than the shipped one."
    )
    ap.add_argument("--then", type=int, default=0, help="Labels that arrive after the first retrain, for a second one.")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a seed in its own process
    args = ap.parse_args(argv)
    from benchmarks._sets import config_sets

    sets = config_sets(args.set)  # first: a malformed one is refused before any work
    for folder, flags in ((Path(args.data) / args.field, "--data and --field"), (Path(args.lab), "--lab")):
        if not folder.is_dir():
            raise SystemExit(
                f"{folder}: no such folder; give {flags} (the field photos: ../shared/data/field with apple-orchard, "
                "the lab photos: ../shared/data/plantvillage)"
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one is not None:
        store = Path(args.store) if args.store else None
        keep = Path(args.keep) / f"seed-{args.one}-engines" if args.keep else None
        result = one_seed(
            args.one,
            args.labels,
            Path(args.data) / args.field,
            Path(args.lab),
            store,
            args.unlabelled,
            not args.no_term,
            keep,
            args.precision,
            sets,
            args.then,
        )
        (out / f"seed-{args.one}.json").write_text(json.dumps(result, indent=2) + "\n")
        return 0
    for seed in args.seeds:
        if not (out / f"seed-{seed}.json").exists():
            cmd = [sys.executable, "-m", "benchmarks.retrain_cost", "--out", str(out), "--labels", str(args.labels), "--one", str(seed)]
            cmd += ["--field", args.field, "--data", args.data, "--lab", args.lab] + (["--store", args.store] if args.store else [])
            cmd += (
                ["--unlabelled", str(args.unlabelled)]
                + (["--no-term"] if args.no_term else [])
                + (["--keep", args.keep] if args.keep else [])
            )
            cmd += ["--precision", str(args.precision)] if args.precision else []
            cmd += [f"--set={item}" for item in args.set] + (["--then", str(args.then)] if args.then else [])
            subprocess.run(cmd, check=True, cwd=REPO)
    print(summarise(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
