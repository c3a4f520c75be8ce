"""The season's photos drawn where they were taken: an inline SVG of the farm from the photos' GPS positions, each
photo a dot coloured by what it shows, with no map tiles (the device is offline) and no JavaScript; under them, where
the farm gives one, an image of the farm from above (a drone photo, a saved satellite view).

A phone's fix is good to a few metres, so the dots of one tree cluster and a row of sick trees shows as a row of red.
The view holds the photos within three times the distance from their middle that 90 % of them lie within (a photo
taken at home, kilometres away, does not shrink the orchard to a dot); the others are counted, not drawn.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from edge_agent.capture_place import east_of, metres_per_degree
from edge_agent.names import is_disease

__all__ = ["STATES", "Backdrop", "MapPoint", "FieldMap", "state_of", "field_map"]

#: What a dot shows, in the order drawn (the last on top), with its colour and its legend's words.
STATES = {
    "healthy": ("#2e7d32", "healthy"),
    "unknown": ("#8a8a8a", "not a plant I know"),
    "unsure": ("#e0a000", "not sure: ask an expert"),
    "sick": ("#c62828", "a disease"),
}


@dataclass(frozen=True)
class MapPoint:
    """One photo with a place: where (degrees), what it shows (:data:`STATES`), its hover text and its photo's sha256."""

    sha256: str
    lat: float
    lon: float
    state: str
    title: str
    plant: str | None = None


@dataclass(frozen=True)
class FieldMap:
    """The drawing, and what it says of the photos: how many drawn, how many outside the view, how many of a state."""

    svg: str
    drawn: int
    outside: int
    counts: dict[str, int]
    span_m: float  # the view's width in metres


def state_of(label: str, verdict: str | None, expert: str | None = None) -> str:
    """What a photo shows for the map: the expert's label where there is one, else a sure answer's class, else the verdict."""
    if expert:
        return "sick" if is_disease(expert) else "healthy"
    if verdict in ("unsure", "unknown"):
        return verdict
    return "sick" if is_disease(label) else "healthy"


def _nice(length: float) -> float:
    """The largest of 1, 2, 5 times a power of ten not above ``length`` (a scale bar's length)."""
    power = 10 ** math.floor(math.log10(max(length, 1e-9)))
    return max(k * power for k in (1, 2, 5) if k * power <= length)


def _kept(xy: list[tuple[float, float]], min_span_m: float) -> list[bool]:
    """Which points the view holds: those within three times the distance from the middle that 90 % of them lie
    within (at least ``min_span_m``); every one of fewer than 5."""
    d = [math.hypot(x, y) for x, y in xy]
    if len(d) < 5:
        return [True] * len(d)
    limit = max(3 * sorted(d)[int(0.9 * (len(d) - 1))], min_span_m)
    return [k <= limit for k in d]


@dataclass(frozen=True)
class Backdrop:
    """An image of the farm from above drawn under the dots (``[web] map_image``): its address, and where its edges lie
    in degrees (``[web] map_bounds``)."""

    href: str
    south: float
    west: float
    north: float
    east: float


def field_map(
    points: Sequence[MapPoint], width: int = 900, height: int = 600, min_span_m: float = 40.0, backdrop: Backdrop | None = None
) -> FieldMap:
    """The points drawn north up on a plane around their median (a farm is flat at this scale), the view holding
    those near the rest (see the module) with a margin, at least ``min_span_m`` across; a scale bar in metres; the
    ``backdrop`` under them, stretched to its edges on the same plane."""
    counts = {s: 0 for s in STATES}
    if not points:
        return FieldMap("", 0, 0, counts, 0.0)
    lat0 = statistics.median(p.lat for p in points)
    lon0 = statistics.median_low(p.lon for p in points)  # one of theirs: an average across the 180th meridian is 0
    north, east = metres_per_degree(lat0)
    xy = [(east_of(p.lon, lon0) * east, (p.lat - lat0) * north) for p in points]
    kept = _kept(xy, min_span_m)
    inside = [v for v, k in zip(xy, kept) if k]
    x_lo, x_hi = min(x for x, _ in inside), max(x for x, _ in inside)
    y_lo, y_hi = min(y for _, y in inside), max(y for _, y in inside)
    pad, r = 24, 6
    span = max(x_hi - x_lo, (y_hi - y_lo) * (width - 2 * pad) / (height - 2 * pad), min_span_m) * 1.1
    scale = (width - 2 * pad) / span  # pixels a metre, the same both ways
    cx, cy = (x_lo + x_hi) / 2, (y_lo + y_hi) / 2

    def at(x: float, y: float) -> tuple[float, float]:
        return width / 2 + (x - cx) * scale, height / 2 - (y - cy) * scale

    parts = [f'<svg class="field-map" id="field-map" viewBox="0 0 {width} {height}" role="img" aria-label="photos where they were taken">']
    parts.append(f'<rect x="0" y="0" width="{width}" height="{height}" class="map-ground"/>')
    if backdrop is not None:
        (left, top), (right, bottom) = (
            at(east_of(lon, lon0) * east, (lat - lat0) * north)
            for lat, lon in ((backdrop.north, backdrop.west), (backdrop.south, backdrop.east))
        )
        parts.append(
            f'<image class="map-image" id="map-image" href="{escape(backdrop.href)}" x="{left:.1f}" y="{top:.1f}" '
            f'width="{right - left:.1f}" height="{bottom - top:.1f}" preserveAspectRatio="none"/>'
        )
    drawn = outside = 0
    order = {s: i for i, s in enumerate(STATES)}
    for p, (x, y), k in sorted(zip(points, xy, kept), key=lambda t: order.get(t[0].state, 0)):
        px, py = at(x, y)
        if not k:
            outside += 1
            continue
        drawn += 1
        counts[p.state] = counts.get(p.state, 0) + 1
        colour = STATES.get(p.state, STATES["unknown"])[0]
        parts.append(
            f'<a href="/photo/{p.sha256}"><circle class="dot {p.state}" cx="{px:.1f}" cy="{py:.1f}" r="{r}" fill="{colour}">'
            f"<title>{escape(p.title)}</title></circle></a>"
        )
    plants: dict[str, list[tuple[float, float]]] = {}
    for p, (x, y) in zip(points, xy):
        if p.plant:
            plants.setdefault(p.plant, []).append((x, y))
    if len(plants) <= 60:  # more names than that would hide the dots
        for name, where in sorted(plants.items()):
            px, py = at(statistics.median(x for x, _ in where), statistics.median(y for _, y in where))
            if pad <= px <= width - pad and pad <= py <= height - pad:
                parts.append(f'<text class="plant-name" x="{px + r + 3:.1f}" y="{py - r:.1f}">{escape(name)}</text>')
    bar = _nice(span / 5)
    bar_px = bar * scale
    words = f"{bar / 1000:g} km" if bar >= 1000 else f"{bar:g} m"
    y0 = height - 14
    parts.append(
        f'<g class="scale" id="map-scale"><line class="halo" x1="{pad}" y1="{y0}" x2="{pad + bar_px:.1f}" y2="{y0}"/>'
        f'<line x1="{pad}" y1="{y0}" x2="{pad + bar_px:.1f}" y2="{y0}"/>'
        f'<text x="{pad + bar_px / 2:.1f}" y="{y0 - 6}" text-anchor="middle">{words}</text></g>'
    )
    parts.append(f'<text class="north" x="{width - pad}" y="{pad + 4}" text-anchor="end">N ↑</text>')
    parts.append("</svg>")
    return FieldMap("".join(parts), drawn, outside, counts, span)
