"""Where a retrain starts: the engine in service's weights, or with ``[trainer] start_from = "root"`` the lineage's first
version's; either way the candidate is gated against the engine in service and its manifest says where it started."""

from __future__ import annotations

import pytest
import torch

from .test_recheck import _open_gate
from .test_unlabelled_term import farm

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


@pytest.mark.parametrize("start_from", ["service", "root"])
def test_a_second_retrain_starts_from_the_engine_in_service_or_from_the_lineages_first_version(
    tiny_store, tmp_path, monkeypatch, start_from
):
    from edge_agent.config import parse_config
    from trainer import retrain as retrain_mod
    from trainer.field_check import FieldDecision
    from trainer.publish import load_weights

    store, samples = farm(tiny_store, tmp_path)
    root = store.current()
    cfg = parse_config({"trainer": {**_open_gate(tmp_path), "field_check_every": 4, "unlabelled_term": False, "start_from": start_from}})
    first = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")
    assert first.published and store.open(first.published).manifest["training"]["started_from"] == root
    real_train, starts = retrain_mod.train_generation, []
    monkeypatch.setattr(
        retrain_mod, "train_generation", lambda start, *a, **k: starts.append(start.state_dict()) or real_train(start, *a, **k)
    )
    gated = []
    real_gate = retrain_mod.gate
    monkeypatch.setattr(retrain_mod, "gate", lambda cand, prev, *a, **k: gated.append(prev.state_dict()) or real_gate(cand, prev, *a, **k))
    monkeypatch.setattr(retrain_mod, "field_gate", lambda *a: FieldDecision(True, "the tiny model's field check is not what is tested"))
    second = retrain_mod.retrain(cfg, store, samples, tmp_path / "strategy")

    expected = load_weights(store.open(root if start_from == "root" else first.published)).state_dict()
    other = load_weights(store.open(first.published if start_from == "root" else root)).state_dict()
    weight = next(k for k, v in expected.items() if v.is_floating_point() and not torch.equal(v, other[k]))  # one the first retrain moved
    assert torch.equal(starts[0][weight], expected[weight])
    assert torch.equal(
        gated[0][weight], load_weights(store.open(first.published)).state_dict()[weight]
    )  # judged against the one in service
    assert second.published and store.open(second.published).manifest["training"]["started_from"] == (
        root if start_from == "root" else first.published
    )
    samples.close()
