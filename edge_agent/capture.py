"""What a photo's EXIF says of its taking: when (:mod:`edge_agent.capture_time`) and where
(:mod:`edge_agent.capture_place`), read once from the header the bomb check parses, never raising on a bad block."""

from __future__ import annotations

import struct
from typing import NamedTuple

from edge_agent.capture_place import Place, exif_place
from edge_agent.capture_time import time_of
from edge_agent.imageheader import HeaderError, ImageHeader, read_header

__all__ = ["Capture", "exif_block", "read_capture"]


class Capture(NamedTuple):
    """When and where a photo was taken, as far as its EXIF tells."""

    taken: float | None = None  # :func:`edge_agent.capture_time.believed`; None: not known, or not believed
    ahead: float | None = None  # seconds its EXIF time, written with a zone, is after it arrived (< 0: before); None: no zone
    place: Place | None = None  # :func:`edge_agent.capture_place.exif_place`; None: not written, or no place


def read_capture(data: bytes, arrived: float) -> Capture:
    """When and where the photo of ``data``, which arrived at ``arrived``, was taken, from its EXIF (nothing from a
    photo with none, an unreadable one, or a HEIC without pillow-heif)."""
    try:
        header = read_header(data)
    except HeaderError:
        return Capture()
    tiff = exif_block(data, header)
    if not tiff:
        return Capture()
    try:
        taken, ahead = time_of(tiff, arrived)
    except (struct.error, ValueError):  # an EXIF block cut short or garbled: the photo is classified all the same
        taken, ahead = None, None
    try:
        place = exif_place(tiff)
    except (struct.error, ValueError):
        place = None
    return Capture(taken, ahead, place)


def exif_block(data: bytes, header: ImageHeader) -> bytes:
    """The TIFF-structured EXIF block of the photo ``data`` whose header is ``header`` (a HEIC's through libheif), or
    b"" where it has none."""
    return header.exif or (_heif_exif(data) if header.format == "heif" else b"")


def _heif_exif(data: bytes) -> bytes:
    """A HEIC's EXIF block through libheif (pillow-heif; its header only, no pixel decoded), or b""."""
    try:
        import pillow_heif

        exif = pillow_heif.open_heif(data).info.get("exif") or b""
    except Exception:  # no pillow-heif, or a file libheif refuses (the decoder says why when it classifies it)
        return b""
    return exif[6:] if exif[:6] == b"Exif\x00\x00" else exif
