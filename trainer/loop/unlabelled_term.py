"""A retrain's unlabelled term: the field photos nobody labelled, labelled by the candidate where the field check says
its confidence can be trusted, and a second candidate trained with them (self-training with a noisy student).

The first candidate (trained on the expert's labels, the replayed lab photos and the pseudo-labels) is the teacher:
it answers every photo of the unlabelled pool (:mod:`trainer.loop.unlabelled_pool`) on the photo as the daemon gives
it (the weak view). Its confidence threshold is fitted on the field check set (the expert's held-back labels): the
lowest confidence above which its answers there are at least ``[trainer] unlabelled_precision`` right, with at least
an eighth of the set (two photos at least) above it; with no such confidence the term is skipped (said in the retrain's record).
That fit, on a dozen or twenty photos the review queue chose, proved optimistic: replayed on the loop's own days
(``benchmarks.term_threshold``), the pool's answers it took were 82 % right. So the threshold is never below
``[trainer] unlabelled_floor`` (0.99), and the photo's mirror image must get the same answer at least as surely: the
replay's answers taken that way were 38 of 38 right. The photos taken join the training data as pseudo-labels (weight:
the teacher's confidence, the commonest classes brought down to the median class's share, so one class cannot take
over), and a second candidate is trained from the same parent on augmented views of everything (the strong view: the
training loop's augmentation). The field check then decides, as it does for BatchNorm statistics adapted to the
field: the second candidate is kept only where it is right on more of the field check set than the first (or as
often, with a log-loss lower by more than one standard error).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from edge_agent.classifier import softmax
from edge_agent.preprocess import ImageRejected, PreprocessSpec, preprocess_file
from trainer.loop.unlabelled_pool import UnlabelledPhoto
from trainer.photos import empty, photo, stack
from trainer.stop import check
from trainer.strategies.base import Generation
from trainer.verdict_fit import logits_of

__all__ = ["Term", "fit_threshold", "load_unlabelled", "teach"]


@dataclass
class Term:
    """The unlabelled photos the teacher labelled (None: the term is skipped) and what was measured."""

    data: Generation | None
    summary: dict = field(default_factory=dict)


def load_unlabelled(
    photos: list[UnlabelledPhoto], exclude: set[str], limit: int, spec: PreprocessSpec, should_stop=lambda: False
) -> tuple[torch.Tensor, list[str]]:
    """Up to ``limit`` of ``photos`` (newest first) not in ``exclude``, as the daemon preprocesses them; a photo evicted
    or unreadable meanwhile is passed over."""
    xs, ids = [], []
    for p in photos:
        if len(xs) >= limit:
            break
        if p.id in exclude:
            continue
        check(should_stop, "while reading the unlabelled photos")
        try:
            xs.append(photo(preprocess_file(p.file, spec)))
        except (ImageRejected, OSError):
            continue
        ids.append(p.id)
    return (stack(xs) if xs else empty(spec.size)), ids


def fit_threshold(confidence: np.ndarray, right: np.ndarray, precision: float, least: int) -> float | None:
    """The lowest confidence at which the answers at or above it are at least ``precision`` right, with at least
    ``least`` of them; None when there is none."""
    order = np.argsort(-confidence, kind="stable")
    conf, ok = confidence[order], right[order].astype(float)
    best = None
    for k in range(max(1, least), len(conf) + 1):
        if k < len(conf) and conf[k] == conf[k - 1]:
            continue  # a threshold takes every answer of the same confidence
        if ok[:k].mean() >= precision:
            best = float(conf[k - 1])
    return best


def _mirrored_probs(teacher: torch.nn.Module, x: torch.Tensor, batch: int = 256) -> np.ndarray:
    """The teacher's probabilities for the photos ``x`` mirrored left to right (a batch at a time: no second copy of the pool)."""
    return np.concatenate([softmax(logits_of(teacher, torch.flip(x[i : i + batch], dims=[3]))) for i in range(0, len(x), batch)])


def teach(
    teacher: torch.nn.Module,
    x: torch.Tensor,
    ids: list[str],
    field_x: torch.Tensor,
    field_y: torch.Tensor,
    precision: float,
    floor: float = 0.0,
    should_stop=lambda: False,
) -> Term:
    """The photos ``x`` the teacher labels, and labels alike mirrored, at or above the confidence fitted on the field
    check set, and never below ``floor``."""
    summary: dict = {"pool_photos": len(ids), "field_photos": int(len(field_x)), "precision_wanted": precision, "floor": floor}
    if len(ids) == 0:
        return Term(None, {**summary, "reason": "no unlabelled photos"})
    check(should_stop, "while fitting the unlabelled threshold")
    probs = softmax(logits_of(teacher, field_x))
    right = probs.argmax(1) == field_y.numpy()
    least = max(2, len(field_x) // 8)
    order = np.argsort(-probs.max(1))[:12]
    summary["field_most_confident"] = [[round(float(probs.max(1)[i]), 3), bool(right[i])] for i in order]  # what the fit saw
    tau = fit_threshold(probs.max(1), right, precision, least=least)
    if tau is None:
        return Term(
            None, {**summary, "reason": f"no confidence at which the candidate is {precision:.0%} right on {least} field check photos"}
        )
    summary["threshold_fitted"] = round(tau, 4)
    tau = max(tau, floor)
    check(should_stop, "while labelling the unlabelled photos")
    probs = softmax(logits_of(teacher, x))
    conf, label = probs.max(1), probs.argmax(1)
    sure = conf >= tau
    mirrored = _mirrored_probs(teacher, x[torch.from_numpy(np.flatnonzero(sure))]) if sure.any() else np.zeros((0, probs.shape[1]))
    keep = sure.copy()
    keep[sure] = (mirrored.argmax(1) == label[sure]) & (mirrored.max(1) >= tau)
    summary.update(threshold=round(tau, 4), taken=int(keep.sum()), mirror_disagreed=int(sure.sum() - keep.sum()))
    if not keep.any():
        return Term(None, {**summary, "reason": f"no unlabelled photo answered {tau:.3f} or surer, and alike mirrored"})
    rows = torch.from_numpy(np.flatnonzero(keep))
    data = Generation(
        x[rows],
        torch.from_numpy(label[keep]).long(),
        torch.from_numpy(conf[keep]).float(),
        torch.ones(len(rows), dtype=torch.bool),
        [ids[i] for i in rows.tolist()],
    )
    summary["by_class"] = {int(c): int(n) for c, n in zip(*np.unique(label[keep], return_counts=True))}
    return Term(data, summary)
