"""Trust across swaps: would a class earn trust sooner, and never wrongly, from the serving engine's own checks?

``python -m benchmarks.trust_swaps RUN_DIR [--seeds 1 2 3] [--per-day 7] [--out FILE]``

Replays a finished ``benchmarks.field_loop`` run (``RUN_DIR/seed-<N>``: its ``report.json`` and ``state/engines``)
with the engines in the order the run served them: day d's photos of the stream are answered by the engine serving
that day, and the photos waiting from earlier days are answered again by it (``[labels] reanswer_pool``). Each day
the expert checks up to ``--per-day`` of the serving engine's sure answers of the class (``confident`` at
``[labels] trust_from``), the smallest margin first, as if that class were the one nearest to trust
(:mod:`benchmarks.check_order`'s convention), and each check is scored by the device's own test
(:func:`edge_agent.review.checks.standing`, shipped policy) over two windows:

* ``shipped``: the class's latest ``trust_window`` checks, whichever engine made them (what the daemon reads);
* ``serving``: only the checks of the engine serving (the window starts again at every swap).

Reported per seed and class: the first day each window trusts the class, the days it is trusted, and the serving
engines' precision on the held-out test photos they are sure of in that class on those days (what their
pseudo-labels would be worth; under 0.95 is trust given wrongly).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.check_order import _confident, _predict, write_report
from benchmarks.field_loop import SHARED, split_field
from edge_agent.names import class_phrase

__all__ = ["WINDOWS", "trust_by_day", "replay", "main"]

WINDOWS = ("shipped", "serving")


def trust_by_day(
    days: list[tuple[str, dict[int, tuple[float, bool]]]], arrived: Callable[[int], int], per_day: int, policy
) -> dict[str, list[bool]]:
    """Whether the class is trusted at each day's end under each window. ``days``: per day, the serving engine and its
    sure answers of the class over the whole stream (photo index -> (margin, right)); ``arrived(i)``: the day (0-based)
    photo ``i`` arrives; each photo is checked at most once."""
    from edge_agent.review.checks import standing

    asked: set[int] = set()
    checks: list[tuple[bool, str]] = []  # newest first
    out: dict[str, list[bool]] = {w: [] for w in WINDOWS}
    for d, (engine, sure) in enumerate(days):
        pool = sorted((m, i, r) for i, (m, r) in sure.items() if arrived(i) <= d and i not in asked)
        for _, i, right in pool[:per_day]:
            asked.add(i)
            checks.insert(0, (right, engine))
        windows = {
            "shipped": [r for r, _ in checks][: policy.trust_window],
            "serving": [r for r, e in checks if e == engine][: policy.trust_window],
        }
        for w in WINDOWS:
            out[w].append(standing("", windows[w], policy).trusted)
    return out


def replay(run_dir: Path, seed: int, per_day: int, field: str = "apple-orchard", day_size: int = 100) -> list[dict]:
    """One row per class any serving engine was sure of: each window's trust and what it was worth held out."""
    from edge_agent.config import parse_config
    from engines.store import EngineStore

    cfg = parse_config({})
    policy = cfg.labels
    root = run_dir / f"seed-{seed}"
    report = json.loads((root / "report.json").read_text())
    serving = [report["start"]["engine"]] + [d["engine"] for d in report["days"][:-1]]
    store = EngineStore(root / "state" / "engines")
    classes = list(store.open(serving[0]).classes)
    test, stream = split_field(SHARED / "field" / field, classes, seed, 0.25)
    sure, held = {}, {}
    for version in sorted(set(serving)):
        at = policy.trust_from
        s = _confident(_predict(store, version, stream, cfg), [y for _, y in stream], classes, policy)
        h = _confident(_predict(store, version, test, cfg), [y for _, y in test], classes, policy)
        sure[version] = {label: {i: (m, r) for i, m, c, r in a if c >= at} for label, a in s.items()}
        held[version] = {label: [r for _, _, c, r in a if c >= at] for label, a in h.items()}
    rows = []
    for label in sorted({lb for v in sure.values() for lb in v}):
        days = [(v, sure[v].get(label, {})) for v in serving]
        trusted = trust_by_day(days, lambda i: i // day_size, per_day, policy)
        row = {"seed": seed, "class": label, "engines": serving}
        for w in WINDOWS:
            on = [d for d, t in enumerate(trusted[w]) if t]
            worth = [r for d in on for r in held[serving[d]].get(label, [])]
            row[w] = {"first_day": on[0] + 1 if on else None, "days": len(on), "heldout_right": sum(worth), "heldout_sure": len(worth)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict], command: str) -> str:
    """The table: per seed and class, each window's first day trusted, days trusted and held-out precision then."""
    out = [
        f"`{command}`",
        "",
        "Per window: the first day the class is trusted (- never), the days of the run it is trusted, and the serving "
        "engines' sure answers of the class on the held-out photos on those days (right of sure).",
        "",
        "| seed | class | shipped: first day, days, held out | serving engine's checks: first day, days, held out |",
        "|---|---|---|---|",
    ]
    for r in rows:
        cells = []
        for w in WINDOWS:
            t = r[w]
            worth = f"{t['heldout_right']} of {t['heldout_sure']}" if t["heldout_sure"] else "-"
            cells.append(f"{t['first_day'] or '-'}, {t['days']}, {worth}")
        out.append(f"| {r['seed']} | {class_phrase(r['class'])} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.trust_swaps", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a benchmarks.field_loop arm's folder, e.g. .../device-fast")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--per-day", type=int, default=7, help="checks a day, all on the class replayed")
    ap.add_argument("--out", type=Path, default=None, help="write the table (markdown) and FILE.jsonl")
    args = ap.parse_args(argv)
    rows = [r for seed in args.seeds for r in replay(args.run_dir, seed, args.per_day)]
    text = markdown(rows, "python -m benchmarks.trust_swaps " + " ".join(argv if argv is not None else sys.argv[1:]))
    write_report(text, rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
