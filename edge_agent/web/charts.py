"""Small charts as inline SVG, drawn on the server: no JavaScript library, no matplotlib in the web process."""

from __future__ import annotations

import colorsys
import hashlib
from datetime import date, timedelta
from html import escape

__all__ = ["class_colour", "photos_per_day", "top1_same_photos", "same_photo_rows"]


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


def same_photo_rows(store, serving: str | None) -> list[dict]:
    """Each retrained version beside its parent, measured by its gate on the same photos: the lab gate photos (on
    the parent's classes) and, where there was one, the field check on held-back expert labels."""
    rows = []
    for v in store.versions():
        m = store.read_manifest(v)
        gate = (m.get("metrics") or {}).get("gate") or {}
        if "candidate_top1" not in gate:
            continue
        after = gate.get("candidate_top1_on_current_classes", gate["candidate_top1"])
        common = {"version": v, "parent": m.get("parent") or "?", "current": v == serving}
        rows.append({**common, "set": "lab gate", "photos": gate.get("validation_photos"), "before": gate["current_top1"], "after": after})
        f = gate.get("field") or {}
        if f.get("field_candidate_top1") is not None:
            rows.append(
                {
                    **common,
                    "set": "field check",
                    "photos": f.get("field_photos"),
                    "before": f["field_current_top1"],
                    "after": f["field_candidate_top1"],
                }
            )
    return rows


def top1_same_photos(rows: list[dict], width: int = 640) -> str:
    """Each version's top-1 beside its parent's on the same photos (two bars a row; the version in service marked)."""
    if not rows:
        return '<p class="muted">No retrained version yet: each one is shown here beside its parent, on the same photos.</p>'
    label_w, bar_h, gap = 210, 12, 10
    row_h = 2 * bar_h + gap
    height = len(rows) * row_h + 8
    scale = width - label_w - 60
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="top-1 of each version and its parent on the same photos">'
    ]
    for i, r in enumerate(rows):
        y0 = 4 + i * row_h
        photos = f", {r['photos']} photos" if r.get("photos") else ""
        mark = " (in service)" if r["current"] else ""
        parts.append(f'<text x="0" y="{y0 + bar_h:.0f}" class="axis">{escape(r["version"])}{mark}</text>')
        parts.append(f'<text x="0" y="{y0 + 2 * bar_h:.0f}" class="axis small">{escape(r["set"])}{escape(photos)}</text>')
        for j, (who, v, cls) in enumerate(
            ((r["parent"], r["before"], "bar before"), (r["version"], r["after"], "bar current" if r["current"] else "bar"))
        ):
            y = y0 + j * bar_h
            w = max(1.0, scale * float(v))
            parts.append(
                f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" class="{cls}"><title>{escape(who)}: {float(v):.4f}</title></rect>'
                f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 3}" class="axis">{escape(who)} {float(v):.3f}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
