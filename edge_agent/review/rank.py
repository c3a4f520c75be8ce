"""Which photos an expert's label would teach the model most, best first.

A photo's *margin* is the probability of the model's first class minus that of its second: a small margin
means the model hesitates between two classes, and a true label there moves the decision boundary where
it matters (margin sampling, Scheffer et al. 2001). Pure margin order would ask about ten near-identical photos
of one confusing pair in a row, so the order is built greedily:

* each pick adds ``class_penalty`` to the margin of every remaining photo the model gives the same class, so
  the questions spread over the classes the model is unsure of;
* a photo whose top-k probabilities are within ``duplicate_l1`` (L1 distance) of an already chosen photo of the
  same class is a near-duplicate and goes to the end.

Pure functions on ``(id, top_k)``; the daemon, the CLI, the web page and the field simulation share them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Candidate", "margin", "rank"]


@dataclass(frozen=True)
class Candidate:
    id: str
    top_k: Sequence[Sequence]  # [(label, probability), ...], most probable first

    @property
    def label(self) -> str:
        return str(self.top_k[0][0]) if self.top_k else ""


def margin(top_k: Sequence[Sequence]) -> float:
    """First minus second probability (with only one class listed: its probability minus the rest's)."""
    if not top_k:
        return 1.0
    p1 = float(top_k[0][1])
    p2 = float(top_k[1][1]) if len(top_k) > 1 else 1.0 - p1
    return p1 - p2


def _distance(a: Sequence[Sequence], b: Sequence[Sequence]) -> float:
    pa, pb = {str(k): float(v) for k, v in a}, {str(k): float(v) for k, v in b}
    return sum(abs(pa.get(k, 0.0) - pb.get(k, 0.0)) for k in pa.keys() | pb.keys())


def rank(
    candidates: Iterable[Candidate], limit: int | None = None, class_penalty: float = 0.15, duplicate_l1: float = 0.02
) -> list[Candidate]:
    """``candidates`` in the order to ask about them (at most ``limit``)."""
    pool = sorted(((margin(c.top_k), c) for c in candidates), key=lambda mc: (mc[0], mc[1].id))
    want = len(pool) if limit is None else min(limit, len(pool))
    chosen: list[Candidate] = []
    per_class: dict[str, int] = {}
    duplicates: list[Candidate] = []
    while pool and len(chosen) < want:
        best = min(range(len(pool)), key=lambda i: (pool[i][0] + class_penalty * per_class.get(pool[i][1].label, 0), pool[i][1].id))
        c = pool.pop(best)[1]
        if any(o.label == c.label and _distance(o.top_k, c.top_k) <= duplicate_l1 for o in chosen):
            duplicates.append(c)
            continue
        chosen.append(c)
        per_class[c.label] = per_class.get(c.label, 0) + 1
    return (chosen + duplicates)[:want]
