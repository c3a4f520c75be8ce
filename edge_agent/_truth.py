"""Labelled lab photos that settle a hot swap's doubt: when a candidate disagrees with the golden photos, the truth decides.

The golden photos (:mod:`edge_agent.golden`) are the engine in service's own confident answers, so in a field where
that engine is often wrong when sure (v4000 on an apple orchard: 32 % of its confident answers right), a retrain
that learnt the field disagrees with them because it is right. The shipped gate photos
(``edge_agent/default_data/gate``: the shipped model's test split, labelled, never trained on by it or by any
retrain) are the truth the daemon carries: a candidate the golden photos doubt is adopted only if it names at least
``min_share`` of them right and names no class wrong on all of its photos; a network whose manifest misnames its
outputs (reversed, swapped, garbage weights) does neither.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np

from edge_agent.config import default_data_path
from edge_agent.preprocess import ImageRejected, PreprocessSpec, preprocess_file

__all__ = ["PER_CLASS", "judge_on_truth", "truth_photos", "precision_check"]

#: Labelled photos of each class shown to a doubted candidate (3 x 38 classes: about 0.7 s at 256 px on 2 cores).
PER_CLASS = 3


def _gate_entries(root: Path) -> list[dict]:
    """The gate photos' entries in ``root``'s ``manifest.json``, in its order; empty when it is missing or unreadable."""
    try:
        files = json.loads((root / "manifest.json").read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [f for f in files if isinstance(f, dict) and f.get("set") == "gate"]


@lru_cache(maxsize=4)
def truth_photos(root: Path | None = None) -> tuple[tuple[Path, str], ...]:
    """The first :data:`PER_CLASS` gate photos of each class listed in ``root``'s ``manifest.json`` (the shipped
    data by default) that are on disk; empty when the manifest is missing or unreadable."""
    root = root or default_data_path()
    taken: dict[str, int] = {}
    out = []
    for f in _gate_entries(root):
        if taken.get(f.get("class"), 0) >= PER_CLASS:
            continue
        path = root / str(f.get("file"))
        if path.is_file():
            out.append((path, str(f["class"])))
            taken[f["class"]] = taken.get(f["class"], 0) + 1
    return tuple(out)


def precision_check(version, batch: int = 16, root: Path | None = None) -> Iterator[np.ndarray]:
    """Every gate photo listed in ``root``'s manifest (the shipped data by default: 672), any class, decoded with
    ``version``'s preprocessing, ``batch`` at a time: what a faster precision is checked against FP32 on, on this
    machine, at a version's first start (:class:`engines.base.CheckPhotos`; about 16 s for v4000 on 2 x86 cores
    without VNNI, once per version). Nothing when the photos are missing."""
    root = root or default_data_path()
    entries = _gate_entries(root)
    if not entries:
        return
    spec = PreprocessSpec.from_manifest(version.manifest["preprocess"])
    done = []
    for f in entries:
        try:
            done.append(preprocess_file(root / str(f.get("file")), spec))
        except (ImageRejected, OSError):
            continue
        if len(done) == batch:
            yield np.stack(done)
            done = []
    if done:
        yield np.stack(done)


def judge_on_truth(engine, min_share: float, photos: tuple[tuple[Path, str], ...] | None = None) -> dict | None:
    """How ``engine`` does on the labelled ``photos`` of classes it knows (:func:`truth_photos` by default), decoded
    with its own preprocessing: ``photos``, ``right`` (share), ``classes_all_wrong`` and ``passed``; None when it
    knows none of their classes (nothing to judge it on)."""
    index = {c: i for i, c in enumerate(engine.classes)}
    mine = [(p, c) for p, c in (truth_photos() if photos is None else photos) if c in index]
    if not mine:
        return None
    spec = PreprocessSpec.from_manifest(engine.version.manifest["preprocess"])
    answers = np.array([int(engine.infer(preprocess_file(p, spec)[None]).argmax(1)[0]) for p, _ in mine])
    right = answers == np.array([index[c] for _, c in mine])
    names = np.array([c for _, c in mine])
    all_wrong = sorted(c for c in set(names) if (names == c).sum() >= PER_CLASS and not right[names == c].any())
    share = float(right.mean())
    return {"photos": len(mine), "right": round(share, 3), "classes_all_wrong": all_wrong, "passed": share >= min_share and not all_wrong}
