"""Which photos nobody labelled go to the trainer today, for retrains that learn from unlabelled field photos.

The daemon hands over, beside the pseudo-labels and the expert's labels, up to ``[labels] unlabelled_per_day`` photos
a local day from the review pool (in the field that is nearly every photo: the classes the expert has not yet
trusted, the unsure and the unknown), each with the model's class and verdict. The day's share is chosen for
coverage: paced over the day (by each hour, that hour's share and one more), the photos grouped by (class, verdict)
and taken round-robin over the groups, newest first within each, no group past a quarter of the day while another
has photos waiting (so one class the model calls everything cannot crowd out the rest). The trainer
keeps what it receives in a bounded pool (:mod:`trainer.loop.unlabelled_pool`); the photo stays in the review pool,
for the expert, until it is labelled or pruned. Labels always go first: at most one unlabelled photo is in flight,
and only while no label waits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from edge_agent.ledger_rows import QueueEntry
from edge_agent.review.queue import start_of_day

__all__ = ["allowed_by", "choose", "start_of_day"]

#: The most of a day's quota one (class, verdict) group may take.
GROUP_SHARE = 0.25


def allowed_by(per_day: int, now: float | None = None) -> int:
    """The day's share paced over the day: by ``now``, the hours gone plus one, of 24 (a burst at dawn leaves room for
    the afternoon's photos; the pool keeps what waits)."""
    now = time.time() if now is None else now
    return math.ceil(per_day * min(1.0, (now - start_of_day(now) + 3600) / 86400))


def choose(
    candidates: Sequence[tuple[QueueEntry, str]], sent_today: dict[tuple[str, str], int], per_day: int, allowed: int | None = None
) -> list[tuple[QueueEntry, str]]:
    """The candidates (newest first, each with its verdict) to hand over next, in order, given what was sent today
    ((class, verdict) -> photos) and what the day allows by now (default: all of ``per_day``): round-robin over the
    groups, the least covered first, no group past ``GROUP_SHARE`` of ``per_day`` while another has photos waiting."""
    left = min(per_day, per_day if allowed is None else allowed) - sum(sent_today.values())
    if left <= 0:
        return []
    cap = max(1, int(per_day * GROUP_SHARE))
    groups: dict[tuple[str, str], list[tuple[QueueEntry, str]]] = {}
    for entry, verdict in candidates:
        groups.setdefault((entry.label or "", verdict), []).append((entry, verdict))
    taken = dict(sent_today)
    out: list[tuple[QueueEntry, str]] = []
    for capped in (True, False):  # coverage first; then, with nothing else waiting, the rest of the day's share
        while len(out) < left:
            progressed = False
            for key in sorted(groups, key=lambda k: (taken.get(k, 0), k)):
                if groups[key] and (not capped or taken.get(key, 0) < cap):
                    out.append(groups[key].pop(0))
                    taken[key] = taken.get(key, 0) + 1
                    progressed = True
                    if len(out) == left:
                        break
            if not progressed:
                break
    return out
