"""Trust across swaps: would a class earn trust sooner, and never wrongly, from the serving engine's own checks?

``python -m benchmarks.trust_swaps RUN_DIR [--seeds 1 2 3] [--per-day 7] [--decay D ...] [--out FILE]``
``python -m benchmarks.trust_swaps --simulate [--decay D ...] [--runs 4000] [--out FILE]``

Replays a finished ``benchmarks.field_loop`` run (``RUN_DIR/seed-<N>``: its ``report.json`` and ``state/engines``)
with the engines in the order the run served them: day d's photos of the stream are answered by the engine serving
that day, and the photos waiting from earlier days are answered again by it (``[labels] reanswer_pool``). Each day
the expert checks up to ``--per-day`` of the serving engine's sure answers of the class (``confident`` at
``[labels] trust_from``), the smallest margin first, as if that class were the one nearest to trust
(:mod:`benchmarks.check_order`'s convention), and each check is scored by the device's own test
(:func:`edge_agent.review.checks.standing`, shipped policy) over two windows:

* ``shipped``: the class's latest ``trust_window`` checks, whichever engine made them (what the daemon reads);
* ``serving``: only the checks of the engine serving (the window starts again at every swap);
* ``older xD`` (``--decay D``): the shipped window with each check's evidence weighed ``D ** k``, ``k`` the swaps
  since the engine that made it served (the serving engine's count whole);
* ``wrong xD``: the same for wrong checks only (an older engine's mistakes count less, its right answers whole).

Reported per seed and class: the first day each window trusts the class, the days it is trusted, and the serving
engines' precision on the held-out test photos they are sure of in that class on those days (what their
pseudo-labels would be worth; under 0.95 is trust given wrongly).

``--simulate`` asks what the real runs cannot: how often a weighing trusts a class whose engines are *not* right, where
every engine after a swap is as right as the one before (a swap that fixes nothing). One class, ``--per-day`` checks
a day, each right with a fixed precision, a swap every 1 or 2 days; reported per precision: the share of ``--runs``
runs trusted by day 9 and within 20 days, for the shipped window and each ``wrong xD`` weighing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.check_order import _confident, _predict, write_report
from benchmarks.field_loop import SHARED, split_field
from edge_agent.names import class_phrase

__all__ = ["WINDOWS", "windows", "trust_by_day", "simulate", "simulation", "replay", "main"]

WINDOWS = ("shipped", "serving")


def windows(decays: tuple[float, ...] = ()) -> tuple[str, ...]:
    """The windows replayed: the two above, then each decay's two weighings."""
    return WINDOWS + tuple(f"{kind} x{d:g}" for d in decays for kind in ("older", "wrong"))


def _trusted(checks: list[tuple[bool, float]], policy) -> bool:
    """The sequential test on checks (right, weight): the weighed evidence reaches the bound, with trust_checks checks."""
    from edge_agent.review.checks import check_evidence

    if policy.trust_checks == 0:
        return True
    bound = math.log(1 / policy.trust_error)  # the bound standing() tests against
    evidence = sum(w * check_evidence(int(r), int(not r), policy) for r, w in checks)
    return len(checks) >= policy.trust_checks and evidence >= bound - 1e-9


def trust_by_day(
    days: list[tuple[str, dict[int, tuple[float, bool]]]],
    arrived: Callable[[int], int],
    per_day: int,
    policy,
    decays: tuple[float, ...] = (),
) -> dict[str, list[bool]]:
    """Whether the class is trusted at each day's end under each window. ``days``: per day, the serving engine and its
    sure answers of the class over the whole stream (photo index -> (margin, right)); ``arrived(i)``: the day (0-based)
    photo ``i`` arrives; each photo is checked at most once."""
    from edge_agent.review.checks import standing

    asked: set[int] = set()
    checks: list[tuple[bool, str, int]] = []  # newest first: right, engine, the swaps before it served
    out: dict[str, list[bool]] = {w: [] for w in windows(decays)}
    swaps, before = 0, days[0][0] if days else None
    for d, (engine, sure) in enumerate(days):
        swaps += engine != before
        before = engine
        pool = sorted((m, i, r) for i, (m, r) in sure.items() if arrived(i) <= d and i not in asked)
        for _, i, right in pool[:per_day]:
            asked.add(i)
            checks.insert(0, (right, engine, swaps))
        latest = checks[: policy.trust_window]
        out["shipped"].append(standing("", [r for r, _, _ in latest], policy).trusted)
        out["serving"].append(standing("", [r for r, e, _ in checks if e == engine][: policy.trust_window], policy).trusted)
        for dc in decays:
            out[f"older x{dc:g}"].append(_trusted([(r, dc ** (swaps - s)) for r, _, s in latest], policy))
            out[f"wrong x{dc:g}"].append(_trusted([(r, 1.0 if r else dc ** (swaps - s)) for r, _, s in latest], policy))
    return out


def simulate(precision: float, decay: float, swap_every: int, days: int, per_day: int, rng, policy) -> int | None:
    """The first day (1-based) a class is trusted whose every engine is right ``precision`` of the time, older
    engines' wrong checks weighed ``decay ** swaps`` (1: the shipped window); None: not within ``days``."""
    checks: list[tuple[bool, int]] = []  # newest first: right, the swaps before it
    swaps = 0
    for d in range(days):
        swaps += d > 0 and d % swap_every == 0
        checks[:0] = [(rng.random() < precision, swaps) for _ in range(per_day)]
        latest = checks[: policy.trust_window]
        if _trusted([(r, 1.0 if r else decay ** (swaps - s)) for r, s in latest], policy):
            return d + 1
    return None


SIM_PRECISIONS = (0.80, 0.85, 0.90, 0.95, 0.97, 0.99)


def simulation(decays: tuple[float, ...], runs: int, per_day: int) -> tuple[str, list[dict]]:
    """The simulated table (markdown) and its rows."""
    import random

    from edge_agent.config import LabelsSection

    policy = LabelsSection()
    weights = (1.0, *decays)
    rows = []
    for swap_every in (1, 2):
        for p in SIM_PRECISIONS:
            row = {"swap_every": swap_every, "precision": p}
            for d in weights:
                rng = random.Random(f"{swap_every}-{p}-{d}")
                got = [simulate(p, d, swap_every, 20, per_day, rng, policy) for _ in range(runs)]
                row["shipped" if d == 1.0 else f"wrong x{d:g}"] = {
                    "by_day_9": sum(g is not None and g <= 9 for g in got) / runs,
                    "within_20": sum(g is not None for g in got) / runs,
                }
            rows.append(row)
    names = ["shipped", *(f"wrong x{d:g}" for d in decays)]
    out = [
        f"Simulated: {runs} runs a row, {per_day} checks a day, every engine as right as the one before; share of runs "
        "that trust the class by day 9 / within 20 days (a class right less than 95 % of the time must not be trusted).",
        "",
        "| a swap every | precision | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for r in rows:
        cells = [f"{r[n]['by_day_9']:.3f} / {r[n]['within_20']:.3f}" for n in names]
        out.append(f"| {r['swap_every']} day{'s' if r['swap_every'] > 1 else ''} | {r['precision']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n", rows


def replay(
    run_dir: Path, seed: int, per_day: int, field: str = "apple-orchard", day_size: int = 100, decays: tuple[float, ...] = ()
) -> list[dict]:
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
        trusted = trust_by_day(days, lambda i: i // day_size, per_day, policy, decays)
        row = {"seed": seed, "class": label, "engines": serving}
        for w in windows(decays):
            on = [d for d, t in enumerate(trusted[w]) if t]
            worth = [r for d in on for r in held[serving[d]].get(label, [])]
            row[w] = {"first_day": on[0] + 1 if on else None, "days": len(on), "heldout_right": sum(worth), "heldout_sure": len(worth)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict], command: str, decays: tuple[float, ...] = ()) -> str:
    """The table: per seed and class, each window's first day trusted, days trusted and held-out precision then."""
    names = {"shipped": "shipped", "serving": "serving engine's checks"}
    shown = windows(decays)
    out = [
        f"`{command}`",
        "",
        "Per window: the first day the class is trusted (- never), the days of the run it is trusted, and the serving "
        "engines' sure answers of the class on the held-out photos on those days (right of sure).",
        "",
        "| seed | class | " + " | ".join(f"{names.get(w, w)}: first day, days, held out" for w in shown) + " |",
        "|---|---|" + "---|" * len(shown),
    ]
    for r in rows:
        cells = []
        for w in shown:
            t = r[w]
            worth = f"{t['heldout_right']} of {t['heldout_sure']}" if t["heldout_sure"] else "-"
            cells.append(f"{t['first_day'] or '-'}, {t['days']}, {worth}")
        out.append(f"| {r['seed']} | {class_phrase(r['class'])} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.trust_swaps", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, nargs="?", help="a benchmarks.field_loop arm's folder, e.g. .../device-fast")
    ap.add_argument("--simulate", action="store_true", help="the simulated farm instead of a run's replay")
    ap.add_argument("--runs", type=int, default=4000, help="simulated runs a row")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--per-day", type=int, default=7, help="checks a day, all on the class replayed")
    ap.add_argument("--decay", nargs="*", type=float, default=[], help="replay the weighed windows with these decays")
    ap.add_argument("--out", type=Path, default=None, help="write the table (markdown) and FILE.jsonl")
    args = ap.parse_args(argv)
    decays = tuple(args.decay)
    command = "python -m benchmarks.trust_swaps " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.simulate:
        table, rows = simulation(decays, args.runs, args.per_day)
        write_report(f"`{command}`\n\n" + table, rows, args.out)
        return 0
    if args.run_dir is None:
        ap.error("give a run's folder (RUN_DIR), or --simulate")
    rows = [r for seed in args.seeds for r in replay(args.run_dir, seed, args.per_day, decays=decays)]
    text = markdown(rows, command, decays)
    write_report(text, rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
