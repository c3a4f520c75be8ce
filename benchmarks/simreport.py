"""The field simulation's markdown report and plots (accuracy over days, precision, confusion matrix)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_markdown", "write_plots"]


def write_markdown(report: dict, path: Path) -> None:
    s = report["settings"]
    lines = [
        f"# Field simulation ({report['mode']} mode)",
        "",
        f"{report['classes']} classes from `{report['data']}`; split {report['split']}; days of {s['day_size']} photos; "
        f"tau {s['tau']}, cap {s['cap']} per class, retrain at {s['retrain_at']} ({s['strategy']}, {s['retrain_epochs']} epochs); "
        f"machine: {report['machine']}; wall time {report['wall_s']:.0f} s.",
        "",
        "| | test top-1 |",
        "|---|---|",
        f"| supervised only ({report['split']['labelled']} labelled photos, {report['supervised_engine_version']}) | {report['supervised_top1']:.4f} |",
        f"| self-training after {len(report['days'])} days ({report['ssl_engine_version']}) | {report['ssl_top1']:.4f} |",
        f"| gain | {report['gain_points']:+.2f} points |",
        "",
        f"Pseudo-labels accepted: {report['pseudo_labels_accepted']}, precision against the true labels: "
        f"{report['pseudo_label_precision']}. The last retrain trained on {report.get('pseudo_labels_trained', '-')} of them "
        f"(`[trainer] recheck_pseudo`: {'on' if s.get('recheck', False) else 'off'}), precision "
        f"{report.get('trained_pseudo_label_precision', '-')}.",
        "",
        "| day | accepted | precision | cumulative | test top-1 | engine | retrain |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in report["days"]:
        r = d["retrain"]
        retrain = "" if not r else (f"published {r['published']} ({r['seconds']} s)" if r["published"] else f"refused: {r['reason']}")
        lines.append(
            f"| {d['day']} | {d['accepted']} | {d['precision'] if d['precision'] is not None else '-'} | "
            f"{d['cumulative_accepted']} | {d['test_top1']:.4f} | {d['engine_version']} | {retrain} |"
        )
    scaled = {v: c for v, c in (report.get("calibration") or {}).items() if c}
    if scaled:
        lines += [
            "",
            "Softmax temperature fitted on the validation split and folded into each published model "
            "(`[trainer] calibrate`; expected calibration error on those photos before -> after):",
            "",
        ]
        lines += [
            f"- {v}: "
            + (
                f"not fitted ({c['skipped']})"
                if c.get("skipped")
                else f"T = {c['temperature']:.3f}, ECE {c['ece_before']:.3f} -> {c['ece_after']:.3f} on {c['photos']} photos"
            )
            for v, c in scaled.items()
        ]
    sweep = report.get("threshold_sweep")
    if sweep:
        lines += [
            "",
            f"Pseudo-labels the supervised model ({sweep['engine_version']}) would give all {sweep['photos']} stream photos "
            "at other thresholds (`[labels] pseudo_threshold`)"
            + (f"; its expected calibration error on those photos is {sweep['ece']:.3f}:" if "ece" in sweep else ":"),
            "",
            "| tau | accepted | share of photos | precision |",
            "|---|---|---|---|",
        ]
        for r in sweep["rows"]:
            prec = f"{r['precision']:.4f}" if r["precision"] is not None else "-"
            lines.append(f"| {r['tau']} | {r['accepted']} | {r['share']:.2f} | {prec} |")
    path.write_text("\n".join(lines) + "\n")


def write_plots(report: dict, out: Path) -> list[Path]:
    """accuracy.png, precision.png and confusion.png (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = [d["day"] for d in report["days"]]
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([0, *days], [report["supervised_top1"], *[d["test_top1"] for d in report["days"]]], marker="o", label="engine in service")
    ax.axhline(report["supervised_top1"], color="grey", linestyle="--", label="supervised only")
    ax.set(xlabel="day", ylabel="test top-1", title="Accuracy over days")
    ax.legend()
    written.append(out / "accuracy.png")
    fig.savefig(written[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(days, [d["accepted"] for d in report["days"]], color="lightsteelblue", label="accepted")
    ax.set(xlabel="day", ylabel="pseudo-labels accepted")
    ax2 = ax.twinx()
    ax2.plot(
        days,
        [d["precision"] if d["precision"] is not None else float("nan") for d in report["days"]],
        color="darkred",
        marker="o",
        label="precision",
    )
    ax2.set(ylabel="precision", ylim=(0, 1.02))
    ax.set_title("Pseudo-labels per day and their precision")
    written.append(out / "precision.png")
    fig.savefig(written[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)

    classes, matrix = report["confusion"]["classes"], report["confusion"]["matrix"]
    fig, ax = plt.subplots(figsize=(1 + 0.35 * len(classes), 1 + 0.35 * len(classes)))
    ax.imshow(matrix, cmap="Blues")
    short = [c.replace("___", ": ").replace("_", " ")[:28] for c in classes]
    ax.set_xticks(range(len(classes)), short, rotation=90, fontsize=6)
    ax.set_yticks(range(len(classes)), short, fontsize=6)
    ax.set(xlabel="predicted", ylabel="true", title=f"Confusion on the test split ({report['ssl_engine_version']})")
    written.append(out / "confusion.png")
    fig.savefig(written[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return written
