"""Which of a class's confident answers the expert should check: the hardest first, a fair draw, or half of each.

``python -m benchmarks.check_order RUN_DIR [--seeds 1 2 3] [--per-day 7] [--draws 200] [--out FILE]``

Replays, on real field photos, the trust a class earns from the expert's checks, with the engines a finished
``benchmarks.field_loop`` run published (``RUN_DIR/seed-<N>/state/engines``, each version in turn as if it served the
whole season). The seed's stream (the photos the device is given, never its held-out test) arrives in days of 100;
each day the class's confident answers join its pool of checks, and the expert checks up to ``--per-day`` of them
(about half of 15 questions a day, all on the class nearest to trust, as :func:`edge_agent.review.checks.nearest_first`
does), in one of three orders:

* ``margin``: the smallest margin first, as :func:`edge_agent.review.rank.rank` orders them today;
* ``drawn``: a fair draw from the pool (``--draws`` draws, averaged);
* ``mixed``: the smallest-margin half of the day's checks (rounded up), the rest a fair draw (``--draws`` draws).

Each check is scored by the device's own rule (:func:`edge_agent.review.checks.standing`), with the shipped policy
and the other tests in ``RULES``. Reported per engine and class: the precision of all its confident answers on the
stream (what its pseudo-labels would be) and on the held-out test, and per rule the day it is first trusted under
``margin`` (or never within the stream) and the share of ``drawn`` and of ``mixed`` draws that trust it.
Pseudo-labels must be 95 % right: a class whose confident answers are right less often should not be trusted. A
second table gives each class's precision at higher confidences (stream and test together), to see whether a higher
threshold would do.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from benchmarks.field_loop import SHARED, split_field

__all__ = ["BANDS", "RULES", "by_day", "main", "trust_day", "write_report"]

#: The trust tests replayed: the shipped one, the earlier ones, stricter and looser ones ([labels] settings).
RULES = {
    "0.97 vs 0.80, from 0.9 (shipped until 2026-11-26)": {"trust_against": 0.80, "trust_confidence": 0.9},
    "0.97 vs 0.85, from 0.9 (shipped until 2026-11-27)": {"trust_confidence": 0.9},
    "0.98 vs 0.85, from 0.9": {"trust_precision": 0.98, "trust_against": 0.85, "trust_confidence": 0.9},
    "0.97 vs 0.85, from 0.98 (shipped: trust_confidence)": {},
    "0.97 vs 0.85, from 0.95": {"trust_confidence": 0.95},
    "0.97 vs 0.80, from 0.98": {"trust_against": 0.80},
    "0.97 vs 0.85, from 0.99": {"trust_confidence": 0.99},
    "0.97 vs 0.85, from 0.995": {"trust_confidence": 0.995},
}
BANDS = (0.9, 0.95, 0.97, 0.98, 0.99, 0.995)


def trust_day(days: list[list[tuple[float, bool]]], order: str, per_day: int, policy, rng: random.Random | None = None) -> int | None:
    """The first day (1-based) a class's checks earn it trust, given each day's confident answers (margin, right)."""
    from edge_agent.review.checks import standing

    pool: list[tuple[float, bool]] = []
    window: list[bool] = []  # newest first, as check_windows builds it
    for day, arrivals in enumerate(days, 1):
        pool += arrivals
        if order == "drawn":
            rng.shuffle(pool)
        else:
            pool.sort(key=lambda a: a[0])
        if order == "mixed":  # the least sure half, then a fair draw from the rest
            least, rest = pool[: (per_day + 1) // 2], pool[(per_day + 1) // 2 :]
            rng.shuffle(rest)
            pool = least + rest
        asked, pool = pool[:per_day], pool[per_day:]
        for _, right in asked:
            window = [right, *window][: policy.trust_window]
            if standing("", window, policy).trusted:
                return day
    return None


def _predict(store, version: str, photos: list, cfg) -> list:
    import numpy as np

    from edge_agent.classifier import Classifier
    from edge_agent.preprocess import PreprocessSpec, preprocess_file
    from engines.loader import open_engine

    opened = store.open(version)
    spec = PreprocessSpec.from_manifest(opened.manifest["preprocess"])
    x = np.stack([preprocess_file(p, spec) for p, _ in photos])
    clf = Classifier.configured(open_engine(store, cfg.engine, version=version), cfg)
    try:
        return [p for i in range(0, len(x), 64) for p in clf.predict_tensors(x[i : i + 64])]
    finally:
        clf.engine.close()


def _confident(preds: list, truth: list[int], classes: list[str], policy) -> dict[str, list[tuple[int, float, float, bool]]]:
    """class -> (index, margin, confidence, right) of every answer that would become a pseudo-label once trusted."""
    from edge_agent.labelling import decide
    from edge_agent.review.rank import margin

    out: dict[str, list] = {}
    every = policy.model_copy(update={"trust_confidence": policy.pseudo_threshold})  # every confident answer
    for i, (p, t) in enumerate(zip(preds, truth)):
        if decide(p.verdict, p.confidence, every, trusted=True) == "pseudo":
            out.setdefault(p.label, []).append((i, margin(p.top_k), p.confidence, classes.index(p.label) == t))
    return out


def by_day(answers: list, threshold: float, day_size: int, days: int) -> tuple[list, list[list[tuple[float, bool]]]]:
    """The answers at ``threshold`` or above (a stricter threshold: fewer checks and pseudo-labels), and each day's
    (margin, right) of them, the stream arriving ``day_size`` photos a day."""
    mine = [a for a in answers if a[2] >= threshold]
    return mine, [[(m, r) for i, m, _, r in mine if i // day_size == d] for d in range(days)]


def _share(answers: list) -> tuple[int, float | None]:
    return len(answers), (round(sum(a[-1] for a in answers) / len(answers), 3) if answers else None)


def _drawn(order: str, days: list[int | None]) -> dict:
    """The share of an order's draws that trust the class, and their mean day of trust."""
    trusted = [d for d in days if d is not None]
    return {
        f"{order}_trusted": round(len(trusted) / len(days), 3),
        f"{order}_day": round(statistics.fmean(trusted), 2) if trusted else None,
    }


def replay(run_dir: Path, seed: int, per_day: int, draws: int, field: str = "apple-orchard", day_size: int = 100) -> list[dict]:
    """One row per engine version and class the engine is confident of: precisions, and each rule's trust."""
    from edge_agent.config import LabelsSection, parse_config
    from engines.store import EngineStore

    cfg = parse_config({})
    policies = {name: LabelsSection(**(cfg.labels.model_dump() | change)) for name, change in RULES.items()}
    store = EngineStore(run_dir / f"seed-{seed}" / "state" / "engines")
    classes = list(store.open("v2000").classes)
    test, stream = split_field(SHARED / "field" / field, classes, seed, 0.25)
    rows = []
    for version in sorted(v for v in store.versions() if v > "v2000"):
        sure = _confident(_predict(store, version, stream, cfg), [y for _, y in stream], classes, cfg.labels)
        held = _confident(_predict(store, version, test, cfg), [y for _, y in test], classes, cfg.labels)
        for label, answers in sorted(sure.items()):
            both = answers + held.get(label, [])
            row = {"seed": seed, "engine": version, "class": label}
            row["confident"], row["precision"] = _share(answers)
            row["test_confident"], row["test_precision"] = _share(held.get(label, []))
            row["bands"] = {str(b): _share([a for a in both if a[2] >= b]) for b in BANDS}
            row["rules"] = {}
            for name, policy in policies.items():
                mine, mine_days = by_day(answers, policy.trust_from, day_size, len(stream) // day_size)
                drawn = [trust_day(mine_days, "drawn", per_day, policy, random.Random(k)) for k in range(draws)]
                mixed = [trust_day(mine_days, "mixed", per_day, policy, random.Random(k)) for k in range(draws)]
                row["rules"][name] = {
                    "margin_day": trust_day(mine_days, "margin", per_day, policy),
                    **_drawn("drawn", drawn),
                    **_drawn("mixed", mixed),
                    "pseudo": _share(mine),
                }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict], command: str) -> str:
    """The trust table and the precision-by-confidence table."""
    rules = list(RULES)
    mixed = any("mixed_trusted" in t for r in rows for t in r["rules"].values())  # reports before 2026-12-07 lack it
    out = [
        f"`{command}`",
        "",
        "Confident answers: how many of the stream's, and the share right (what its pseudo-labels would be). Each rule: "
        "the day the class is first trusted when its smallest-margin answers are checked first (- never), the "
        "share of fair draws that trust it, "
        + ("the share of mixed draws (half smallest-margin, half drawn) that trust it, " if mixed else "")
        + "and the share right of the stream's answers it would check and pseudo-label "
        "(a rule with its own confidence threshold takes fewer).",
        "",
        "| seed | engine | class | stream: right of | held-out test: right of | " + " | ".join(rules) + " |",
        "|---|---|---|---|---|" + "---|" * len(rules),
    ]
    for r in rows:
        test = f"{r['test_precision']:.3f} of {r['test_confident']}" if r["test_precision"] is not None else "-"
        cells = []
        for name in rules:
            t = r["rules"][name]
            n, right = t.get("pseudo", (r["confident"], r["precision"]))
            mix = f"mixed {t['mixed_trusted']:.2f}; " if "mixed_trusted" in t else ""
            cells.append(f"day {t['margin_day'] or '-'}; drawn {t['drawn_trusted']:.2f}; {mix}" + (f"{right:.3f} of {n}" if n else "none"))
        out.append(
            f"| {r['seed']} | {r['engine']} | {r['class'].split('___')[-1]} | {r['precision']:.3f} of {r['confident']} | {test} | "
            + " | ".join(cells)
            + " |"
        )
    out += [
        "",
        "Precision of the confident answers at or above each confidence (stream and held-out test together):",
        "",
        "| seed | engine | class | " + " | ".join(f">= {b}" for b in BANDS) + " |",
        "|---|---|---|" + "---|" * len(BANDS),
    ]
    for r in rows:
        cells = [f"{p:.2f} of {n}" if p is not None else "-" for n, p in (r["bands"][str(b)] for b in BANDS)]
        out.append(f"| {r['seed']} | {r['engine']} | {r['class'].split('___')[-1]} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def write_report(text: str, rows: list[dict], out: Path | None) -> None:
    """The table printed, and with ``out`` written there (markdown) beside its rows (``out`` with ``.jsonl``)."""
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.check_order", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a benchmarks.field_loop arm's folder, e.g. .../device-fast")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--per-day", type=int, default=7, help="checks a day, all on the class nearest to trust")
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None, help="write the table (markdown) and FILE.jsonl")
    args = ap.parse_args(argv)
    rows = [r for seed in args.seeds for r in replay(args.run_dir, seed, args.per_day, args.draws)]
    text = markdown(rows, "python -m benchmarks.check_order " + " ".join(argv if argv is not None else sys.argv[1:]))
    write_report(text, rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
