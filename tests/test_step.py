"""trainer.step: a retrain on pseudo-labels alone keeps the step with the lowest log-loss on the gate photos."""

from __future__ import annotations

import copy

import pytest
import torch

from trainer.batchnorm import recompute_batchnorm
from trainer.models import build_model
from trainer.step import choose_step

STEPS = [1.0, 0.5, 0.0]


def _pair():
    torch.manual_seed(0)
    previous = build_model(4)
    trained = copy.deepcopy(previous)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.5 * torch.randn_like(p))  # somewhere else entirely
    x = torch.randn(24, 3, 32, 32)
    return previous, trained, x


def _labels_of(model, x):
    m = recompute_batchnorm(copy.deepcopy(model), x)
    with torch.no_grad():
        return m(x).argmax(1)


@pytest.mark.parametrize("right", ["previous", "trained"])
def test_the_step_towards_the_model_that_is_right_on_the_gate_photos_wins(right):
    previous, trained, x = _pair()
    y = _labels_of(previous if right == "previous" else trained, x)
    model, choice = choose_step(trained, previous, STEPS, x, x, y)
    assert choice.step == (0.0 if right == "previous" else 1.0)
    assert [t["step"] for t in choice.tried] == [0.0, 0.5, 1.0]
    best = min(choice.tried, key=lambda t: t["gate_log_loss"])
    assert best["step"] == choice.step and best["above_lowest"] == 0.0
    # the candidate's weights really are previous + step x (trained - previous)
    prev_w, trained_w = dict(previous.named_parameters()), dict(trained.named_parameters())
    for name, w in model.named_parameters():
        assert torch.allclose(w, prev_w[name] + choice.step * (trained_w[name] - prev_w[name]), atol=1e-6)
    assert not model.training


def test_a_single_step_is_taken_as_it_is_and_inputs_are_left_alone():
    previous, trained, x = _pair()
    before = {k: v.clone() for k, v in trained.state_dict().items()}
    _, choice = choose_step(trained, previous, [0.25], x, x, torch.zeros(len(x), dtype=torch.long))
    assert choice.step == 0.25 and len(choice.tried) == 1
    assert all(torch.equal(before[k], v) for k, v in trained.state_dict().items())


def test_ties_keep_the_smaller_step():
    previous, _, x = _pair()
    _, choice = choose_step(copy.deepcopy(previous), previous, [0.0, 1.0, 0.5], x, x, torch.zeros(len(x), dtype=torch.long))
    assert choice.step == 0.0  # the same weights everywhere: nothing to choose between, so the least change


@pytest.mark.parametrize("gain, spread, expected", [(0.01, 0.5, 0.0), (0.2, 0.05, 1.0)])
def test_a_larger_step_must_be_better_by_more_than_one_standard_error(monkeypatch, gain, spread, expected):
    """Step 1 has the lowest mean log-loss in both cases; it is taken only where the gain stands out of the noise."""
    import trainer.step as step

    previous, trained, x = _pair()
    g = torch.Generator().manual_seed(1)
    base = torch.rand(100, generator=g, dtype=torch.float64) + 0.5
    noise = spread * torch.randn(100, generator=g, dtype=torch.float64)
    fake = iter([(base, 0.9), (base - gain + noise - noise.mean(), 0.9)])  # steps ascending: 0, then 1
    monkeypatch.setattr(step, "_losses", lambda model, vx, vy, should_stop: next(fake))
    _, choice = choose_step(trained, previous, [1.0, 0.0], x, x, torch.zeros(len(x), dtype=torch.long))
    assert choice.step == expected
    one = choice.tried[1]
    assert one["gate_log_loss"] < choice.tried[0]["gate_log_loss"]
    assert (choice.tried[0]["above_lowest"] <= choice.tried[0]["standard_error"]) == (expected == 0.0)


def test_no_steps_or_no_gate_photos_is_an_error():
    previous, trained, x = _pair()
    with pytest.raises(ValueError, match="no step"):
        choose_step(trained, previous, [], x, x, torch.zeros(len(x), dtype=torch.long))
    with pytest.raises(ValueError, match="no validation photos"):
        choose_step(trained, previous, [1.0], x, x[:0], torch.zeros(0, dtype=torch.long))


def test_the_search_may_sample_photos_but_the_chosen_candidate_gets_statistics_over_all_of_them():
    previous, trained, x = _pair()
    y = _labels_of(previous, x)
    model, choice = choose_step(trained, previous, [1.0, 0.0], x, x, y, search_photos=8)
    exact = recompute_batchnorm(copy.deepcopy(previous), x)  # step 0: previous's weights, statistics over all 24
    for (name, got), (_, want) in zip(model.named_buffers(), exact.named_buffers()):
        if name.endswith(("running_mean", "running_var")):
            torch.testing.assert_close(got, want)
    assert choice.step == 0.0


def test_a_stop_request_is_seen_inside_the_search():
    """SIGTERM must end a retrain within 5 s: the search checks between batches, not only between steps."""
    from trainer.stop import Stopped

    previous, trained, x = _pair()
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) > 3  # during the first step's BatchNorm pass

    with pytest.raises(Stopped):
        choose_step(trained, previous, [1.0, 0.0], x, x, torch.zeros(len(x), dtype=torch.long), should_stop=should_stop)
    assert len(calls) == 4


@pytest.mark.parametrize(
    "step, says",
    [
        (0.0, "the weights kept, only the BatchNorm statistics recomputed"),
        (0.25, "0.25 of the way from the engine in service to the retrained weights"),
    ],
)
def test_trainer_status_says_which_step_the_last_retrain_took(tmp_path, step, says):
    import json
    import subprocess
    import sys
    from pathlib import Path

    status = tmp_path / "trainer" / "status.json"
    status.parent.mkdir(parents=True)
    tried = [{"step": a} for a in (0.0, 0.25, 1.0)]
    status.write_text(
        json.dumps(
            {
                "state": "idle",
                "samples": {"pseudo": 250},
                "retrain_threshold": 200,
                "last_retrain": {
                    "published": "v0002",
                    "reason": "candidate is not worse",
                    "samples": 250,
                    "seconds": 1.0,
                    "metrics": {"step": {"step": step, "tried": tried}},
                },
            }
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "status", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == 0, out.stderr
    assert f"pseudo-labels only: step {step:g} chosen of [0.0, 0.25, 1.0] on the gate photos: {says}" in out.stdout
