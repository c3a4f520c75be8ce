"""A retrain's second candidate: the first one's training again with the photos nobody labelled, kept only where the
field check (the expert's held-back photos) prefers it; ``[trainer] unlabelled_method`` says how the photos teach
(:mod:`trainer.loop.unlabelled_term`'s self-training, or :mod:`trainer.loop.consistency`). Self-training trains it
only where the term takes ``[trainer] unlabelled_min_taken`` photos: a handful more barely changes what a candidate
learns, costs a whole training again, and gives the field check a second draw to pick on its few photos.
"""

from __future__ import annotations

from trainer.continual import balance_pseudo, train_generation
from trainer.field_check import prefer
from trainer.loop.consistency import Consistency
from trainer.loop.unlabelled_pool import pool_photos
from trainer.loop.unlabelled_term import load_unlabelled, teach

__all__ = ["with_unlabelled"]


def with_unlabelled(
    candidate, used, previous, data, strategy, tc, lr, interpolate, num_classes, field, spec, root, exclude, should_stop, teacher=None
):
    """The first candidate, or a second trained with the unlabelled photos it labels (:mod:`trainer.loop.unlabelled_term`)
    where the field check prefers it; the data the chosen one saw; what was measured."""
    photos = pool_photos(root)
    x, ids = load_unlabelled(photos, exclude, tc.unlabelled_max, spec, should_stop)
    if tc.unlabelled_method == "consistency":
        return _with_consistency(
            candidate, used, previous, data, strategy, tc, lr, interpolate, num_classes, field, spec, x, should_stop, teacher
        )
    term = teach(candidate, x, ids, field.x, field.y, tc.unlabelled_precision, floor=tc.unlabelled_floor, should_stop=should_stop)
    del x  # the photos it took are copied into term.data; the rest need no memory while the second candidate trains
    summary = {**term.summary, "kept": False}
    if term.data is None:
        return candidate, used, summary
    if len(term.data.y) < tc.unlabelled_min_taken:
        reason = f"only {len(term.data.y)} taken, fewer than the {tc.unlabelled_min_taken} a second candidate waits for"
        return candidate, used, {**summary, "reason": reason}
    term.data.weight = term.data.weight * balance_pseudo(term.data.y, term.data.pseudo)
    if tc.unlabelled_epochs:  # on from the first: the two then differ by what the photos taught, not by a second draw
        start, settings, step, teacher = candidate, _on_from_first(tc), 1.0, teacher if teacher is not None else previous
    else:
        start, settings, step = previous, tc, interpolate
    second = train_generation(
        start, data + term.data, strategy, settings, lr, step, num_classes=num_classes, should_stop=should_stop, spec=spec, teacher=teacher
    )
    return _chosen(second, (candidate, used), field, summary)


def _on_from_first(tc):
    """``[trainer]`` settings for a second candidate trained ``unlabelled_epochs`` epochs on from the first: every
    epoch averaged at the averaging phase's learning rate, the photos the term took at full weight from the first step."""
    epochs = tc.unlabelled_epochs
    return tc.model_copy(update={"epochs": epochs, "swa_epochs": epochs, "ramp_epochs": 0})


def _with_consistency(
    candidate, used, previous, data, strategy, tc, lr, interpolate, num_classes, field, spec, x, should_stop, teacher=None
):
    """The first candidate, or a second trained with the consistency term over the pool photos ``x``
    (:mod:`trainer.loop.consistency`) where the field check prefers it."""
    summary = {"method": "consistency", "pool_photos": int(len(x)), "kept": False}
    if len(x) == 0:
        return candidate, used, {**summary, "reason": "no unlabelled photos"}
    term = Consistency(x, tc.consistency_threshold, tc.consistency_weight, tc.consistency_ratio, spec)
    second = train_generation(
        previous,
        data,
        strategy,
        tc,
        lr,
        interpolate,
        num_classes=num_classes,
        should_stop=should_stop,
        spec=spec,
        consistency=term,
        teacher=teacher,
    )
    summary.update(views=term.tally["views"], sure=term.tally["sure"], sure_by_class=term.tally["sure_by_class"])
    return _chosen(second, (candidate, used), field, summary)


def _chosen(second: tuple, first: tuple, field, summary: dict):
    """The second (candidate, data it saw) where the field check prefers it to the first, else the first; with
    ``summary`` saying which and the field check's figures."""
    better, figures = prefer(second[0], first[0], field.x, field.y)
    summary.update(kept=better, **figures)
    return (*(second if better else first), summary)
