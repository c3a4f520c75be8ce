"""Temperature scaling: the fit finds a known temperature, folding divides the logits and keeps top-1."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="the 'train' extra (torch) is not installed")

from trainer.calibrate import calibrate, calibration_error, expected_calibration_error, fit_temperature, fold_temperature  # noqa: E402
from trainer.models import build_model  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


def _sampled(temperature: float, n: int = 20000, classes: int = 10, seed: int = 0):
    """Logits and labels drawn from softmax(logits / temperature): ``temperature`` is the right answer."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=g, dtype=torch.double) * 4
    labels = torch.multinomial(torch.softmax(logits / temperature, 1), 1, generator=g).squeeze(1)
    return logits, labels


@pytest.mark.parametrize("true_t", [0.5, 1.0, 2.5])
def test_fit_recovers_the_temperature_the_labels_were_drawn_with(true_t):
    logits, labels = _sampled(true_t)
    assert fit_temperature(logits, labels) == pytest.approx(true_t, rel=0.05)


def test_fit_stays_in_bounds_and_refuses_no_photos():
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    assert fit_temperature(logits, torch.tensor([0, 1])) == pytest.approx(0.1, rel=1e-3)  # always right: sharpest allowed
    assert fit_temperature(logits, torch.tensor([1, 0])) == pytest.approx(10.0, rel=1e-3)  # always wrong: flattest
    with pytest.raises(ValueError, match="no photos"):
        fit_temperature(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))


def test_ece_of_an_overconfident_and_a_calibrated_set():
    sure = torch.tensor([[20.0, 0.0]] * 4)  # confidence ~1.0
    assert expected_calibration_error(sure, torch.tensor([0, 0, 1, 1])) == pytest.approx(0.5, abs=1e-6)
    assert expected_calibration_error(sure, torch.tensor([0, 0, 0, 0])) == pytest.approx(0.0, abs=1e-6)
    logits, labels = _sampled(1.0, n=2000)
    conf, pred = torch.softmax(logits, 1).max(1)
    assert calibration_error(conf, pred == labels) == expected_calibration_error(logits, labels) < 0.05  # drawn calibrated
    assert calibration_error(torch.tensor([0.3, 0.3]), torch.tensor([False, False])) == pytest.approx(0.3)  # low confidences too


def test_fold_divides_the_logits_and_keeps_every_prediction():
    torch.manual_seed(0)
    model = build_model(5).eval()
    x = torch.randn(8, 3, 128, 128)
    with torch.no_grad():
        before = model(x)
        fold_temperature(model, 2.0)
        after = model(x)
    torch.testing.assert_close(after, before / 2.0, rtol=1e-5, atol=1e-6)
    assert torch.equal(after.argmax(1), before.argmax(1))
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="positive finite"):
            fold_temperature(model, bad)


def test_calibrate_cools_an_overconfident_model_and_lowers_its_ece():
    torch.manual_seed(0)
    model = build_model(3).eval()
    x = torch.randn(60, 3, 128, 128)
    with torch.no_grad():
        model.head.weight.mul_(5000.0)  # very sure of arbitrary answers
        model.head.bias.zero_()
        pred = model(x).argmax(1)
    y = pred.clone()
    y[::2] = (pred[::2] + 1) % 3  # right only half the time
    result = calibrate(model, x, y)
    assert result.skipped is None and result.temperature > 2.0
    assert result.ece_after < result.ece_before and result.nll_after < result.nll_before
    with torch.no_grad():
        assert torch.equal(model(x).argmax(1), pred)
    assert set(result.summary()) >= {"temperature", "photos", "ece_before", "ece_after"}


def test_calibrate_skips_too_few_held_out_photos_and_leaves_the_model_alone():
    torch.manual_seed(0)
    model = build_model(3).eval()
    weight = model.head.weight.clone()
    result = calibrate(model, torch.randn(5, 3, 128, 128), torch.tensor([0, 1, 2, 0, 1]))
    assert result.temperature == 1.0 and "5 held-out photos" in result.skipped
    assert torch.equal(model.head.weight, weight)
    one_class = calibrate(model, torch.randn(30, 3, 128, 128), torch.zeros(30, dtype=torch.long))
    assert one_class.skipped and torch.equal(model.head.weight, weight)
