"""A candidate the lab gate refuses is stepped back towards the engine in service ([trainer] lab_steps); the first
step the lab gate passes is judged by the field check as it is, and its manifest records the step."""

from __future__ import annotations

import pytest
import torch

from .test_recheck import _open_gate
from .test_unlabelled_term import farm

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


def _retrain_with(tiny_store, tmp_path, monkeypatch, lab_passes_from: int, field_publishes: bool = True, steps=(0.75, 0.5, 0.25)):
    """One retrain whose lab gate refuses every candidate before the ``lab_passes_from``-th it is shown; returns the
    result, the store, the candidates gated (their weights) and the engine in service's weights."""
    from edge_agent.config import parse_config
    from trainer import retrain as retrain_mod
    from trainer.field_check import FieldDecision
    from trainer.gate import GateDecision
    from trainer.publish import load_weights

    store, samples = farm(tiny_store, tmp_path)
    previous = load_weights(store.open()).state_dict()
    cfg = parse_config({"trainer": {**_open_gate(tmp_path), "unlabelled_term": False, "lab_steps": list(steps)}})
    gated = []

    def lab_gate(candidate, *a, **k):
        gated.append({n: v.clone() for n, v in candidate.state_dict().items()})
        if len(gated) < lab_passes_from:
            return GateDecision(False, f"top-1 0.9{len(gated)} < first version's 0.98 - 0.01", {"candidate_top1": 0.9})
        return GateDecision(True, "candidate is not worse", {"candidate_top1": 0.975})

    monkeypatch.setattr(retrain_mod, "gate", lab_gate)
    fields = []
    monkeypatch.setattr(
        retrain_mod,
        "field_gate",
        lambda *a: fields.append(1) or FieldDecision(field_publishes, "not worse" if field_publishes else "field check: worse"),
    )
    result = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")
    samples.close()
    return result, store, gated, previous


def _moved(gated: list[dict], previous: dict) -> str:
    """A weight the retrain changed (a convolution's or the head's: interpolated exactly, not recomputed)."""
    return next(
        n for n, v in gated[0].items() if v.is_floating_point() and "running" not in n and v.dim() > 1 and not torch.equal(v, previous[n])
    )


def test_a_candidate_the_lab_gate_refuses_is_published_at_the_first_step_back_the_lab_gate_passes(tiny_store, tmp_path, monkeypatch):
    from trainer.publish import load_weights

    result, store, gated, previous = _retrain_with(tiny_store, tmp_path, monkeypatch, lab_passes_from=3)
    assert result.published, result.reason
    assert len(gated) == 3 and store.open(result.published).manifest["training"]["lab_step"] == 0.5
    w = _moved(gated, previous)
    trained = gated[0][w]
    assert torch.allclose(gated[1][w], previous[w] + 0.75 * (trained - previous[w]), atol=1e-6)
    assert torch.allclose(gated[2][w], previous[w] + 0.5 * (trained - previous[w]), atol=1e-6)
    assert torch.allclose(load_weights(store.open(result.published)).state_dict()[w], gated[2][w], atol=1e-6)


def test_a_step_back_the_field_check_refuses_is_not_published_and_no_smaller_step_is_tried(tiny_store, tmp_path, monkeypatch):
    result, store, gated, _ = _retrain_with(tiny_store, tmp_path, monkeypatch, lab_passes_from=2, field_publishes=False)
    assert not result.published and result.reason.startswith("field check") and len(gated) == 2
    assert result.metrics["gate"]["lab_step"] == 0.75


def test_where_every_step_is_refused_by_the_lab_gate_nothing_is_published_and_the_refusal_says_so(tiny_store, tmp_path, monkeypatch):
    result, store, gated, _ = _retrain_with(tiny_store, tmp_path, monkeypatch, lab_passes_from=99)
    assert not result.published and "first version's" in result.reason and len(gated) == 4
    assert result.metrics["gate"]["lab_step"] == 0.25 and store.current() == store.versions()[0]


def test_a_candidate_the_lab_gate_passes_is_never_stepped_back_and_without_lab_steps_none_is_tried(tiny_store, tmp_path, monkeypatch):
    result, store, gated, _ = _retrain_with(tiny_store, tmp_path, monkeypatch, lab_passes_from=1, field_publishes=False)
    assert not result.published and len(gated) == 1  # the field check refused the candidate itself: no step back
    assert "lab_step" not in result.metrics["gate"]
    result, store, gated, _ = _retrain_with(tiny_store, tmp_path / "none", monkeypatch, lab_passes_from=2, steps=())
    assert not result.published and len(gated) == 1 and "first version's" in result.reason


def test_lab_steps_must_lie_between_0_and_1():
    from edge_agent.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"trainer.lab_steps: every step must lie between 0 and 1, got \[1.5\]"):
        parse_config({"trainer": {"lab_steps": [0.5, 1.5]}})
