"""A season's labels, bounded per retrain: the new ones first, then a class-balanced draw of the older ones.

An expert who labels ten photos a day gives 1,800 over a season, and a retrain that trained on every one would grow
with them (about 0.55 s and 0.47 MB a label trained on, on 2 CPU cores, measured at 75 and 300: a season's 1,350,
the rest held back for the field check, would take about 900 s and 1.8 GB; 600, measured once with 900 labels, took
401 s and a peak of 1,493 MiB, at the 1.5 GiB line, so the default is 500). :func:`choose` keeps at most ``budget`` of the labels a retrain may train on: every label that
arrived since the last retrain, then the older ones, a class at a time, in an order drawn anew each retrain (each
class's expert labels before its pseudo-labels). So a class with few labels keeps all of them, a new class is never
left out, and every older label is trained on again now and then. The ones left out wait, counted as considered like
the rest (a later retrain may draw them; nothing is deleted).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from trainer.samples import Sample

__all__ = ["choose"]


def _by_class(samples: Iterable[Sample], rng: random.Random | None) -> list[list[Sample]]:
    """Each class's samples, expert labels first then pseudo-labels: newest first, or shuffled by ``rng``."""
    queues: dict[str, tuple[list[Sample], list[Sample]]] = {}
    for s in samples:
        queues.setdefault(s.label, ([], []))[s.kind != "expert"].append(s)
    out = []
    for label in sorted(queues):
        expert, pseudo = queues[label]
        for part in (expert, pseudo):
            if rng is None:
                part.sort(key=lambda s: s.received, reverse=True)
            else:
                rng.shuffle(part)
        out.append(expert + pseudo)
    if rng is not None:
        rng.shuffle(out)  # which class gets the last places of a round is drawn too
    return out


def _round_robin(queues: list[list[Sample]], places: int) -> list[Sample]:
    """Up to ``places`` samples taken one class at a time, in turn, until every class's queue is empty."""
    taken: list[Sample] = []
    depth = 0
    while len(taken) < places and any(depth < len(q) for q in queues):
        for q in queues:
            if depth < len(q) and len(taken) < places:
                taken.append(q[depth])
        depth += 1
    return taken


def choose(samples: list[Sample], budget: int, seed: str) -> tuple[list[Sample], set[str]]:
    """The samples one retrain trains on, at most ``budget`` (0: all), in their order, and the ids left for a later
    retrain; ``seed`` draws the older ones (pass one that changes from retrain to retrain)."""
    if budget <= 0 or len(samples) <= budget:
        return list(samples), set()
    new = [s for s in samples if s.generation is None]
    taken = _round_robin(_by_class(new, None), budget)
    old = [s for s in samples if s.generation is not None]
    taken += _round_robin(_by_class(old, random.Random(seed)), budget - len(taken))
    kept = {s.id for s in taken}
    return [s for s in samples if s.id in kept], {s.id for s in samples if s.id not in kept}
