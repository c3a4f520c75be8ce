"""``edge-agent classes [CLASS]``: what the model knows, crop by crop, and what one class is (its cause, what to look
for on the plant, how it spreads, what is done about it), as the Diseases page shows them."""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import asdict
from datetime import datetime

from edge_agent._cli_common import load, print_rows
from edge_agent.names import printable

__all__ = ["classes"]


def classes(args: argparse.Namespace) -> int:
    """Every class with the season's photos of it, or (``CLASS``) its notes; before the daemon's first start, the
    shipped model's classes without photos."""
    from edge_agent.class_notes import PAGE_NOTES, load_notes
    from edge_agent.config import default_store_path
    from edge_agent.state import StateLayout, inbox_dir, resolve_state_dir
    from edge_agent.web.class_pages import class_views, season_classes
    from edge_agent.web.context import WebContext
    from engines.store import EngineStore

    cfg = load(args)
    state = StateLayout(resolve_state_dir(args.state_dir, cfg))
    if state.db.is_file():
        views = season_classes(WebContext(cfg, state, inbox_dir(cfg, state.root), ""))
    else:  # nothing classified yet: the model the daemon would serve first
        shipped = EngineStore(cfg.store.resolved() if cfg.store.path else default_store_path())
        views = class_views(load_notes(cfg.web.class_notes, state.root / PAGE_NOTES), shipped.open(verify=False).classes, {})
    if args.name:
        wanted = args.name.strip().lower()
        found = [v for v in views if wanted in (v.label.lower(), v.title.lower(), f"{v.crop} {v.title}".lower())]
        if not found:
            near = [v.label for v in views if wanted in v.label.lower() or wanted in v.title.lower()][:8]
            hint = f"; did you mean: {', '.join(near)}" if near else "; `edge-agent classes` lists them"
            print(printable(f"edge-agent: the model knows no class {args.name!r}{hint}"), file=sys.stderr)
            return 2
        views = found
    rows = [_row(v) for v in views]
    if args.name and not args.json:
        for v in views:
            for line in _page(v):
                print(printable(line))
        return 0
    print_rows(rows, args.json, _line)
    return 0


def _row(v) -> dict:
    from edge_agent.ledger_rows import iso

    row = {k: getattr(v, k) for k in ("label", "crop", "title", "disease", "known")}
    se = v.season
    row |= {"photos": se.photos, "sure": se.sure, "labelled": se.labelled, "found": se.found, "plants": se.plants}
    row |= {"first": iso(se.first) if se.first is not None else None, "last": iso(se.last) if se.last is not None else None}
    note = asdict(v.note) if v.note else {}
    note.pop("label", None)
    note.pop("name", None)
    row.update({k: (list(x) if isinstance(x, tuple) else x) for k, x in note.items()})
    return row


def _day(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d")


def _line(r: dict) -> str:
    urgent = "  URGENT" if r.get("urgency") else ""
    seen = f"  {r['photos']} photos ({r['sure']} sure)" if r["photos"] else ""
    if r["disease"] and r["found"]:
        seen += f", found on {r['found']}" + (f" of {r['plants']} plants" if r["plants"] else "")
    said = f"  the expert named {r['labelled']}" if r["labelled"] else ""
    kind = "" if r["disease"] else "  (healthy)"
    return f"{r['crop'] or '-'}: {r['title']}{kind}{urgent}  [{r['label']}]{seen}{said}"


def _page(v) -> list[str]:
    """One class's notes, wrapped for a terminal, line by line."""
    lines = [f"{v.title} ({v.crop})" if v.crop else v.title, f"  the model's name: {v.label}"]
    note = v.note
    if note is None:
        lines.append(
            "  no notes on this class: write them in a file of your own ([web] class_notes)"
            if v.disease
            else "  the model saw no disease it knows on the leaf; a pest, a shortage of water or nutrients, or another disease can look healthy to it"
        )
    else:
        for key, head in (
            ("urgency", "URGENT"),
            ("look_for", "Look for"),
            ("cause", "Cause"),
            ("spread", "How it spreads"),
            ("act", "What to do"),
        ):
            text = getattr(note, key)
            if text:
                lines += textwrap.wrap(text, 100, initial_indent=f"  {head}: ", subsequent_indent="    ")
        if note.looks_like:
            lines.append("  Often confused with: " + ", ".join(note.looks_like))
        if note.source:
            lines.append(f"  Read more: {note.source}")
    se = v.season
    lines.append(f"  this season: {se.photos} photos answered as it ({se.sure} sure), {se.labelled} labelled by the expert")
    if v.disease and se.found:
        on = f" of {se.plants} plants" if se.plants else ""
        lines.append(f"  found on {se.found} photos{on}, first photographed {_day(se.first)}, last {_day(se.last)}")
    return lines
