"""Field augmentation: the leaf found on its lab background, and field-like batches composed from it."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from .conftest import leaf_image

torch = pytest.importorskip("torch", reason="training-time augmentation needs the 'train' extra")

from trainer.fieldaug import FieldAugSettings, FieldComposer, leaf_mask  # noqa: E402


def test_the_leaf_is_found_on_a_plain_background_with_its_pale_spots_inside():
    bgr = leaf_image(3, (200, 200))
    cv2.circle(bgr, (100, 100), 12, (200, 200, 200), -1)  # a pale lesion the colour of the background, inside the leaf
    mask = leaf_mask(np.ascontiguousarray(bgr[:, :, ::-1]))
    truth = np.zeros((200, 200), np.uint8)
    cv2.ellipse(truth, (100, 100), (66, 66), 0, 0, 360, 1, -1)
    inside, outside = mask[truth == 1], mask[cv2.dilate(truth, np.ones((9, 9), np.uint8)) == 0]
    assert inside.mean() > 0.95 and outside.mean() < 0.02
    assert mask[100, 100] > 0.9  # the hole is filled


def test_a_photo_with_nothing_to_cut_out_keeps_the_whole_photo():
    assert leaf_mask(np.full((64, 64, 3), 128, np.uint8)).min() == 1.0


def composer(n: int = 6, **settings) -> FieldComposer:
    pix = torch.stack([torch.from_numpy(leaf_image(i, (64, 64))[:, :, ::-1].copy()).permute(2, 0, 1).float() / 255 for i in range(n)])
    masks = torch.stack([torch.from_numpy(leaf_mask(leaf_image(i, (64, 64))[:, :, ::-1].copy()))[None] for i in range(n)])
    return FieldComposer(pix, masks, FieldAugSettings(**settings))


def test_a_composed_batch_is_normalised_like_the_daemons_input_and_reproducible_from_its_seed():
    c = composer()
    a = c(torch.tensor([0, 1, 2, 3]), torch.Generator().manual_seed(1))
    b = c(torch.tensor([0, 1, 2, 3]), torch.Generator().manual_seed(1))
    assert a.shape == (4, 3, 64, 64) and torch.equal(a, b)
    pix = a * c.std + c.mean
    assert pix.min() >= -1e-5 and pix.max() <= 1 + 1e-5


def test_field_backgrounds_replace_the_lab_background():
    c = composer(lab_background=0.0, occluder=0, shadow=0, blur=0, jpeg=0, noise_std=0, color=0, scale=(1.0, 1.0))
    out = c(torch.arange(6), torch.Generator().manual_seed(0)) * c.std + c.mean
    corner = out[:, :, :4, :4].mean(dim=(2, 3))  # the lab background is a flat grey (200/255)
    assert (corner - 200 / 255).abs().max(1).values.min() > 0.02


def test_keeping_the_lab_background_keeps_the_photo_when_every_other_part_is_off():
    c = composer(lab_background=1.0, occluder=0, shadow=0, blur=0, jpeg=0, noise_std=0, color=0, scale=(1.0, 1.0))
    out = c(torch.arange(6), torch.Generator().manual_seed(0)) * c.std + c.mean
    assert out[:, :, :4, :4].mean().item() == pytest.approx(200 / 255, abs=0.02)


def test_a_composer_needs_two_photos_each_with_a_mask():
    with pytest.raises(ValueError, match="at least two photos"):
        FieldComposer(torch.zeros(1, 3, 8, 8), torch.ones(1, 1, 8, 8))


def test_the_settings_a_manifest_records_come_back_as_settings_whatever_keys_it_adds_or_lacks():
    from dataclasses import asdict

    record = asdict(FieldAugSettings(shadow=0.1))
    record["scale"] = list(record["scale"])  # as JSON gives it back
    assert FieldAugSettings.from_record(record) == FieldAugSettings(shadow=0.1)
    assert FieldAugSettings.from_record({"blur": 0.0, "from_a_later_version": 1}) == FieldAugSettings(blur=0.0)


def test_lab_photos_that_cannot_be_read_or_decoded_are_left_out(tmp_path):
    from trainer.data import Sample
    from trainer.fieldaug import load_lab_photos

    good = [tmp_path / f"{i}.png" for i in range(2)]
    for i, p in enumerate(good):
        cv2.imwrite(str(p), leaf_image(i, (96, 96)))
    (tmp_path / "half.jpg").write_bytes(b"\xff\xd8\xff\xe0 not the rest")
    samples = [
        Sample(str(good[0]), 0),
        Sample(str(tmp_path / "half.jpg"), 1),
        Sample(str(tmp_path / "gone.png"), 1),
        Sample(str(good[1]), 2),
    ]
    photos = load_lab_photos(samples)
    assert [s.label for s in photos.samples] == [0, 2]
    assert photos.pixels.shape[0] == photos.masks.shape[0] == 2 and photos.pixels.dtype == np.uint8
    assert load_lab_photos(samples[1:3]).pixels.shape[0] == 0


def test_batchnorm_photos_for_a_field_trained_version_are_composed_lab_photos_plus_the_others_as_they_are(tmp_path, monkeypatch):
    from dataclasses import asdict

    import trainer.batchnorm as bn
    from trainer.data import Sample

    paths = []
    for i in range(5):
        paths.append(tmp_path / f"{i}.png")
        cv2.imwrite(str(paths[-1]), leaf_image(i, (96, 96)))
    lab = [Sample(str(p), i) for i, p in enumerate(paths)]
    others = torch.zeros(3, 3, 128, 128)
    release = {"augmentation": asdict(FieldAugSettings())}

    x, how = bn.batchnorm_photos(release, lab, others, seed=0)
    assert x.shape == (bn.BN_PASSES * 5 + 3, 3, 128, 128) and torch.equal(x[-3:], others)
    assert not torch.equal(x[:5], x[5:10])  # each pass composed anew
    assert torch.equal(x, bn.batchnorm_photos(release, lab, others, seed=0)[0])  # reproducible from its seed
    assert "composed passes of 5 lab photos and 3 others" in how

    assert bn.batchnorm_photos({"kind": "supervised"}, lab, others, seed=0) == (None, "exact over the photos it trained on")
    none, why = bn.batchnorm_photos(release, [Sample(str(tmp_path / "gone.png"), 0)], others, seed=0)
    assert none is None and "no lab photos to compose" in why
    monkeypatch.setattr(bn, "BN_MAX_LAB_PHOTOS", 3)  # a large labelled folder: a seeded share of it
    assert bn.batchnorm_photos(release, lab, others, seed=0)[0].shape[0] == bn.BN_PASSES * 3 + 3
