"""An expert's few labels in the field simulation: chosen by the device, at random, or none; over seeds.

``python -m benchmarks.experts --out DIR --baselines DIR [--seeds 1 2 3] [--k 5 10]``

For each seed, every arm reuses the same supervised baseline (``--baselines DIR/base-<seed>``, made by
``python -m benchmarks.simulate --seed N --days 1 --out DIR/base-N``), so the arms differ only in what the expert is
asked: ``none`` (self-training alone), ``random-K`` (K photos a day at random from the review pool) and
``device-K`` (the K the review queue ranks first, :mod:`edge_agent.review.rank`). At most 100 expert labels a
run. Writes ``DIR/<arm>/seed-<N>/`` (each run's report), ``summary.json`` (``expert_labels`` and ``arms``, each
with ``top1_mean``, ``top1_sd``, ``gain_mean``, ...), ``summary.md`` and ``accuracy.png`` (mean test top-1 over
days per arm). A run with a ``report.json`` is not run again, so an interrupted series resumes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.seeds import REPO, mean_sd, simulate


def run_arm(data: str, out: Path, baseline: Path, seed: int, arm: str) -> dict:
    extra = ["--baseline-from", str(baseline)]
    if arm != "none":
        choice, k = arm.split("-")
        extra += ["--expert-per-day", k, "--expert-choice", choice]
    return simulate(data, out, seed, "fast", extra, label=arm + " seed")


def summarise(runs: dict[str, list[dict]]) -> dict:
    arms = {}
    for arm, reports in runs.items():
        top1, sup = [r["ssl_top1"] for r in reports], [r["supervised_top1"] for r in reports]
        gain = [r["gain_points"] for r in reports]
        prec = [r["pseudo_label_precision"] for r in reports if r["pseudo_label_precision"] is not None]
        arms[arm] = {
            "seeds": [r["settings"]["seed"] for r in reports],
            "top1_mean": mean_sd(top1)[0],
            "top1_sd": mean_sd(top1)[1],
            "supervised_top1_mean": mean_sd(sup)[0],
            "gain_mean": mean_sd(gain)[0],
            "gain_sd": mean_sd(gain)[1],
            "expert_labels_mean": mean_sd([r.get("expert_labels", 0) for r in reports])[0],
            "pseudo_label_precision_mean": mean_sd(prec)[0] if prec else None,
            "pseudo_labels_mean": mean_sd([r["pseudo_labels_accepted"] for r in reports])[0],
            "retrains_published": sum(1 for r in reports for d in r["days"] if d.get("retrain") and d["retrain"].get("published")),
            "retrains": sum(1 for r in reports for d in r["days"] if d.get("retrain")),
            "days_top1_mean": [statistics.fmean(v) for v in zip(*[[d["test_top1"] for d in r["days"]] for r in reports])],
            "runs": [
                {
                    "seed": r["settings"]["seed"],
                    "supervised_top1": r["supervised_top1"],
                    "top1": r["ssl_top1"],
                    "gain_points": r["gain_points"],
                    "expert_labels": r.get("expert_labels", 0),
                    "pseudo_labels": r["pseudo_labels_accepted"],
                    "precision": r["pseudo_label_precision"],
                }
                for r in reports
            ],
        }
    return {"expert_labels": {a: v["expert_labels_mean"] for a, v in arms.items()}, "arms": arms}


def markdown(summary: dict) -> str:
    lines = [
        "Field simulation (fast mode, rehearsal, the same baseline per seed in every arm); mean +- sd over seeds.",
        "",
        "| arm | seeds | supervised top-1 | final top-1 | gain (points) | expert labels | pseudo-labels | precision | retrains published |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, a in summary["arms"].items():
        prec = f"{a['pseudo_label_precision_mean']:.3f}" if a["pseudo_label_precision_mean"] is not None else "-"
        lines.append(
            f"| {arm} | {len(a['seeds'])} | {a['supervised_top1_mean']:.4f} | {a['top1_mean']:.4f} +- {a['top1_sd']:.4f} | "
            f"{a['gain_mean']:+.1f} +- {a['gain_sd']:.1f} | {a['expert_labels_mean']:.0f} | {a['pseudo_labels_mean']:.0f} | "
            f"{prec} | {a['retrains_published']} of {a['retrains']} |"
        )
    lines += [
        "",
        "Per run:",
        "",
        "| arm | seed | supervised | final | gain | expert labels | pseudo-labels | precision |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, a in summary["arms"].items():
        for r in a["runs"]:
            prec = f"{r['precision']:.3f}" if r["precision"] is not None else "-"
            lines.append(
                f"| {arm} | {r['seed']} | {r['supervised_top1']:.4f} | {r['top1']:.4f} | {r['gain_points']:+.1f} | "
                f"{r['expert_labels']} | {r['pseudo_labels']} | {prec} |"
            )
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, a in summary["arms"].items():
        ax.plot(range(1, len(a["days_top1_mean"]) + 1), a["days_top1_mean"], marker="o", label=arm)
    ax.set_xlabel("day")
    ax.set_ylabel(f"test top-1 (mean of {len(next(iter(summary['arms'].values()))['seeds'])} seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.experts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/plantvillage"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--baselines", required=True, help="folder of base-<seed>/ simulations whose baselines are reused")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--k", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--arms", nargs="+", help="only these arms (none, device-K, random-K)")
    ap.add_argument("--summarise-only", action="store_true", help="run nothing: summarise the runs already in --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    arms = args.arms or ["none"] + [f"{c}-{k}" for k in args.k for c in ("device", "random")]
    runs = {arm: [] for arm in arms}
    for seed in args.seeds:
        for arm in arms:
            run = out / arm / f"seed-{seed}"
            if args.summarise_only:
                if (run / "report.json").exists():
                    runs[arm].append(json.loads((run / "report.json").read_text()))
                continue
            runs[arm].append(run_arm(args.data, run, Path(args.baselines) / f"base-{seed}", seed, arm))
    runs = {arm: reports for arm, reports in runs.items() if reports}
    summary = summarise(runs)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    plot(summary, out / "accuracy.png")
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
