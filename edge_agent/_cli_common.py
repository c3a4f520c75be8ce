"""What the ``edge-agent`` subcommands do first: load the configuration, find the engine store or the results."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path

from edge_agent.names import printable

__all__ = ["load", "print_rows", "state_db", "store_of"]


def load(args: argparse.Namespace):
    from edge_agent.config import load_config
    from edge_agent.log import configure_logging

    cfg = load_config(getattr(args, "config", None))
    configure_logging(getattr(args, "log_level", None) or cfg.log.level, cfg.log.format)
    return cfg


def store_of(args: argparse.Namespace, cfg, changing: bool = False):
    """``--store``, else the daemon's own store (``[store] path``, else ``<state>/engines``): to look at, as it is (the
    shipped store where the daemon has made none yet: :func:`edge_agent.state.store_to_read`); ``changing`` (a
    rollback, an unpin), as the daemon resolves it, made from the shipped store where it is not there yet."""
    from edge_agent.state import resolve_state_dir, resolve_store, store_to_read
    from engines.store import EngineStore

    if getattr(args, "store", None):
        return EngineStore(Path(args.store))
    state_dir = resolve_state_dir(getattr(args, "state_dir", None), cfg)
    return resolve_store(cfg, state_dir) if changing else store_to_read(cfg, state_dir)


def state_db(args: argparse.Namespace, cfg):
    """The state directory (``--state-dir``, else as the daemon finds it) and its results database; StateNotFound
    (a FileNotFoundError saying where it looked and why) if none."""
    from edge_agent.results import ResultsDB
    from edge_agent.state import StateLayout, looked_for, resolve_state_dir

    state = StateLayout(resolve_state_dir(args.state_dir, cfg))
    if not state.db.is_file():
        raise looked_for("results database", state.db, args.state_dir, cfg, "`edge-agent run` makes it on its first start")
    return state, ResultsDB(state.db, readonly=getattr(args, "readonly", True))


def print_rows(rows: Iterable[dict], as_json: bool, line: Callable[[dict], str], flush: bool = True) -> None:
    """Each row as one JSON line (``--json``) or as the text ``line(row)`` gives it, control characters escaped."""
    for row in rows:
        print(json.dumps(row) if as_json else printable(line(row)), flush=flush)  # a name may carry escape sequences
