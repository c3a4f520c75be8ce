"""benchmarks.feature_probe: a linear probe on frozen features ranks starting points by what N field labels give."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks.feature_probe import backbone, probe  # noqa: E402


def _photos(n: int, classes: int, informative: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = [i % classes for i in range(n)]
    feats = {}
    for i, y in enumerate(labels):
        v = torch.randn(16, generator=g)
        if informative:
            v[y] += 6.0  # the class is written in the features
        feats[f"p{i}"] = v
    rows = [(f"p{i}", y) for i, y in enumerate(labels)]
    return feats, rows


def test_features_that_carry_the_class_are_probed_right_and_features_that_do_not_are_probed_near_chance():
    feats, rows = _photos(200, 4, informative=True)
    assert probe(feats, rows[100:], rows[:100], 40) > 0.95
    noise, rows = _photos(200, 4, informative=False)
    assert probe(noise, rows[100:], rows[:100], 40) < 0.45


def test_the_probe_learns_only_from_the_first_n_stream_photos():
    feats, rows = _photos(200, 4, informative=True)
    flipped = [(p, (y + 1) % 4) for p, y in rows[:100]]  # every stream label wrong ...
    stream = rows[:8] + flipped[8:]  # ... but the first 8
    assert probe(feats, rows[100:], stream, 8) > 0.9
    assert probe(feats, rows[100:], stream, 100) < 0.2


def test_a_shipped_version_at_another_input_side_keeps_its_normalisation_and_an_unknown_name_is_refused():
    net, spec = backbone("v3000:256")
    shipped = backbone("v3000")[1]
    assert (spec.size, spec.mean, spec.std) == (256, shipped.mean, shipped.std) and shipped.size == 192
    assert net.arch == "efficientnet-lite0"
    with pytest.raises(Exception, match="v9999"):
        backbone("v9999")


def test_flip_averaging_averages_each_photos_mirror_images_before_its_answer(monkeypatch):
    import benchmarks.flip_average as fa

    class LeftSided(torch.nn.Module):  # class 0 when the left half is bright (0.98 sure), else class 1 (0.998 sure)
        def forward(self, x):
            left = x[..., : x.shape[-1] // 2].mean((1, 2, 3))
            return torch.stack([10 * left, torch.full_like(left, 6.0)], 1)

    x = torch.zeros(2, 3, 8, 8)
    x[0, :, :, :4] = 1.0  # photo 0: bright left half, labelled 0 (right as it is, wrong once its mirror weighs in)
    x[1, :, :, 4:] = 1.0  # photo 1: bright right half, labelled 1 (right either way)
    monkeypatch.setattr(fa, "tensors", lambda paths, spec: x[: len(paths)])
    top1 = fa.averaged_top1(LeftSided(), [("p0", 0), ("p1", 1)], spec=None)
    mirrors = ("as it is", "and left-right", "all four mirrors")
    assert {k: top1[k] for k in mirrors} == {"as it is": 1.0, "and left-right": 0.5, "all four mirrors": 0.5}
    assert set(top1) == set(fa.VIEWS)


def test_a_test_time_crop_is_the_named_part_of_the_photo_at_the_full_size():
    from benchmarks.flip_average import crop

    x = torch.zeros(1, 1, 10, 10)
    x[..., :6, :6] = 1.0  # the top-left 60 %
    x[..., 4:6, 4:6] = 2.0  # its bottom-right corner, inside the centre
    top_left = crop(x, 0.6, 0, 0)
    assert top_left.shape == x.shape and top_left.min() > 0.999  # only the bright part, resized back to 10 x 10
    assert crop(x, 0.6, 1, 1)[..., -1, -1].item() == 0.0  # the bottom-right corner is dark
    centre = crop(x, 0.2, 0.5, 0.5)  # the 2 x 2 square in the middle: rows and columns 4-5
    assert torch.allclose(centre, torch.full_like(x, 2.0))
