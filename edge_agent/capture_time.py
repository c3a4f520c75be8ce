"""When a photo was taken, from its EXIF, believed only where a camera's clock can be.

A card of a week's photos copied into the inbox at once is classified in one minute; its photos were taken days apart,
and a plant's visits (:func:`edge_agent.plants.visits`) are told apart by when its photos were taken. A camera's
clock is not always right: one never set says 2000 or 2015, one set to another zone a few hours off. A time is
believed where it lies between :data:`BELIEVED_DAYS` before the photo arrived and a day after (a later one is taken as
the time it arrived); otherwise, or without EXIF (a screenshot, most PNGs, WebPs, a photo sent through a messenger that
strips it), the photo counts as taken when it was classified, as before this module.

The other way round, a phone's clock (set by its network, its EXIF time written with its zone) tells when this
device's own clock is behind: a board without a clock battery, offline, starts at the time it was switched off, and
stamps every result with the wrong day. :func:`clock_behind` says so from the latest such photos.
:mod:`edge_agent.capture` reads a photo's EXIF block once for this and for where it was taken.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from edge_agent.imageheader import ifd_entries

__all__ = ["BELIEVED_DAYS", "CLOCK_WINDOW", "CLOCK_AHEAD", "exif_time", "parse_exif_time", "believed", "time_of", "clock_behind"]

#: How far before its arrival a photo's EXIF time is believed (older: a camera's clock never set, taken as arrival).
BELIEVED_DAYS = 366

#: How many of the latest photos with a zoned EXIF time this device's clock is judged on, and how many of them taken
#: more than a day after it said they arrived make it behind (one camera set wrong is not enough).
CLOCK_WINDOW, CLOCK_AHEAD = 10, 3

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


def _zone(offset: str) -> timezone | None:
    """The zone of an EXIF offset ("+02:00"), or None where it is none (blank, "   :  ", "+99:00")."""
    zone = _ZONE.fullmatch(offset)
    if zone is None or int(zone[2]) > 14 or int(zone[3]) >= 60:
        return None
    return timezone(timedelta(hours=int(zone[2]), minutes=int(zone[3])) * (1 if zone[1] == "+" else -1))


def parse_exif_time(text: str, offset: str = "") -> float | None:
    """Seconds since the epoch of an EXIF time ("2026:05:04 10:11:12") in its zone offset ("+02:00"), or in this
    device's local time where none is written (a camera keeps the local time of the farm it is used on); None where
    it is no time (blank, "0000:00:00 00:00:00", a day that does not exist)."""
    try:
        when = datetime.strptime(text[:19], "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None
    zone = _zone(offset)
    if zone is not None:
        when = when.replace(tzinfo=zone)
    try:
        return when.timestamp()  # naive: this device's local time
    except (OverflowError, OSError, ValueError):  # year 1 in a zone east of it
        return None


def believed(taken: float | None, arrived: float) -> float | None:
    """``taken`` where it may be right for a photo that ``arrived`` then (see the module), at most ``arrived``; else None."""
    if taken is None or taken > arrived + 86400 or taken < arrived - BELIEVED_DAYS * 86400:
        return None
    return min(taken, arrived)


def time_of(tiff: bytes, arrived: float) -> tuple[float | None, float | None]:
    """When a TIFF-structured EXIF block's photo, which arrived at ``arrived``, was taken (:func:`believed`), and how
    many seconds its time, written with a zone, is after it arrived (None: no zone); raises ``struct.error`` or
    ``ValueError`` where the block is garbled."""
    text, zone = exif_time(tiff)
    when = parse_exif_time(text, zone)
    return believed(when, arrived), None if when is None or _zone(zone) is None else when - arrived


def clock_behind(aheads: Sequence[float]) -> str | None:
    """A sentence for ``status`` and the Health page where :data:`CLOCK_AHEAD` of the latest photos with a zoned EXIF
    time (``aheads``: :attr:`Capture.ahead` of at most :data:`CLOCK_WINDOW`) were taken more than a day after this
    device's clock said they arrived; None otherwise."""
    late = sorted(a for a in aheads if a > 86400)
    if len(late) < CLOCK_AHEAD:
        return None
    return (
        f"{len(late)} of the last {len(aheads)} photos from phones were taken, by their own clocks, about "
        f"{late[len(late) // 2] / 86400:.1f} days after this device's clock says they arrived: its clock is probably "
        "behind (a board without a clock battery starts at the time it was switched off), and results, visits and the "
        "daily digest go by the wrong day; set it (sudo timedatectl set-time 'YYYY-MM-DD HH:MM:SS'), or connect it to a "
        "network once"
    )
