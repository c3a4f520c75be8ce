"""``edge-agent engine ...``: list, show, roll back and unpin the versions of the daemon's engine store."""

from __future__ import annotations

import argparse
import json
import sys

from edge_agent._cli_common import load, print_rows, store_of

__all__ = ["engine_list", "engine_show", "engine_rollback", "engine_unpin"]


def _metric(m: dict, *keys: str) -> str:
    for k in keys:
        if not isinstance(m, dict) or k not in m:
            return "-"
        m = m[k]
    return f"{m:.4f}" if isinstance(m, float) else str(m)


def engine_list(args: argparse.Namespace) -> int:
    cfg = load(args)
    store = store_of(args, cfg)
    versions = store.versions()
    if not versions:
        print(f"{store.root}: no engine versions", file=sys.stderr)
        return 1
    from edge_agent.state import resolve_state_dir, served

    view = served(cfg, resolve_state_dir(getattr(args, "state_dir", None), cfg), store)
    current = view["serving"]
    rows = []
    for v in versions:
        m = store.read_manifest(v)
        rows.append(
            {
                "version": v,
                "current": v == current,
                "refused": view["refused"].get(v),
                "created": m.get("created"),
                "parent": m.get("parent"),
                "classes": len(m["classes"]),
                "val_top1": _metric(m.get("metrics", {}), "val", "top1"),
                "test_top1": _metric(m.get("metrics", {}), "test", "top1"),
                "int8_agreement": _metric(m.get("metrics", {}), "int8", "top1_agreement_with_fp32"),
                "artifacts": sorted(m["artifacts"]),
            }
        )
    if not args.json:
        print(f"store: {store.root}{_shipped_note(store, cfg, args)}")
        print(f"{'':2}{'version':8} {'created':26} {'parent':7} {'classes':>7} {'val':>7} {'test':>7} {'int8 agr':>8}  artifacts")
    print_rows(rows, args.json, _engine_line)
    if not args.json:
        if view["current"] and view["current"] != view["serving"]:
            print(f"* in service; the store names {view['current']}, which the daemon refused (below)")
        for v, why in view["refused"].items():
            print(f"REFUSED {v}: {why}")
        gone = sorted(store.pruned(), key=lambda v: int(v[1:]))
        if gone:
            shown = ", ".join(gone[-10:]) + (f" and {len(gone) - 10} before" if len(gone) > 10 else "")
            print(f"deleted as old retrains ([retention] engine_versions = {cfg.retention.engine_versions}): {shown}")
        if view["pinned"]:
            print(
                f"PINNED to {view['pinned'].get('version')} by a rollback from {view['pinned'].get('from')} (edge-agent engine unpin lifts it)"
            )
    return 0


def _shipped_note(store, cfg, args: argparse.Namespace) -> str:
    """Where ``store`` is the package's shipped store because the daemon has made none yet, the words that say so."""
    from edge_agent.config import default_store_path
    from edge_agent.state import resolve_state_dir

    if cfg.store.path or getattr(args, "store", None) or store.root.resolve() != default_store_path().resolve():
        return ""
    engines = resolve_state_dir(getattr(args, "state_dir", None), cfg) / "engines"
    return f" (the shipped store: the daemon copies it to {engines} when it first starts there)"


def _engine_line(r: dict) -> str:
    return (
        f"{'* ' if r['current'] else '  '}{r['version']:8} {r['created'] or '-':26} {r['parent'] or '-':7} {r['classes']:>7} "
        f"{r['val_top1']:>7} {r['test_top1']:>7} {r['int8_agreement']:>8}  {','.join(r['artifacts'])}"
    )


def engine_show(args: argparse.Namespace) -> int:
    cfg = load(args)
    store = store_of(args, cfg)
    version = store.open(args.version)  # verifies every file's sha256
    print(json.dumps({**version.manifest, "verified": True, "path": str(version.path)}, indent=2))
    return 0


def engine_rollback(args: argparse.Namespace) -> int:
    cfg = load(args)
    store = store_of(args, cfg, changing=True)
    from edge_agent.rollback import roll_back
    from edge_agent.state import resolve_state_dir
    from edge_agent.trust import daemon_trust

    state_dir = resolve_state_dir(getattr(args, "state_dir", None), cfg)
    done = roll_back(cfg, state_dir, store, args.to, daemon_trust(cfg, state_dir))
    print(f"{store.root}: current {done.before} -> {done.to}")
    if done.pin is not None:
        print(
            f"pinned to {done.pin['version']}: offers of {done.pin['from']} or older are refused until a newer version arrives "
            "(edge-agent engine unpin lifts it)"
        )
    print({"serving": f"the daemon serves {done.to}"}.get(done.state, f"{done.state}: {done.reason}"))
    return 0 if done.ok else 1


def engine_unpin(args: argparse.Namespace) -> int:
    cfg = load(args)
    store = store_of(args, cfg, changing=True)
    pin = store.pin()
    store.unpin()
    print(f"{store.root}: " + (f"pin to {pin['version']} lifted: the trainer's offers are taken again" if pin else "not pinned"))
    return 0
