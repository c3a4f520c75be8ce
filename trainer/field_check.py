"""The field check: expert labels held back to judge every candidate on the device's own field.

Every ``[trainer] field_check_every``-th expert label of a class (its 4th, 8th, ... in the order they arrived; a label
put right later keeps its place) is never trained on; together those photos are the field check set. Once an expert label exists, a candidate is
published only if, on that set, it is right on at least as many photos as the engine in service (a tie
publishes: the candidate has learnt from more labels), besides passing the lab gate. A photo worse is refused: the
field loop published a version one held-back photo behind, within the one standard error an earlier rule allowed,
and it was worse on the held-out field (0.737 -> 0.700). While the set holds fewer than ``field_check_min`` photos
no candidate is published: the lab photos alone cannot say whether the field got better. Adapting BatchNorm
statistics to the field's photos is kept only where the same set shows, by log-loss, that it helps.

A version published because it was not worse on the held-back photos scores high on them partly by luck (they chose
it), and holds every successor to that score: with ``[trainer] field_check_judges_on = "new"`` (the default) a
candidate is judged only on the photos held back since (:func:`new_photos`; every published version records the photos
that chose it) once there are ``field_check_min`` of them; until then, and with ``"all"``, on all of them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from edge_agent.names import ordinal
from trainer.batchnorm import recompute_batchnorm
from trainer.models import Classifier, inference_copy
from trainer.photos import INFERENCE_BATCH
from trainer.samples import Sample
from trainer.strategies.base import Generation

__all__ = ["FieldDecision", "held_back", "new_photos", "judging_photos", "field_gate", "adapt_batchnorm", "prefer", "too_few_to_judge"]


def held_back(samples: Iterable[Sample], every: int) -> set[str]:
    """The ids of the expert labels kept for the field check: per class, every ``every``-th in arrival order (0: none).

    A label the expert put right keeps its place among the class it arrived as (:attr:`Sample.arrived_as`): moving one
    photo to another class moves no other photo into or out of the set, and none the versions in service trained on."""
    if every <= 0:
        return set()
    seen: dict[str, int] = {}
    out = set()
    for s in sorted((s for s in samples if s.kind == "expert"), key=lambda s: (s.received, s.id)):
        seen[s.arrived_as] = seen.get(s.arrived_as, 0) + 1
        if seen[s.arrived_as] % every == 0:
            out.add(s.id)
    return out


def new_photos(check_ids: list[str], judged_before: Iterable[str] | None, min_photos: int) -> list[bool] | None:
    """Which of the field check photos ``check_ids`` did not choose the version in service (``judged_before``: the ids
    its manifest records), where at least ``min_photos`` did not and some did; None: all of them judge."""
    if not judged_before:
        return None
    seen = set(judged_before)
    keep = [i not in seen for i in check_ids]
    return keep if min_photos <= sum(keep) < len(keep) else None


def judging_photos(field: Generation, judged_before: Iterable[str] | None, mode: str, min_photos: int) -> tuple[Generation, str]:
    """The field check photos that judge a candidate against the version in service: all of them, or where ``mode`` is
    "new" and :func:`new_photos` finds enough, those that did not judge it; and which ("all" or "new")."""
    keep = new_photos(field.sample_ids, judged_before, min_photos) if mode == "new" else None
    if keep is None:
        return field, "all"
    return field.subset(torch.tensor(keep, dtype=torch.bool)), "new"


def too_few_to_judge(samples: list[Sample], every: int, min_photos: int) -> str | None:
    """Why no candidate could be published yet (expert labels exist, too few held back to judge on), or None."""
    if every <= 0 or not any(s.kind == "expert" for s in samples):
        return None
    n = len(held_back(samples, every))
    if n >= min_photos:
        return None
    return f"waiting for expert labels: the field check holds {n} of the {min_photos} photos it needs (every {ordinal(every)} label of a class)"


@dataclass
class FieldDecision:
    publish: bool
    reason: str
    metrics: dict = field(default_factory=dict)


@torch.no_grad()
def _scores(model: Classifier, x: torch.Tensor, y: torch.Tensor, batch: int = INFERENCE_BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Per photo: right (0/1) and cross-entropy; a class the model has no output for counts as wrong, loss log(k)."""
    model = inference_copy(model)
    right, loss = [], []
    k = model.num_classes
    for i in range(0, len(x), batch):
        logits, yb = model(x[i : i + batch]), y[i : i + batch]
        known = yb < k
        safe = torch.where(known, yb, torch.zeros_like(yb))
        right.append(((logits.argmax(1) == yb) & known).double())
        ce = F.cross_entropy(logits, safe, reduction="none").double()
        loss.append(torch.where(known, ce, torch.full_like(ce, math.log(k))))
    return torch.cat(right), torch.cat(loss)


def _paired(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Mean of ``a - b`` and its standard error."""
    d = a - b
    n = len(d)
    return float(d.mean()), (float(d.std(unbiased=True)) / math.sqrt(n) if n > 1 else 0.0)


def field_gate(
    candidate: Classifier,
    current: Classifier,
    x: torch.Tensor,
    y: torch.Tensor,
    expert_labels: int,
    every: int,
    min_photos: int,
    current_xy: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> FieldDecision:
    """Whether ``candidate`` may replace ``current`` as far as the field check set (``x``, ``y``) can tell.
    ``current_xy``: the same photos as ``current`` takes them (its own preprocessing and class indices), where it is
    of another lineage (a new release judged against the farm's own version)."""
    n = len(x)
    if expert_labels == 0 or every <= 0:
        why = "no expert labels yet" if every > 0 else "[trainer] field_check_every = 0"
        return FieldDecision(True, f"{why}: nothing to check the field on", {"field_photos": 0})
    metrics: dict = {"field_photos": n, "field_photos_needed": min_photos, "expert_labels": expert_labels}
    if n < min_photos:
        return FieldDecision(
            False,
            f"field check set too small to judge: {n} of {min_photos} photos (every {ordinal(every)} expert label of a class is "
            "held back for it); the labels are kept for the next retrain",
            metrics,
        )
    cand_right, cand_loss = _scores(candidate, x, y)
    cur_right, cur_loss = _scores(current, *(current_xy or (x, y)))
    diff, se = _paired(cand_right, cur_right)
    _, loss_se = _paired(cand_loss, cur_loss)
    right_cand, right_cur = int(cand_right.sum()), int(cur_right.sum())
    metrics.update(
        field_candidate_top1=round(float(cand_right.mean()), 4),
        field_current_top1=round(float(cur_right.mean()), 4),
        field_candidate_right=right_cand,
        field_current_right=right_cur,
        field_difference=round(diff, 4),
        field_standard_error=round(se, 4),
        # recorded, not decided on: what a check on more than right and wrong would have seen
        field_candidate_log_loss=round(float(cand_loss.mean()), 4),
        field_current_log_loss=round(float(cur_loss.mean()), 4),
        field_log_loss_standard_error=round(loss_se, 4),
    )
    if right_cand < right_cur:
        return FieldDecision(
            False,
            f"field check: top-1 {metrics['field_candidate_top1']:.4f} < current {metrics['field_current_top1']:.4f} "
            f"({right_cand} of {n} held-back photos right against {right_cur})",
            metrics,
        )
    return FieldDecision(True, "not worse on the field check set", metrics)


def prefer(second: Classifier, first: Classifier, x: torch.Tensor, y: torch.Tensor) -> tuple[bool, dict]:
    """Whether the field check set (``x``, ``y``) prefers ``second`` to ``first``: right on more photos, or on as many
    with a log-loss lower by more than one standard error (as for BatchNorm statistics, :func:`adapt_batchnorm`: a
    lower log-loss within the noise kept candidates that were worse held out); and the figures."""
    right2, loss2 = _scores(second, x, y)
    right1, loss1 = _scores(first, x, y)
    a, b = float(right2.sum()), float(right1.sum())
    gain, se = _paired(loss1, loss2) if len(y) else (0.0, 0.0)  # > 0: the second has the lower log-loss
    better = a > b or (a == b and gain > se)
    figures = {
        "field_top1_with": round(a / max(1, len(y)), 4),
        "field_top1_without": round(b / max(1, len(y)), 4),
        "field_log_loss_with": round(float(loss2.mean()), 4) if len(y) else None,
        "field_log_loss_without": round(float(loss1.mean()), 4) if len(y) else None,
        "field_log_loss_standard_error": round(se, 4),
    }
    return better, figures


def adapt_batchnorm(model: Classifier, field_x: torch.Tensor, check_x: torch.Tensor, check_y: torch.Tensor, should_stop=lambda: False):
    """``model``, or a copy with BatchNorm statistics recomputed on ``field_x`` where that lowers the field check set's
    log-loss by more than one standard error; and what was measured."""
    if len(field_x) < 16 or len(check_x) == 0:
        return model, {"kept": False, "reason": "too few field photos to adapt or to check on"}
    adapted = recompute_batchnorm(copy.deepcopy(model), field_x, should_stop=should_stop)
    _, before = _scores(model, check_x, check_y)
    _, after = _scores(adapted, check_x, check_y)
    gain, se = _paired(before, after)  # > 0: the adapted statistics lower the log-loss
    kept = gain > se
    summary = {
        "kept": kept,
        "field_photos": int(len(field_x)),
        "log_loss_before": round(float(before.mean()), 4),
        "log_loss_after": round(float(after.mean()), 4),
        "standard_error": round(se, 4),
    }
    return (adapted if kept else model), summary
