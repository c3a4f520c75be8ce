"""Read an image's format, size, EXIF orientation and EXIF block from its header, without decoding it.

This is the first line of defence against bad input: a decompression bomb is
rejected from the dimensions in its header before a single pixel is allocated,
and a half-copied JPEG or PNG is recognised by its missing end marker.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from engines.errors import EdgeAgentError

__all__ = [
    "ImageHeader",
    "HeaderError",
    "HeaderTruncated",
    "ImageRejected",
    "ImageTruncated",
    "ImageTooLarge",
    "read_header",
    "check_image",
    "IMAGE_EXTENSIONS",
    "ifd_entries",
    "png_chunks",
]

#: File extensions of the formats the header parser and decoder accept.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".heic", ".heif")


class HeaderError(EdgeAgentError, ValueError):
    """The bytes are not a complete image in a supported format."""


class HeaderTruncated(HeaderError):
    """The file ends before its format says it should: it may still be being copied."""


class ImageRejected(EdgeAgentError, ValueError):
    """A photo that cannot or must not be classified; the message says why."""


class ImageTruncated(ImageRejected):
    """The photo is incomplete (a copy still in progress, or a cut-off file)."""


class ImageTooLarge(ImageRejected):
    """The photo is over the byte or pixel cap ([preprocess] max_file_bytes, max_pixels)."""


@dataclass(frozen=True)
class ImageHeader:
    format: str  # "jpeg" | "png" | "bmp" | "webp" | "tiff" | "heif"
    width: int
    height: int
    orientation: int = 1  # EXIF orientation 1..8 (1 = as stored)
    exif: bytes = field(default=b"", repr=False, compare=False)  # the TIFF-structured EXIF block (JPEG, TIFF, PNG, WebP), or b""

    @property
    def pixels(self) -> int:
        return self.width * self.height


def read_header(data: bytes) -> ImageHeader:
    """Parse ``data``'s header and check that the file is complete.

    Raises :class:`HeaderError` naming the problem: empty file, unknown format,
    truncated file, or an implausible header.
    """
    if not data:  # a copy that has not written its first bytes yet looks the same: judged as incomplete
        raise HeaderTruncated("empty file (0 bytes)")
    if data[:3] == b"\xff\xd8\xff":
        return _jpeg(data)
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return _png(data)
    if data[:2] == b"BM":
        return _bmp(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return _tiff(data)
    if data[4:8] == b"ftyp":
        return _heif(data)
    if data[:4] in (b"II+\x00", b"MM\x00+"):
        raise HeaderError("BigTIFF is not supported (save it as an ordinary TIFF, JPEG or PNG)")
    raise HeaderError("not a supported image (expected JPEG, PNG, BMP, WebP, TIFF or HEIC)")


def check_image(data: bytes, max_file_bytes: int, max_pixels: int) -> ImageHeader:
    """Apply the size and pixel caps and the completeness checks; return the header.

    Every way in (the hot folder, the camera, an upload through the web page) passes here before a pixel is
    decoded. Raises :class:`ImageRejected` with the reason."""
    if len(data) > max_file_bytes:
        raise ImageTooLarge(f"file too large: {len(data)} bytes > limit {max_file_bytes}")
    try:
        header = read_header(data)
    except HeaderTruncated as exc:
        raise ImageTruncated(str(exc)) from None
    except HeaderError as exc:
        raise ImageRejected(str(exc)) from None
    if header.pixels > max_pixels:
        raise ImageTooLarge(
            f"image too large: {header.width}x{header.height} = {header.pixels} pixels > limit {max_pixels} (decompression bomb?)"
        )
    return header


# JPEG start-of-frame markers that carry the dimensions (not DHT C4, JPG C8, DAC CC).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes) -> ImageHeader:
    pos, n = 2, len(data)
    size: tuple[int, int] | None = None
    orientation, exif = 1, b""
    while True:
        # Skip fill bytes before a marker.
        while pos < n and data[pos] == 0xFF and pos + 1 < n and data[pos + 1] == 0xFF:
            pos += 1
        if pos + 4 > n:
            raise HeaderTruncated("truncated JPEG (header ends before the image data)")
        if data[pos] != 0xFF:
            raise HeaderError(f"corrupt JPEG (no marker at byte {pos})")
        marker = data[pos + 1]
        if marker == 0xD9:
            raise HeaderError("corrupt JPEG (end marker before any image data)")
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if length < 2:
            raise HeaderError("corrupt JPEG (bad segment length)")
        segment = data[pos + 4 : pos + 2 + length]
        if marker == 0xE1 and segment[:6] == b"Exif\x00\x00":
            exif = segment[6:]
            orientation = _exif_orientation(exif)
        elif marker in _SOF:
            if len(segment) < 5:
                raise HeaderTruncated("truncated JPEG (frame header cut off)")
            height, width = struct.unpack(">HH", segment[1:5])
            size = (width, height)
        elif marker == 0xDA:  # start of scan: entropy-coded data follows
            if size is None:
                raise HeaderError("corrupt JPEG (image data before the frame header)")
            # 0xFF 0xD9 cannot occur inside entropy-coded data (0xFF is stuffed),
            # so a file without it after the first scan was cut short.
            if data.rfind(b"\xff\xd9", pos + 2 + length) < 0:
                raise HeaderTruncated("truncated JPEG (no end-of-image marker: file incomplete?)")
            break
        pos += 2 + length
    width, height = size
    if width == 0 or height == 0:
        raise HeaderError("corrupt JPEG (zero width or height)")
    return ImageHeader("jpeg", width, height, orientation, exif)


def ifd_entries(tiff: bytes, offset: int | None = None) -> Iterator[tuple[str, int, int, int, bytes]]:
    """(byte order, tag, type, count, the 4 value-or-offset bytes) of each entry of a TIFF-structured block's directory
    at ``offset`` (None: the first); none where the block is too short or its byte order unknown, at most 512."""
    endian = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if endian is None or len(tiff) < 8:
        return
    if offset is None:
        (offset,) = struct.unpack(endian + "I", tiff[4:8])
    if offset + 2 > len(tiff):
        return
    (count,) = struct.unpack(endian + "H", tiff[offset : offset + 2])
    for i in range(min(count, 512)):
        entry = tiff[offset + 2 + 12 * i : offset + 14 + 12 * i]
        if len(entry) < 12:
            return
        tag, typ, cnt = struct.unpack(endian + "HHI", entry[:8])
        yield endian, tag, typ, cnt, entry[8:12]


def _exif_orientation(tiff: bytes) -> int:
    """Orientation tag (0x0112) from a TIFF-structured EXIF block; 1 when absent or odd."""
    for endian, tag, typ, _cnt, value in ifd_entries(tiff):
        if tag == 0x0112 and typ == 3:
            (orientation,) = struct.unpack(endian + "H", value[:2])
            return orientation if 1 <= orientation <= 8 else 1
    return 1


_TIFF_SIZES = {3: 2, 4: 4}  # SHORT, LONG: the types the tags read here use


def _tiff_values(data: bytes, endian: str, entry: bytes) -> list[int]:
    """The values of one IFD entry (inline when they fit in 4 bytes, else at the offset it holds)."""
    _tag, typ, count = struct.unpack(endian + "HHI", entry[:8])
    size = _TIFF_SIZES.get(typ)
    if size is None or count == 0 or count > 1 << 20:
        return []
    if size * count <= 4:
        raw = entry[8 : 8 + size * count]
    else:
        (offset,) = struct.unpack(endian + "I", entry[8:12])
        raw = data[offset : offset + size * count]
        if len(raw) < size * count:
            raise HeaderTruncated("truncated TIFF (a tag's values lie past the end of the file)")
    return list(struct.unpack(endian + ("H" if size == 2 else "I") * count, raw))


def _tiff(data: bytes) -> ImageHeader:
    """First image of a TIFF: width, height, orientation; complete if every strip or tile lies inside the file."""
    endian = "<" if data[:2] == b"II" else ">"
    if len(data) < 8:
        raise HeaderTruncated("truncated TIFF header")
    (ifd,) = struct.unpack(endian + "I", data[4:8])
    if ifd < 8 or ifd + 2 > len(data):
        raise HeaderTruncated("truncated TIFF (no image directory)")
    (count,) = struct.unpack(endian + "H", data[ifd : ifd + 2])
    if ifd + 2 + 12 * count > len(data):
        raise HeaderTruncated("truncated TIFF (image directory cut off)")
    tags: dict[int, list[int]] = {}
    for i in range(min(count, 1024)):
        entry = data[ifd + 2 + 12 * i : ifd + 14 + 12 * i]
        (tag,) = struct.unpack(endian + "H", entry[:2])
        if tag in (256, 257, 273, 274, 279, 324, 325):
            tags[tag] = _tiff_values(data, endian, entry)
    width, height = (tags.get(256) or [0])[0], (tags.get(257) or [0])[0]
    if width == 0 or height == 0:
        raise HeaderError("corrupt TIFF (no width or height)")
    offsets, counts = tags.get(273) or tags.get(324) or [], tags.get(279) or tags.get(325) or []
    if not offsets or len(offsets) != len(counts):
        raise HeaderError("corrupt TIFF (no image data offsets)")
    end = max(o + c for o, c in zip(offsets, counts))
    if end > len(data):
        raise HeaderTruncated(f"truncated TIFF (image data ends at byte {end}, the file has {len(data)}: file incomplete?)")
    orientation = (tags.get(274) or [1])[0]
    return ImageHeader("tiff", width, height, orientation if 1 <= orientation <= 8 else 1, data)


#: ftyp brands of HEIF stills coded with HEVC (an iPhone's HEIC) that libheif decodes.
HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"}


def _boxes(data: bytes, start: int, end: int):
    """(type, payload start, payload end) of the ISO-BMFF boxes in data[start:end]; a box past ``end`` is truncation."""
    i = start
    while i + 8 <= end:
        size, kind = struct.unpack(">I4s", data[i : i + 8])
        head = 8
        if size == 1:
            if i + 16 > end:
                raise HeaderTruncated("truncated HEIF (box header cut off)")
            (size,) = struct.unpack(">Q", data[i + 8 : i + 16])
            head = 16
        elif size == 0:
            size = end - i
        if size < head or i + size > end:
            raise HeaderTruncated(f"truncated HEIF ({kind.decode('latin-1')} box ends past the end of the file: file incomplete?)")
        yield kind, i + head, i + size
        i += size
    if i != end:
        raise HeaderTruncated("truncated HEIF (a box header cut off at the end)")


def _heif(data: bytes) -> ImageHeader:
    """HEIC/HEIF: every top-level box complete; the size is the largest image extent (``ispe``) it declares, so the
    pixel cap holds whichever image is decoded. Rotation and mirroring (``irot``/``imir``) are applied by the decoder."""
    boxes = list(_boxes(data, 0, len(data)))
    kind, start, end = boxes[0]
    brands = {data[start : start + 4]} | {data[j : j + 4] for j in range(start + 8, end - 3, 4)}
    if kind != b"ftyp" or not brands & HEIF_BRANDS:
        raise HeaderError("not a supported image (an ISO media file, but not a HEIC/HEIF still image)")
    meta = next(((s, e) for k, s, e in boxes if k == b"meta"), None)
    if meta is None or not any(k == b"mdat" for k, _, _ in boxes):
        raise HeaderError("corrupt HEIF (no meta or no mdat box)")
    extents = []
    for k, s, e in _boxes(data, meta[0] + 4, meta[1]):  # meta is a full box: 4 bytes of version and flags
        if k != b"iprp":
            continue
        for k2, s2, e2 in _boxes(data, s, e):
            if k2 != b"ipco":
                continue
            for k3, s3, e3 in _boxes(data, s2, e2):
                if k3 == b"ispe" and e3 - s3 >= 12:
                    extents.append(struct.unpack(">II", data[s3 + 4 : s3 + 12]))
    if not extents:
        raise HeaderError("corrupt HEIF (no image size)")
    width, height = max(extents, key=lambda wh: wh[0] * wh[1])
    if width == 0 or height == 0:
        raise HeaderError("corrupt HEIF (zero width or height)")
    return ImageHeader("heif", width, height)


def _png(data: bytes) -> ImageHeader:
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise HeaderTruncated("truncated PNG (no IHDR header)")
    width, height = struct.unpack(">II", data[16:24])
    if width == 0 or height == 0:
        raise HeaderError("corrupt PNG (zero width or height)")
    if data.rfind(b"IEND", len(data) - 64) < 0:
        raise HeaderTruncated("truncated PNG (no IEND chunk: file incomplete?)")
    exif = _tiff_block(_png_chunk(data, b"eXIf"))
    return ImageHeader("png", width, height, _exif_orientation(exif) if exif else 1, exif)


#: The most chunks read looking for one (a 24 MP PNG written in 8 KB IDAT chunks has about 9,000).
_MAX_CHUNKS = 100_000


def png_chunks(data: bytes | bytearray) -> Iterator[tuple[int, bytes, int]]:
    """The chunks of the PNG ``data`` as ``(offset, type, data length)``, the offset that of its length field: up to
    ``IEND``, the end of ``data`` or :data:`_MAX_CHUNKS` (a chunk's data may run past the end of a file cut short)."""
    pos, n = 8, len(data)
    for _ in range(_MAX_CHUNKS):
        if pos + 8 > n:
            return
        length, name = struct.unpack(">I4s", data[pos : pos + 8])
        yield pos, name, length
        if name == b"IEND":
            return
        pos += 12 + length


def _png_chunk(data: bytes, kind: bytes) -> bytes:
    """The data of a PNG's first chunk of ``kind`` (``eXIf``: PNG 1.5's EXIF, before or after the image data), or
    b"" where there is none or it is cut short."""
    for pos, name, length in png_chunks(data):
        if name == kind:
            return data[pos + 8 : pos + 8 + length] if pos + 8 + length <= len(data) else b""
    return b""


def _webp_chunk(data: bytes, kind: bytes) -> bytes:
    """The data of a WebP's first RIFF chunk of ``kind`` (``EXIF``, in an extended file), or b"" where there is none or
    it is cut short."""
    pos, n = 12, len(data)
    for _ in range(_MAX_CHUNKS):
        if pos + 8 > n:
            return b""
        name, (size,) = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])
        if name == kind:
            return data[pos + 8 : pos + 8 + size] if pos + 8 + size <= n else b""
        pos += 8 + size + (size & 1)  # chunks are padded to an even length
    return b""


def _tiff_block(block: bytes) -> bytes:
    """A TIFF-structured EXIF block as JPEG's APP1 holds it after its "Exif" header, from a PNG's or WebP's chunk
    (some writers keep that header there too); b"" for anything else."""
    if block[:6] == b"Exif\x00\x00":
        block = block[6:]
    return block if block[:4] in (b"II*\x00", b"MM\x00*") else b""


def _bmp(data: bytes) -> ImageHeader:
    if len(data) < 26:
        raise HeaderTruncated("truncated BMP header")
    (declared,) = struct.unpack("<I", data[2:6])
    (dib,) = struct.unpack("<I", data[14:18])
    if dib == 12:
        width, height = struct.unpack("<HH", data[18:22])
    else:
        width, height = struct.unpack("<ii", data[18:26])
    height = abs(height)
    if width <= 0 or height == 0:
        raise HeaderError("corrupt BMP (zero width or height)")
    if declared and len(data) < declared:
        raise HeaderTruncated(f"truncated BMP ({len(data)} of {declared} bytes)")
    return ImageHeader("bmp", width, height)


def _webp(data: bytes) -> ImageHeader:
    (riff_size,) = struct.unpack("<I", data[4:8])
    if len(data) < riff_size + 8:
        raise HeaderTruncated(f"truncated WebP ({len(data)} of {riff_size + 8} bytes)")
    chunk = data[12:16]
    body = data[20:]
    if chunk == b"VP8X" and len(body) >= 10:
        width = 1 + int.from_bytes(body[4:7], "little")
        height = 1 + int.from_bytes(body[7:10], "little")
    elif chunk == b"VP8 " and len(body) >= 10:
        width, height = (v & 0x3FFF for v in struct.unpack("<HH", body[6:10]))
    elif chunk == b"VP8L" and len(body) >= 5:
        bits = int.from_bytes(body[1:5], "little")
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    else:
        raise HeaderError("corrupt WebP header")
    if width == 0 or height == 0:
        raise HeaderError("corrupt WebP (zero width or height)")
    exif = _tiff_block(_webp_chunk(data, b"EXIF")) if chunk == b"VP8X" else b""
    return ImageHeader("webp", width, height, _exif_orientation(exif) if exif else 1, exif)
