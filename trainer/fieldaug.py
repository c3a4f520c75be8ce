"""Field augmentation: lab photos (one leaf on a plain background) made to look like field photos.

Each lab photo's leaf is cut out of its nearly uniform background once (:func:`leaf_mask`: the background has
little colour saturation, the leaf has much), then every training batch is composed anew (:class:`FieldComposer`):

1. a background per photo: foliage (other lab photos' leaves, scattered, scaled, rotated and blurred as out of
   focus), soil, sky or a hand (smooth colour fields with grain), or the photo's own lab background;
2. the photo's leaf on it, scaled (close-ups overflow the frame), rotated, flipped and moved; sometimes another
   leaf in front of it, as in a canopy;
3. light and colour: brightness, contrast, saturation, colour temperature, a shadow, blur, sensor noise and JPEG
   quality.

Everything works on [N,3,S,S] pixel tensors in [0,1] (S = the network's input side), so the composed batch goes
through the same normalisation as :func:`edge_agent.preprocess.normalize`. Which parts are on is a
:class:`FieldAugSettings`; each part is kept only where the field photos show it helps (``docs/model.md``).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from edge_agent.preprocess import DEFAULT_SPEC, ImageRejected, PreprocessSpec, decode_rgb, normalize, read_limited, resize
from trainer.data import Sample

__all__ = ["BN_PASSES", "FieldAugSettings", "FieldComposer", "LabPhotos", "leaf_mask", "load_lab_photos"]

#: BatchNorm statistics are exact over this many composed passes of the training photos: the distribution the network
#: was trained on. Exact statistics over the clean lab photos instead cost 5.5 points of validation top-1 (0.894 -> 0.839).
BN_PASSES = 2


def leaf_mask(rgb: np.ndarray) -> np.ndarray:
    """float32 HxW in [0,1]: where the leaf is in a lab photo (``rgb`` HxWx3 uint8 on a plain background).

    The background's colour is the median of the photo's border; a pixel is leaf where its chroma (CIELAB a, b)
    differs from it by more than Otsu's threshold (with a floor, so a photo that is all leaf stays all leaf): a
    shadow on the background changes lightness, not chroma. Then the largest connected part, its holes filled
    (pale lesions and mildew), and a soft edge. A photo where this finds almost nothing is kept whole."""
    lab = cv2.cvtColor(rgb, cv2.COLOR_RGB2LAB).astype(np.float32)
    border = np.concatenate([lab[:4].reshape(-1, 3), lab[-4:].reshape(-1, 3), lab[:, :4].reshape(-1, 3), lab[:, -4:].reshape(-1, 3)])
    ref = np.median(border, axis=0)
    d = np.sqrt((lab[:, :, 1] - ref[1]) ** 2 + (lab[:, :, 2] - ref[2]) ** 2) + 0.15 * np.abs(lab[:, :, 0] - ref[0])
    d8 = cv2.GaussianBlur(np.clip(d * 4, 0, 255).astype(np.uint8), (5, 5), 0)
    t, _ = cv2.threshold(d8, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    binary = (d8 > max(t, 32)).astype(np.uint8)
    binary = cv2.morphologyEx(binary, cv2.MORPH_OPEN, np.ones((5, 5), np.uint8))
    contours, _ = cv2.findContours(binary, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    if not contours:
        return np.ones(rgb.shape[:2], np.float32)
    leaf = np.zeros(rgb.shape[:2], np.uint8)
    cv2.drawContours(leaf, [max(contours, key=cv2.contourArea)], -1, 1, thickness=cv2.FILLED)
    if leaf.mean() < 0.05:  # segmentation failed (dark or odd background): keep the whole photo
        return np.ones(rgb.shape[:2], np.float32)
    return cv2.GaussianBlur(leaf.astype(np.float32), (5, 5), 0)


@dataclass(frozen=True)
class FieldAugSettings:
    """Which field augmentations are applied, and how often."""

    lab_background: float = 0.2  # share of photos that keep their own lab background
    foliage: float = 0.5  # of the others: share on a foliage background (the rest: soil, sky or hand)
    scale: tuple[float, float] = (0.7, 1.8)  # leaf scale (1 = as in the lab photo); > 1 overflows the frame
    occluder: float = 0.3  # share with another leaf partly in front
    shadow: float = 0.4
    blur: float = 0.3
    jpeg: float = 0.3
    noise_std: float = 0.03
    color: float = 1.0  # 0 turns brightness, contrast, saturation and colour temperature off

    @classmethod
    def from_record(cls, record: dict) -> "FieldAugSettings":
        """The settings a manifest's ``training.augmentation`` records (as :func:`dataclasses.asdict` wrote them);
        keys this version does not know are ignored, missing ones take their defaults."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in record.items() if k in known}
        if "scale" in values:
            values["scale"] = tuple(float(v) for v in values["scale"])
        return cls(**values)


@dataclass
class LabPhotos:
    """Lab photos decoded once: pixels (uint8 [N,S,S,3] RGB), leaf masks (float32 [N,S,S]) and their samples."""

    samples: list[Sample]
    pixels: np.ndarray
    masks: np.ndarray

    def tensors(self, spec: PreprocessSpec = DEFAULT_SPEC) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised network inputs (exactly :func:`edge_agent.preprocess.preprocess_bytes`) and labels."""
        x = np.stack([normalize(p, spec) for p in self.pixels]) if len(self.pixels) else np.zeros((0, 3, spec.size, spec.size), np.float32)
        return torch.from_numpy(x), torch.tensor([s.label for s in self.samples], dtype=torch.long)


def load_lab_photos(samples: list[Sample], spec: PreprocessSpec = DEFAULT_SPEC, workers: int = 2) -> LabPhotos:
    """Decode each photo once: its resized pixels and its leaf mask (photos that cannot be read or decoded are left out)."""

    def one(s: Sample):
        try:
            rgb = decode_rgb(read_limited(s.path, spec), spec)
        except (ImageRejected, OSError):
            return None
        mask = cv2.resize(leaf_mask(rgb), (spec.size, spec.size), interpolation=cv2.INTER_AREA)
        return resize(rgb, spec), mask

    with ThreadPoolExecutor(max_workers=workers) as pool:
        got = list(pool.map(one, samples))
    keep = [i for i, r in enumerate(got) if r is not None]
    if not keep:
        return LabPhotos([], np.zeros((0, spec.size, spec.size, 3), np.uint8), np.zeros((0, spec.size, spec.size), np.float32))
    return LabPhotos(
        [samples[i] for i in keep], np.stack([got[i][0] for i in keep]), np.stack([got[i][1] for i in keep]).astype(np.float32)
    )


_PALETTES = {  # RGB in [0,1]: base colours of non-foliage backgrounds
    "soil": [(0.35, 0.25, 0.16), (0.45, 0.34, 0.22), (0.25, 0.18, 0.12), (0.55, 0.45, 0.33)],
    "sky": [(0.70, 0.82, 0.95), (0.85, 0.88, 0.92), (0.95, 0.95, 0.95), (0.55, 0.70, 0.90)],
    "hand": [(0.86, 0.67, 0.55), (0.72, 0.52, 0.40), (0.50, 0.34, 0.25), (0.95, 0.78, 0.68)],
    "grass": [(0.25, 0.40, 0.12), (0.40, 0.50, 0.20), (0.15, 0.30, 0.10), (0.55, 0.55, 0.30)],
}


class FieldComposer:
    """Composes field-like training batches from lab photos and their leaf masks.

    ``pixels`` [N,3,S,S] float32 in [0,1] RGB, ``masks`` [N,1,S,S] in [0,1]; :meth:`__call__` takes the indices of
    a batch and returns it normalised as the network sees photos (``spec``'s mean and std)."""

    def __init__(
        self, pixels: torch.Tensor, masks: torch.Tensor, settings: FieldAugSettings | None = None, spec: PreprocessSpec = DEFAULT_SPEC
    ) -> None:
        if pixels.shape[0] != masks.shape[0] or pixels.shape[0] < 2:
            raise ValueError("need at least two photos, each with a mask")
        self.pixels, self.masks = pixels, masks
        self.settings = settings or FieldAugSettings()
        self.mean = torch.tensor(spec.mean).view(1, 3, 1, 1)
        self.std = torch.tensor(spec.std).view(1, 3, 1, 1)

    @classmethod
    def of(cls, photos: LabPhotos, settings: FieldAugSettings | None = None, spec: PreprocessSpec = DEFAULT_SPEC) -> "FieldComposer":
        """A composer over ``photos`` (decoded by :func:`load_lab_photos`)."""
        return cls(
            torch.from_numpy(photos.pixels).permute(0, 3, 1, 2).float().div(255).contiguous(),
            torch.from_numpy(photos.masks)[:, None].contiguous(),
            settings,
            spec,
        )

    def __call__(self, idx: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        s = self.settings
        n = len(idx)
        img, mask = self.pixels[idx], self.masks[idx]
        lab = torch.rand(n, generator=g) < s.lab_background
        # The photo's own leaf, moved; lab-background photos move with their background (reflection padding).
        theta = _affine(n, g, s.scale)
        leaf = _warp(img, theta, "reflection")
        leaf_mask = _warp(mask, theta, "zeros")
        bg = self._backgrounds(n, g)
        out = torch.where(lab.view(n, 1, 1, 1), leaf, leaf_mask * leaf + (1 - leaf_mask) * bg)
        if s.occluder > 0:
            out = self._occlude(out, torch.rand(n, generator=g) < s.occluder, g)
        if s.color > 0:
            out = _colour(out, g, s.color)
        if s.shadow > 0:
            out = _shadow(out, torch.rand(n, generator=g) < s.shadow, g)
        if s.blur > 0:
            out = _blur(out, torch.where(torch.rand(n, generator=g) < s.blur, torch.rand(n, generator=g) * 1.5 + 0.3, 0.0))
        if s.noise_std > 0:
            out = out + torch.randn(out.shape, generator=g) * (torch.rand(n, 1, 1, 1, generator=g) * s.noise_std)
        out = out.clamp(0, 1)
        if s.jpeg > 0:
            out = _jpeg(out, torch.rand(n, generator=g) < s.jpeg, g)
        return (out - self.mean) / self.std

    def sample(self, passes: int, seed: int, batch: int = 64) -> torch.Tensor:
        """Every photo composed ``passes`` times (seeded): the training distribution, for exact BatchNorm statistics."""
        g = torch.Generator().manual_seed(seed)
        n = len(self.pixels)
        return torch.cat([self(torch.arange(i, min(i + batch, n)), g) for _ in range(passes) for i in range(0, n, batch)])

    def _backgrounds(self, n: int, g: torch.Generator) -> torch.Tensor:
        size = self.pixels.shape[-1]
        foliage = self._foliage(n, g)
        plain = _plain(n, size, g)
        pick = (torch.rand(n, generator=g) < self.settings.foliage).view(n, 1, 1, 1)
        return torch.where(pick, foliage, plain)

    def _foliage(self, n: int, g: torch.Generator, leaves: int = 6) -> torch.Tensor:
        """Other photos' leaves scattered over a dark green base, then blurred as out of focus."""
        size = self.pixels.shape[-1]
        base = _noise_field(n, size, g, _PALETTES["grass"], scale=0.15)
        out = base * (0.4 + 0.4 * torch.rand(n, 1, 1, 1, generator=g))
        for _ in range(leaves):
            j = torch.randint(0, len(self.pixels), (n,), generator=g)
            theta = _affine(n, g, (0.5, 1.3), shift=1.0)
            m = _warp(self.masks[j], theta, "zeros")
            out = m * _warp(self.pixels[j], theta, "zeros") + (1 - m) * out
        sigma = torch.rand(n, generator=g) * 2.5 + 0.5
        return _blur(out, sigma)

    def _occlude(self, out: torch.Tensor, which: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        n = len(out)
        j = torch.randint(0, len(self.pixels), (n,), generator=g)
        theta = _affine(n, g, (0.6, 1.2), shift=1.3)  # mostly off-centre: it covers an edge, not the lesions
        m = _warp(self.masks[j], theta, "zeros") * which.view(n, 1, 1, 1)
        return m * _warp(self.pixels[j], theta, "zeros") + (1 - m) * out


def _affine(n: int, g: torch.Generator, scale: tuple[float, float], shift: float = 0.3) -> torch.Tensor:
    """[n,2,3] sampling matrices: rotation, flips, zoom ``scale`` (log-uniform) and a shift."""
    lo, hi = math.log(scale[0]), math.log(scale[1])
    z = torch.exp(torch.rand(n, generator=g) * (hi - lo) + lo)
    a = torch.rand(n, generator=g) * 2 * math.pi
    fx = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    cos, sin = torch.cos(a) / z, torch.sin(a) / z
    tx, ty = (torch.rand(n, generator=g) * 2 - 1) * shift, (torch.rand(n, generator=g) * 2 - 1) * shift
    return torch.stack([torch.stack([cos * fx, -sin, tx], 1), torch.stack([sin * fx, cos, ty], 1)], 1)


def _warp(x: torch.Tensor, theta: torch.Tensor, padding: str) -> torch.Tensor:
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=padding, align_corners=False)


def _noise_field(n: int, size: int, g: torch.Generator, palette, scale: float) -> torch.Tensor:
    """A colour from ``palette`` per photo, varied by smooth (4x4 and 16x16) and fine noise."""
    colours = torch.tensor(palette)[torch.randint(0, len(palette), (n,), generator=g)].view(n, 3, 1, 1)
    coarse = F.interpolate(torch.randn(n, 1, 4, 4, generator=g), size=size, mode="bicubic", align_corners=False)
    mid = F.interpolate(torch.randn(n, 3, 16, 16, generator=g), size=size, mode="bilinear", align_corners=False)
    fine = torch.randn(n, 1, size, size, generator=g)
    return (colours * (1 + scale * coarse) + scale * 0.25 * mid + scale * 0.08 * fine).clamp(0, 1)


def _plain(n: int, size: int, g: torch.Generator) -> torch.Tensor:
    """Soil, sky, hand or grass: one kind per photo."""
    kinds = list(_PALETTES)
    fields = torch.stack([_noise_field(n, size, g, _PALETTES[k], scale=0.2) for k in kinds])
    pick = torch.randint(0, len(kinds), (n,), generator=g)
    return fields[pick, torch.arange(n)]


def _colour(x: torch.Tensor, g: torch.Generator, strength: float) -> torch.Tensor:
    n = len(x)

    def jitter(span: float) -> torch.Tensor:
        return 1 + (torch.rand(n, 1, 1, 1, generator=g) * 2 - 1) * span * strength

    x = x * jitter(0.35)  # exposure
    m = x.mean(dim=(1, 2, 3), keepdim=True)
    x = (x - m) * jitter(0.3) + m  # contrast
    grey = x.mean(dim=1, keepdim=True)
    x = (x - grey) * jitter(0.4) + grey  # saturation
    t = (torch.rand(n, 1, 1, generator=g) * 2 - 1) * 0.12 * strength  # colour temperature: warm <-> cool
    return x * torch.cat([1 + t, torch.ones_like(t), 1 - t], 1).view(n, 3, 1, 1)


def _shadow(x: torch.Tensor, which: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    n, _, h, w = x.shape
    field = F.interpolate(torch.rand(n, 1, 3, 3, generator=g), size=(h, w), mode="bicubic", align_corners=False).clamp(0, 1)
    depth = torch.rand(n, 1, 1, 1, generator=g) * 0.6 * which.view(n, 1, 1, 1)
    return x * (1 - depth * field)


def _blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Gaussian blur with one ``sigma`` per photo (0: unchanged), as a grouped separable convolution."""
    n, c, h, w = x.shape
    radius = 5
    t = torch.arange(-radius, radius + 1, dtype=x.dtype)
    k = torch.exp(-(t.view(1, -1) ** 2) / (2 * sigma.clamp(min=1e-3).view(-1, 1) ** 2))
    k = torch.where(sigma.view(-1, 1) > 0, k, (t == 0).to(x.dtype).view(1, -1))
    k = (k / k.sum(1, keepdim=True)).repeat_interleave(c, 0)  # [n*c, 2r+1]
    y = F.pad(x.reshape(1, n * c, h, w), (radius, radius, radius, radius), mode="reflect")
    y = F.conv2d(y, k.view(n * c, 1, 1, -1), groups=n * c)
    y = F.conv2d(y, k.view(n * c, 1, -1, 1), groups=n * c)
    return y.view(n, c, h, w)


def _jpeg(x: torch.Tensor, which: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    out = x.clone()
    for i in torch.nonzero(which).flatten().tolist():
        q = int(torch.randint(25, 90, (1,), generator=g))
        rgb = (x[i].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        ok, buf = cv2.imencode(".jpg", rgb, [cv2.IMWRITE_JPEG_QUALITY, q])
        if ok:
            out[i] = torch.from_numpy(cv2.imdecode(buf, cv2.IMREAD_UNCHANGED).astype(np.float32) / 255).permute(2, 0, 1)
    return out
