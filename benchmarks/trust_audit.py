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
pseudo-labels made in the days after it (mean and 90th percentile) and the share of runs that never lost trust. A
second table counts what the daemon's withdrawal (:mod:`edge_agent.review.withdraw`) takes back: once a check the
expert finds wrong leaves the class untrusted and the serving engine's own checks of it turn against it
(:func:`edge_agent.review.checks.check_evidence` below 0; the engine before the swap starts with the 23 right checks
that earned the trust), every pseudo-label that engine made of it so far (that day's included) is withdrawn; it
gives the wrong pseudo-labels left to train on after the swap, and the right ones taken back before it.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from benchmarks.trust_rules import report
from edge_agent.config import LabelsSection
from edge_agent.review.checks import audited, check_evidence, right_checks_to_trust, standing

SHARES = (0.0, 0.02, 0.05, 0.1, 0.2)


def simulate(
    policy: LabelsSection, rng: random.Random, run: int, precisions: list[float], days: int, per_day: int, checks: int
) -> list[dict]:
    """One class, one phase per precision of ``days`` days; per phase its questions, untrusted days, pseudo-labels made
    and how many were wrong, and the day trust was lost (None: kept)."""
    window = [True] * right_checks_to_trust(policy)  # newest first: the class has just earned trust
    phases = []
    for phase, p in enumerate(precisions):
        tally = [len(window) if phase == 0 else 0, 0]  # this engine's own checks: right, wrong
        out = {"asked": 0, "untrusted_days": 0, "made": 0, "wrong": 0, "lost_day": None, "withdrawn_right": 0, "withdrawn_wrong": 0}
        kept_right = kept_wrong = 0  # this engine's pseudo-labels not withdrawn yet
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
                kept_right, kept_wrong = kept_right + made.count(True), kept_wrong + made.count(False)
                asked = audits
            else:
                asked = [right for _, right in answers[:checks]]
            for right in asked:
                window.insert(0, right)
                tally[not right] += 1
            del window[policy.trust_window :]
            out["asked"] += len(asked)
            trusted_after = standing("A", window, policy).trusted
            if trusted and out["lost_day"] is None and not trusted_after:
                out["lost_day"] = day
            if False in asked and not trusted_after and check_evidence(*tally, policy) < 0:  # the engine's pseudo-labels go
                out["withdrawn_right"] += kept_right
                out["withdrawn_wrong"] += kept_wrong
                kept_right = kept_wrong = 0
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
    taken = [
        "",
        "What the withdrawal takes back (a check found wrong that leaves the class untrusted, where the serving engine's own "
        "checks of it turn against it, withdraws that engine's pseudo-labels of it)",
        "",
        "| audit_share | before the swap: right pseudo-labels withdrawn in the "
        f"{args.days} days (of those made) | "
        + " | ".join(f"swap to {b}: wrong pseudo-labels left after withdrawal, mean (90th pct) / right ones withdrawn" for b in args.bad)
        + " |",
        "|---|---|" + "---|" * len(args.bad),
    ]
    summary = []
    for share in SHARES:
        policy = LabelsSection(audit_share=share)
        row = {"audit_share": share, "after": {}}
        good = []
        cells, left_cells = [], []
        for bad in args.bad:
            rng = random.Random(20261206)
            runs = [simulate(policy, rng, i, [args.good, bad], args.days, args.per_day, args.checks) for i in range(args.runs)]
            good += [r[0] for r in runs]
            wrong = sorted(r[1]["wrong"] for r in runs)
            never = sum(r[1]["lost_day"] is None and r[1]["untrusted_days"] == 0 for r in runs) / len(runs)
            p90 = wrong[int(0.9 * (len(wrong) - 1))]
            cells.append(f"{statistics.mean(wrong):.1f} ({p90}) / {never:.2f}")
            left = sorted(r[1]["wrong"] - r[1]["withdrawn_wrong"] for r in runs)
            left_p90 = left[int(0.9 * (len(left) - 1))]
            right_taken = statistics.mean(r[1]["withdrawn_right"] for r in runs)
            left_cells.append(f"{statistics.mean(left):.1f} ({left_p90}) / {right_taken:.1f}")
            row["after"][str(bad)] = {
                "wrong_mean": statistics.mean(wrong),
                "wrong_p90": p90,
                "never_lost": never,
                "wrong_left_mean": statistics.mean(left),
                "wrong_left_p90": left_p90,
                "right_withdrawn_mean": right_taken,
            }
        asked = statistics.mean(g["asked"] for g in good) / args.days
        untrusted = statistics.mean(g["untrusted_days"] for g in good)
        made = statistics.mean(g["made"] for g in good) / args.days
        wrong_good = statistics.mean(g["wrong"] for g in good) / args.days
        right_before = statistics.mean(g["withdrawn_right"] for g in good)
        row.update(
            asked_per_day=asked,
            untrusted_days=untrusted,
            made_per_day=made,
            wrong_per_day_before=wrong_good,
            right_withdrawn_before=right_before,
        )
        summary.append(row)
        lines.append(
            f"| {share} | {asked:.2f} / {untrusted:.1f} of {args.days} / {made:.1f} ({wrong_good:.2f}) | " + " | ".join(cells) + " |"
        )
        taken.append(f"| {share} | {right_before:.1f} (of {made * args.days:.0f}) | " + " | ".join(left_cells) + " |")
    report(lines + taken, summary, args.out, "trust_audit")


if __name__ == "__main__":
    main()
