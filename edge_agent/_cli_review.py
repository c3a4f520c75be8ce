"""``edge-agent review ...``: what to ask the expert today, and the expert's answer."""

from __future__ import annotations

import argparse
import json
import sys

from edge_agent._cli_common import load, state_db

__all__ = ["review_list", "review_label"]


def review_list(args: argparse.Namespace) -> int:
    from edge_agent.review.queue import left_today, to_ask, wanted_classes
    from edge_agent.state import trainer_live

    cfg = load(args)
    state, db = state_db(args, cfg)
    wanted = wanted_classes(trainer_live(cfg, state.root)[0])
    items = to_ask(db, cfg.labels.review_per_day, everything=args.all, wanted=wanted, policy=cfg.labels)
    if args.json:
        for it in items:
            print(json.dumps({**it.as_json(), "file": it.entry.file}))
        return 0
    left = left_today(db, cfg.labels.review_per_day)
    if not items:
        print(
            "nothing to ask today: today's budget is used ([labels] review_per_day; --all shows the pool)"
            if left == 0
            else "review queue is empty"
        )
    for it in items:
        q = it.entry
        alts = ", ".join(f"{lab} {p:.2f}" for lab, p in it.top_k[:3])
        print(f"{q.photo_id}  margin {it.margin:.3f}  ({alts})  {q.file}")
    if left is not None and not args.all:
        print(f"-- best first; {left} of today's {cfg.labels.review_per_day} questions left", file=sys.stderr)
    return 0


def review_label(args: argparse.Namespace) -> int:
    from edge_agent.review.queue import LabelError, label_photo
    from edge_agent.state import resolve_store

    cfg = load(args)
    args.readonly = False
    state, db = state_db(args, cfg)
    try:  # the classes of the store the daemon and trainer share (it may have grown new ones)
        entry = label_photo(
            db,
            state.queue,
            cfg.labels.max_spool_mb << 20,
            resolve_store(cfg, state.root).open(verify=False).classes,
            args.photo,
            args.label,
            args.new_class,
        )
    except LabelError as exc:
        print(f"edge-agent: {exc}", file=sys.stderr)
        return 2
    print(f"{entry.photo_id}: labelled {args.label} by an expert; queued for training")
    return 0
