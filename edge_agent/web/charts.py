"""Small charts as inline SVG, drawn on the server: no JavaScript library, no matplotlib in the web process."""

from __future__ import annotations

import colorsys
import hashlib
from datetime import date, timedelta
from html import escape

__all__ = ["class_colour", "photos_per_day", "top1_per_version"]


def class_colour(label: str) -> str:
    """A stable colour per class name."""
    h = int(hashlib.sha1(label.encode()).hexdigest()[:6], 16) / 0xFFFFFF
    r, g, b = colorsys.hls_to_rgb(h, 0.48, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def photos_per_day(per_day: dict[str, dict[str, int]], days: int, today: date | None = None, width: int = 640, height: int = 220) -> str:
    """Stacked bars: photos classified per local day, coloured by predicted class."""
    today = today or date.today()
    keys = [(today - timedelta(days=days - 1 - i)).isoformat() for i in range(days)]
    totals = [sum(per_day.get(k, {}).values()) for k in keys]
    top = max(totals + [1])
    left, bottom, plot_h = 40, 24, height - 34
    bar_w = (width - left - 10) / days
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="photos per day per class">']
    parts.append(f'<text x="4" y="14" class="axis">{top}</text><text x="4" y="{height - bottom}" class="axis">0</text>')
    for i, k in enumerate(keys):
        x = left + i * bar_w
        y = height - bottom
        for label, n in sorted(per_day.get(k, {}).items()):
            h = plot_h * n / top
            y -= h
            parts.append(
                f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" fill="{class_colour(label)}">'
                f"<title>{escape(k)}: {escape(label)} {n}</title></rect>"
            )
        if days <= 16 or i % 2 == 0:
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{height - 8}" class="axis" text-anchor="middle">{k[5:]}</text>')
    parts.append("</svg>")
    return "".join(parts)


def top1_per_version(points: list[tuple[str, float | None, bool]], width: int = 640, height: int = 200) -> str:
    """The gate's validation top-1 of each engine version (the current one filled)."""
    vals = [v for _, v, _ in points if v is not None]
    if not vals:
        return '<p class="muted">No version has a validation top-1 yet.</p>'
    lo, hi = max(0.0, min(vals) - 0.05), min(1.0, max(vals) + 0.02)
    left, right, top_pad, bottom = 48, 16, 12, 28
    step = (width - left - right) / max(1, len(points) - 1)

    def y(v: float) -> float:
        return top_pad + (height - top_pad - bottom) * (hi - v) / max(1e-9, hi - lo)

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="validation top-1 per engine version">']
    for tick in (lo, (lo + hi) / 2, hi):
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" class="grid"/>'
            f'<text x="2" y="{y(tick) + 4:.1f}" class="axis">{tick:.3f}</text>'
        )
    xy = [(left + i * step if len(points) > 1 else (left + width - right) / 2, v) for i, (_, v, _) in enumerate(points)]
    line = " ".join(f"{x:.1f},{y(v):.1f}" for x, v in xy if v is not None)
    parts.append(f'<polyline points="{line}" class="line"/>')
    for (x, v), (name, _, current) in zip(xy, points):
        if v is not None:
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y(v):.1f}" r="{6 if current else 4}" class="{"dot current" if current else "dot"}">'
                f"<title>{escape(name)}: {v:.4f}</title></circle>"
            )
        parts.append(f'<text x="{x:.1f}" y="{height - 8}" class="axis" text-anchor="middle">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)
