"""``edge-agent``: the daemon side's command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["main", "build_parser"]


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file (default: $EDGE_AGENT_CONFIG, else built-in defaults)")
    common.add_argument(
        "--log-level", default=argparse.SUPPRESS, choices=["debug", "info", "warning", "error"], help="overrides [log] level"
    )
    return common


def _load(args: argparse.Namespace):
    from edge_agent.config import load_config
    from edge_agent.log import configure_logging

    cfg = load_config(getattr(args, "config", None))
    configure_logging(getattr(args, "log_level", None) or cfg.log.level, cfg.log.format)
    return cfg


def _store(args: argparse.Namespace, cfg):
    from engines.store import EngineStore

    return EngineStore(Path(args.store) if getattr(args, "store", None) else cfg.store.resolved())


# ---- classify -------------------------------------------------------------
def _walk(paths: list[str], extensions: set[str]) -> Iterator[Path]:
    """Named files as given; folders recursively, keeping image extensions, skipping hidden entries."""
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if not name.startswith(".") and Path(name).suffix.lower() in extensions:
                        yield Path(root) / name
        else:
            yield p


def _classify(args: argparse.Namespace) -> int:
    from edge_agent.classifier import Classifier
    from edge_agent.log import get_logger
    from edge_agent.preprocess import ImageRejected
    from engines.loader import open_engine

    cfg = _load(args)
    engine = open_engine(_store(args, cfg), cfg.engine)
    clf = Classifier(engine, top_k=cfg.classify.top_k, max_file_bytes=cfg.preprocess.max_file_bytes, max_pixels=cfg.preprocess.max_pixels)
    log = get_logger("classify", engine_version=engine.engine_version)
    log.debug("engine_loaded", **engine.describe())
    failures = 0
    for path in _walk(args.paths, set(cfg.classify.extensions)):
        try:
            pred = clf.predict_file(path)
        except ImageRejected as exc:
            failures += 1
            log.warning("photo_rejected", photo=str(path), reason=str(exc))
            if args.json:
                print(json.dumps({"path": str(path), "error": str(exc)}), flush=True)
            else:
                print(f"{path}: ERROR {exc}", flush=True)
            continue
        if args.json:
            row = {
                "path": str(path),
                "label": pred.label,
                "confidence": round(pred.confidence, 6),
                "top_k": [[c, p] for c, p in pred.top_k],
                "engine_version": pred.engine_version,
                "ms": pred.ms,
            }
            print(json.dumps(row), flush=True)
        else:
            others = ", ".join(f"{c} {p:.3f}" for c, p in pred.top_k[1:])
            print(
                f"{path}: {pred.label} ({pred.confidence:.3f})  next: {others}  [{pred.engine_version}, {pred.ms:.1f} ms]",
                flush=True,
            )
    return 1 if failures else 0


# ---- config ---------------------------------------------------------------
def _config_show(args: argparse.Namespace) -> int:
    from edge_agent.config import dump_toml

    cfg = _load(args)
    print(dump_toml(cfg, comments=not args.bare), end="")
    return 0


# ---- engine ---------------------------------------------------------------
def _metric(m: dict, *keys: str) -> str:
    for k in keys:
        if not isinstance(m, dict) or k not in m:
            return "-"
        m = m[k]
    return f"{m:.4f}" if isinstance(m, float) else str(m)


def _engine_list(args: argparse.Namespace) -> int:
    cfg = _load(args)
    store = _store(args, cfg)
    versions = store.versions()
    if not versions:
        print(f"{store.root}: no engine versions", file=sys.stderr)
        return 1
    try:
        current = store.current()
    except Exception:
        current = None
    rows = []
    for v in versions:
        m = store.read_manifest(v)
        rows.append(
            {
                "version": v,
                "current": v == current,
                "created": m.get("created"),
                "parent": m.get("parent"),
                "classes": len(m["classes"]),
                "val_top1": _metric(m.get("metrics", {}), "val", "top1"),
                "test_top1": _metric(m.get("metrics", {}), "test", "top1"),
                "int8_agreement": _metric(m.get("metrics", {}), "int8", "top1_agreement_with_fp32"),
                "artifacts": sorted(m["artifacts"]),
            }
        )
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"store: {store.root}")
    print(f"{'':2}{'version':8} {'created':26} {'parent':7} {'classes':>7} {'val':>7} {'test':>7} {'int8 agr':>8}  artifacts")
    for r in rows:
        mark = "* " if r["current"] else "  "
        print(
            f"{mark}{r['version']:8} {r['created'] or '-':26} {r['parent'] or '-':7} {r['classes']:>7} "
            f"{r['val_top1']:>7} {r['test_top1']:>7} {r['int8_agreement']:>8}  {','.join(r['artifacts'])}"
        )
    return 0


def _engine_show(args: argparse.Namespace) -> int:
    cfg = _load(args)
    store = _store(args, cfg)
    version = store.open(args.version)  # verifies every file's sha256
    print(json.dumps({**version.manifest, "verified": True, "path": str(version.path)}, indent=2))
    return 0


def _engine_rollback(args: argparse.Namespace) -> int:
    cfg = _load(args)
    store = _store(args, cfg)
    before = store.current()
    after = store.rollback(args.to)
    print(f"{store.root}: current {before} -> {after.name}")
    return 0


# ---- parser ---------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="On-device plant-disease recognition.", parents=[common]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("classify", parents=[common], help="classify photos (files or folders)")
    c.add_argument("paths", nargs="+", metavar="PATH")
    c.add_argument("--json", action="store_true", help="one JSON object per photo per line")
    c.add_argument("--store", help="engine store (default: [store] path, else the shipped model)")
    c.set_defaults(func=_classify)

    cfg = sub.add_parser("config", help="inspect the configuration").add_subparsers(dest="action", required=True)
    show = cfg.add_parser("show", parents=[common], help="print the effective configuration with defaults")
    show.add_argument("--bare", action="store_true", help="no comments")
    show.set_defaults(func=_config_show)

    eng = sub.add_parser("engine", help="engine store: list, show, rollback").add_subparsers(dest="action", required=True)
    for name, func, helptext in (
        ("list", _engine_list, "list versions (* marks current)"),
        ("show", _engine_show, "verify a version and print its manifest"),
        ("rollback", _engine_rollback, "switch current back to the parent (or --to VERSION)"),
    ):
        p = eng.add_parser(name, parents=[common], help=helptext)
        p.add_argument("--store", help="engine store (default: [store] path, else the shipped model)")
        if name == "list":
            p.add_argument("--json", action="store_true")
        if name == "show":
            p.add_argument("version", nargs="?", help="default: current")
        if name == "rollback":
            p.add_argument("--to", metavar="VERSION", help="version to switch to")
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    from edge_agent.config import ConfigError
    from engines.base import EngineError
    from engines.store import StoreError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, StoreError, EngineError) as exc:
        print(f"edge-agent: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
