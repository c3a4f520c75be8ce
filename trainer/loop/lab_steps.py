"""A candidate the lab gate refuses is not thrown away: steps back towards the engine in service are tried in turn.

A retrain on a farm's labels moves the network away from what it knew of the lab photos, a little more each
generation, until the lab gate (``[trainer] gate_tolerance`` below the version in service, ``lab_drift_max`` below
the lineage's first) refuses it, and the farm's new labels then teach nothing. Where ``[trainer] lab_steps`` lists
steps, the candidate's weights are moved back towards the engine in service's (``previous + a x (candidate -
previous)``, WiSE-FT, :func:`trainer.step.at_step`), the largest step first; the first one the lab gate passes goes on
to the field check, whose verdict stands (a step no better on the field check than the version in service is not
published). Steps are tried only after the candidate itself (and its field-adapted statistics) was refused by the
lab gate: a candidate the lab gate passes is judged as it is.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from trainer.models import Classifier
from trainer.step import at_step

__all__ = ["with_lab_steps"]


def with_lab_steps(
    variants: list[Classifier], previous: Classifier, steps: list[float], bn_x: torch.Tensor | None, should_stop=lambda: False
) -> Iterator[tuple[float | None, Classifier]]:
    """``variants`` (step None), then for each of ``steps`` (largest first, below 1) the last variant stepped back
    towards ``previous``, its BatchNorm statistics recomputed on ``bn_x`` (None: interpolated with the weights). The
    caller stops asking once a variant passes the lab gate: a step is only made where the last variant was refused."""
    yield from ((None, v) for v in variants)
    trained = variants[-1]
    for a in sorted({s for s in steps if s < 1.0}, reverse=True):
        yield a, at_step(trained, previous, a, bn_x, should_stop)
