"""Which trust rule and which order of checks let a class earn pseudo-labels soonest without trusting a wrong one.

``python -m benchmarks.trust_rules [--runs 4000] [--out DIR]``

A simulated farm: four classes whose confident answers are right with a fixed probability each (the true precision,
unknown to the device), each giving ``--confident`` confident photos a day to the review pool; an expert answering
``--per-day`` questions a day, half of them checks while unsure photos are plentiful (the queue alternates), for
``--days`` days. Each rule is the device's own function (:func:`edge_agent.review.checks.standing`) over the class's
latest ``trust_window`` checks; each order is how the day's checks are shared between the classes:

* ``spread``: round-robin over the classes (what margin ranking with a class penalty does);
* ``nearest``: the class that needs the fewest more right checks first (:func:`edge_agent.review.checks.nearest_first`).

Reported per class precision: the share of runs in which the class is trusted at the end, the mean day it was first
trusted, and the share of runs in which it was trusted on any day at all; and the precision of the pseudo-labels the
trusted days would have made.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from edge_agent.config import LabelsSection
from edge_agent.review.checks import nearest_first, standing

PRECISIONS = (0.99, 0.96, 0.90, 0.75)

RULES = {
    "wilson (<= 2026-11: 10 checks, Wilson lower >= 0.95)": {"trust_rule": "wilson", "trust_checks": 10, "trust_precision": 0.95},
    "sequential 0.97 vs 0.80, 5 % (the default until 2026-11-26)": {"trust_against": 0.80},
    "sequential 0.97 vs 0.85, 5 % (the default)": {},
    "sequential 0.97 vs 0.70, 5 %": {"trust_against": 0.70},
    "sequential 0.98 vs 0.85, 5 %": {"trust_precision": 0.98, "trust_against": 0.85},
}


def simulate(policy: LabelsSection, order: str, rng: random.Random, days: int, per_day: int, confident: int) -> dict:
    """One farm: per class, the day it was first trusted (None: never), trusted at the end, pseudo-labels made/right."""
    windows: dict[int, list[bool]] = {k: [] for k in range(len(PRECISIONS))}  # newest first
    first: dict[int, int | None] = {k: None for k in windows}
    made = right = 0
    for day in range(1, days + 1):
        # the day's confident photos: a trusted class's become pseudo-labels, the others wait in the pool as checks
        trusted = {k for k, w in windows.items() if standing(str(k), w, policy).trusted}
        for k in trusted:
            hits = sum(rng.random() < PRECISIONS[k] for _ in range(confident))
            made, right = made + confident, right + hits
        open_ = [k for k in windows if k not in trusted]
        checks = per_day // 2 + per_day % 2
        if order == "spread":
            asked = [open_[i % len(open_)] for i in range(checks)] if open_ else []
        else:
            asked = []
            for _ in range(checks):
                ranked = nearest_first({str(k): windows[k] for k in open_}, policy)
                if not ranked:
                    break
                k = int(ranked[0])
                asked.append(k)
                windows[k].insert(0, rng.random() < PRECISIONS[k])
                del windows[k][policy.trust_window :]
                if standing(str(k), windows[k], policy).trusted:
                    open_.remove(k)
            asked = []  # already answered one at a time
        for k in asked:
            windows[k].insert(0, rng.random() < PRECISIONS[k])
            del windows[k][policy.trust_window :]
        for k, w in windows.items():
            if first[k] is None and standing(str(k), w, policy).trusted:
                first[k] = day
    end = {k: standing(str(k), w, policy).trusted for k, w in windows.items()}
    return {"first": first, "end": end, "made": made, "right": right}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.trust_rules")
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--days", type=int, default=6)
    ap.add_argument("--per-day", type=int, default=15, help="expert questions a day (half are checks)")
    ap.add_argument("--confident", type=int, default=10, help="confident photos a class gives a day")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = [
        f"# Trust rules: {args.runs} simulated farms, {args.days} days, {args.per_day} questions a day (half checks), "
        f"{args.confident} confident photos a class a day; classes' true precision {', '.join(map(str, PRECISIONS))}",
        "",
        "| rule | order | "
        + " | ".join(f"p={p}: trusted at the end / first day / ever" for p in PRECISIONS)
        + " | pseudo-labels a farm / right |",
        "|---|---|" + "---|" * (len(PRECISIONS) + 1),
    ]
    summary = []
    for name, overrides in RULES.items():
        policy = LabelsSection(**overrides)
        for order in ("spread", "nearest"):
            rng = random.Random(20261125)
            runs = [simulate(policy, order, rng, args.days, args.per_day, args.confident) for _ in range(args.runs)]
            cells = []
            row = {"rule": name, "order": order, "classes": {}}
            for k, p in enumerate(PRECISIONS):
                at_end = sum(r["end"][k] for r in runs) / len(runs)
                days = [r["first"][k] for r in runs if r["first"][k] is not None]
                ever = len(days) / len(runs)
                day = f"{statistics.mean(days):.1f}" if days else "-"
                cells.append(f"{at_end:.2f} / {day} / {ever:.3f}")
                row["classes"][str(p)] = {"trusted_at_end": at_end, "first_day_mean": statistics.mean(days) if days else None, "ever": ever}
            made = sum(r["made"] for r in runs) / len(runs)
            right = sum(r["right"] for r in runs) / max(1, sum(r["made"] for r in runs))
            row.update(pseudo_labels=made, pseudo_precision=right)
            summary.append(row)
            lines.append(f"| {name} | {order} | " + " | ".join(cells) + f" | {made:.0f} / {right:.3f} |")
    report(lines, summary, args.out, "trust_rules")


def report(lines: list[str], summary: list[dict], out: Path | None, name: str) -> None:
    """Print the table; with ``out``, write it there as ``name.md`` and the figures as ``name.json``."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.md").write_text(text)
        (out / f"{name}.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
