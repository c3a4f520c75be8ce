"""LeafNet: the project's small CNN trained from scratch (four or five conv blocks, global pooling, a small head).

Written as plain composable blocks (the way torchvision/timm write models) so the
trainer's strategies can reach the backbone and the head separately.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from trainer.models._base import Classifier

__all__ = ["LEAFNET_ARCHS", "ConvBlock", "LeafNet", "StridedStem"]


class ConvBlock(nn.Sequential):
    """Conv3x3 (same padding) -> BatchNorm -> ReLU -> MaxPool2."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )


class StridedStem(nn.Sequential):
    """Conv3x3 with stride 2 -> BatchNorm -> ReLU: halves the side at a quarter of a full-resolution block's cost."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=1), nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True)
        )


class LeafNet(Classifier):
    """Small CNN for 128x128 RGB leaf photos (~465k parameters at 38 classes).

    ``features`` maps [N,3,H,W] to [N,hidden] embeddings; ``head`` maps those to logits. ``stem=True`` makes the
    first block a strided convolution (:class:`StridedStem`) and every later one a :class:`ConvBlock`.
    """

    def __init__(
        self, num_classes: int, channels: Sequence[int] = (32, 64, 128, 256), hidden: int = 256, dropout: float = 0.3, stem: bool = False
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        blocks: list[nn.Module] = []
        in_ch = 3
        for i, out_ch in enumerate(channels):
            blocks.append(StridedStem(in_ch, out_ch) if stem and i == 0 else ConvBlock(in_ch, out_ch))
            in_ch = out_ch
        self.backbone = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.embed = nn.Sequential(nn.Flatten(), nn.Linear(in_ch, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout))
        self.head = nn.Linear(hidden, num_classes)
        self.arch = "LeafNet"  # the ARCHS name it was built as (build_model sets it)

    def feature_blocks(self) -> list[nn.Module]:
        """The convolutional blocks and the embedding layer, from the input on."""
        return [*self.backbone, self.embed]

    def feature_path(self) -> list:
        """The convolutional blocks, pooling, the embedding layer: the penultimate embedding [N, hidden] (after ReLU and dropout)."""
        return [*self.backbone, self.pool, self.embed]


#: LeafNet's named variants (a manifest's ``model.arch``): the seed's LeafNet, and LeafNet5 (strided stem, five
#: stages to 384 channels; v1000's architecture, ``docs/model.md``).
LEAFNET_ARCHS: dict[str, dict] = {"LeafNet": {}, "LeafNet5": {"channels": (32, 64, 128, 256, 384), "hidden": 256, "stem": True}}
