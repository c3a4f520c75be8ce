"""Where a retrain's true labels come from: the photos it replays and the photos its gate judges on.

In order of precedence:

1. ``[trainer] validation_data``: the gate's photos (never trained on); ``labelled_data``, if set, is replayed whole.
2. ``[trainer] labelled_data`` alone: replayed, with ``val_fraction`` of it held out (stratified, seeded) for the gate.
3. Neither, with ``shipped_data`` on: the photos shipped beside the default model (``edge_agent/default_data``):
   ``gate/`` (the shipped model's test split) for the gate and ``replay/`` to replay. ``validation_data`` alone
   replaces only the gate's half.

Photos are matched to the engine by class name; classes the engine does not know are left out. The gate's photos
are never trained on, even when the same bytes arrive from the field (a user dropping the sample photos into the
inbox): :attr:`Labelled.gate_ids` lists their sha256 so the trainer can leave such samples out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from edge_agent.config import AppConfig, default_data_path
from edge_agent.log import get_logger
from edge_agent.preprocess import DEFAULT_SPEC, ImageRejected, PreprocessSpec, preprocess_bytes, read_limited
from trainer import photos
from trainer.data import DatasetError, Sample, scan_folder, stratified_split
from trainer.stop import check
from trainer.strategies.base import Generation

__all__ = ["Labelled", "LabelledSources", "labelled_sources", "load_labelled", "empty_generation"]


def empty_generation() -> Generation:
    return Generation(photos.empty(), torch.zeros(0, dtype=torch.long))


@dataclass
class LabelledSources:
    """The photos (path and engine class index) a retrain replays and gates on, and where they come from."""

    train: list[Sample] = field(default_factory=list)
    val: list[Sample] = field(default_factory=list)
    origin: str = "none"  # "configured", "shipped", "configured+shipped" or "none"
    problems: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        return {
            "replay_photos": len(self.train),
            "validation_photos": len(self.val),
            "origin": self.origin,
            **({"problems": self.problems} if self.problems else {}),
        }


@dataclass
class Labelled:
    train: Generation
    val: Generation
    gate_ids: set[str]


def _folder(path: str | Path, classes: list[str], problems: list[str]) -> list[Sample]:
    """``path``'s photos with the engine's class indices (classes the engine lacks left out)."""
    try:
        folder = scan_folder(path)
    except DatasetError as exc:
        problems.append(str(exc))
        return []
    index = {name: i for i, name in enumerate(classes)}
    unknown = [name for name in folder.classes if name not in index]
    if unknown:
        problems.append(f"{path}: {len(unknown)} class folder(s) the engine does not know, left out: {', '.join(unknown[:5])}")
    return [Sample(s.path, index[folder.classes[s.label]]) for s in folder.samples if folder.classes[s.label] in index]


def labelled_sources(cfg: AppConfig, classes: list[str], shipped: Path | None = None) -> LabelledSources:
    """Resolve the configuration to lists of photos (no photo is read yet); ``shipped``: the shipped photos' folder
    (:func:`edge_agent.config.default_data_path` unless given)."""
    tc = cfg.trainer
    problems: list[str] = []
    shipped = default_data_path() if shipped is None else shipped
    use_shipped = tc.shipped_data and (shipped / "gate").is_dir()
    train = _folder(tc.labelled_data, classes, problems) if tc.labelled_data else []
    if tc.validation_data:
        val = _folder(tc.validation_data, classes, problems)
        if not tc.labelled_data and use_shipped:
            return LabelledSources(_folder(shipped / "replay", classes, problems), val, "configured+shipped", problems)
        return LabelledSources(train, val, "configured", problems)
    if tc.labelled_data:
        parts = stratified_split(train, {"val": tc.val_fraction}, tc.seed) if train else {"train": [], "val": []}
        return LabelledSources(parts["train"], parts["val"], "configured", problems)
    if use_shipped:
        return LabelledSources(
            _folder(shipped / "replay", classes, problems), _folder(shipped / "gate", classes, problems), "shipped", problems
        )
    return LabelledSources([], [], "none", problems)


def _tensors(
    samples: list[Sample], should_stop, spec: PreprocessSpec, replayed: bool = False, unreadable: list[str] | None = None
) -> tuple[Generation, set[str]]:
    xs, ys, ids = [], [], set()
    for s in samples:
        check(should_stop, "while reading labelled photos")
        try:
            data = read_limited(s.path, spec)  # read once: hashed, and preprocessed as the daemon would
            xs.append(photos.photo(preprocess_bytes(data, spec)))
        except (OSError, ImageRejected) as exc:
            if unreadable is not None:
                unreadable.append(f"{s.path}: {getattr(exc, 'strerror', None) or exc}")
            continue
        ys.append(s.label)
        ids.add(hashlib.sha256(data).hexdigest())
    if not xs:
        return empty_generation(), ids
    return Generation(photos.stack(xs), torch.tensor(ys), replayed=torch.full((len(ys),), replayed)), ids


def load_labelled(sources: LabelledSources, should_stop=lambda: False, spec: PreprocessSpec = DEFAULT_SPEC) -> Labelled:
    """Read and preprocess the photos of ``sources`` as the daemon does for an engine whose manifest records ``spec``;
    a photo that cannot be read is left out and named in ``sources.problems`` (and the log)."""
    unreadable: list[str] = []
    train, _ = _tensors(sources.train, should_stop, spec, replayed=True, unreadable=unreadable)
    val, gate_ids = _tensors(sources.val, should_stop, spec, unreadable=unreadable)
    if unreadable:
        get_logger("trainer.labelled").warning("labelled_photos_unreadable", photos=len(unreadable), first=unreadable[:3])
        sources.problems.append(f"{len(unreadable)} labelled photo(s) could not be read and were left out, e.g. {unreadable[0]}")
    return Labelled(train, val, gate_ids)
