"""Labelled photo folders: discovery, stratified splits and a cached tensor dataset.

Tensors come from :func:`edge_agent.preprocess.preprocess_file`, the very function
the daemon uses, so a photo looks the same to the network in training and in the field.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from edge_agent.preprocess import DEFAULT_SPEC, IMAGE_EXTENSIONS, ImageRejected, PreprocessSpec, preprocess_file
from engines.errors import EdgeAgentError

__all__ = [
    "DatasetError",
    "Sample",
    "LabelledFolder",
    "scan_folder",
    "stratified_split",
    "recorded_split",
    "TensorDataset",
    "IMAGE_EXTENSIONS",
]


class DatasetError(EdgeAgentError, ValueError):
    """The training data is missing, empty or malformed."""


@dataclass(frozen=True)
class Sample:
    path: Path
    label: int


@dataclass
class LabelledFolder:
    """A folder of class folders: ``classes`` in label order and every photo found."""

    root: Path
    classes: list[str]
    samples: list[Sample]
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = Counter(s.label for s in self.samples)
        return {name: c.get(i, 0) for i, name in enumerate(self.classes)}


def scan_folder(root: str | os.PathLike) -> LabelledFolder:
    """Find ``root/<Class name>/*.jpg`` (and other image types); class names are kept verbatim.

    Hidden entries are ignored. Raises :class:`DatasetError` for a missing folder,
    fewer than two classes, or a class folder with no photos.
    """
    base = Path(root)
    if not base.is_dir():
        raise DatasetError(f"{base}: not a directory")
    classes = sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise DatasetError(f"{base}: found {len(classes)} class folder(s); expected at least 2 (layout: {base}/<Class>/<photo>.jpg)")
    samples: list[Sample] = []
    empty = []
    for label, name in enumerate(classes):
        files = sorted(
            p for p in (base / name).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")
        )
        if not files:
            empty.append(name)
        samples.extend(Sample(p, label) for p in files)
    if empty:
        raise DatasetError(f"{base}: class folder(s) with no photos: {', '.join(map(repr, empty))}")
    return LabelledFolder(base, classes, samples)


def stratified_split(samples: list[Sample], fractions: dict[str, float], seed: int) -> dict[str, list[Sample]]:
    """Split per class with a fixed seed. ``fractions`` maps split name -> share;
    the remainder goes to ``"train"``. Every class keeps at least one training photo."""
    if sum(fractions.values()) >= 1.0:
        raise ValueError("split fractions must sum to less than 1")
    by_class: dict[int, list[Sample]] = {}
    for s in samples:
        by_class.setdefault(s.label, []).append(s)
    out: dict[str, list[Sample]] = {name: [] for name in fractions} | {"train": []}
    for label in sorted(by_class):
        items = sorted(by_class[label], key=lambda s: str(s.path))
        random.Random(f"{seed}:{label}").shuffle(items)
        start = 0
        for name, frac in fractions.items():
            k = min(round(len(items) * frac), len(items) - 1 - start)
            out[name].extend(items[start : start + max(k, 0)])
            start += max(k, 0)
        out["train"].extend(items[start:])
    return out


def recorded_split(version, data_dir: str | os.PathLike) -> dict[str, list[Sample]]:
    """The photos a store version was trained, validated and tested on, found in ``data_dir``.

    From the version's ``split.json`` (photo paths relative to the training folder) where it has one, so the split
    stays the same when the folder grows; labels are indices into the version's classes. Versions published before
    it are recomputed from the folder with the manifest's seed and fractions, which is their split only while the
    folder holds exactly the photos they were trained from. Raises :class:`DatasetError` for a photo listed but missing."""
    base = Path(data_dir)
    classes = list(version.manifest["classes"])
    if "split" in version.manifest.get("artifacts", {}):
        import json

        listed = json.loads(version.artifact("split").read_text())
        out: dict[str, list[Sample]] = {}
        for name, paths in listed.items():
            out[name] = []
            for rel in paths:
                path = base / rel
                if not path.is_file():
                    raise DatasetError(
                        f"{path}: listed in {version.name}'s split.json but not found (is {base} the folder it was trained from?)"
                    )
                out[name].append(Sample(path, classes.index(Path(rel).parts[0])))
        return out
    split = version.manifest["training"]["split"]
    folder = scan_folder(base)
    if folder.classes != classes:
        raise DatasetError(f"{base}: its class folders differ from {version.name}'s classes")
    return stratified_split(folder.samples, {"test": split["test_fraction"], "val": split["val_fraction"]}, split["seed"])


class TensorDataset(Dataset):
    """Preprocessed photos held in memory as one float32 array (decoded once, in parallel).

    Photos the preprocessing rejects are left out and listed in ``skipped``.
    """

    def __init__(self, samples: list[Sample], spec: PreprocessSpec = DEFAULT_SPEC, workers: int = 4) -> None:
        def load(s: Sample):
            try:
                return preprocess_file(s.path, spec)
            except ImageRejected as exc:
                return exc

        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(load, samples))
        keep = [i for i, r in enumerate(results) if not isinstance(r, Exception)]
        self.skipped = [(str(samples[i].path), str(results[i])) for i, r in enumerate(results) if isinstance(r, Exception)]
        self.samples = [samples[i] for i in keep]
        shape = (len(keep), 3, spec.size, spec.size)
        self.x = torch.from_numpy(np.stack([results[i] for i in keep]) if keep else np.zeros(shape, np.float32))
        self.y = torch.tensor([samples[i].label for i in keep], dtype=torch.long)

    @classmethod
    def of(cls, samples: list[Sample], x: torch.Tensor | None, y: torch.Tensor) -> "TensorDataset":
        """A dataset of tensors already made (``x`` may be None where batches are composed from elsewhere)."""
        ds = cls.__new__(cls)
        ds.samples, ds.x, ds.y, ds.skipped = samples, x, y, []
        return ds

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]
