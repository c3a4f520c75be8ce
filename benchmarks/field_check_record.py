"""What the field check's decisions did held out, over every stored ``benchmarks.field_loop`` run.

``python -m benchmarks.field_check_record [RESULTS_DIR] [--runs PATTERN]`` (default ``benchmarks/results``, every
run) reads each ``<run>/<arm>/seed-<N>/report.json`` and, for every version published over another on the field check's word, how
the held-out field top-1 moved from the version it replaced, split by how the candidate passed: right on more of the
held-back photos than the version in service, or on as many (a tie, which publishes). The loop's first publication
(over the shipped model, before the field check has seen much) is left out, as are days the check did not judge.
Days that several runs share (a run that repeats another's first days with the same versions and figures) count once.
It answers whether ties should publish and how often a version the check passed was worse held out.

A second table reads the runs that also scored every candidate the check judged, refused ones too (their ``judged``
records, since 2026-12-02): per margin on the held-back photos (the candidate's right photos less the version in
service's), how many candidates, and how the candidate stood held out against the version in service; and, where the
trainer recorded it (since 2026-12-06), how many had the lower log-loss on the held-back photos. A third table
splits those with a recorded log-loss by both readings of the held-back photos (right on more, as many or fewer; the
lower log-loss or not): whether the log-loss tells a refused candidate that is better held out from one that is not.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

__all__ = ["decisions", "summary", "judged", "by_margin", "by_log_loss"]


def _top1(field) -> float | None:
    """A day's held-out field top-1 (the report stores a number, or a dict with ``top1``)."""
    return field.get("top1") if isinstance(field, dict) else field


def decisions(report: dict) -> list[dict]:
    """One row per version a report's loop published over a version of its own: the day, "more" or "tie", the
    held-back photos, and the held-out field top-1 before and after."""
    rows, before, first = [], None, True
    for day in report.get("days") or []:
        after = _top1(day.get("field"))
        retrain = day.get("retrain") or {}
        check = retrain.get("field_check") or {}
        if retrain.get("published"):
            if not first and "field_candidate_right" in check and before is not None and after is not None:
                tie = check["field_candidate_right"] == check["field_current_right"]
                rows.append(
                    {
                        "day": day["day"],
                        "passed_on": "tie" if tie else "more",
                        "held_back": check["field_photos"],
                        "before": before,
                        "after": after,
                    }
                )
            first = False
        before = after
    return rows


def _once(rows: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """``rows`` with those equal on ``keys`` kept once (the same seed's same day in two runs that share it): the one
    that recorded the most (a later run of the same day may carry figures an earlier one did not)."""
    kept: dict[tuple, dict] = {}
    for r in rows:
        key = tuple(r[k] for k in keys)
        if key not in kept or sum(v is not None for v in r.values()) > sum(v is not None for v in kept[key].values()):
            kept[key] = r
    return list(kept.values())


def judged(report: dict, seed: int | None = None) -> list[dict]:
    """One row per day whose one judged candidate a report scored held out: the day, the margin on the held-back
    photos, their number, whether it passed, and the candidate's and the version in service's held-out field top-1."""
    rows = []
    for day in report.get("days") or []:
        retrain = day.get("retrain") or {}
        check, scored = retrain.get("field_check") or {}, retrain.get("judged") or []
        if len(scored) != 1 or "field_candidate_right" not in check:
            continue  # no judged record, or several candidates on one decision (which one it names is unknown)
        rows.append(
            {
                "seed": seed,
                "day": day["day"],
                "margin": check["field_candidate_right"] - check["field_current_right"],
                "held_back": check["field_photos"],
                "passed": bool(scored[0]["passed"]),
                "candidate": scored[0]["candidate"],
                "in_service": scored[0]["in_service"],
                # the held-back photos' log-loss of each side, where the trainer recorded it (since 2026-12-06)
                "candidate_log_loss": check.get("field_candidate_log_loss"),
                "in_service_log_loss": check.get("field_current_log_loss"),
            }
        )
    return rows


def by_margin(rows: list[dict], widest: int = 3) -> dict[int, dict]:
    """Per margin (clipped to +-``widest``), the candidates the check judged once each: how many, passed, better and
    worse held out than the version in service, the mean, lowest and highest held-out change, and of those whose
    log-loss was recorded, how many had the lower one on the held-back photos."""
    out: dict[int, list] = {}
    for r in _judged_once(rows):
        out.setdefault(max(-widest, min(widest, r["margin"])), []).append(r)
    table = {}
    for m in sorted(out):
        change = [r["candidate"] - r["in_service"] for r in out[m]]
        table[m] = _tally(out[m]) | {
            "lowest": round(min(change), 4),
            "highest": round(max(change), 4),
            "held_back_median": statistics.median(r["held_back"] for r in out[m]),
            "log_loss_recorded": len(losses := [r for r in out[m] if r["candidate_log_loss"] is not None]),
            "log_loss_lower": sum(r["candidate_log_loss"] < r["in_service_log_loss"] for r in losses),
        }
    return table


def _judged_once(rows: list[dict]) -> list[dict]:
    return _once(rows, ("seed", "day", "margin", "held_back", "candidate", "in_service"))


def _tally(rows: list[dict]) -> dict:
    """Judged candidates: how many, passed, better and worse held out than the version in service, the mean change."""
    change = [r["candidate"] - r["in_service"] for r in rows]
    return {
        "candidates": len(change),
        "passed": sum(r["passed"] for r in rows),
        "better": sum(c > 0 for c in change),
        "worse": sum(c < 0 for c in change),
        "mean_change": round(statistics.fmean(change), 4),
    }


def by_log_loss(rows: list[dict]) -> dict[tuple[str, bool], dict]:
    """Of the judged candidates whose log-loss was recorded, per (``more``, ``tie`` or ``fewer`` right on the held-back
    photos; the lower log-loss there or not): how many, passed, better and worse held out, and the mean held-out change."""
    out: dict[tuple[str, bool], list] = {}
    for r in _judged_once(rows):
        if r["candidate_log_loss"] is None or r["in_service_log_loss"] is None:
            continue
        right = "more" if r["margin"] > 0 else "tie" if r["margin"] == 0 else "fewer"
        out.setdefault((right, r["candidate_log_loss"] < r["in_service_log_loss"]), []).append(r)
    return {key: _tally(out[key]) for key in sorted(out, key=lambda k: (("more", "tie", "fewer").index(k[0]), not k[1]))}


def summary(rows: list[dict], worse_by: float = 0.01) -> dict:
    """Per way of passing ("more", "tie"): publications, mean and sd of the held-out change, how many were worse and
    worse by more than ``worse_by``, and the worst change."""
    out = {}
    for kind in ("more", "tie"):
        change = [r["after"] - r["before"] for r in rows if r["passed_on"] == kind]
        if not change:
            continue
        out[kind] = {
            "published": len(change),
            "mean_change": round(statistics.fmean(change), 4),
            "sd_change": round(statistics.stdev(change), 4) if len(change) > 1 else 0.0,
            "worse": sum(c < 0 for c in change),
            f"worse_by_over_{worse_by}": sum(c < -worse_by for c in change),
            "worst_change": round(min(change), 4),
            "held_back_median": statistics.median(r["held_back"] for r in rows if r["passed_on"] == kind),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.field_check_record", description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, nargs="?", default=Path("benchmarks/results"), help="folder of field_loop runs")
    p.add_argument("--runs", default="*", help="only the run folders whose name matches this pattern (field-loop-v4000*)")
    a = p.parse_args(argv)
    reports = sorted(a.results.glob(f"{a.runs}/**/seed-*/report.json"))
    if not reports:
        raise SystemExit(f"{a.results}: no <run>/<arm>/seed-<N>/report.json here; give the folder the field loop wrote to")
    rows, scored = [], []
    for path in reports:
        try:
            report, seed = json.loads(path.read_text()), int(path.parent.name.removeprefix("seed-"))
            rows += [r | {"seed": seed} for r in decisions(report)]
            scored += judged(report, seed)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SystemExit(f"{path}: not a field loop report ({exc}); remove it or run the loop again") from exc
    rows = _once(rows, ("seed", "day", "passed_on", "held_back", "before", "after"))
    print(
        f"{len(rows)} publications judged by the field check (a day that several runs share counted once), from {len(reports)} reports under {a.results}"
    )
    print("| passed on | published | held-out change, mean +- sd | worse | worse by > 1 pt | worst | held-back photos (median) |")
    print("|---|---|---|---|---|---|---|")
    for kind, s in summary(rows).items():
        print(
            f"| {'more right' if kind == 'more' else 'a tie'} | {s['published']} | {s['mean_change'] * 100:+.1f} +- "
            f"{s['sd_change'] * 100:.1f} pts | {s['worse']} | {s['worse_by_over_0.01']} | {s['worst_change'] * 100:+.1f} pts | "
            f"{s['held_back_median']:g} |"
        )
    table = by_margin(scored)
    if not table:
        return
    print()
    print(f"{sum(t['candidates'] for t in table.values())} candidates the check judged and the run scored held out (refused ones too)")
    print(
        "| margin on the held-back photos | candidates | passed | better held out | worse | held-out change, mean (lowest, highest) "
        "| held-back photos (median) | lower log-loss there (of those recorded) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for m, t in table.items():
        edge = " or less" if m == -3 else " or more" if m == 3 else ""
        print(
            f"| {m:+d}{edge} | {t['candidates']} | {t['passed']} | {t['better']} | {t['worse']} | "
            f"{t['mean_change'] * 100:+.1f} ({t['lowest'] * 100:+.1f}, {t['highest'] * 100:+.1f}) pts | {t['held_back_median']:g} | "
            + (f"{t['log_loss_lower']} of {t['log_loss_recorded']} |" if t["log_loss_recorded"] else "- |")
        )
    losses = by_log_loss(scored)
    if not losses:
        return
    print()
    print(f"{sum(t['candidates'] for t in losses.values())} of them with each side's log-loss on the held-back photos recorded")
    print("| right on the held-back photos | log-loss there | candidates | passed | better held out | worse | held-out change, mean |")
    print("|---|---|---|---|---|---|---|")
    for (right, lower), t in losses.items():
        print(
            f"| {right} | {'lower' if lower else 'not lower'} | {t['candidates']} | {t['passed']} | {t['better']} | "
            f"{t['worse']} | {t['mean_change'] * 100:+.1f} pts |"
        )


if __name__ == "__main__":
    main()
