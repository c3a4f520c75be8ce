"""Where a photo was taken, from its EXIF's GPS directory, kept only where it can be a place on Earth.

A phone writes where each photo was taken (latitude and longitude in degrees, minutes and seconds, each a fraction,
and a hemisphere letter); a farmer who photographs the orchard row by row without a folder per tree finds the sick
ones again by it, and a spreadsheet or a map program draws the season's photos from the CSV's columns. A position is
kept where both halves are written, their fractions are whole (no zero denominator, minutes and seconds no more than
60: a phone that rounds 59.996 seconds to hundredths writes 60.00),
it lies on Earth, the receiver did not mark it void (GPSStatus "V") nor said it may be more than 50 m off
(GPSHPositioningError: a photo taken indoors), and it is not 0, 0 (a phone without a fix writes that); otherwise, or
without GPS (a camera without a receiver, a photo sent through a messenger, which strips it), the photo has no place.
Garbled or cut blocks read as no place and never raise.
"""

from __future__ import annotations

import math
import statistics
import struct
from collections.abc import Iterable
from typing import NamedTuple

from edge_agent.imageheader import ifd_entries

__all__ = [
    "GPS_IFD",
    "MAX_ERROR_M",
    "distance_m",
    "NEAR_M",
    "Place",
    "east_of",
    "exif_place",
    "geo_uri",
    "metres_per_degree",
    "middle",
    "near_sql",
    "parse_place",
    "place_of",
]

#: How near (metres) another photo's place must be to count as taken "near here": a phone's fix is good to a few
#: metres under open sky, and an orchard's trees stand 3-5 m apart, so it is the tree and its neighbours.
NEAR_M = 15

#: The largest error (metres) of a fix kept, where the phone writes how far off its fix may be (GPSHPositioningError,
#: as iPhones and recent Androids do): a photo taken indoors, placed 200 m off, would sit among the wrong trees.
MAX_ERROR_M = 50.0

#: The tag of the pointer from the first directory of an EXIF block to its GPS directory.
GPS_IFD = 0x8825
_STATUS, _LAT_REF, _LAT, _LON_REF, _LON, _ERROR = 0x0009, 0x0001, 0x0002, 0x0003, 0x0004, 0x001F
_RATIONAL, _SRATIONAL, _ASCII = 5, 10, 2


class Place(NamedTuple):
    """Where a photo was taken: degrees north (negative: south) and east (negative: west), rounded to 6 decimals
    (about 0.1 m)."""

    lat: float
    lon: float


def _rationals(tiff: bytes, endian: str, typ: int, count: int, value: bytes) -> list[float] | None:
    """The numbers of a RATIONAL (or SRATIONAL) entry, or None where it is another type or one denominator is 0."""
    if typ not in (_RATIONAL, _SRATIONAL) or not 1 <= count <= 3:
        return None
    (offset,) = struct.unpack(endian + "I", value)
    raw = tiff[offset : offset + 8 * count]
    if len(raw) < 8 * count:
        return None
    pairs = struct.unpack(endian + ("i" if typ == _SRATIONAL else "I") * 2 * count, raw)
    if any(d == 0 for d in pairs[1::2]):
        return None
    return [n / d for n, d in zip(pairs[0::2], pairs[1::2])]


def _letter(count: int, value: bytes) -> str:
    """The first letter of a short ASCII entry ("N\\0" is written inline), upper case; "" where there is none."""
    return value[:1].decode("ascii", "replace").upper() if count >= 1 else ""


def _degrees(parts: list[float] | None, ref: str, positive: str, negative: str, limit: float) -> float | None:
    """Degrees from (degrees, minutes, seconds) and a hemisphere letter, or None where they are no coordinate."""
    if not parts or ref not in (positive, negative):
        return None
    d, m, s = (parts + [0.0, 0.0])[:3]
    if min(d, m, s) < 0 or m > 60 or s > 60:
        return None
    deg = d + m / 60 + s / 3600
    if deg > limit:
        return None
    return round(deg if ref == positive else -deg, 6)


def place_of(lat: float | None, lon: float | None) -> Place | None:
    """A place from a stored latitude and longitude, None where either is not known."""
    return None if lat is None or lon is None else Place(lat, lon)


def exif_place(tiff: bytes) -> Place | None:
    """Where a TIFF-structured EXIF block says its photo was taken (see the module), or None."""
    sub = None
    for endian, tag, typ, _count, value in ifd_entries(tiff):
        if tag == GPS_IFD and typ in (4, 13):
            (sub,) = struct.unpack(endian + "I", value)
    if sub is None:
        return None
    got: dict[int, object] = {}
    for endian, tag, typ, count, value in ifd_entries(tiff, sub):
        if tag in (_LAT_REF, _LON_REF, _STATUS) and typ == _ASCII:
            got[tag] = _letter(count, value)
        elif tag in (_LAT, _LON):
            got[tag] = _rationals(tiff, endian, typ, count, value)
        elif tag == _ERROR:
            got[tag] = _rationals(tiff, endian, typ, count, value)
    if got.get(_STATUS) == "V":  # the receiver said its fix is void
        return None
    error = got.get(_ERROR)
    if error and error[0] > MAX_ERROR_M:  # the phone said its fix may be this far off: not where the tree is
        return None
    lat = _degrees(got.get(_LAT), got.get(_LAT_REF, ""), "N", "S", 90)  # type: ignore[arg-type]
    lon = _degrees(got.get(_LON), got.get(_LON_REF, ""), "E", "W", 180)  # type: ignore[arg-type]
    if lat is None or lon is None or (lat == 0 and lon == 0):
        return None
    return Place(lat, lon)


def metres_per_degree(lat: float) -> tuple[float, float]:
    """How many metres a degree of latitude and one of longitude span at latitude ``lat`` (good to 0.5 % over a farm)."""
    return 111_132.0, max(111_320.0 * math.cos(math.radians(lat)), 1.0)


def east_of(lon: float, lon0: float) -> float:
    """Degrees east from ``lon0`` to ``lon``, the short way round (a farm across the 180th meridian, as on Taveuni, Fiji,
    is one farm)."""
    return (lon - lon0 + 540.0) % 360.0 - 180.0


def distance_m(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Metres between two places on a plane (a farm is flat at this scale), across the 180th meridian too."""
    north, east = metres_per_degree(a[0])
    return math.hypot((b[0] - a[0]) * north, east_of(b[1], a[1]) * east)


def near_sql(near: tuple[float, float], within_m: float, prefix: str = "") -> tuple[str, list]:
    """The SQL condition (and its arguments) that a result (columns ``lat``, ``lon`` of table alias ``prefix``) was
    taken within ``within_m`` metres of ``near``: a box an index can use, then the distance on a plane (a farm is flat
    at this scale), across the 180th meridian too."""
    lat0, lon0 = near
    north, east = metres_per_degree(lat0)
    dlat, dlon = within_m / north, within_m / east
    lat, lon = f"{prefix}lat", f"{prefix}lon"
    west_end, east_end = lon0 - dlon, lon0 + dlon
    if -180 <= west_end and east_end <= 180:
        box, box_args, d, d_args = f"{lon} BETWEEN ? AND ?", [west_end, east_end], f"({lon} - ?)", [lon0]
    else:  # the box crosses the 180th meridian: its two halves, and the difference the short way round
        box, box_args = f"({lon} >= ? OR {lon} <= ?)", [east_of(west_end, 0.0), east_of(east_end, 0.0)]
        d = f"(CASE WHEN {lon} - ? > 180 THEN {lon} - ? - 360 WHEN {lon} - ? < -180 THEN {lon} - ? + 360 ELSE {lon} - ? END)"
        d_args = [lon0] * 5
    sql = f"{lat} BETWEEN ? AND ? AND {box} AND (({lat} - ?) * ?) * (({lat} - ?) * ?) + ({d} * ?) * ({d} * ?) <= ?"
    args = [lat0 - dlat, lat0 + dlat, *box_args, lat0, north, lat0, north, *d_args, east, *d_args, east, within_m**2]
    return sql, args


def parse_place(text: str) -> Place:
    """A place typed as "latitude,longitude" in decimal degrees ("47.3769,8.5417"); raises ``ValueError`` saying why."""
    parts = text.split(",")
    if len(parts) != 2 or len(text) > 40:
        raise ValueError(f"not a place (latitude,longitude in degrees, like 47.3769,8.5417): {text[:40]!r}")
    try:
        lat, lon = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"not a place (latitude,longitude in degrees, like 47.3769,8.5417): {text[:40]!r}") from None
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):  # also refuses nan
        raise ValueError(f"no place on Earth: latitude {lat:g} (-90..90), longitude {lon:g} (-180..180)")
    return Place(round(lat, 6), round(lon, 6))


def middle(places: Iterable[tuple[float, float] | None]) -> Place | None:
    """Where several photos of one plant were taken: the median latitude and longitude of those with a place (one
    bad fix among them does not move it), None where none has one."""
    known = [p for p in places if p is not None]
    if not known:
        return None
    lon0 = statistics.median_low(p[1] for p in known)  # one of theirs: an average across the 180th meridian is 0
    east = statistics.median(east_of(p[1], lon0) for p in known)
    return Place(round(statistics.median(p[0] for p in known), 6), round(east_of(lon0 + east, 0.0), 6))


def geo_uri(lat: float, lon: float) -> str:
    """The place as a ``geo:`` link (RFC 5870), which a phone opens in its map app (offline maps included)."""
    return f"geo:{lat:.6f},{lon:.6f}"
