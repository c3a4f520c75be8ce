"""Where engines keep device-specific build artifacts (TensorRT plans, EP caches)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir(configured: str = "", sub: str = "") -> Path:
    """``configured`` if set, else ``$CACHE_DIRECTORY`` (systemd), else ``$XDG_CACHE_HOME/edge-agent``
    (``~/.cache/edge-agent``); created if missing."""
    if configured:
        base = Path(configured).expanduser()
    elif os.environ.get("CACHE_DIRECTORY"):
        base = Path(os.environ["CACHE_DIRECTORY"].split(":")[0])
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edge-agent"
    path = base / sub if sub else base
    path.mkdir(parents=True, exist_ok=True)
    return path
