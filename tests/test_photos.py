"""The trainer holds photos as 8-bit codes or in half precision, and every network, augmentation, image check and ONNX
Runtime call sees the float32 values the daemon computes."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, ".")

from edge_agent.preprocess import DEFAULT_SPEC, preprocess_bytes  # noqa: E402
from trainer import photos  # noqa: E402
from trainer.augment import Augment  # noqa: E402
from trainer.data import Sample  # noqa: E402
from trainer.labelled import LabelledSources, load_labelled  # noqa: E402
from trainer.models import build_model, data_config  # noqa: E402

from .conftest import encode, leaf_image  # noqa: E402

LITE = data_config("efficientnet-lite0", 96)


def test_a_lite_photo_is_stored_as_its_8_bit_codes_without_losing_a_value():
    x = preprocess_bytes(encode(leaf_image(3, (240, 180))), LITE)
    stored = photos.photo(x)
    assert stored.dtype == torch.uint8 and stored.nbytes == x.nbytes // 4
    assert np.abs(photos.as_input(stored).numpy() - x).max() <= 1.2e-7  # (v - 127) / 128 is a multiple of 1/128
    assert np.abs(photos.as_array(stored.numpy()) - x).max() <= 1.2e-7  # the numpy view ONNX Runtime is given decodes alike


def test_a_photo_a_little_off_the_codes_is_held_in_half_precision_not_rounded_onto_them():
    x = preprocess_bytes(encode(leaf_image(3, (240, 180))), LITE)
    x[0, 0, 0] += 0.004  # half a code away: codes would move it
    stored = photos.photo(x)
    assert stored.dtype == torch.float16 and np.abs(photos.as_input(stored).numpy() - x).max() < 1e-3


def test_an_imagenet_normalised_photo_is_stored_within_a_tenth_of_one_pixel_level():
    x = preprocess_bytes(encode(leaf_image(4, (240, 180))), DEFAULT_SPEC)
    level = 1 / 255 / min(DEFAULT_SPEC.std)
    assert photos.photo(x).dtype == torch.float16 and np.abs(photos.photo(x).float().numpy() - x).max() < 0.1 * level


def test_a_network_given_stored_photos_answers_as_for_float32():
    x = torch.from_numpy(np.stack([preprocess_bytes(encode(leaf_image(i, (200, 160))), LITE) for i in range(3)]))
    model = build_model(5, "LeafNet").eval()
    with torch.no_grad():
        assert torch.allclose(model(photos.stack([photos.photo(p.numpy()) for p in x])), model(x), atol=1e-5)


def test_the_augmentation_computes_in_float32_from_stored_photos():
    x = photos.stack([photos.photo(preprocess_bytes(encode(leaf_image(i, (200, 160))), LITE)) for i in range(2)])
    out = Augment(spec=LITE)(x, torch.Generator().manual_seed(0))
    assert out.dtype == torch.float32 and out.shape == x.shape


def test_joining_no_photos_to_stored_photos_keeps_their_precision():
    x = photos.stack([photos.photo(preprocess_bytes(encode(leaf_image(1, (200, 160))), LITE))])
    assert photos.join([photos.empty(96), x]).dtype == torch.uint8  # torch.cat would read the codes as half-precision values
    as_float = photos.as_input(x)
    assert as_float.dtype == torch.float32 and photos.as_input(as_float) is as_float  # float32 is passed as it is


def test_codes_joined_to_photos_of_another_precision_are_decoded_not_read_as_values():
    lite = photos.stack([photos.photo(preprocess_bytes(encode(leaf_image(i, (200, 160))), LITE)) for i in range(2)])
    imagenet = dataclasses.replace(DEFAULT_SPEC, size=96)
    half = photos.photo(preprocess_bytes(encode(leaf_image(5, (200, 160))), imagenet)).unsqueeze(0)
    joined = photos.join([lite, half])
    assert joined.dtype == torch.float16 and torch.equal(photos.as_input(joined[:2]), photos.as_input(lite))
    as_float = photos.join([torch.zeros(1, 3, 96, 96), lite])  # the field's composed photos (float32) and codes
    assert as_float.dtype == torch.float32 and torch.equal(as_float[1:], photos.as_input(lite))
    mixed = photos.stack([lite[0], half[0]])  # one by one, as a retrain reads them
    assert torch.equal(photos.as_input(mixed[:1]), photos.as_input(lite[:1]))


def test_the_image_checks_read_codes_as_the_pixels_they_are():
    from edge_agent.verdict import image_checks

    x = np.stack([preprocess_bytes(encode(leaf_image(i, (200, 160))), LITE) for i in range(3)])
    stored = photos.stack([photos.photo(p) for p in x])
    for a, b in zip(image_checks(*photos.image_view(stored, LITE.mean, LITE.std)), image_checks(x, LITE.mean, LITE.std)):
        assert np.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_retrain_reads_its_replay_and_gate_photos_as_8_bit_codes(tmp_path):
    files = []
    for i in range(3):
        files.append(tmp_path / f"{i}.jpg")
        files[-1].write_bytes(encode(leaf_image(i, (200, 160))))
    labelled = load_labelled(LabelledSources([Sample(f, 0) for f in files[:2]], [Sample(files[2], 1)]), spec=LITE)
    assert labelled.train.x.dtype == labelled.val.x.dtype == torch.uint8
    assert labelled.train.x.shape == (2, 3, 96, 96) and labelled.val.y.tolist() == [1]


@pytest.mark.parametrize("on", ["logits", "features"])
def test_a_retrain_publishes_from_stored_photos_what_it_would_from_float32_without_a_copy_of_them(tmp_path, on):
    from trainer.publish import publish_model
    from trainer.verdict_fit import fit_verdict_for

    x = photos.stack([photos.photo(preprocess_bytes(encode(leaf_image(i, (200, 160))), LITE)) for i in range(12)])
    y = torch.arange(12) % 2
    model = build_model(2, "LeafNet").eval()
    fitted = fit_verdict_for(model, x, y, x, LITE, on=on)
    version = publish_model(
        model,
        ["a", "b"],
        tmp_path,
        calibration=x[:8].numpy(),
        held_out=(x.numpy(), y.numpy()),
        verdict=fitted.section,
        distance=fitted.distance,
        spec=LITE,
    )
    int8 = version.manifest["metrics"]["int8"]
    assert int8["photos"] == 12 and 0.0 <= int8["verdict_agreement_with_fp32"] <= 1.0
    assert version.manifest["preprocess"]["size"] == 96
    xf = photos.as_input(x)  # the same photos in float32: every figure the same
    fitted_f = fit_verdict_for(model, xf, y, xf, LITE, on=on)
    assert fitted_f.section == fitted.section
    again = publish_model(
        model,
        ["a", "b"],
        tmp_path / "f32",
        calibration=xf[:8].numpy(),
        held_out=(xf.numpy(), y.numpy()),
        verdict=fitted_f.section,
        distance=fitted_f.distance,
        spec=LITE,
    )
    assert again.manifest["metrics"]["int8"] == int8


class _Recording(torch.nn.Module):
    """A network that records how many photos it is given at once."""

    num_classes = 2

    def __init__(self, batchnorm_layers: int = 0) -> None:
        super().__init__()
        self.norms = torch.nn.Sequential(*(torch.nn.BatchNorm2d(3) for _ in range(batchnorm_layers)))
        self.head = torch.nn.Linear(3, 2)
        self.seen: list[int] = []
        self._record = lambda n, seen=self.seen: seen.append(n)  # a function: a deep copy of the network shares it

    def features(self, x):
        self._record(len(x))
        return self.norms(photos.as_input(x)).mean((2, 3))

    def forward(self, x):
        return self.head(self.features(x))


def test_outside_training_no_trainer_step_gives_a_network_more_than_a_batch_of_photos_at_once(tmp_path):
    """Rehearsal once chose its memory 128 photos at a time: 1.84 GB of activations at 192 px, a retrain's peak."""
    from edge_agent.trainer_config import RehearsalConfig
    from trainer.batchnorm import EXACT_MAX_LAYERS
    from trainer.calibrate import calibrate
    from trainer.field_check import adapt_batchnorm
    from trainer.recheck import recheck
    from trainer.strategies.base import Generation
    from trainer.strategies.ewc import fisher_information
    from trainer.strategies.rehearsal import Rehearsal
    from trainer.verdict_fit import logits_of

    x, y = photos.empty(8).new_zeros(200, 3, 8, 8), torch.arange(200) % 2
    model = _Recording()
    Rehearsal(tmp_path, RehearsalConfig(per_class=5), seed=0).after(model, Generation(x, y))
    recheck(model, x, 0.9)
    logits_of(model, x)
    calibrate(model, x, y)
    fisher_information(model, Generation(x, y))  # EWC: a batch of 32's gradient, summed over parts
    assert model.seen and max(model.seen) <= photos.INFERENCE_BATCH
    deep = _Recording(batchnorm_layers=EXACT_MAX_LAYERS + 1)  # EfficientNet-Lite's one-pass statistics
    adapt_batchnorm(deep, x, x[:10], y[:10])  # the field's BatchNorm statistics once went 64 photos at a time: 1 GB
    assert deep.seen and max(deep.seen) <= photos.INFERENCE_BATCH
