"""``edge-agent review ...``: what to ask the expert today, and the expert's answer."""

from __future__ import annotations

import argparse
import json
import sys

from edge_agent._cli_common import load, print_rows, state_db
from edge_agent.names import printable
from engines.durable import file_now

__all__ = ["review_label", "review_label_plant", "review_list", "review_trust"]


def review_list(args: argparse.Namespace) -> int:
    from edge_agent.capture_place import NEAR_M
    from edge_agent.review.queue import left_today, others_labelled, to_ask, wanted_classes
    from edge_agent.state import trainer_live

    cfg = load(args)
    state, db = state_db(args, cfg)
    wanted = wanted_classes(trainer_live(cfg, state.root)[0])
    items = to_ask(db, cfg.labels.review_per_day, everything=args.all, wanted=wanted, policy=cfg.labels)
    limit, gap = cfg.classify.plant_max_photos, cfg.classify.plant_visit_gap_s
    if args.json:
        for it in items:
            beside = others_labelled(db, it, limit, gap)
            said = {
                "plant_labels": dict(beside.labels) if beside.of == "plant" else {},
                "near_labels": dict(beside.labels) if beside.of == "near" else {},
            }
            print(json.dumps({**it.as_json(), **said, "file": str(file_now(it.entry.file, state.queue))}))
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
        others, of = others_labelled(db, it, limit, gap)
        whose = "of this plant" if of == "plant" else f"taken within {NEAR_M} m of it"
        hint = f"  (the expert said {others[0][0]} of {others[0][1]} other photo{'s' * (others[0][1] > 1)} {whose})" if others else ""
        why = "a check" if it.check else f"margin {it.margin:.3f}"  # a check: is the model right when this sure?
        print(printable(f"{q.photo_id}  {why}  ({alts})  {it.arrival.where}{hint}  {file_now(q.file, state.queue)}"))
    if left is not None and not args.all:
        print(f"-- best first; {left} of today's {cfg.labels.review_per_day} questions left", file=sys.stderr)
    return 0


def review_label(args: argparse.Namespace) -> int:
    from edge_agent.review.queue import LabelError, label_photo

    cfg, state, db, classes = _labelling(args)
    try:
        entry = label_photo(db, state.queue, cfg.labels.max_spool_mb << 20, classes, args.photo, args.label, args.new_class)
    except LabelError as exc:
        print(f"edge-agent: {exc}", file=sys.stderr)
        return 2
    print(f"{entry.photo_id}: labelled {args.label} by an expert; queued for training")
    return 0


def review_label_plant(args: argparse.Namespace) -> int:
    """Every photo of one plant the expert has not labelled yet, given the same class (exit 1 where one could not be)."""
    from edge_agent.review.queue import LabelError, label_plant

    cfg, state, db, classes = _labelling(args)
    quota, limit, gap = cfg.labels.max_spool_mb << 20, cfg.classify.plant_max_photos, cfg.classify.plant_visit_gap_s
    try:
        done = label_plant(db, state.queue, quota, classes, args.plant, args.label, args.new_class, limit=limit, gap_s=gap)
    except LabelError as exc:
        print(printable(f"edge-agent: {exc}"), file=sys.stderr)
        return 2
    for entry in done.labelled:
        print(f"{entry.photo_id}: labelled {done.label} by an expert; queued for training")
    for sha, why in done.missed:
        print(printable(f"edge-agent: {sha[:16]}: not labelled: {why}"), file=sys.stderr)
    n = len(done.labelled)
    print(printable(f"-- {n} photo{'s' * (n != 1)} of plant {done.plant} labelled {done.label}, {len(done.missed)} not"), file=sys.stderr)
    return 1 if done.missed else 0


def _labelling(args: argparse.Namespace):
    """The configuration, state directory, writable ledger and the classes of the store the daemon and trainer share
    (it may have grown new ones) that a label needs."""
    from edge_agent.state import store_to_read

    cfg = load(args)
    args.readonly = False
    state, db = state_db(args, cfg)
    return cfg, state, db, store_to_read(cfg, state.root).open(verify=False).classes


def review_trust(args: argparse.Namespace) -> int:
    """Each class the expert has labelled: how often the model was right, its checks, and what it waits for before
    its confident answers become pseudo-labels (the web page's trust table, for a terminal)."""
    from edge_agent.review.checks import right_checks_to_trust, trust_table

    cfg = load(args)
    policy = cfg.labels
    _state, db = state_db(args, cfg)
    rows, _table, _columns = trust_table(db, policy)
    if not rows and not args.json:
        print(
            "no expert labels yet: no class is trusted, so every answer waits for the expert "
            f"({right_checks_to_trust(policy)} right checks in a row earn a class pseudo-labels)"
        )
        return 0
    width = max([len("class")] + [len(r.label) for r in rows])

    def waits(r) -> str:
        found = f" (audits while trusted: {r.right_audits} of {r.audits} right)" if r.audits else ""
        if r.trusted:
            audits = f", {policy.audit_share * 100:g} % of them still checked" if policy.audit_share and policy.trust_checks else ""
            return f"trusted: its confident answers become pseudo-labels{audits}{found}"
        if r.needed > policy.trust_window:
            return f"untrusted: out of reach in a window of {policy.trust_window} checks{found}"
        return f"untrusted: {r.needed} more right checks in a row{found}"

    if not args.json:
        print(f"{'class':<{width}}  labelled  model right  checks  right checks  pseudo-labels")
    print_rows(
        (
            {
                "label": r.label,
                "labelled": r.labelled,
                "right": r.right,
                "checks": r.checks,
                "right_checks": r.right_checks,
                "trusted": r.trusted,
                "right_checks_needed": r.needed,
                "audits": r.audits,
                "right_audits": r.right_audits,
                "status": waits(r),
            }
            for r in rows
        ),
        args.json,
        lambda x: f"{x['label']:<{width}}  {x['labelled']:>8}  {x['right']:>11}  {x['checks']:>6}  {x['right_checks']:>12}  {x['status']}",
    )
    if not args.json:
        print(
            f"-- a check is an expert label on a confident answer at {policy.trust_from:g} or above; [labels] trust_rule "
            f"({policy.trust_rule}) decides from a class's latest {policy.trust_window} checks",
            file=sys.stderr,
        )
    return 0
