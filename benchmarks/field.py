"""Lab and field side by side: top-1, verdicts, per-class tables and confusion matrices, through the daemon's path.

``python -m benchmarks.field --out benchmarks/results/field`` measures the shipped model (or ``--store DIR``) on:

- ``lab``: its own test split of the PlantVillage lab photos (the photos its ``split.json`` lists as never trained on);
- ``field``: ``../shared/data/field/apple-orchard`` + ``corn-field`` (real field photos; never trained on);
- ``unknown``: ``../shared/data/field/unknown/apple-powdery-mildew`` (a disease no class names);

with the engine as configured by default (INT8 on a CPU) and FP32, each photo through :class:`Classifier`
(the daemon's preprocessing, engine and verdict). Writes ``field.json``, ``field.md`` and a confusion-matrix
PNG per set, and checks the issue's targets.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from edge_agent._truth import precision_check
from edge_agent.classifier import Classifier
from edge_agent.config import default_store_path, parse_config
from edge_agent.preprocess import IMAGE_EXTENSIONS, ImageRejected
from engines.loader import open_engine
from engines.store import EngineStore

__all__ = ["TARGETS", "evaluate_set", "field_sets", "main"]

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"

#: The issue's targets: (what, set, figure, comparison, value).
TARGETS = [
    ("lab test top-1 >= 0.98", "lab", "top1", ">=", 0.98),
    ("field top-1 >= 0.45", "field", "top1", ">=", 0.45),
    ("field photos marked confident: >= 90 % right", "field", "confident_top1", ">=", 0.90),
    ("lab test photos marked confident: >= 90 %", "lab", "share_confident", ">=", 0.90),
    ("unknown disease marked confident: <= 5 %", "unknown", "share_confident", "<=", 0.05),
]


def _photos(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def field_sets(version, plantvillage: Path, field: Path) -> dict[str, list[tuple[Path, str | None]]]:
    """The three sets as (photo, true class or None for the unknown disease)."""
    from trainer.data import DatasetError, recorded_split

    try:
        sets = {"lab": [(s.path, version.classes[s.label]) for s in recorded_split(version, plantvillage)["test"]]}
    except DatasetError as exc:  # a version from before split.json, trained on an older folder
        print(f"lab set left out: {exc}", file=sys.stderr)
        sets = {}
    sets["field"] = [
        (p, d.name) for sub in ("apple-orchard", "corn-field") for d in sorted((field / sub).iterdir()) if d.is_dir() for p in _photos(d)
    ]
    sets["unknown"] = [(p, None) for p in _photos(field / "unknown")]
    return sets


def evaluate_set(clf: Classifier, photos: list[tuple[Path, str | None]]) -> dict:
    """Top-1, verdict shares, confident precision, per-class rows and the confusion (true -> predicted counts)."""
    rows = []
    for path, truth in photos:
        try:
            p = clf.predict_file(path)
        except ImageRejected as exc:
            rows.append({"photo": str(path), "truth": truth, "error": str(exc)})
            continue
        rows.append({"photo": path.name, "truth": truth, "label": p.label, "confidence": round(p.confidence, 4), "verdict": p.verdict})
    ok = [r for r in rows if "error" not in r]
    verdicts = Counter(r["verdict"] for r in ok)
    out = {
        "photos": len(rows),
        "errors": len(rows) - len(ok),
        **{f"share_{k}": round(verdicts.get(k, 0) / max(len(ok), 1), 4) for k in ("confident", "unsure", "unknown")},
    }
    labelled = [r for r in ok if r["truth"] is not None]
    if labelled:
        right = [r["label"] == r["truth"] for r in labelled]
        conf = [r["label"] == r["truth"] for r in labelled if r["verdict"] == "confident"]
        out["top1"] = round(float(np.mean(right)), 4)
        out["confident_photos"] = len(conf)
        out["confident_top1"] = round(float(np.mean(conf)), 4) if conf else None
        per_class = {}
        for cls in sorted({r["truth"] for r in labelled}):
            mine = [r for r in labelled if r["truth"] == cls]
            mc = [r for r in mine if r["verdict"] == "confident"]
            per_class[cls] = {
                "photos": len(mine),
                "top1": round(np.mean([r["label"] == cls for r in mine]), 4),
                "share_confident": round(len(mc) / len(mine), 4),
                "confident_top1": round(np.mean([r["label"] == cls for r in mc]), 4) if mc else None,
                "most_said": Counter(r["label"] for r in mine).most_common(1)[0][0],
            }
        out["per_class"] = per_class
    out["said"] = dict(Counter(r["label"] for r in ok).most_common(5))
    out["rows"] = rows
    return out


def confusion_png(result: dict, classes: list[str], path: Path, title: str) -> None:
    """Rows: the true classes present; columns: every class the model said for them (row-normalised)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "error" not in r and r["truth"] is not None]
    order = {c: i for i, c in enumerate(classes)}
    truths = sorted({r["truth"] for r in rows}, key=lambda c: (order.get(c, len(order)), c))
    said = sorted({r["label"] for r in rows} | set(truths), key=lambda c: (order.get(c, len(order)), c))
    m = np.zeros((len(truths), len(said)))
    for r in rows:
        m[truths.index(r["truth"]), said.index(r["label"])] += 1
    m = m / m.sum(1, keepdims=True).clip(min=1)
    fig, ax = plt.subplots(figsize=(max(6, 0.28 * len(said) + 3), max(3, 0.28 * len(truths) + 2)))
    ax.imshow(m, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(said)), [c.replace("___", ": ")[:28] for c in said], rotation=90, fontsize=6)
    ax.set_yticks(range(len(truths)), [c.replace("___", ": ")[:28] for c in truths], fontsize=6)
    ax.set_xlabel("said")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def history_png(version, path: Path) -> bool:
    """Validation (lab) and field top-1 after each training epoch, where the release recorded them (--watch-field)."""
    history = version.manifest.get("training", {}).get("history") or []
    if not history or "field_top1" not in history[0]:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    epochs = [h["epoch"] for h in history]
    ax.plot(epochs, [h["val_top1"] for h in history], label="lab validation (672)")
    ax.plot(epochs, [h["field_top1"] for h in history], label="field: apple orchard + corn (1,382)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("top-1 (running BatchNorm statistics)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{version.name}: training history (field never chooses anything)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _check(result: dict, target) -> tuple[bool | None, float | None]:
    _, which, key, op, value = target
    got = result.get(which, {}).get(key)
    if got is None:
        return None, None
    return (got >= value if op == ">=" else got <= value), got


def report_md(results: dict, meta: dict) -> str:
    lines = [f"# Lab and field: {meta['store']} {meta['version']}", "", f"`{meta['command']}` on {meta['date']} ({meta['host']}).", ""]
    for engine, res in results.items():
        lines += [
            f"## {engine}",
            "",
            "| set | photos | top-1 | confident | unsure | unknown | right when confident |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in res.items():
            lines.append(
                f"| {name} | {r['photos']} | {r.get('top1', '-')} | {r['share_confident']} | {r['share_unsure']} | "
                f"{r['share_unknown']} | {r.get('confident_top1', '-')} ({r.get('confident_photos', '-')} photos) |"
            )
        lines += ["", "| target | measured | met |", "|---|---|---|"]
        for t in TARGETS:
            ok, got = _check(res, t)
            lines.append(f"| {t[0]} | {got} | {'yes' if ok else 'no' if ok is False else '-'} |")
        lines.append("")
    first = next(iter(results.values()))
    for name in ("lab", "field"):
        lines += [
            f"## Per class, {name} ({next(iter(results))})",
            "",
            "| class | photos | top-1 | confident | right when confident | said most |",
            "|---|---|---|---|---|---|",
        ]
        for cls, r in first.get(name, {}).get("per_class", {}).items():
            lines.append(f"| {cls} | {r['photos']} | {r['top1']} | {r['share_confident']} | {r['confident_top1']} | {r['most_said']} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.field", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for field.json, field.md and the confusion matrices")
    ap.add_argument("--store", default=str(default_store_path()), help="engine store (default: the shipped one)")
    ap.add_argument("--version", default=None)
    ap.add_argument("--plantvillage", default=str(SHARED / "plantvillage"))
    ap.add_argument("--field", default=str(SHARED / "field"))
    ap.add_argument("--engines", default="auto,fp32", help="comma-separated precisions to measure")
    ap.add_argument("--crops", default="", help="comma-separated [classify] crops (e.g. 'Apple,Corn_(maize)'); default: none")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    version = EngineStore(args.store).open(args.version)
    sets = field_sets(version, Path(args.plantvillage), Path(args.field))
    results, engines = {}, {}
    for precision in args.engines.split(","):
        cfg = parse_config({"engine": {"precision": precision}}).engine
        engine = open_engine(args.store, cfg, version.name, check_photos=precision_check)  # as the daemon opens it
        engine.wait_checked()  # and as it serves once the precision is checked here
        name = f"{precision} ({engine.precision})"
        engines[name] = engine.describe()
        crops = [c for c in args.crops.split(",") if c]
        clf = Classifier.configured(engine, parse_config({"classify": {"crops": crops}}))
        name += f", crops {'+'.join(crops)}" if crops else ""
        t0 = time.perf_counter()
        results[name] = {k: evaluate_set(clf, v) for k, v in sets.items()}
        print(
            f"{name}: "
            + ", ".join(f"{k} top-1 {r.get('top1', '-')} confident {r['share_confident']}" for k, r in results[name].items())
            + f" ({time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
        )
        engine.close()
    first = next(iter(results))
    for name in ("lab", "field"):
        if name in results[first]:
            confusion_png(results[first][name], version.classes, out / f"confusion-{name}.png", f"{name}: {version.name}, {first}")
    history_png(version, out / "training-history.png")
    import platform
    from datetime import datetime, timezone

    meta = {
        "store": args.store,
        "version": version.name,
        "arch": version.manifest.get("model", {}).get("arch"),
        "command": "python -m benchmarks.field " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "engines": engines,
    }
    (out / "field.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (out / "field.md").write_text(report_md(results, meta))
    print((out / "field.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
