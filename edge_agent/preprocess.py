"""The one preprocessing path from photo bytes to the network's input tensor.

The daemon and the trainer both call :func:`preprocess_bytes` (or
:func:`preprocess_file`), so a photo becomes exactly the same float32 tensor at
training time and in the field.

Steps, in order:

1. Size cap on the file (``max_file_bytes``), then the header is parsed without
   decoding (:mod:`edge_agent.imageheader`): unknown formats, truncated files and
   images over ``max_pixels`` are rejected before anything is allocated.
2. Decode with OpenCV, ignoring OpenCV's own EXIF handling, then apply the EXIF
   orientation here (OpenCV builds differ in whether ``imdecode`` honours it). A JPEG whose shorter side is at
   least twice the input side times 2, 4 or 8 is decoded at that reduced scale by libjpeg's DCT scaling
   (:func:`reduction`): a 12 MP phone photo costs a quarter of its full decode, and since the daemon and the
   trainer both decode here, they see the same pixels.
3. Resize to ``size`` x ``size`` with ``cv2.INTER_AREA``: the anti-aliased choice
   for downscaling (field photos are almost always larger than the input); it
   averages over the source pixels instead of sampling, so fine lesion texture is
   not aliased. Upscaling (rare) uses ``INTER_LINEAR``. No aspect-preserving
   crop: PlantVillage photos are square, and a crop could cut off the lesion.
4. Scale to [0, 1], subtract ImageNet mean, divide by std, HWC -> CHW float32, BGR -> RGB
   (a lookup table per channel; swapping channels after the resize gives the same tensor as before it).
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import asdict, dataclass, field

import numpy as np

from edge_agent.imageheader import IMAGE_EXTENSIONS, ImageHeader, ImageRejected, ImageTooLarge, check_image


class _OpenCV:
    """OpenCV, imported at its first use instead of with this module: ~25 ms of the daemon's start that READY=1
    need not wait for (the daemon imports it just after READY=1, before a photo could need it)."""

    def __getattr__(self, name: str):
        import cv2 as real

        globals()["cv2"] = real  # every later use goes straight to the module
        return getattr(real, name)


cv2 = _OpenCV()


def load_decoder() -> None:
    """Import OpenCV now (the daemon calls this just after READY=1)."""
    cv2.imdecode  # noqa: B018 - the attribute access is the import


__all__ = [
    "PreprocessSpec",
    "ImageRejected",
    "DEFAULT_SPEC",
    "decode_rgb",
    "decode_bgr",
    "reduction",
    "resize",
    "normalize",
    "preprocess_bytes",
    "preprocess_file",
    "read_limited",
    "IMAGE_EXTENSIONS",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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


#: libjpeg's DCT scaling factors, largest first (OpenCV's IMREAD_REDUCED_COLOR_<factor>).
_REDUCED = (8, 4, 2)


def reduction(header: ImageHeader, size: int) -> int:
    """The factor a photo is decoded smaller by for an input of ``size`` pixels: the largest of 8, 4, 2 that leaves
    its shorter side at least ``2 * size`` (so the area resize still averages), for JPEG only; else 1."""
    if header.format != "jpeg":
        return 1
    short = min(header.width, header.height)
    return next((f for f in _REDUCED if short // f >= 2 * size), 1)


def check_header(data: bytes, spec: PreprocessSpec = DEFAULT_SPEC) -> ImageHeader:
    """Apply the size and pixel caps and the completeness checks; return the header."""
    return check_image(data, spec.max_file_bytes, spec.max_pixels)


def decode_rgb(data: bytes, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """Checked decode of ``data`` to an upright HxWx3 uint8 RGB array."""
    return cv2.cvtColor(decode_bgr(data, spec), cv2.COLOR_BGR2RGB)


def decode_bgr(data: bytes, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """Checked decode of ``data`` to an upright HxWx3 uint8 array in OpenCV's BGR order, at :func:`reduction`'s
    scale for ``spec.size``."""
    header = check_header(data, spec)
    if header.format == "heif":
        return _decode_heif(data, header)
    buf = np.frombuffer(data, np.uint8)
    factor = reduction(header, spec.size)
    flag = getattr(cv2, f"IMREAD_REDUCED_COLOR_{factor}") if factor in _REDUCED else cv2.IMREAD_COLOR
    img = cv2.imdecode(buf, flag | cv2.IMREAD_IGNORE_ORIENTATION)
    if img is None or img.ndim != 3 or img.shape[2] != 3:
        raise ImageRejected(f"undecodable {header.format.upper()} (corrupt image data)")
    # OpenCV's TIFF decoder (libtiff's RGBA reader) turns the image upright itself, whatever the flags; for the other
    # formats the orientation is applied here, so every build gives the same pixels (tests pin both, orientations 1-8).
    upright_already = header.format == "tiff"
    w, h = (header.height, header.width) if upright_already and header.orientation >= 5 else (header.width, header.height)
    w, h = -(-w // factor), -(-h // factor)  # libjpeg rounds a scaled side up
    if (img.shape[1], img.shape[0]) != (w, h):
        raise ImageRejected(f"decoded size {img.shape[1]}x{img.shape[0]} does not match header {w}x{h}")
    return img if upright_already else _apply_orientation(img, header.orientation)


def _decode_heif(data: bytes, header: ImageHeader) -> np.ndarray:
    """HEIC/HEIF through libheif (pillow-heif), upright as its irot/imir boxes say, 8 bits, BGR."""
    try:
        import pillow_heif
    except ImportError:
        raise ImageRejected("HEIC/HEIF needs pillow-heif (pip install pillow-heif); or export the photo as JPEG") from None
    try:
        heif = pillow_heif.open_heif(data, convert_hdr_to_8bit=True)
        rgb = np.asarray(heif)
    except Exception as exc:  # libheif reports corrupt data as ValueError/RuntimeError
        raise ImageRejected(f"undecodable HEIF ({exc})") from None
    if rgb.ndim != 3 or rgb.shape[2] not in (3, 4):
        raise ImageRejected(f"undecodable HEIF (unexpected {heif.mode} image)")
    if rgb.shape[0] * rgb.shape[1] > header.pixels:
        raise ImageRejected(f"decoded size {rgb.shape[1]}x{rgb.shape[0]} exceeds the header's {header.width}x{header.height}")
    return np.ascontiguousarray(rgb[:, :, 2::-1])


def resize(rgb: np.ndarray, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """Resize to ``spec.size`` square (INTER_AREA down, INTER_LINEAR up)."""
    h, w = rgb.shape[:2]
    if (h, w) == (spec.size, spec.size):
        return rgb
    shrinking = h >= spec.size and w >= spec.size
    interp = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    return cv2.resize(rgb, (spec.size, spec.size), interpolation=interp)


def normalize(img: np.ndarray, spec: PreprocessSpec = DEFAULT_SPEC, order: str = "RGB") -> np.ndarray:
    """uint8 HxWx3 (``order`` RGB or BGR) -> float32 3xHxW RGB, ImageNet-normalised: ``(v / 255 - mean) / std``.

    A 256-entry table per channel, computed with exactly that float32 arithmetic, turns this into one
    lookup pass (``cv2.LUT``) with a bit-for-bit identical result: a third of the CPU of computing it."""
    bgr = order == "BGR"
    mean, std = (spec.mean[::-1], spec.std[::-1]) if bgr else (spec.mean, spec.std)
    chw = cv2.LUT(img, _normalize_table(mean, std)).transpose(2, 0, 1)
    return np.ascontiguousarray(chw[::-1] if bgr else chw)


@functools.lru_cache(maxsize=8)
def _normalize_table(mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """[1, 256, 3] float32 (cv2.LUT's layout): byte v in channel c -> (v / 255 - mean[c]) / std[c]."""
    v = np.arange(256, dtype=np.float32)[:, None].repeat(3, axis=1) * np.float32(1.0 / 255.0)
    v -= np.asarray(mean, np.float32)
    v /= np.asarray(std, np.float32)
    return np.ascontiguousarray(v[None])


def preprocess_bytes(data: bytes, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """Photo bytes -> float32 [3, size, size] network input. Raises :class:`ImageRejected`.

    Exactly ``normalize(resize(decode_rgb(data)))``, with the BGR -> RGB swap folded into the last step: resizing
    treats channels alike, so swapping after it gives the same tensor without a pass over the full-size photo."""
    return normalize(resize(decode_bgr(data, spec), spec), spec, order="BGR")


def read_limited(path: str | os.PathLike, spec: PreprocessSpec = DEFAULT_SPEC) -> bytes:
    """Read a regular file's bytes, refusing it over the size cap before reading it.

    One open, one fstat and reads sized from the file (a photo still growing is read to its end, up to
    the cap), not a cap-sized buffer per photo. A FIFO, device or socket is refused without blocking."""
    cap = spec.max_file_bytes
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise ImageRejected("no such file") from None
    except PermissionError:
        raise ImageRejected("permission denied") from None
    except IsADirectoryError:
        raise ImageRejected("is a directory") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ImageRejected("is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ImageRejected("not a regular file")
        if st.st_size > cap:
            raise ImageTooLarge(f"file too large: {st.st_size} bytes > limit {cap}")
        chunks, total, want = [], 0, st.st_size + 1  # +1: the read that finds the end costs nothing extra
        while total <= cap:
            chunk = os.read(fd, min(want, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            want = 1 << 20
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def preprocess_file(path: str | os.PathLike, spec: PreprocessSpec = DEFAULT_SPEC) -> np.ndarray:
    """:func:`preprocess_bytes` on a file's contents."""
    return preprocess_bytes(read_limited(path, spec), spec)
