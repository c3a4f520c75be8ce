"""Which engine versions a daemon relies on, and the pass that deletes the rest of a store's old retrains
(:mod:`engines.prune`): run by the daemon's retention and by the trainer after it publishes, on one store or two.

A daemon relies on the version it serves (its status file says which, so a trainer on the same state directory
knows it too) and on the version its golden photos were labelled by (a start compares the engine in service with
it); both are kept whatever their age, beside what :func:`engines.prune.prune_versions` always keeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from edge_agent.log import get_logger
from engines.prune import Deleted, forget_caches, prune_versions
from engines.store import EngineStore, StoreError

__all__ = ["GOLDEN_FILE", "engines_line", "prune_engines", "versions_in_use"]

#: The golden photos' file in the state directory (:mod:`edge_agent.golden`).
GOLDEN_FILE = "golden.npz"


def versions_in_use(state_root: Path) -> set[str]:
    """The version the daemon on ``state_root`` serves and the one its golden photos were labelled by (none where a
    file is missing or unreadable: the store's own rules still keep the version in service and the newest)."""
    used = set()
    try:
        version = json.loads((state_root / "status.json").read_text())["engine"]["engine_version"]
        used |= {version} if isinstance(version, str) else set()
    except (OSError, ValueError, KeyError, TypeError):
        pass
    import numpy as np  # here: `status`, which formats a line of this module, does not load numpy

    try:
        with np.load(state_root / GOLDEN_FILE) as golden:
            used.add(str(golden["version"]))
    except (OSError, ValueError, KeyError):
        pass
    return used


def prune_engines(store: EngineStore, keep: int, state_root: Path, serving: Iterable[str] = (), cache: str = "", log=None) -> list[Deleted]:
    """Delete ``store``'s retrains that nothing needs, keeping the ``keep`` newest (0: all), the versions in use on
    ``state_root`` and ``serving``; what this machine built for them (``cache``: the engines' cache folder) goes too.
    What was deleted is logged; a store that cannot be written (a full or read-only disk) keeps its versions and says
    so in ``log`` (default: the ``engines`` logger), and the next pass tries again."""
    log = log or get_logger("engines")
    try:
        deleted = prune_versions(store, keep, versions_in_use(state_root) | set(serving))
    except (OSError, StoreError) as exc:
        log.warning("engines_prune_failed", error=repr(exc)[:300])
        return []
    forget_caches(deleted, cache)
    if deleted:
        log.info("engines_pruned", versions=[d.version for d in deleted], mb=round(sum(d.bytes for d in deleted) / 1e6, 1))
    return deleted


def engines_line(held: int, size: int, keep: int, deleted: int, when: str) -> str:
    """What a store holds and keeps, in one line for ``status``: "engines: 6 versions (200 MiB), the 5 newest
    retrains kept; 3 older deleted ``when``"."""
    rule = ("the newest retrain kept" if keep == 1 else f"the {keep} newest retrains kept") if keep else "every version kept"
    gone = f"; {deleted} older deleted {when}" if deleted else ""
    return f"engines: {held} versions ({size >> 20} MiB), {rule}{gone}"
