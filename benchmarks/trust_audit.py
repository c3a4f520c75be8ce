"""What a trusted class's audits cost the expert and what they save: a worse engine's wrong pseudo-labels.

``python -m benchmarks.trust_audit [--runs 1000] [--out DIR]``

A simulated class that has just earned trust (23 right checks, the defaults' test) gives ``--per-day`` sure answers
a day. For ``--days`` days the engine serving is right on them with ``--good`` precision; then a swap brings one right
``--bad`` of the time (each value in turn), for ``--days`` more. Each day a trusted class's answers become
pseudo-labels, but for its audits (the daemon's own :func:`edge_agent.review.checks.audited` at each
``audit_share``); an untrusted class's answers all go to the review pool as checks. The expert answers the day's
audits and at most ``--checks`` of the other checks a day (half of the default budget of 10 questions); each answer
enters the class's window and :func:`edge_agent.review.checks.standing` judges it the next day.

Reported per share: before the swap, the expert's questions a day, the days the class was untrusted (a right engine
whose trust an unlucky audit took away) and the pseudo-labels a day; after it, for each worse precision, the wrong
pseudo-labels made in the days after it (mean and 90th percentile) and the share of runs that never lost trust.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from benchmarks.trust_rules import report
from edge_agent.config import LabelsSection
from edge_agent.review.checks import audited, right_checks_to_trust, standing

SHARES = (0.0, 0.02, 0.05, 0.1, 0.2)


def simulate(
    policy: LabelsSection, rng: random.Random, run: int, precisions: list[float], days: int, per_day: int, checks: int
) -> list[dict]:
    """One class, one phase per precision of ``days`` days; per phase its questions, untrusted days, pseudo-labels made
    and how many were wrong, and the day trust was lost (None: kept)."""
    window = [True] * right_checks_to_trust(policy)  # newest first: the class has just earned trust
    phases = []
    for phase, p in enumerate(precisions):
        out = {"asked": 0, "untrusted_days": 0, "made": 0, "wrong": 0, "lost_day": None}
        for day in range(days):
            trusted = standing("A", window, policy).trusted
            out["untrusted_days"] += not trusted
            answers = [(f"{run}:{phase}:{day}:{i}", rng.random() < p) for i in range(per_day)]
            if trusted:
                drawn = [(audited(sha, policy), right) for sha, right in answers]
                audits = [right for audit, right in drawn if audit]
                made = [right for audit, right in drawn if not audit]
                out["made"] += len(made)
                out["wrong"] += made.count(False)
                asked = audits
            else:
                asked = [right for _, right in answers[:checks]]
            for right in asked:
                window.insert(0, right)
            del window[policy.trust_window :]
            out["asked"] += len(asked)
            if trusted and out["lost_day"] is None and not standing("A", window, policy).trusted:
                out["lost_day"] = day
        phases.append(out)
    return phases


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.trust_audit")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--days", type=int, default=30, help="days before the swap, and after it")
    ap.add_argument("--per-day", type=int, default=20, help="the class's sure answers a day")
    ap.add_argument("--checks", type=int, default=5, help="checks of an untrusted class the expert answers a day")
    ap.add_argument("--good", type=float, default=0.99)
    ap.add_argument("--bad", type=float, nargs="+", default=[0.9, 0.8, 0.6])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = [
        f"# Audits of a trusted class: {args.runs} simulated runs; {args.per_day} sure answers a day, {args.checks} checks "
        f"a day answered while untrusted; {args.days} days right {args.good}, then {args.days} days at each worse precision",
        "",
        "| audit_share | before the swap: questions a day / days untrusted / pseudo-labels a day (wrong) | "
        + " | ".join(
            f"swap to {b}: wrong pseudo-labels in the {args.days} days after, mean (90th pct) / trust never lost" for b in args.bad
        )
        + " |",
        "|---|---|" + "---|" * len(args.bad),
    ]
    summary = []
    for share in SHARES:
        policy = LabelsSection(audit_share=share)
        row = {"audit_share": share, "after": {}}
        good = []
        cells = []
        for bad in args.bad:
            rng = random.Random(20261206)
            runs = [simulate(policy, rng, i, [args.good, bad], args.days, args.per_day, args.checks) for i in range(args.runs)]
            good += [r[0] for r in runs]
            wrong = sorted(r[1]["wrong"] for r in runs)
            never = sum(r[1]["lost_day"] is None and r[1]["untrusted_days"] == 0 for r in runs) / len(runs)
            p90 = wrong[int(0.9 * (len(wrong) - 1))]
            cells.append(f"{statistics.mean(wrong):.1f} ({p90}) / {never:.2f}")
            row["after"][str(bad)] = {"wrong_mean": statistics.mean(wrong), "wrong_p90": p90, "never_lost": never}
        asked = statistics.mean(g["asked"] for g in good) / args.days
        untrusted = statistics.mean(g["untrusted_days"] for g in good)
        made = statistics.mean(g["made"] for g in good) / args.days
        wrong_good = statistics.mean(g["wrong"] for g in good) / args.days
        row.update(asked_per_day=asked, untrusted_days=untrusted, made_per_day=made, wrong_per_day_before=wrong_good)
        summary.append(row)
        lines.append(
            f"| {share} | {asked:.2f} / {untrusted:.1f} of {args.days} / {made:.1f} ({wrong_good:.2f}) | " + " | ".join(cells) + " |"
        )
    report(lines, summary, args.out, "trust_audit")


if __name__ == "__main__":
    main()
