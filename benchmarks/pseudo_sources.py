"""Where a loop's pseudo-labels came from, and how sure: photos answered once against photos answered again.

``python -m benchmarks.pseudo_sources RUN_DIR [--seeds 1] [--bars 0.99 0.995] [--out FILE]``

Reads a finished ``benchmarks.field_loop`` run's kept state (``RUN_DIR/seed-<N>``: its ``report.json`` and ledger
``state/results.sqlite``). Each pseudo-label the daemon delivered (``pseudo_sent``) is *answered again* where the
version that made it had answered the photo again in the review pool (``pool_answers``: a photo an earlier version
was unsure of, or sure of a class not yet trusted, given another chance at every swap:
:mod:`edge_agent.review.reanswer`), else *answered once* (the answer it arrived with; or, a few, a pool photo its
first version made a pseudo-label once the class was trusted). The confidence is the answer that made it. Reported
per seed and over all the seeds asked: right of made per source and confidence band (from the least confidence trust
covers, ``[labels] trust_confidence``: the bar a pseudo-label meets), and per day the pseudo-labels made and right as
run and those kept were each ``--bars`` value asked of the photos answered again (a first-order estimate: the
retrains on fewer pseudo-labels were not run). The truth of a photo is the field folder it came from, matched by sha256.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.check_order import write_report
from benchmarks.held_back_checks import stream_days
from edge_agent.results import query_readonly

__all__ = ["SOURCES", "Made", "made", "bands", "by_day", "markdown", "main"]

SOURCES = ("answered once", "answered again")


@dataclass(frozen=True)
class Made:
    """One delivered pseudo-label: the day (1-based), whether its photo was answered again, how sure, whether right."""

    day: int
    again: bool
    confidence: float | None
    right: bool


def made(seed_dir: Path) -> tuple[dict, list[Made]]:
    """A kept run's report and each pseudo-label its daemon delivered (see the module)."""
    report, _, path_of, day_at = stream_days(seed_dir)
    classes = report["classes"]
    rows = query_readonly(
        seed_dir / "state" / "results.sqlite",
        "SELECT p.sha256, p.label, p.engine_version, p.sent, r.engine_version, r.confidence, a.engine_version, a.confidence "
        "FROM pseudo_sent p JOIN results r ON r.sha256 = p.sha256 LEFT JOIN pool_answers a ON a.sha256 = p.sha256",
    )
    out = []
    for sha, label, maker, sent, first, first_conf, again, again_conf in rows:
        if sha not in path_of:  # not a photo of the run's stream
            continue
        conf = again_conf if again == maker else first_conf if first == maker else None
        out.append(Made(day_at(sent), again == maker, conf, classes.index(label) == path_of[sha][1]))
    return report, sorted(out, key=lambda m: m.day)


def _tally(made: list[Made]) -> dict:
    """Made and right per source."""
    return {
        s: {"made": sum(m.again == a for m in made), "right": sum(m.right for m in made if m.again == a)}
        for s, a in zip(SOURCES, (False, True))
    }


def bands(made: list[Made], edges: list[float]) -> list[dict]:
    """Right of made per source and confidence band: ``[edges[i], edges[i+1])``, the last band up to 1 included; a
    row for those under ``edges[0]`` (a ledger from before the bar) and for those of unknown confidence, where any."""
    known = [m for m in made if m.confidence is not None]
    rows = [{"band": f"under {edges[0]:g}", "ms": [m for m in known if m.confidence < edges[0]]}]
    for i, lo in enumerate(edges):
        hi = edges[i + 1] if i + 1 < len(edges) else None
        mine = [m for m in known if m.confidence >= lo and (hi is None or m.confidence < hi)]
        rows.append({"band": f"{lo:g} to {hi:g}" if hi is not None else f"{lo:g} and up", "ms": mine})
    rows.append({"band": "not known", "ms": [m for m in made if m.confidence is None]})
    return [{"band": r["band"], **_tally(r["ms"])} for k, r in enumerate(rows) if r["ms"] or 0 < k < len(rows) - 1]


def by_day(made: list[Made], bars: list[float], days: int) -> list[dict]:
    """Per day: made and right as run, and kept and right were each bar asked of the photos answered again."""
    rows = []
    for d in range(1, days + 1):
        mine = [m for m in made if m.day == d]
        row = {"day": d, "made": len(mine), "right": sum(m.right for m in mine), "bars": {}}
        for bar in bars:
            k = [m for m in mine if not m.again or (m.confidence is not None and m.confidence >= bar)]
            row["bars"][f"{bar:g}"] = {"kept": len(k), "right": sum(m.right for m in k)}
        rows.append(row)
    return rows


def _share(right: int, n: int) -> str:
    return f"{right} of {n} ({right / n:.1%})" if n else "-"


def markdown(runs: list[dict], command: str) -> str:
    """Per seed and over all: the band table and the day table (days with pseudo-labels only)."""
    out = [f"`{command}`", ""]
    for r in runs:
        bars = list(r["days"][0]["bars"]) if r["days"] else []
        out += [f"**{r['name']}**: {r['made']} pseudo-labels, {r['right']} right.", ""]
        out += ["| confidence | " + " | ".join(f"{s}: right of made" for s in SOURCES) + " |", "|---|" + "---|" * len(SOURCES)]
        out += [f"| {b['band']} | " + " | ".join(_share(b[s]["right"], b[s]["made"]) for s in SOURCES) + " |" for b in r["bands"]]
        if r["days"]:
            out += [
                "",
                "| day | made: right of made | " + " | ".join(f"answered again at {b} or surer: right of kept" for b in bars) + " |",
            ]
            out += ["|---|---|" + "---|" * len(bars)]
            for d in r["days"]:
                if d["made"]:
                    out.append(
                        f"| {d['day']} | {_share(d['right'], d['made'])} | "
                        + " | ".join(_share(d["bars"][b]["right"], d["bars"][b]["kept"]) for b in bars)
                        + " |"
                    )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from edge_agent.config import parse_config

    ap = argparse.ArgumentParser(prog="python -m benchmarks.pseudo_sources", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", type=Path, nargs="+", help="benchmarks.field_loop arms' folders, e.g. .../device-fast")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1], help="the seed of each folder, in order (one for all)")
    ap.add_argument("--bars", nargs="*", type=float, default=[0.99, 0.995], help="confidences to ask of photos answered again")
    ap.add_argument("--out", type=Path, default=None, help="write the tables (markdown) and FILE.jsonl")
    args = ap.parse_args(argv)
    if len(args.seeds) not in (1, len(args.run_dirs)):
        ap.error(f"--seeds takes one seed, or one per folder ({len(args.run_dirs)} given)")
    seeds = args.seeds * len(args.run_dirs) if len(args.seeds) == 1 else args.seeds
    command = "python -m benchmarks.pseudo_sources " + " ".join(argv if argv is not None else sys.argv[1:])
    policy = parse_config({}).labels
    edges = sorted({policy.trust_from, *(b for b in args.bars if b > policy.trust_from)})
    runs, everything = [], []
    for run_dir, seed in zip(args.run_dirs, seeds):
        report, mine = made(run_dir / f"seed-{seed}")
        everything += mine
        runs.append(
            {
                "name": f"{run_dir} seed {seed}",
                "made": len(mine),
                "right": sum(m.right for m in mine),
                "bands": bands(mine, edges),
                "days": by_day(mine, args.bars, len(report["days"])),
            }
        )
    if len(runs) > 1:
        runs.append(
            {
                "name": "all",
                "made": len(everything),
                "right": sum(m.right for m in everything),
                "bands": bands(everything, edges),
                "days": [],
            }
        )
    write_report(markdown(runs, command), runs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
