"""A new release after an upgrade: the farm's own version serves until the farm's field check prefers the release.

:func:`edge_agent.upgrade.adopt_shipped_release` installs the release beside the farm's versions and names it in
the store's ``release-pending`` file. The next retrain then works on the release's lineage instead of the serving
one (:func:`lineage_base`): first the bare release is compared with the version in service on the field check set
(the expert labels held back, each model given the photos as its own preprocessing makes them, classes matched by
name); no worse, it is put in service at once. Either way a retrain of the release on every sample the farm has
(expert labels and pseudo-labels, which are photos, not tensors) follows, and its candidate is published only if
it passes the usual gates against its parent and is no worse on the field check than the version in service; once a
version of the release's lineage serves, the pending file is removed.
"""

from __future__ import annotations

import torch

from edge_agent.preprocess import ImageRejected, PreprocessSpec, preprocess_file
from edge_agent.upgrade import PENDING_RELEASE, pending_release
from engines.store import EngineStore, StoreVersion
from trainer.field_check import FieldDecision, field_gate
from trainer.lineage import lineage_root
from trainer.models import Classifier
from trainer.photos import photo, stack
from trainer.samples import Sample
from trainer.stop import check
from trainer.strategies.base import Generation

__all__ = ["against_serving", "lineage_base", "settle_pending"]


def lineage_base(store: EngineStore) -> str | None:
    """The version a retrain should start from instead of the one in service: the newest of the pending release's
    lineage; None when no release is pending (or it, or a descendant, already serves: then the file is removed)."""
    release = pending_release(store)
    if release is None:
        return None
    if settle_pending(store):
        return None
    ours = [v for v in store.versions() if lineage_root(store, v) == release]
    return ours[-1] if ours else release


def settle_pending(store: EngineStore) -> bool:
    """Remove the pending file once the release's lineage serves (or the release is gone); True if it was removed."""
    release = pending_release(store)
    if release is not None and lineage_root(store, store.current()) != release:
        return False
    (store.root / PENDING_RELEASE).unlink(missing_ok=True)
    return True


def against_serving(
    serving: StoreVersion,
    serving_model: Classifier,
    candidate: Classifier,
    field: Generation,
    stored: list[Sample],
    expert_labels: int,
    every: int,
    min_photos: int,
    should_stop=lambda: False,
) -> FieldDecision:
    """``candidate`` (of the release's lineage; ``field`` its field check set, with sample ids) against the version in
    service on the same photos, given to it through its own preprocessing and class list."""
    spec = PreprocessSpec.from_manifest(serving.manifest["preprocess"])
    classes = list(serving.classes)
    by_id = {s.id: s for s in stored}
    keep, xs, ys = [], [], []
    for i, sid in enumerate(field.sample_ids):
        check(should_stop, "while reading the field check set for the version in service")
        s = by_id.get(sid)
        if s is None:
            continue
        try:
            xs.append(photo(preprocess_file(s.file, spec)))
        except (ImageRejected, OSError):
            continue
        keep.append(i)
        ys.append(classes.index(s.label) if s.label in classes else len(classes))  # a class it lacks: counted wrong
    idx = torch.tensor(keep, dtype=torch.long)
    theirs = (stack(xs), torch.tensor(ys)) if xs else (field.x[:0], field.y[:0])
    decision = field_gate(candidate, serving_model, field.x[idx], field.y[idx], expert_labels, every, min_photos, current_xy=theirs)
    decision.reason = f"against {serving.name} in service: {decision.reason}"
    return decision
