"""The field simulation repeated over seeds: how large is self-training's gain next to run-to-run noise?

``python -m benchmarks.seeds --out DIR [--seeds 1 2 3] [--mode fast] [-- simulate options...]``

Each seed draws its own splits, initialisation and augmentation; one ``python -m benchmarks.simulate`` per seed
(in ``DIR/seed-N``), then ``DIR/summary.md`` and ``summary.json``: per seed and mean +- standard deviation
of supervised-only top-1, self-training top-1, the gain, pseudo-label precision and wall time. A seed whose
run already has a ``report.json`` is not run again, so an interrupted series can be resumed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEYS = ("supervised_top1", "ssl_top1", "gain_points", "pseudo_label_precision", "pseudo_labels_accepted", "wall_s")
TRAINED = "trained_pseudo_label_precision"  # absent from older reports, None where no retrain ran


def simulate(data: str, out: Path, seed: int, mode: str, extra: list[str], label: str = "") -> dict:
    """One ``python -m benchmarks.simulate`` run into ``out``, unless its ``report.json`` is there; its report."""
    report = out / "report.json"
    if not report.exists():
        shutil.rmtree(out, ignore_errors=True)  # an interrupted run: start it again
        cmd = [sys.executable, "-m", "benchmarks.simulate", "--log-level", "warning", "--data", data, "--out", str(out)]
        cmd += ["--mode", mode, "--seed", str(seed), *extra]
        print(f"{label or 'seed'} {seed}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, cwd=REPO)
    return json.loads(report.read_text())


def mean_sd(values: list[float]) -> tuple[float, float]:
    """The mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def run_seed(data: str, out: Path, seed: int, mode: str, extra: list[str]) -> dict:
    full = simulate(data, out, seed, mode, extra)
    retrains = [d["retrain"] for d in full["days"] if d.get("retrain")]
    return {
        "seed": seed,
        **{k: full[k] for k in KEYS},
        TRAINED: full.get(TRAINED),
        "retrains": len(retrains),
        "published": sum(1 for r in retrains if r.get("published")),
    }


def summarise(rows: list[dict]) -> dict:
    out = {"runs": rows}
    for k in KEYS:
        values = [r[k] for r in rows]
        mean, sd = mean_sd(values)
        out[k] = {"mean": mean, "sd": sd}
    values = [r[TRAINED] for r in rows if r.get(TRAINED) is not None]
    out[TRAINED] = dict(zip(("mean", "sd"), mean_sd(values)), runs=len(values)) if values else None
    return out


def _maybe(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "-"


def markdown(summary: dict, mode: str) -> str:
    rows = summary["runs"]
    lines = [
        f"Field simulation over {len(rows)} seeds ({mode} mode); mean +- standard deviation in the last row.",
        "",
        "| seed | supervised top-1 | self-training top-1 | gain (points) | pseudo-labels | precision | "
        "precision of the last retrain's pseudo-labels | retrains published | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['seed']} | {r['supervised_top1']:.4f} | {r['ssl_top1']:.4f} | {r['gain_points']:+.1f} | "
            f"{r['pseudo_labels_accepted']} | {r['pseudo_label_precision']:.4f} | {_maybe(r.get(TRAINED))} | "
            f"{r['published']} of {r['retrains']} | {r['wall_s']:.0f} |"
        )

    def ms(k: str, fmt: str) -> str:
        return f"{summary[k]['mean']:{fmt}} +- {summary[k]['sd']:{fmt.lstrip('+')}}"

    lines.append(
        f"| mean | {ms('supervised_top1', '.4f')} | {ms('ssl_top1', '.4f')} | {ms('gain_points', '+.1f')} | "
        f"{ms('pseudo_labels_accepted', '.0f')} | {ms('pseudo_label_precision', '.4f')} | "
        f"{ms(TRAINED, '.4f') if summary.get(TRAINED) else '-'} | | {ms('wall_s', '.0f')} |"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/plantvillage"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--mode", choices=["fast", "full"], default="fast")
    ap.add_argument("extra", nargs="*", help="more `python -m benchmarks.simulate` options, after --")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [run_seed(args.data, out / f"seed-{s}", s, args.mode, args.extra) for s in args.seeds]
    summary = summarise(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = markdown(summary, args.mode)
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
