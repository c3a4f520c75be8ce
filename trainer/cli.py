"""``edge-trainer``: the learning side's command line (its commands live beside it, one module per job)."""

from __future__ import annotations

import argparse
import sqlite3
import sys

from trainer import _cli_fleet, _cli_loop, _cli_models

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-trainer", description="Train and publish edge-agent models.")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="auto", choices=["auto", "json", "console"])
    # The same options after the subcommand too (`edge-trainer serve --log-level debug`); SUPPRESS keeps a value
    # given before the subcommand when none is given after it.
    logging_opts = argparse.ArgumentParser(add_help=False)
    logging_opts.add_argument("--log-level", default=argparse.SUPPRESS, choices=["debug", "info", "warning", "error"])
    logging_opts.add_argument("--log-format", default=argparse.SUPPRESS, choices=["auto", "json", "console"])
    sub = parser.add_subparsers(dest="command", required=True)
    for job in (_cli_loop, _cli_fleet, _cli_models):
        job.add_commands(sub, [logging_opts])
    return parser


def main(argv: list[str] | None = None) -> int:
    from edge_agent.log import configure_logging
    from engines.errors import EdgeAgentError

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        return args.func(args)
    except EdgeAgentError as exc:
        print(f"edge-trainer: {exc}", file=sys.stderr)
        return 2
    except (sqlite3.DatabaseError, OSError) as exc:
        from edge_agent.storage_errors import access_problem

        said = access_problem(exc, getattr(args, "state_dir", None))
        if not said:
            raise
        print(f"edge-trainer: {said}", file=sys.stderr)  # one line naming the file and the fix, not a traceback
        return 2


if __name__ == "__main__":
    sys.exit(main())
