"""Whether the verdict would be ``confident`` on field photos if the farm's own labelled photos were class centres too.

``python -m benchmarks.field_verdict STATE_DIR [--version V] [--seed 1] [--field apple-orchard] [--out FILE]``

The verdict (:mod:`edge_agent.verdict`) calls an answer ``confident`` only where its logits lie within
``confident_distance`` of a class mean fitted on the training photos; after a retrain those are mostly the replayed
lab photos, so a field photo rarely is (the full-mode field loop: 16 of 400). This replays, for one version of a
finished ``benchmarks.field_loop`` run's state, the shipped rule beside one variant: each class's mean logits over
the expert's labelled field photos (two at least) added as a second centre of that class, with the same shared
covariance and thresholds. Scored on the seed's held-out field photos (never labelled) and on the unknown apple
disease: the share marked ``confident``, and the share of those right. The image checks are left out (both rules
share them). Nothing here changes the product; it measures whether the change is worth making.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from benchmarks.field_loop import SHARED

__all__ = ["field_centres", "judge", "main"]

FIELD = SHARED / "field"


def field_centres(logits: np.ndarray, labels: np.ndarray, k: int, least: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(centres, their class): each class's mean logits over its labelled photos, where it has ``least`` or more."""
    rows = [(logits[labels == c].mean(0), c) for c in range(k) if (labels == c).sum() >= least]
    if not rows:
        return np.zeros((0, logits.shape[1])), np.zeros(0, int)
    return np.stack([r[0] for r in rows]), np.array([r[1] for r in rows])


def judge(logits: np.ndarray, means: np.ndarray, precision: np.ndarray, confident_distance: float, sure: float) -> np.ndarray:
    """True where an answer is ``confident``: softmax at least ``sure`` and the nearest centre within the distance
    (the product's :class:`~edge_agent.verdict.Judge` on these centres; the image checks left out)."""
    from benchmarks.verdict_features import distances
    from edge_agent.classifier import softmax

    return (softmax(logits).max(1) >= sure) & (distances(means, precision, logits) <= confident_distance)


def _logits(version, paths: list[Path]) -> np.ndarray:
    import torch

    from edge_agent.preprocess import PreprocessSpec, preprocess_file
    from trainer.publish import load_weights
    from trainer.verdict_fit import logits_of

    spec = PreprocessSpec.from_manifest(version.manifest["preprocess"])
    x = torch.from_numpy(np.stack([preprocess_file(p, spec) for p in paths]))
    return logits_of(load_weights(version), x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.field_verdict", description=__doc__.split("\n\n")[0])
    ap.add_argument("state", type=Path, help="a field_loop run's state folder (…/device-full/seed-1/state)")
    ap.add_argument("--version", default=None, help="default: the version the state's store serves")
    ap.add_argument("--seed", type=int, default=1, help="the run's seed (its held-out photos)")
    ap.add_argument("--field", default="apple-orchard")
    ap.add_argument("--sure", type=float, default=0.9, help="[labels] pseudo_threshold")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import hashlib
    import sqlite3

    from benchmarks.field_loop import split_field
    from edge_agent.verdict import VerdictSpec
    from engines.store import EngineStore

    version = EngineStore(args.state / "engines").open(args.version)
    classes = list(version.classes)
    spec = VerdictSpec.from_manifest(version.manifest)
    if spec is None or spec.on != "logits":
        raise SystemExit(f"{version.name}: the farm's centres are measured on a verdict on the logits; this one is on {spec and spec.on}")
    test, stream = split_field(FIELD / args.field, classes, args.seed, 0.25)
    with sqlite3.connect(args.state / "results.sqlite") as db:
        expert = dict(db.execute("SELECT sha256, label FROM expert_labels").fetchall())
    labelled = [(p, classes.index(expert[h])) for p, _ in stream if (h := hashlib.sha256(p.read_bytes()).hexdigest()) in expert]
    unknown = sorted(p for p in (FIELD / "unknown").rglob("*") if p.is_file() and p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    lab_logits = _logits(version, [p for p, _ in labelled])
    centres, owner = field_centres(lab_logits, np.array([y for _, y in labelled]), len(classes))
    rules = {
        "shipped (lab centres)": spec.means,
        "with the farm's centres": np.concatenate([spec.means, centres]) if len(centres) else spec.means,
    }
    sets = {
        "held-out field": (_logits(version, [p for p, _ in test]), np.array([y for _, y in test])),
        "unknown disease": (_logits(version, unknown), None),
    }
    lines = [
        f"`python -m benchmarks.field_verdict {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        f"{version.name}; {len(labelled)} expert-labelled field photos, {len(centres)} classes with a field centre "
        f"({', '.join(classes[c].split('___')[-1] for c in owner)}); held-out field {len(test)}, unknown disease {len(unknown)}.",
        "",
        "| rule | held-out field: confident | right when confident | top-1 | unknown disease: confident |",
        "|---|---|---|---|---|",
    ]
    for name, means in rules.items():
        cells = []
        (fl, fy), (ul, _) = sets["held-out field"], sets["unknown disease"]
        sure = judge(fl, means, spec.precision, spec.confident_distance, args.sure)
        right = fl.argmax(1) == fy
        cells.append(f"{sure.mean():.3f} ({sure.sum()})")
        cells.append(f"{right[sure].mean():.3f}" if sure.any() else "-")
        cells.append(f"{right.mean():.3f}")
        u = judge(ul, means, spec.precision, spec.confident_distance, args.sure)
        cells.append(f"{u.mean():.3f} ({u.sum()})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
