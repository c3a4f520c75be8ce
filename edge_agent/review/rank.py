"""Which photos an expert's label would teach the model most, best first.

A photo's *margin* is the probability of the model's first class minus that of its second: a small margin
means the model hesitates between two classes, and a true label there moves the decision boundary where
it matters (margin sampling, Scheffer et al. 2001). Pure margin order would ask about ten near-identical photos
of one confusing pair in a row, so the order is built greedily:

* each pick adds ``class_penalty`` to the margin of every remaining photo the model gives the same class, so
  the questions spread over the classes the model is unsure of;
* a photo whose top-k probabilities are within ``duplicate_l1`` (L1 distance) of an already chosen photo of the
  same class is a near-duplicate and goes to the end.

``order = "draw"`` puts a fixed draw in the margin's place (a number in [0, 1) from the photo's id, the same at every
call): with ``class_penalty`` 0 the pool in a random order, near-duplicates last (``[labels] ask_order = "draw"``).
Measured in a field the model has never seen (:mod:`benchmarks.field_ceiling` ``--choose``, docs/learning-loop.md):
one retrain of the shipped model on 90 orchard labels drawn at random ended 2 points above the 90 this module ranks
first on the mean of five seeds, within their spread; the margin's order stays the default.

Pure functions on ``(id, top_k)``; the daemon, the CLI, the web page and the field simulation share them.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["ORDERS", "Candidate", "draw", "margin", "rank"]

#: What orders a class's photos: the least margin first, or a fixed draw (:func:`draw`).
ORDERS = ("margin", "draw")


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


def draw(id: str) -> float:
    """A number in [0, 1) fixed by ``id`` alone: a photo's place in a random order that stays put between calls."""
    return int.from_bytes(hashlib.sha256(id.encode()).digest()[:8], "big") / 2.0**64


def _distance(a: Sequence[Sequence], b: Sequence[Sequence]) -> float:
    pa, pb = {str(k): float(v) for k, v in a}, {str(k): float(v) for k, v in b}
    return sum(abs(pa.get(k, 0.0) - pb.get(k, 0.0)) for k in pa.keys() | pb.keys())


def _top(c: Candidate) -> float:
    """The probability of ``c``'s first class (two photos whose first classes differ by more than ``duplicate_l1``
    in it are no duplicates)."""
    return float(c.top_k[0][1]) if c.top_k else 0.0


def rank(
    candidates: Iterable[Candidate],
    limit: int | None = None,
    class_penalty: float = 0.15,
    duplicate_l1: float = 0.02,
    order: Literal["margin", "draw"] = "margin",
) -> list[Candidate]:
    """``candidates`` in the order to ask about them (at most ``limit``; ``order``: what stands for the margin below,
    the module's).

    The greedy order of the module: each step takes the photo of least margin plus ``class_penalty`` times the
    photos of its class taken so far. Within a class that order is fixed (by margin, then id), so each class's next
    photo waits on a heap and a step costs a logarithm, not a pass over the pool (2,000 photos ranked in
    milliseconds, not half a second); near-duplicates are looked for among the chosen photos of the same class whose
    first probability lies within ``duplicate_l1`` of its own."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    by_class: dict[str, list[tuple[float, str, Candidate]]] = {}
    for c in candidates:
        by_class.setdefault(c.label, []).append((margin(c.top_k) if order == "margin" else draw(c.id), c.id, c))
    total = sum(len(v) for v in by_class.values())
    want = total if limit is None else min(limit, total)
    for queue in by_class.values():
        queue.sort(key=lambda m: (m[0], m[1]), reverse=True)  # the next photo of the class at the end
    per_class = dict.fromkeys(by_class, 0)
    heap = [(q[-1][0], q[-1][1], label) for label, q in by_class.items()]
    heapq.heapify(heap)
    chosen: list[Candidate] = []
    near: dict[tuple[str, int], list[Candidate]] = {}  # the chosen, by class and first probability's bucket
    width = max(duplicate_l1, 1e-9)
    duplicates: list[Candidate] = []
    while heap and len(chosen) < want:
        _, _, label = heapq.heappop(heap)
        queue = by_class[label]
        c = queue.pop()[2]
        bucket = math.floor(_top(c) / width)
        others = (o for b in range(bucket - 2, bucket + 3) for o in near.get((label, b), ()))  # a rounding wider
        if any(_distance(o.top_k, c.top_k) <= duplicate_l1 for o in others):
            duplicates.append(c)
        else:
            chosen.append(c)
            near.setdefault((label, bucket), []).append(c)
            per_class[label] += 1
        if queue:
            heapq.heappush(heap, (queue[-1][0] + class_penalty * per_class[label], queue[-1][1], label))
    return (chosen + duplicates)[:want]
