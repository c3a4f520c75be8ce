"""What the field check's decisions did held out, over every stored ``benchmarks.field_loop`` run.

``python -m benchmarks.field_check_record [RESULTS_DIR] [--runs PATTERN]`` (default ``benchmarks/results``, every
run) reads each ``<run>/<arm>/seed-<N>/report.json`` and, for every version published over another on the field check's word, how
the held-out field top-1 moved from the version it replaced, split by how the candidate passed: right on more of the
held-back photos than the version in service, or on as many (a tie, which publishes). The loop's first publication
(over the shipped model, before the field check has seen much) is left out, as are days the check did not judge.
It answers whether ties should publish and how often a version the check passed was worse held out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

__all__ = ["decisions", "summary"]


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
    reports = sorted(a.results.glob(f"{a.runs}/*/seed-*/report.json"))
    if not reports:
        raise SystemExit(f"{a.results}: no <run>/<arm>/seed-<N>/report.json here; give the folder the field loop wrote to")
    rows = []
    for path in reports:
        try:
            rows += [r | {"run": str(path.parent.relative_to(a.results))} for r in decisions(json.loads(path.read_text()))]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}: not a field loop report ({exc}); remove it or run the loop again") from exc
    runs = len({r["run"] for r in rows})
    print(f"{len(rows)} publications judged by the field check, in {runs} seeds of {len(reports)} reports under {a.results}")
    print("| passed on | published | held-out change, mean +- sd | worse | worse by > 1 pt | worst | held-back photos (median) |")
    print("|---|---|---|---|---|---|---|")
    for kind, s in summary(rows).items():
        print(
            f"| {'more right' if kind == 'more' else 'a tie'} | {s['published']} | {s['mean_change'] * 100:+.1f} +- "
            f"{s['sd_change'] * 100:.1f} pts | {s['worse']} | {s['worse_by_over_0.01']} | {s['worst_change'] * 100:+.1f} pts | "
            f"{s['held_back_median']:g} |"
        )


if __name__ == "__main__":
    main()
