"""A strategy's state on disk, written whole or not at all, and read as absent where it cannot be read.

torch.save straight onto the file it replaces left, after a crash or a power cut mid-write, a file torch.load cannot
read, and every later retrain failed on it; now the file is written beside, fsynced and renamed into place, and one
that cannot be read is set aside (``<name>.corrupt-<time>``, kept for a look) and said, the strategy starting again
from what the retrain has (rehearsal: no memory yet; EWC: the Fisher information estimated afresh).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import torch

from edge_agent.log import get_logger
from engines.durable import atomic_write, set_aside

__all__ = ["load_state", "save_state"]

#: What torch.load raises for a file cut short or not its own (an empty file: EOFError; a cut zip: RuntimeError).
_UNREADABLE = (EOFError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, KeyError)


def save_state(obj: dict, path: Path) -> None:
    """``obj`` saved to ``path`` (torch.save's format) through a temporary file fsynced and renamed into place."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write(path, buf.getvalue())


def load_state(path: Path) -> dict | None:
    """What :func:`save_state` wrote to ``path``; None where there is none, or where it cannot be read (then set aside
    and logged). An error of the disk itself (OSError) is raised."""
    if not path.exists():
        return None
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict):
            raise ValueError(f"holds a {type(blob).__name__}, not the strategy's state")
        return blob
    except _UNREADABLE as exc:
        aside = set_aside(path)
        get_logger("trainer").error(
            "strategy_state_unreadable",
            file=str(path),
            error=repr(exc)[:200],
            kept=str(aside),
            then="the strategy starts again from this retrain",
        )
        return None
