"""``edge-agent plants ...``: the plants photographed with their diagnoses, and a plant named wrong put right."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from itertools import islice

from edge_agent._cli_common import load, print_rows, state_db
from edge_agent.names import printable
from edge_agent.state import inbox_dir

__all__ = ["plants_list", "plants_rename"]


def plants_list(args: argparse.Namespace) -> int:
    """Each plant, the most recently photographed first, with its newest visit's diagnosis (the Plants page's)."""
    from edge_agent.ledger_rows import iso
    from edge_agent.web.context import WebContext

    cfg = load(args)
    state, db = state_db(args, cfg)
    db.close()
    ctx = WebContext(cfg, state, inbox_dir(cfg, state.root), "")
    rows = (
        {
            "plant": name,
            "photos": d.photos + d.earlier,
            "visit_photos": d.photos,
            "label": d.label,
            "verdict": d.verdict,
            "probability": round(d.probability, 4),
            "reason": d.reason,
            "expert": d.expert,
            "last": iso(max(r.when for r in photos)),  # when last photographed (taken, else classified)
            "latitude": d.place[0] if d.place else None,  # where its newest visit's photos were taken (EXIF GPS)
            "longitude": d.place[1] if d.place else None,
            "not_one_plant": d.not_one or None,  # why its newest visit is not one plant
        }
        for name, photos, d, _ in ctx.plants(args.name.strip()[:64], args.show, args.limit)
    )
    found = list(islice(rows, args.limit))
    if not found and not args.json:
        print("no plants" + (" in that view" if args.show or args.name else " yet: a plant is a folder in the inbox (inbox/<plant>/)"))

    def line(p: dict) -> str:
        said = "labelled by the expert" if p["expert"] else p["verdict"]
        when = datetime.fromisoformat(p["last"]).astimezone().strftime("%Y-%m-%d %H:%M")
        at = f"  at {p['latitude']},{p['longitude']}" if p["latitude"] is not None else ""
        return f"{p['plant']}  {said}  {p['label']}  {p['visit_photos']} of {p['photos']} photos (newest visit)  last {when}{at}  ({p['reason']})"

    print_rows(found, args.json, line)
    return 0


def plants_rename(args: argparse.Namespace) -> int:
    """Plant OLD's photos moved to NEW (merged where NEW has photos): a name typed wrong put right."""
    from edge_agent.plant_rename import PlantRenameError, rename_plant
    from edge_agent.web.queries import Reader

    cfg = load(args)
    args.readonly = False
    state, db = state_db(args, cfg)
    try:
        done = rename_plant(db, args.old, args.new, inbox_dir(cfg, state.root), Reader(state.db).plant_named)
    except PlantRenameError as exc:
        print(printable(f"edge-agent: {exc}"), file=sys.stderr)
        return 2
    finally:
        db.close()
    joined = " (merged with the photos it had)" if done.merged else ""
    print(printable(f"{done.photos} photos of plant {done.old} are plant {done.new}'s now{joined}"))
    if done.folder_note:
        print(printable(done.folder_note))
    return 0
