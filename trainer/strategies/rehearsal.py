"""Rehearsal: a class-balanced memory of past photos replayed with each new generation.

The memory (``per_class`` photos per class, default 20) is kept on disk as
tensors under the strategy's state directory. A photo is replayed only where the
generation does not already hold it (an on-device retrain is given the shipped replay
photos and every expert label each time: replaying them again weighed them double and,
chosen from what the last retrain saw, memory included, filled the memory with copies
that tripled a retrain's time by the fifth day), and kept once. ``selection``: ``random``;
``herding`` (iCaRL: greedily the photos whose running mean best matches the
class mean in feature space); ``distance`` (the photos nearest the class mean).
"""

from __future__ import annotations

import hashlib

import torch

from edge_agent.trainer_config import RehearsalConfig
from trainer.models import inference_copy
from trainer.photos import INFERENCE_BATCH, join
from trainer.strategies._state_file import load_state, save_state
from trainer.strategies.base import Generation, Strategy, register


@register
class Rehearsal(Strategy):
    type = "rehearsal"
    Config = RehearsalConfig
    config: RehearsalConfig

    @property
    def _path(self):
        return self.state_dir / "memory.pt"

    def _load(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        blob = load_state(self._path)
        return None if blob is None else (blob["x"], blob["y"])

    def before(self, model, previous, data: Generation) -> Generation:
        memory = self._load()
        if memory is None:
            return data
        mx, my = memory
        held = set(_digests(data.x))
        new = [i for i, d in enumerate(_digests(mx)) if d not in held]
        if not new:
            return data
        rows = torch.tensor(new)
        return data + Generation(mx[rows], my[rows])

    def after(self, model, data: Generation, features: torch.Tensor | None = None) -> None:
        """Keep ``per_class`` photos a class from ``data``'s true labels and the memory; ``features`` (the model's of
        ``data.x[~data.pseudo]``, where the retrain has them) spare running those photos through the model again."""
        per_class = self.config.per_class
        how = self.config.selection
        memory = self._load()
        truth = torch.nonzero(~data.pseudo).flatten()  # remember true labels only
        if features is not None and len(features) != len(truth):
            raise ValueError(f"features of {len(features)} photos for {len(truth)} true labels")
        parts = [(data.x, truth, data.y[truth], features)]
        if memory is not None:
            parts.append((memory[0], torch.arange(len(memory[1])), memory[1], None))
        # (photos, row, its given features) of every candidate, each photo once (the newest label first): a batch is
        # gathered at a time, never all the photos again
        rows, labels, seen = [], [], set()
        for px, idx, py, given in parts:
            for k, (i, label, digest) in enumerate(zip(idx.tolist(), py.tolist(), _digests(px, idx.tolist()))):
                if digest not in seen:
                    seen.add(digest)
                    rows.append((px, i, None if given is None else given[k]))
                    labels.append(label)
        y = torch.tensor(labels, dtype=torch.long)
        keep = []
        gen = torch.Generator().manual_seed(self.seed)
        feats = _features(model, rows) if how != "random" else None
        for c in torch.unique(y).tolist():
            idx = torch.nonzero(y == c).flatten()
            if len(idx) <= per_class:
                keep.append(idx)
            elif how == "random":
                keep.append(idx[torch.randperm(len(idx), generator=gen)[:per_class]])
            else:
                keep.append(idx[select(feats[idx], per_class, how)])
        order = torch.cat(keep)
        save_state({"x": _gather([rows[int(i)][:2] for i in order]), "y": y[order].clone()}, self._path)


def _digests(x: torch.Tensor, rows: list[int] | None = None) -> list[bytes]:
    """A digest of the values of each photo (of ``rows``, default all): the same photo, the same digest (in the same
    precision)."""
    return [
        hashlib.blake2b(x[i].contiguous().numpy().tobytes(), digest_size=16).digest() for i in (range(len(x)) if rows is None else rows)
    ]


def _features(model, rows: list[tuple[torch.Tensor, int, torch.Tensor | None]]) -> torch.Tensor:
    """The model's features (in eval mode) of each of ``rows``: the ones given, the rest run through the model a
    batch at a time."""
    out = torch.empty(len(rows), model.head.in_features)
    need = []
    for k, (_, _, given) in enumerate(rows):
        if given is None:
            need.append(k)
        else:
            out[k] = given
    model.eval()
    if need:
        fast = inference_copy(model)
        with torch.no_grad():
            for s in range(0, len(need), INFERENCE_BATCH):
                part = need[s : s + INFERENCE_BATCH]
                out[part] = fast.features(_gather([rows[k][:2] for k in part])).float()
    return out


def _gather(rows: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """The photos at ``rows`` ((photos, index) pairs) as one new tensor."""
    return join([px[i : i + 1] for px, i in rows])


def select(feats: torch.Tensor, k: int, how: str) -> torch.Tensor:
    """Indices of ``k`` exemplars by herding or by distance to the class mean."""
    f = torch.nn.functional.normalize(feats, dim=1)
    mean = f.mean(0)
    if how == "distance":
        return torch.argsort(((f - mean) ** 2).sum(1))[:k]
    if how != "herding":
        raise ValueError(f"unknown rehearsal selection {how!r}")
    chosen: list[int] = []
    running = torch.zeros_like(mean)
    for i in range(k):
        cand = ((mean - (running + f) / (i + 1)) ** 2).sum(1)
        if chosen:
            cand[chosen] = float("inf")
        j = int(torch.argmin(cand))
        chosen.append(j)
        running += f[j]
    return torch.tensor(chosen)
