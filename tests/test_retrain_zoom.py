"""``[trainer] zoom``: a retrain's random zoom (a crop at a random place above 1, the photo shrunk amid its reflection
below 1), off unless configured, checked where the file is read."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the 'train' extra (torch) is not installed")

from edge_agent.config import ConfigError, parse_config  # noqa: E402
from edge_agent.preprocess import DEFAULT_SPEC  # noqa: E402
from edge_agent.trainer_config import TrainerSection  # noqa: E402
from trainer import continual  # noqa: E402
from trainer.augment import Augment  # noqa: E402
from trainer.continual import train_generation  # noqa: E402
from trainer.models import build_model  # noqa: E402
from trainer.strategies.base import Generation, get_strategy  # noqa: E402

MEAN, STD = (torch.tensor(v).view(1, 3, 1, 1) for v in (DEFAULT_SPEC.mean, DEFAULT_SPEC.std))


def _ramp(n=2, side=64) -> torch.Tensor:
    """``n`` photos whose pixels rise from black at the left edge to white at the right, normalised as the model's."""
    return (torch.linspace(0, 1, side).view(1, 1, 1, side).expand(n, 3, side, side) - MEAN) / STD


def _pixels(x: torch.Tensor) -> torch.Tensor:
    return x * STD + MEAN


def _only_zoom(zoom) -> Augment:
    return Augment(max_degrees=0, brightness=0, contrast=0, noise_std=0, hflip=False, vflip=False, zoom=zoom)


def test_a_zoom_of_two_shows_half_of_the_photo_and_a_zoom_of_a_half_shows_it_twice_as_small():
    gen = torch.Generator().manual_seed(0)
    same = _pixels(_only_zoom(None)(_ramp(), gen))
    crop = _pixels(_only_zoom((2.0, 2.0))(_ramp(), gen))
    shrunk = _pixels(_only_zoom((0.5, 0.5))(_ramp(), gen))
    span = lambda p: p.amax(dim=(1, 2, 3)) - p.amin(dim=(1, 2, 3))  # noqa: E731
    step = lambda p: (p[..., 1:] - p[..., :-1]).abs().mean()  # noqa: E731
    assert torch.allclose(span(same), torch.ones(2), atol=0.03)
    assert torch.allclose(span(crop), torch.full((2,), 0.5), atol=0.05)  # half the ramp, wherever the crop lies
    assert step(crop) == pytest.approx(step(same) / 2, rel=0.1)
    assert step(shrunk) == pytest.approx(step(same) * 2, rel=0.1)  # the ramp and its reflection in one frame


def test_a_retrain_zooms_only_where_configured(tmp_path, monkeypatch):
    made = []

    class Recorded(continual.Augment):
        def __init__(self, **kw):
            made.append(kw.get("zoom"))
            super().__init__(**kw)

    monkeypatch.setattr(continual, "Augment", Recorded)
    x = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 0.3
    data = Generation(x, torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    for zoom in ([], [0.8, 1.25]):
        cfg = TrainerSection(epochs=1, batch_size=4, seed=0, swa_epochs=0, distill=0.0, zoom=zoom)
        train_generation(build_model(3), data, get_strategy("finetune")(tmp_path / str(len(zoom))), cfg, 5e-4)
    assert made == [None, (0.8, 1.25)]
    assert TrainerSection().zoom == []  # off by default: the shipped retrain is as measured


@pytest.mark.parametrize("zoom", [[1.25, 0.8], [0.8], [0.8, 1.0, 1.25], [0.1, 1.0], [1.0, 5.0]])
def test_a_zoom_that_is_not_a_low_and_a_high_within_a_quarter_and_four_is_refused_naming_the_key(zoom):
    with pytest.raises(ConfigError, match=r"trainer.zoom: zoom is \[low, high\] with 0.25 <= low <= high <= 4"):
        parse_config({"trainer": {"zoom": zoom}})
