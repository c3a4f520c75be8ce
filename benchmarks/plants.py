"""Several photos a plant: what 1, 3 and 6 photos give on field photos, combined as the daemon combines them.

``python -m benchmarks.plants --out benchmarks/results/plants [--store DIR [--held-out SEED]] [--seeds 5]``

Every field photo (``apple-orchard`` + ``corn-field``; and the unknown disease) is classified once through
:class:`edge_agent.classifier.Classifier` (the daemon's preprocessing, engine and verdict), then *plants* are formed
from them: per seed, each class's photos shuffled and cut into groups of n, each group combined with
:func:`edge_agent.plants.combine`. The data set does not say which photos show the same plant, so these plants are
photos of one disease from different trees: more independent than photos of one plant (same light, same leaves,
often the same lesion), so the gain measured here is an upper bound on what a real plant's photos give.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from edge_agent.classifier import Classifier
from edge_agent.config import default_store_path, parse_config
from edge_agent.plants import combine
from engines.loader import open_engine
from engines.store import EngineStore

REPO = Path(__file__).resolve().parents[1]
FIELD = REPO.parent / "shared" / "data" / "field"
SIZES = (1, 3, 6)


def _answers(store: Path, field: Path, only: set[Path] | None = None) -> tuple[dict[str, list[tuple[list, str]]], int, float, str]:
    """Per true class (``unknown`` for the unknown disease): every photo's (top_k, verdict); with ``only``, the
    apple-orchard photos in it alone (the others a retrain learnt from)."""
    cfg = parse_config({})
    out: dict[str, list[tuple[list, str]]] = {}
    with open_engine(EngineStore(store), cfg.engine) as engine:
        clf = Classifier.configured(engine, cfg)
        for sub in ("apple-orchard", "corn-field", "unknown"):
            for d in sorted(p for p in (field / sub).iterdir() if p.is_dir()):
                key = "unknown" if sub == "unknown" else d.name
                for photo in sorted(d.glob("*.jpg")):
                    if only is not None and sub == "apple-orchard" and photo not in only:
                        continue
                    p = clf.predict_file(photo)
                    out.setdefault(key, []).append(([list(t) for t in p.top_k], p.verdict))
        return out, len(engine.classes), cfg.labels.pseudo_threshold, engine.version.name


def measure(answers: dict, num_classes: int, sure: float, n: int, seed: int) -> dict:
    """Plants of ``n`` photos: top-1 and verdict shares on the field classes, confident share on the unknown disease."""
    rng = random.Random(seed)
    right = total = confident = confident_right = 0
    unknown_plants = unknown_confident = 0
    for cls, photos in sorted(answers.items()):
        photos = photos[:]
        rng.shuffle(photos)
        for i in range(0, len(photos) - n + 1, n):
            d = combine(photos[i : i + n], num_classes, sure)
            if cls == "unknown":
                unknown_plants += 1
                unknown_confident += d.verdict == "confident"
                continue
            total += 1
            right += d.label == cls
            if d.verdict == "confident":
                confident += 1
                confident_right += d.label == cls
    return {
        "plants": total,
        "top1": right / total,
        "share_confident": confident / total,
        "confident_right": confident_right / confident if confident else None,
        "unknown_confident": unknown_confident / unknown_plants if unknown_plants else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.plants")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--field", type=Path, default=FIELD)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument(
        "--held-out", type=int, default=None, metavar="SEED", help="Only the orchard photos benchmarks.retrain_cost held out with SEED."
    )
    args = ap.parse_args()
    only = None
    if args.held_out is not None:
        from benchmarks.retrain_cost import _split

        only = {p for p, _ in _split(args.field / "apple-orchard", args.held_out, 100)[0]}
    answers, k, sure, version = _answers(args.store or default_store_path(), args.field, only)
    rows = {n: [measure(answers, k, sure, n, seed) for seed in range(1, args.seeds + 1)] for n in SIZES}

    def ms(n: int, key: str) -> str:
        values = [r[key] for r in rows[n] if r[key] is not None]
        if not values:
            return "-"
        return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"

    photos = sum(len(v) for c, v in answers.items() if c != "unknown")
    lines = [
        f"# Photos a plant ({version}; {photos} field photos, {len(answers.get('unknown', []))} of an unknown disease; "
        f"{args.seeds} seeds of random same-class plants, mean +- sd)",
        "",
        f"`python -m benchmarks.plants --out {args.out}`. Plants are photos of one disease from different trees (the data "
        "set does not say which photos show one plant): an upper bound on what a real plant's photos give.",
        "",
        "| photos a plant | plants | top-1 | marked confident | right when confident | unknown disease: plants marked confident |",
        "|---|---|---|---|---|---|",
    ]
    for n in SIZES:
        lines.append(
            f"| {n} | {rows[n][0]['plants']} | {ms(n, 'top1')} | {ms(n, 'share_confident')} | {ms(n, 'confident_right')} | "
            f"{ms(n, 'unknown_confident')} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plants.md").write_text(text)
    (args.out / "plants.json").write_text(json.dumps({"version": version, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
