"""What the trainer's commands share: the configuration and state folder they run on, and whether a trainer runs."""

from __future__ import annotations

import argparse

__all__ = ["CONFIG_HELP", "STATE_HELP", "add_config_options", "running", "service_config"]

CONFIG_HELP = "TOML configuration (default: $EDGE_AGENT_CONFIG, else /etc/edge-agent/edge-agent.toml where it exists, else defaults)"

STATE_HELP = "the daemon's state dir (default: $STATE_DIRECTORY or ./edge-state)"


def add_config_options(sp: argparse.ArgumentParser, state_help: str | None) -> None:
    """``--config`` and ``--state-dir`` (hidden where ``state_help`` is None)."""
    sp.add_argument("--config", help=CONFIG_HELP)
    sp.add_argument("--state-dir", help=state_help if state_help is not None else argparse.SUPPRESS)


def service_config(args: argparse.Namespace):
    """The configuration and state folder a command runs on (``--config``, ``--state-dir``)."""
    from edge_agent.config import load_config, override
    from edge_agent.state import resolve_state_dir

    cfg = override(
        load_config(getattr(args, "config", None)),
        {"trainer.retrain_threshold": getattr(args, "retrain_threshold", None)},
        "--retrain-threshold",
    )
    return cfg, resolve_state_dir(getattr(args, "state_dir", None), cfg)


def running(status_file) -> dict | None:
    """The status of a running `serve` (pid alive, refreshed within 30 s), else None."""
    from edge_agent.state import live_status

    st, alive = live_status(status_file, 30)
    return st if alive else None
