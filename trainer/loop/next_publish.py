"""What the next publish waits for, in plain words: the sentence the Health page, ``edge-trainer status``, the API and
``/metrics`` show, and the classes the review queue should ask about first.

A retrain starts once ``retrain_threshold`` new samples or ``expert_threshold`` new expert labels have arrived; once
the expert has labelled anything, a candidate is published only when the field check holds ``field_check_min``
photos (every ``field_check_every``-th expert label of a class, :mod:`trainer.field_check`). The plan counts the
fewest expert labels that fill the field check, taking first the classes closest to their next held-back photo and,
among equals, the class with the fewest labels (a field check spread over the classes judges them all).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from edge_agent.names import class_phrase, ordinal
from edge_agent.trainer_config import TrainerSection
from trainer.field_check import held_back
from trainer.samples import Sample

__all__ = ["NextPublish", "plan"]


@dataclass(frozen=True)
class NextPublish:
    """What stands between the samples and the next published version."""

    sentence: str  # one plain sentence
    waiting_for: str  # "nothing" | "samples" | "expert_labels" | "field_check"
    expert_labels_needed: int = 0
    samples_needed: int = 0
    by_class: dict[str, int] = field(default_factory=dict)  # class -> expert labels of it that would fill the field check

    def as_dict(self) -> dict:
        return asdict(self)


def _field_plan(samples: list[Sample], every: int, need: int) -> dict[str, int]:
    """The fewest expert labels, per class, that bring the held-back set to ``need`` photos."""
    places: dict[str, int] = {}
    named: set[str] = set()
    for s in samples:
        if s.kind == "expert":
            places[s.arrived_as] = places.get(s.arrived_as, 0) + 1  # a label put right keeps the place it took
            named.add(s.label)  # the classes this farm's labels name now: those asked for
    counts = {c: places.get(c, 0) for c in named}
    plan: dict[str, int] = {}
    for _ in range(max(0, need)):
        if not counts:
            break
        label = min(counts, key=lambda c: (every - counts[c] % every, counts[c], c))  # nearest next held-back photo; spread
        step = every - counts[label] % every
        counts[label] += step
        plan[label] = plan.get(label, 0) + step
    return plan


def plan(samples: list[Sample], counts: dict, tc: TrainerSection) -> NextPublish:
    """What the next publish needs, given every sample and :meth:`~trainer.samples.SampleStore.counts`."""
    experts = counts.get("expert", 0)
    new, new_expert = counts.get("new", 0), counts.get("new_expert", 0)
    if experts and tc.field_check_every > 0:
        held = len(held_back(samples, tc.field_check_every))
        if held < tc.field_check_min:
            by_class = _field_plan(samples, tc.field_check_every, tc.field_check_min - held)
            n = sum(by_class.values())
            # those labels must also start a retrain: the expert threshold, unless the samples reach theirs first
            total = max(n, min(tc.expert_threshold - new_expert, tc.retrain_threshold - new))
            top = sorted(by_class.items(), key=lambda kv: -kv[1])[:3]
            which = " and ".join(f"{k} of {class_phrase(c)}" for c, k in top)
            return NextPublish(
                f"{total} more expert label{'' if total == 1 else 's'} of any class before a new version can be published, soonest {which}: "
                "the field check "
                f"holds {held} of the {tc.field_check_min} photos it needs (every {ordinal(tc.field_check_every)} label of a class "
                "is kept to judge each new version on this farm's own photos)",
                "field_check",
                expert_labels_needed=total,
                by_class=by_class,
            )
    if new >= tc.retrain_threshold or new_expert >= tc.expert_threshold:
        return NextPublish("a retrain is due: it starts when the trainer is free", "nothing")
    samples_needed, experts_needed = tc.retrain_threshold - new, tc.expert_threshold - new_expert
    return NextPublish(
        f"{experts_needed} more expert label{'' if experts_needed == 1 else 's'} or {samples_needed} more "
        f"sample{'' if samples_needed == 1 else 's'} (pseudo-labels count too) before the next "
        f"retrain ({new_expert} expert labels and {new} samples new since the last one)",
        "expert_labels" if experts_needed <= samples_needed else "samples",
        expert_labels_needed=experts_needed,
        samples_needed=samples_needed,
    )
