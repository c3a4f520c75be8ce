"""How often an engine of a kept field-loop run is right when it is sure, per class, on the run's held-out photos: what
a trusted class's pseudo-labels would be worth beyond the few the run made; and, with ``--confusion``, what it
answers each class's held-out photos with, sure or not: where its mistakes lie.

    python -m benchmarks.sure_heldout RUN_DIR/device-fast/seed-N [--versions v4006 v4007] [--confusion]

``RUN_DIR/.../seed-N`` is what ``python -m benchmarks.field_loop`` kept of a seed (its ``report.json`` and ``state/``):
the held-out photos are that seed's test split, each engine is opened from the run's store as the daemon opens it,
and a *sure* answer is what trust covers (``confident`` at ``[labels] trust_from``): a check when the expert labels
one, a pseudo-label once its class is trusted. Prints a line of JSON per version: class -> [sure, right, [(photo,
true class) of each wrong one]]; with ``--confusion``, its held-out top-1 and true class -> {answer: photos}.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

__all__ = ["answers", "sure_answers", "confusion", "main"]


def answers(seed_dir: Path, version: str, test: list | None = None) -> list[tuple[str, str, object]]:
    """``version``'s answers to the seed's held-out photos (``test``, its split where a caller has it already), as the
    device gives them: (photo path, true class, prediction) per photo."""
    from benchmarks.field_loop import _Measure, split_field
    from edge_agent.config import parse_config
    from engines.store import EngineStore

    s = json.loads((seed_dir / "report.json").read_text())["settings"]
    store = EngineStore(seed_dir / "state" / "engines")
    if test is None:
        test, _ = split_field(Path(s["data"]) / s["field"], list(store.open(version).classes), s["seed"], s["test_fraction"])
    classes, sets = _Measure(parse_config({}), test, []).predictions(store, version)
    preds, truths = sets["field"]
    return [(str(path), classes[truth], q) for (path, _), truth, q in zip(test, truths, preds)]


def sure_answers(seed_dir: Path, version: str, test: list | None = None) -> dict[str, list]:
    """Per class, ``version``'s sure answers on the seed's held-out photos (``test``, its split where a caller has it
    already): [how many, how many right, the wrong ones]."""
    from edge_agent.config import parse_config

    trust_from = parse_config({}).labels.trust_from
    out: dict[str, list] = {}
    for path, truth, q in answers(seed_dir, version, test):
        if q.verdict == "confident" and q.confidence >= trust_from:
            row = out.setdefault(q.label, [0, 0, []])
            row[0] += 1
            if q.label == truth:
                row[1] += 1
            else:
                row[2].append((Path(path).name, truth))
    return out


def confusion(answered: list[tuple[str, str, object]]) -> dict:
    """Top-1 of ``answered`` (:func:`answers`) and, per true class, how many of its photos got each answer, the most
    given first."""
    table: dict[str, Counter] = {}
    for _, truth, q in answered:
        table.setdefault(truth, Counter())[q.label] += 1
    right = sum(q.label == truth for _, truth, q in answered)
    return {
        "top1": round(right / len(answered), 4) if answered else None,
        "confusion": {truth: dict(got.most_common()) for truth, got in sorted(table.items())},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sure_heldout", description=__doc__.split("\n\n")[0])
    ap.add_argument("seed_dir", help="a seed's folder of a kept field-loop run (report.json, state/)")
    ap.add_argument("--versions", nargs="+", help="engine versions (default: the one serving at the run's end)")
    ap.add_argument("--confusion", action="store_true", help="print each version's answers per true class instead of its sure ones")
    args = ap.parse_args(argv)
    seed_dir = Path(args.seed_dir)
    versions = args.versions or [json.loads((seed_dir / "report.json").read_text())["days"][-1]["engine"]]
    for v in versions:
        if args.confusion:
            print(json.dumps({"version": v, **confusion(answers(seed_dir, v))}))
        else:
            print(json.dumps({"version": v, "sure": sure_answers(seed_dir, v)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
