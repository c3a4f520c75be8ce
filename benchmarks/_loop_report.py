"""A field loop's runs summarised over seeds: per arm and day, the field and lab top-1, pseudo-labels, what trust
covers, versions published; as JSON, a markdown table and a plot (``python -m benchmarks.field_loop --report``)."""

from __future__ import annotations

import statistics
from pathlib import Path

__all__ = ["markdown", "plot", "summarise"]


def _ms(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _covered(rows: list[dict]) -> dict:
    """Over the seeds that recorded verdicts: the answers trust covers a day (mean), and the share of them right."""
    v = [x["verdicts"] for x in rows if x.get("verdicts")]
    if not v:
        return {}
    right, cover = sum(x["covered_right"] for x in v), sum(x["covered"] for x in v)
    return {
        "covered": statistics.fmean(x["covered"] for x in v),
        "covered_precision": round(right / cover, 4) if cover else None,
        "unknown": statistics.fmean(x["unknown"] for x in v),
        "verdict_seeds": len(v),
    }


def _sources(rows: list[dict]) -> dict:
    """Over the seeds that recorded it: the day's pseudo-labels made from the review pool and from new photos (sums),
    and how many of each were right."""
    v = [x for x in rows if "pseudo_from_pool_right" in x]
    if not v:
        return {}
    pool, pool_right = sum(x["pseudo_from_pool"] for x in v), sum(x["pseudo_from_pool_right"] for x in v)
    return {
        "pool_made": pool,
        "pool_right": pool_right,
        "new_made": sum(x["pseudo_labels"] for x in v) - pool,
        "new_right": sum(x["pseudo_right"] for x in v) - pool_right,
        "source_seeds": len(v),
    }


def _term(rows: list[dict]) -> dict:
    """Over the seeds whose retrain that day ran the unlabelled term: the pool photos it read, the labels it gave them,
    the share of them right (where the benchmark recorded it; and the worst retrain's), and in how many retrains its
    candidate was kept."""
    terms = [u for x in rows if (u := (x.get("retrain") or {}).get("unlabelled")) and "taken_known" in u]
    if not terms:
        return {}
    known, right = sum(u["taken_known"] for u in terms), sum(u["taken_right"] for u in terms)
    return {
        "term_runs": len(terms),
        "term_pool": statistics.fmean(u.get("pool_photos", 0) for u in terms),
        "term_taken": statistics.fmean(u["taken_known"] for u in terms),
        "term_precision": round(right / known, 4) if known else None,
        "term_precision_min": min((round(u["taken_right"] / u["taken_known"], 4) for u in terms if u["taken_known"]), default=None),
        "term_kept": sum(bool(u.get("kept")) for u in terms),
    }


def summarise(reports: dict[str, list[dict]]) -> dict:
    """Per arm, over seeds: field and lab top-1 per day (mean, sd), pseudo-label precision, labels, versions."""
    arms = {}
    for arm, runs in reports.items():
        days = min(len(r["days"]) for r in runs)
        per_day = []
        for d in range(days):
            rows = [r["days"][d] for r in runs]
            prec = [x["pseudo_precision"] for x in rows if x["pseudo_precision"] is not None]
            per_day.append(
                {
                    "day": d + 1,
                    "field": _ms([x["field"] for x in rows]),
                    "lab": _ms([x["lab"] for x in rows]),
                    "pseudo_labels": statistics.fmean(x["pseudo_labels"] for x in rows),
                    "pseudo_precision_min": min(prec) if prec else None,
                    "expert_labels": statistics.fmean(x["expert_labels"] for x in rows),
                    **_covered(rows),
                    **_sources(rows),
                    **_term(rows),
                }
            )
        retrains = [x["retrain"] for r in runs for x in r["days"] if x["retrain"] and not x["retrain"].get("skipped")]
        worse = 0
        for r in runs:  # a published version below the one before it on the field test
            prev = r["start"]["field"]
            for x in r["days"]:
                if x["retrain"] and x["retrain"].get("published"):
                    worse += x["field"] < prev
                prev = x["field"]
        judged = [j for x in retrains for j in x.get("judged") or []]
        arms[arm] = {
            "seeds": [r["settings"]["seed"] for r in runs],
            "start_field": _ms([r["start"]["field"] for r in runs]),
            "start_lab": _ms([r["start"]["lab"] for r in runs]),
            "days": per_day,
            "published": sum(1 for x in retrains if x.get("published")),
            "refused": sum(1 for x in retrains if not x.get("published")),
            "swap_refused": sum(1 for x in retrains if (x.get("swap") or {}).get("refused")),
            "published_worse_on_field": worse,
            **({"sources": s} if (s := _sources([x for r in runs for x in r["days"][:days]])) else {}),
            **({"field_check": _field_check(judged)} if judged else {}),
        }
    return {"arms": arms}


def _field_check(judged: list[dict]) -> dict:
    """The field check's decisions on the candidates it judged, against the benchmark's held-out photos: how many it
    passed and refused, and of those how many were worse / better held out than the version in service."""
    passed = [j for j in judged if j["passed"]]
    refused = [j for j in judged if not j["passed"]]
    return {
        "passed": len(passed),
        "passed_worse": sum(j["candidate"] < j["in_service"] for j in passed),
        "refused": len(refused),
        "refused_better": sum(j["candidate"] > j["in_service"] for j in refused),
        "refused_gain": [round(j["candidate"] - j["in_service"], 4) for j in refused],
    }


def _not_adopted(arm: dict) -> str:
    """The published versions the device's hot swap refused (fast mode records the swap since 2026-11-28)."""
    n = arm.get("swap_refused", 0)
    return f" ({n} published, not adopted by the device)" if n else ""


def markdown(summary: dict, command: str) -> str:
    lines = [
        f"# The device in a new field\n\n`{command}`; mean +- sd over seeds; field: held-out field test photos; lab: the shipped model's validation split.\n"
    ]
    lines.append(
        "| arm | seeds | field top-1 start -> end | lab top-1 start -> end | expert labels | pseudo-labels (last day) | lowest daily pseudo precision | published / refused | published worse on field |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for arm, a in summary["arms"].items():
        end = a["days"][-1] if a["days"] else None
        f = lambda ms: f"{ms[0]:.3f} +- {ms[1]:.3f}"  # noqa: E731
        precs = [d["pseudo_precision_min"] for d in a["days"] if d["pseudo_precision_min"] is not None]
        lines.append(
            f"| {arm} | {len(a['seeds'])} | {f(a['start_field'])} -> {f(end['field']) if end else '-'} | {f(a['start_lab'])} -> {f(end['lab']) if end else '-'} "
            f"| {end['expert_labels']:.0f} | {end['pseudo_labels']:.1f} | {min(precs) if precs else 'none made'} | {a['published']} / {a['refused']}{_not_adopted(a)} | {a['published_worse_on_field']} |"
        )
    lines.append("\nField top-1 per day (mean):\n")
    arms = list(summary["arms"])
    lines.append("| day | " + " | ".join(arms) + " |")
    lines.append("|---|" + "---|" * len(arms))
    n = max(len(a["days"]) for a in summary["arms"].values())
    for d in range(n):
        cells = [f"{summary['arms'][a]['days'][d]['field'][0]:.3f}" if d < len(summary["arms"][a]["days"]) else "" for a in arms]
        lines.append(f"| {d + 1} | " + " | ".join(cells) + " |")
    if any("field_check" in a for a in summary["arms"].values()):
        lines.append(
            "\nThe field check (the expert's held-back photos) against the held-out field photos it never sees: the "
            "candidates it judged (torch FP32), passed (of them worse held out than the version in service) and refused "
            "(of them better held out; each refused one's held-out gain over the version in service):\n"
        )
        lines.append("| arm | passed (worse held out) | refused (better held out) | refused: held-out gain |")
        lines.append("|---|---|---|---|")
        for arm, a in summary["arms"].items():
            if c := a.get("field_check"):
                gains = ", ".join(f"{g:+.3f}" for g in c["refused_gain"]) or "-"
                lines.append(f"| {arm} | {c['passed']} ({c['passed_worse']}) | {c['refused']} ({c['refused_better']}) | {gains} |")
    if any("covered" in d for a in summary["arms"].values() for d in a["days"]):
        lines.append(
            "\nA day's photos answered `confident` at `[labels] trust_from` or surer (what trust covers: a check when the "
            "expert labels one, a pseudo-label once its class is trusted), mean a day, and the share of them right; photos "
            "called `unknown`, mean a day (seeds that recorded verdicts):\n"
        )
        _day_table(
            lines,
            summary,
            arms,
            n,
            lambda x: (
                f"{x['covered']:.1f} ({_share(x.get('covered_precision'))} right), unknown {x['unknown']:.1f} [{x['verdict_seeds']}]"
                if "covered" in x
                else ""
            ),
        )
    if any("source_seeds" in d for a in summary["arms"].values() for d in a["days"]):
        lines.append(
            "\nWhere a day's pseudo-labels came from, summed over the seeds that recorded it: a photo of the review pool "
            "(answered again sure after a swap, or sure of a class trusted since) and a new photo, each right of made "
            "[seeds]; totals in the last row:\n"
        )
        _day_table(
            lines,
            summary,
            arms,
            n,
            lambda x: (
                f"pool {_count(x['pool_right'], x['pool_made'])}, new {_count(x['new_right'], x['new_made'])} [{x['source_seeds']}]"
                if "source_seeds" in x
                else ""
            ),
        )
        totals = [
            f"pool {_count(s['pool_right'], s['pool_made'])}, new {_count(s['new_right'], s['new_made'])}"
            if (s := summary["arms"][a].get("sources"))
            else ""
            for a in arms
        ]
        lines.append("| all | " + " | ".join(totals) + " |")
    if any("term_runs" in d for a in summary["arms"].values() for d in a["days"]):
        lines.append(
            "\nThe unlabelled term's labels (made in the trainer from the pool's field photos, not the daemon's "
            "pseudo-labels): a retrain's mean of the pool photos it read, of the labels it gave, the share of them right "
            "(the worst retrain's), and the retrains whose candidate with them the field check kept [retrains that ran the term]:\n"
        )
        _day_table(
            lines,
            summary,
            arms,
            n,
            lambda x: (
                f"{x['term_taken']:.0f} of {x['term_pool']:.0f} ({_share(x.get('term_precision'))} right, worst "
                f"{_share(x.get('term_precision_min'))}), kept {x['term_kept']} [{x['term_runs']}]"
                if "term_runs" in x
                else ""
            ),
        )
    return "\n".join(lines) + "\n"


def _share(p: float | None) -> str:
    return "-" if p is None else f"{p:.0%}"


def _count(right: int, made: int) -> str:
    """``right`` of ``made`` with the share, or ``-`` when none was made."""
    return f"{right} of {made} ({right / made:.0%})" if made else "-"


def _day_table(lines: list[str], summary: dict, arms: list[str], n: int, cell) -> None:
    """A table of one row a day and one column an arm, each cell ``cell(that day's summary)``."""
    lines.append("| day | " + " | ".join(arms) + " |")
    lines.append("|---|" + "---|" * len(arms))
    for d in range(n):
        cells = [cell(summary["arms"][a]["days"][d] if d < len(summary["arms"][a]["days"]) else {}) for a in arms]
        lines.append(f"| {d + 1} | " + " | ".join(cells) + " |")


def plot(summary: dict, path: Path, day_size: int = 100) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, a in summary["arms"].items():
        xs = [0] + [d["day"] for d in a["days"]]
        ys = [a["start_field"][0]] + [d["field"][0] for d in a["days"]]
        sd = [a["start_field"][1]] + [d["field"][1] for d in a["days"]]
        ax.plot(xs, ys, marker="o", label=f"{arm} ({len(a['seeds'])} seed{'s' if len(a['seeds']) > 1 else ''})")
        ax.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], alpha=0.15)
    ax.set_xlabel(f"day ({day_size} field photos each)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("field top-1 (held-out field photos)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
