"""Training-time augmentation on batches of already-preprocessed tensors.

Applied only while training, after :mod:`edge_agent.preprocess`, so evaluation
and the daemon see the untouched tensors. Works in pixel space ([0,1] RGB):
the batch is un-normalised, augmented, clamped and normalised again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from edge_agent.preprocess import DEFAULT_SPEC, PreprocessSpec
from trainer.photos import as_input

__all__ = ["Augment"]


@dataclass
class Augment:
    """Random flips, rotation up to ``max_degrees``, brightness/contrast jitter and light noise; optionally
    cutout: one square, its side a random share of the image in ``cutout`` (low, high), set to the mean colour; and
    ``zoom`` (low, high): a random scale, above 1 a crop at a random place, below 1 the photo shrunk amid its reflection
    (leaves photographed nearer or farther than the lab's)."""

    max_degrees: float = 20.0
    brightness: float = 0.2
    contrast: float = 0.2
    noise_std: float = 0.02
    hflip: bool = True
    vflip: bool = True
    spec: PreprocessSpec = DEFAULT_SPEC
    cutout: tuple[float, float] | None = None
    zoom: tuple[float, float] | None = None

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        x = as_input(x)  # stored photos are half precision (trainer.photos)
        n = x.shape[0]
        dev, g = x.device, generator

        def rand(*shape: int) -> torch.Tensor:
            return torch.rand(*shape, generator=g).to(dev)

        mean = torch.tensor(self.spec.mean, device=dev).view(1, 3, 1, 1)
        std = torch.tensor(self.spec.std, device=dev).view(1, 3, 1, 1)
        pix = x * std + mean

        # Flips and rotation as one affine warp per sample (reflection padding: no black corners).
        angle = (rand(n) * 2 - 1) * math.radians(self.max_degrees)
        sx = torch.where(rand(n) < 0.5, -1.0, 1.0) if self.hflip else torch.ones(n, device=dev)
        sy = torch.where(rand(n) < 0.5, -1.0, 1.0) if self.vflip else torch.ones(n, device=dev)
        cos, sin = torch.cos(angle), torch.sin(angle)
        tx = ty = torch.zeros_like(cos)
        if self.zoom is not None:
            low, high = self.zoom
            inv = 1 / (low + rand(n) * (high - low))  # the share of the photo the output shows, per side
            cos, sin = cos * inv, sin * inv
            room = (1 - inv).clamp(min=0)  # a crop moves anywhere inside the photo
            tx, ty = (rand(n) * 2 - 1) * room, (rand(n) * 2 - 1) * room
        theta = torch.stack([torch.stack([cos * sx, -sin * sy, tx], 1), torch.stack([sin * sx, cos * sy, ty], 1)], 1)
        grid = F.affine_grid(theta, list(pix.shape), align_corners=False)
        pix = F.grid_sample(pix, grid, mode="bilinear", padding_mode="reflection", align_corners=False)

        # Brightness (additive) and contrast (around each image's mean).
        b = ((rand(n) * 2 - 1) * self.brightness).view(n, 1, 1, 1)
        c = (1 + (rand(n) * 2 - 1) * self.contrast).view(n, 1, 1, 1)
        m = pix.mean(dim=(1, 2, 3), keepdim=True)
        pix = (pix - m) * c + m + b
        if self.noise_std > 0:
            pix = pix + torch.randn(pix.shape, generator=g).to(dev) * self.noise_std
        pix = pix.clamp(0.0, 1.0)
        out = (pix - mean) / std
        return self._cutout(out, g) if self.cutout else out

    def _cutout(self, x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
        n, _, h, w = x.shape
        low, high = self.cutout
        half = ((torch.rand(n, generator=g) * (high - low) + low) * h / 2).view(n, 1, 1)
        cy, cx = (torch.rand(n, generator=g) * h).view(n, 1, 1), (torch.rand(n, generator=g) * w).view(n, 1, 1)
        inside = ((torch.arange(h).view(1, h, 1) - cy).abs() < half) & ((torch.arange(w).view(1, 1, w) - cx).abs() < half)
        return x.masked_fill(inside.unsqueeze(1).to(x.device), 0.0)  # 0 after normalisation is the dataset's mean colour
