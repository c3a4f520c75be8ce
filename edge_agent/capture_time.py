"""When a photo was taken, from its EXIF, believed only where a camera's clock can be.

A card of a week's photos copied into the inbox at once is classified in one minute; its photos were taken days apart,
and a plant's visits (:func:`edge_agent.plants.visits`) are told apart by when its photos were taken. A camera's
clock is not always right: one never set says 2000 or 2015, one set to another zone a few hours off. A time is
believed where it lies between :data:`BELIEVED_DAYS` before the photo arrived and a day after (a later one is taken as
the time it arrived); otherwise, or without EXIF (a screenshot, most PNGs, WebPs, a photo sent through a messenger that
strips it), the photo counts as taken when it was classified, as before this module.
"""

from __future__ import annotations

import re
import struct
from datetime import datetime, timedelta, timezone

from edge_agent.imageheader import HeaderError, ifd_entries, read_header

__all__ = ["BELIEVED_DAYS", "exif_time", "parse_exif_time", "believed", "taken_at"]

#: How far before its arrival a photo's EXIF time is believed (older: a camera's clock never set, taken as arrival).
BELIEVED_DAYS = 366

_EXIF_IFD = 0x8769  # the pointer from the first directory to the Exif directory
_ORIGINAL, _DIGITIZED = 0x9003, 0x9004  # DateTimeOriginal, DateTimeDigitized ("YYYY:MM:DD HH:MM:SS")
_ZONE = re.compile(r"([+-])(\d\d):(\d\d)")
_OFFSETS = {_ORIGINAL: 0x9011, _DIGITIZED: 0x9012}  # OffsetTimeOriginal, OffsetTimeDigitized ("+02:00")


def _ascii(tiff: bytes, endian: str, count: int, value: bytes) -> str:
    """An ASCII entry's text (inline up to 4 bytes, else at the offset it holds); "" where it lies outside the block."""
    if count <= 4:
        raw = value[:count]
    else:
        (offset,) = struct.unpack(endian + "I", value)
        raw = tiff[offset : offset + min(count, 64)]
    return raw.split(b"\x00", 1)[0].decode("ascii", "replace").strip()


def exif_time(tiff: bytes) -> tuple[str, str]:
    """The time a TIFF-structured EXIF block says its photo was taken, and its zone offset, as written ("" each where
    absent): DateTimeOriginal, else DateTimeDigitized, never DateTime (which editing software rewrites)."""
    sub = None
    for endian, tag, typ, _count, value in ifd_entries(tiff):
        if tag == _EXIF_IFD and typ in (4, 13):
            (sub,) = struct.unpack(endian + "I", value)
    if sub is None:
        return "", ""
    texts = {tag: _ascii(tiff, endian, count, value) for endian, tag, typ, count, value in ifd_entries(tiff, sub) if typ == 2}
    for tag in (_ORIGINAL, _DIGITIZED):
        if texts.get(tag):
            return texts[tag], texts.get(_OFFSETS[tag], "")
    return "", ""


def parse_exif_time(text: str, offset: str = "") -> float | None:
    """Seconds since the epoch of an EXIF time ("2026:05:04 10:11:12") in its zone offset ("+02:00"), or in this
    device's local time where none is written (a camera keeps the local time of the farm it is used on); None where
    it is no time (blank, "0000:00:00 00:00:00", a day that does not exist)."""
    try:
        when = datetime.strptime(text[:19], "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None
    zone = _ZONE.fullmatch(offset)
    if zone and int(zone[2]) <= 14 and int(zone[3]) < 60:
        shift = timedelta(hours=int(zone[2]), minutes=int(zone[3])) * (1 if zone[1] == "+" else -1)
        when = when.replace(tzinfo=timezone(shift))
    try:
        return when.timestamp()  # naive: this device's local time
    except (OverflowError, OSError, ValueError):  # year 1 in a zone east of it
        return None


def believed(taken: float | None, arrived: float) -> float | None:
    """``taken`` where it may be right for a photo that ``arrived`` then (see the module), at most ``arrived``; else None."""
    if taken is None or taken > arrived + 86400 or taken < arrived - BELIEVED_DAYS * 86400:
        return None
    return min(taken, arrived)


def taken_at(data: bytes, arrived: float) -> float | None:
    """When the photo of ``data`` was taken, from its EXIF, where it is :func:`believed`; None otherwise (no EXIF, an
    unreadable one, a HEIC without pillow-heif)."""
    try:
        header = read_header(data)
    except HeaderError:
        return None
    tiff = header.exif or (_heif_exif(data) if header.format == "heif" else b"")
    try:
        return believed(parse_exif_time(*exif_time(tiff)), arrived) if tiff else None
    except (struct.error, ValueError):  # an EXIF block cut short or garbled: the photo is classified all the same
        return None


def _heif_exif(data: bytes) -> bytes:
    """A HEIC's EXIF block through libheif (pillow-heif; its header only, no pixel decoded), or b""."""
    try:
        import pillow_heif

        exif = pillow_heif.open_heif(data).info.get("exif") or b""
    except Exception:  # no pillow-heif, or a file libheif refuses (the decoder says why when it classifies it)
        return b""
    return exif[6:] if exif[:6] == b"Exif\x00\x00" else exif
