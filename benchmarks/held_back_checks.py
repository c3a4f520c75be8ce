"""Would the field check's held-back photos have kept a loop's wrong pseudo-labels out?

``python -m benchmarks.held_back_checks RUN_DIR [--seeds 1] [--out FILE]``

Replays a finished ``benchmarks.field_loop`` run (``RUN_DIR/seed-<N>``: its ``report.json`` and ``state/``, fast or
full mode). Every expert label the trainer holds back for the field check (:func:`trainer.field_check.held_back`:
every ``field_check_every``-th of a class) is a photo no version ever trains on, so a version's sure answers on them
(``confident`` at ``[labels] trust_from``, what trust covers) are unbiased checks of that version, where the checks
the daemon's trust reads were mostly made by the versions before it. Each version the run served is opened from the
run's store as the daemon serves it and answers the held-back photos; each pseudo-label the daemon made
(``pseudo_sent``, or the trainer's store for a fast-mode run from before 2026-12-07: the photo, the class, the
version that made it, when) is then judged by two vetoes:

* ``before``: the version that made it has a wrong sure answer of that class among the held-back photos labelled
  before the pseudo-label was made (what the daemon could know if the trainer answered them at every retrain);
* ``published``: the same among those labelled before that version first answered a photo (what its manifest
  could carry from the trainer that published it).

A vetoed pseudo-label is one the rule would not have made (the rest of the run is taken as it was: a first-order
estimate; the retrains on fewer pseudo-labels were not run). Reported per day (pseudo-labels made, right; kept by
each veto, right) and per version and class (its pseudo-labels; its sure answers on all the run's held-back photos,
whenever labelled, and the true class of each wrong one; its sure answers on the seed's held-out photos:
:mod:`benchmarks.sure_heldout`). The truth of a
photo is the field folder it came from, matched by sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.check_order import _confident, _predict, write_report
from edge_agent.names import class_phrase
from edge_agent.results import query_readonly

__all__ = ["Made", "VETOES", "kept", "by_day", "stream_days", "replay", "markdown", "main"]

VETOES = ("before", "published")


@dataclass(frozen=True)
class Made:
    """One pseudo-label the run's daemon made: the day (1-based), the class, the version, when, and whether right."""

    day: int
    label: str
    engine: str
    sent: float
    right: bool


def kept(made: Made, sure: dict[str, list[tuple]], published: dict[str, float], veto: str) -> bool:
    """Whether ``veto`` keeps ``made``: ``sure`` is version -> (labelled, class said, right, ...) of its sure answers on
    the held-back photos; none of ``made``'s class wrong among those labelled before the veto's moment."""
    until = made.sent if veto == "before" else published.get(made.engine, made.sent)
    return not any(said == made.label and not right and labelled < until for labelled, said, right, *_ in sure.get(made.engine, []))


def by_day(made: list[Made], sure: dict, published: dict[str, float], days: int) -> list[dict]:
    """Per day: pseudo-labels made and right as run, and kept and right under each veto."""
    rows = []
    for d in range(1, days + 1):
        mine = [m for m in made if m.day == d]
        row = {"day": d, "made": len(mine), "right": sum(m.right for m in mine)}
        for veto in VETOES:
            k = [m for m in mine if kept(m, sure, published, veto)]
            row[veto] = {"kept": len(k), "right": sum(m.right for m in k)}
        rows.append(row)
    return rows


def _delivered(ledger: Path, samples: Path) -> list[tuple]:
    """Each pseudo-label the daemon delivered, oldest first: (sha256, class, version, when): the ledger's
    ``pseudo_sent``, and the trainer's pseudo-labels it does not hold (a fast-mode run from before 2026-12-07 recorded
    none there; the time is then when the trainer received it, the same day)."""
    sent = query_readonly(ledger, "SELECT sha256, label, engine_version, sent FROM pseudo_sent")
    known = {row[0] for row in sent}
    got = query_readonly(samples, "SELECT id, label, engine_version, received FROM samples WHERE kind = 'pseudo'")
    return sorted(sent + [row for row in got if row[0] not in known], key=lambda row: row[3])


def stream_days(seed_dir: Path) -> tuple[dict, list, dict[str, tuple], Callable[[float], int]]:
    """A kept run's report, its held-out test photos, its stream by sha256 ((path, class index) each), and the day
    (1-based) a moment falls in: from the first answer of that day's first photo answered."""
    from benchmarks.field_loop import split_field

    report = json.loads((seed_dir / "report.json").read_text())
    s = report["settings"]
    test, stream = split_field(Path(s["data"]) / s["field"], report["classes"], s["seed"], s["test_fraction"])
    shas = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p, _ in stream]
    created = dict(query_readonly(seed_dir / "state" / "results.sqlite", "SELECT sha256, created FROM results"))
    size = s["day_size"]
    starts = []  # when each day's first photo was answered
    for d in range(len(report["days"])):
        times = [created[h] for h in shas[d * size : (d + 1) * size] if h in created]
        starts.append(min(times) if times else None)

    def day_at(t: float) -> int:
        return max([d for d, start in enumerate(starts) if start is not None and start <= t], default=0) + 1

    return report, test, dict(zip(shas, stream)), day_at


def replay(seed_dir: Path) -> dict:
    """One seed's replay: ``days`` (:func:`by_day`), ``versions`` (per version and class) and the totals."""
    from benchmarks.sure_heldout import sure_answers
    from edge_agent.config import parse_config
    from engines.store import EngineStore
    from trainer.field_check import held_back
    from trainer.samples import SampleStore

    report, test, path_of, day_at = stream_days(seed_dir)
    s = report["settings"]
    cfg = parse_config({})
    policy = cfg.labels
    state = seed_dir / "state"
    store = EngineStore(state / "engines")
    classes = report["classes"]
    results = state / "results.sqlite"
    days = len(report["days"])
    made = [
        Made(day_at(sent), label, engine, sent, classes.index(label) == path_of[sha][1])
        for sha, label, engine, sent in _delivered(results, state / "trainer" / "samples.sqlite")
        if sha in path_of
    ]
    first_answer = dict(
        query_readonly(
            results,
            "SELECT engine_version, MIN(t) FROM (SELECT engine_version, created AS t FROM results UNION ALL "
            "SELECT engine_version, answered AS t FROM pool_answers) GROUP BY engine_version",
        )
    )
    labelled = dict(query_readonly(results, "SELECT sha256, labelled FROM expert_labels"))
    samples = SampleStore(state / "trainer")
    try:
        held = sorted(i for i in held_back(samples.all(), cfg.trainer.field_check_every) if i in path_of and i in labelled)
    finally:
        samples.close()
    photos = [path_of[i] for i in held]
    serving = sorted({report["start"]["engine"]} | {d["engine"] for d in report["days"]} | {m.engine for m in made})
    sure: dict[str, list[tuple[float, str, bool, str]]] = {}
    versions = []
    for version in serving:
        got = _confident(_predict(store, version, photos, cfg), [y for _, y in photos], classes, policy) if photos else {}
        sure[version] = [
            (labelled[held[i]], label, r, classes[photos[i][1]]) for label, a in got.items() for i, _, c, r in a if c >= policy.trust_from
        ]
        out_sure = sure_answers(seed_dir, version, test)
        for label in sorted({a[1] for a in sure[version]} | {m.label for m in made if m.engine == version}):
            mine = [m for m in made if m.engine == version and m.label == label]
            hb = [a for a in sure[version] if a[1] == label]
            o = out_sure.get(label, [0, 0, []])
            versions.append(
                {
                    "version": version,
                    "class": label,
                    "served_from": first_answer.get(version),
                    "pseudo": len(mine),
                    "pseudo_right": sum(m.right for m in mine),
                    "held_back_sure": len(hb),
                    "held_back_right": sum(a[2] for a in hb),
                    "held_back_wrong_are": sorted(a[3] for a in hb if not a[2]),
                    "heldout_sure": o[0],
                    "heldout_right": o[1],
                }
            )
            print(json.dumps(versions[-1]), file=sys.stderr, flush=True)
    day_rows = by_day(made, sure, first_answer, days)
    totals = {"made": len(made), "right": sum(m.right for m in made), "held_back_photos": len(held)}
    for veto in VETOES:
        k = [m for m in made if kept(m, sure, first_answer, veto)]
        totals[veto] = {"kept": len(k), "right": sum(m.right for m in k)}
    return {"seed": s["seed"], "days": day_rows, "versions": versions, "totals": totals}


def _share(right: int, n: int) -> str:
    return f"{right} of {n}" if n else "-"


def markdown(runs: list[dict], command: str) -> str:
    """Per seed: the day table (as run, and kept by each veto) and the version-and-class table."""
    out = [f"`{command}`", ""]
    for r in runs:
        t = r["totals"]
        out += [
            f"Seed {r['seed']}: {t['made']} pseudo-labels, {t['right']} right; {t['held_back_photos']} held-back photos. "
            + "; ".join(f"`{v}` keeps {t[v]['kept']}, {t[v]['right']} right" for v in VETOES)
            + ".",
            "",
            "| day | made: right of made | " + " | ".join(f"`{v}`: right of kept" for v in VETOES) + " |",
            "|---|---|" + "---|" * len(VETOES),
        ]
        for d in r["days"]:
            if d["made"]:
                out.append(
                    f"| {d['day']} | {_share(d['right'], d['made'])} | "
                    + " | ".join(_share(d[v]["right"], d[v]["kept"]) for v in VETOES)
                    + " |"
                )
        out += [
            "",
            "| version | class | its pseudo-labels: right of made | held-back photos: right of sure | wrong ones are | held out: right of sure |",
            "|---|---|---|---|---|---|",
        ]
        for v in r["versions"]:
            wrong = ", ".join(class_phrase(c) for c in v["held_back_wrong_are"]) or "-"
            out.append(
                f"| {v['version']} | {class_phrase(v['class'])} | {_share(v['pseudo_right'], v['pseudo'])} | "
                f"{_share(v['held_back_right'], v['held_back_sure'])} | {wrong} | {_share(v['heldout_right'], v['heldout_sure'])} |"
            )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.held_back_checks", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a benchmarks.field_loop arm's folder, e.g. .../device-fast")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1])
    ap.add_argument("--out", type=Path, default=None, help="write the tables (markdown) and FILE.jsonl")
    args = ap.parse_args(argv)
    command = "python -m benchmarks.held_back_checks " + " ".join(argv if argv is not None else sys.argv[1:])
    runs = [replay(args.run_dir / f"seed-{seed}") for seed in args.seeds]
    write_report(markdown(runs, command), runs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
