"""The one preprocessing path from photo bytes to the network's input tensor.

The daemon and the trainer both call :func:`preprocess_bytes` (or
:func:`preprocess_file`), so a photo becomes exactly the same float32 tensor at
training time and in the field.

Steps, in order:

1. Size cap on the file (``max_file_bytes``), then the header is parsed without
   decoding (:mod:`edge_agent.imageheader`): unknown formats, truncated files and
   images over ``max_pixels`` are rejected before anything is allocated.
2. Decode with OpenCV, ignoring OpenCV's own EXIF handling, then apply the EXIF
   orientation here (OpenCV builds differ in whether ``imdecode`` honours it).
3. BGR -> RGB.
4. Resize to ``size`` x ``size`` with ``cv2.INTER_AREA``: the anti-aliased choice
   for downscaling (field photos are almost always larger than the input); it
   averages over the source pixels instead of sampling, so fine lesion texture is
   not aliased. Upscaling (rare) uses ``INTER_LINEAR``. No aspect-preserving
   crop: PlantVillage photos are square, and a crop could cut off the lesion.
5. Scale to [0, 1], subtract ImageNet mean, divide by std, HWC -> CHW float32.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cv2
import numpy as np

from edge_agent.imageheader import HeaderError, ImageHeader, read_header

__all__ = [
    "PreprocessSpec",
    "ImageRejected",
    "DEFAULT_SPEC",
    "decode_rgb",
    "resize",
    "normalize",
    "preprocess_bytes",
    "preprocess_file",
    "read_limited",
    "IMAGE_EXTENSIONS",
]

#: File extensions of the formats the header parser and decoder accept.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageRejected(ValueError):
    """A photo that cannot or must not be classified; the message says why."""


@dataclass(frozen=True)
class PreprocessSpec:
    """How photos become tensors; stored in every engine manifest."""

    size: int = 128
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "area"
    layout: str = "NCHW"
    color: str = "RGB"
    max_file_bytes: int = field(default=50 * 1024 * 1024, compare=False)
    max_pixels: int = field(default=50_000_000, compare=False)

    def to_manifest(self) -> dict:
        """The parts that define the tensor (not the safety caps)."""
        d = asdict(self)
        d.pop("max_file_bytes")
        d.pop("max_pixels")
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    @classmethod
    def from_manifest(cls, d: dict, **caps: int) -> "PreprocessSpec":
        spec = cls(
            size=int(d["size"]),
            mean=tuple(float(v) for v in d["mean"]),
            std=tuple(float(v) for v in d["std"]),
            interpolation=str(d.get("interpolation", "area")),
            layout=str(d.get("layout", "NCHW")),
            color=str(d.get("color", "RGB")),
            **caps,
        )
        if spec.interpolation != "area" or spec.layout != "NCHW" or spec.color != "RGB":
            raise ValueError(f"unsupported preprocessing in manifest: {d}")
        return spec


DEFAULT_SPEC = PreprocessSpec()

def _apply_orientation(img: np.ndarray, orientation: int) -> np.ndarray:
    """Bring stored pixels upright for EXIF orientation 1..8."""
    if orientation == 2:
        return cv2.flip(img, 1)
    if orientation == 3:
        return cv2.rotate(img, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(img, 0)
    if orientation == 5:
        return cv2.flip(cv2.rotate(img, cv2.ROTATE_90_CLOCKWISE), 1)
    if orientation == 6:
        return cv2.rotate(img, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.flip(cv2.rotate(img, cv2.ROTATE_90_COUNTERCLOCKWISE), 1)
    if orientation == 8:
        return cv2.rotate(img, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return img


def check_header(data: bytes, spec: PreprocessSpec = DEFAULT_SPEC) -> ImageHeader:
    """Apply the size and pixel caps and the completeness checks; return the header."""
    if len(data) > spec.max_file_bytes:
        raise ImageRejected(f"file too large: {len(data)} bytes > limit {spec.max_file_bytes}")
    try:
        header = read_header(data)
    except HeaderError as exc:
        raise ImageRejected(str(exc)) from None
    if header.pixels > spec.max_pixels:
        raise ImageRejected(
            f"image too large: {header.width}x{header.height} = {header.pixels} pixels "
            f"> limit {spec.max_pixels} (decompression bomb?)"
        )
    return header


def decode_rgb(data: bytes, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """Checked decode of ``data`` to an upright HxWx3 uint8 RGB array."""
    header = check_header(data, spec)
    buf = np.frombuffer(data, np.uint8)
    img = cv2.imdecode(buf, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if img is None or img.ndim != 3 or img.shape[2] != 3:
        raise ImageRejected(f"undecodable {header.format.upper()} (corrupt image data)")
    if (img.shape[1], img.shape[0]) != (header.width, header.height):
        raise ImageRejected(
            f"decoded size {img.shape[1]}x{img.shape[0]} does not match header {header.width}x{header.height}"
        )
    img = _apply_orientation(img, header.orientation)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def resize(rgb: np.ndarray, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """Resize to ``spec.size`` square (INTER_AREA down, INTER_LINEAR up)."""
    h, w = rgb.shape[:2]
    if (h, w) == (spec.size, spec.size):
        return rgb
    shrinking = h >= spec.size and w >= spec.size
    interp = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    return cv2.resize(rgb, (spec.size, spec.size), interpolation=interp)


def normalize(rgb: np.ndarray, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """uint8 HxWx3 RGB -> float32 3xHxW, ImageNet-normalised."""
    x = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
    x -= np.asarray(spec.mean, np.float32)
    x /= np.asarray(spec.std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def preprocess_bytes(data: bytes, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """Photo bytes -> float32 [3, size, size] network input. Raises :class:`ImageRejected`."""
    return normalize(resize(decode_rgb(data, spec), spec), spec)


def read_limited(path: str | os.PathLike, spec: PreprocessSpec = DEFAULT_SPEC) -> bytes:
    """Read a photo's bytes, refusing files over the size cap before reading them."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > spec.max_file_bytes:
            raise ImageRejected(f"file too large: {size} bytes > limit {spec.max_file_bytes}")
        with open(p, "rb") as f:
            return f.read(spec.max_file_bytes + 1)
    except IsADirectoryError:
        raise ImageRejected("is a directory") from None
    except FileNotFoundError:
        raise ImageRejected("no such file") from None
    except PermissionError:
        raise ImageRejected("permission denied") from None


def preprocess_file(path: str | os.PathLike, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """:func:`preprocess_bytes` on a file's contents."""
    return preprocess_bytes(read_limited(path, spec), spec)
