"""An operator's rollback, reported as it turned out: served, refused with the daemon's reason, or not yet and why.

The CLI (``edge-agent engine rollback``), the Engines page and ``POST /api/v1/engines/rollback`` all call
:func:`roll_back`: it moves the store's ``current`` back and pins it (:meth:`engines.store.EngineStore.rollback`, every
file and the signature checked first), then, when the daemon runs on that store, waits until its hot swap has looked
at the new pointer and says what it did. A rollback is served whatever the golden photos of the version left behind
say (:func:`edge_agent.hotswap.operator_chosen`), so "refused" means the version itself is broken (its network does not
run) and "pending" that the daemon did not look in time (busy, or stopped meanwhile).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edge_agent.config import AppConfig
from edge_agent.state import daemon_live, resolve_store
from engines.store import EngineStore

__all__ = ["RollbackOutcome", "roll_back"]


@dataclass(frozen=True)
class RollbackOutcome:
    """What a rollback did: ``state`` serving (the daemon serves ``to``), refused (it will not: ``reason``), pending
    (the daemon has not looked yet: ``reason``) or stopped (no daemon runs on this store: it serves ``to`` at its next
    start); ``before`` the version current before, ``pin`` the pin left."""

    to: str
    before: str
    state: Literal["serving", "refused", "pending", "stopped"]
    reason: str
    pin: dict | None

    @property
    def ok(self) -> bool:
        """The version asked for serves, or will at the daemon's next start."""
        return self.state in ("serving", "stopped")


def _pointer(store: EngineStore) -> int | None:
    try:
        return (store.root / "current").stat().st_mtime_ns
    except OSError:
        return None


def roll_back(cfg: AppConfig, state_dir: Path, store: EngineStore, to: str | None, trust, wait_s: float | None = None) -> RollbackOutcome:
    """Roll ``store`` back to ``to`` (None: the current version's parent) and wait up to ``wait_s`` (default: two hot
    swap polls and 20 s for loading) for the daemon to serve it. Raises :class:`engines.store.StoreError` when the
    version cannot be put in service (missing, tampered, unsigned)."""
    before = store.current()
    target = store.rollback(to, trust=trust).name
    pointer, pin = _pointer(store), store.pin()
    if resolve_store(cfg, state_dir).root.resolve() != store.root.resolve():
        return RollbackOutcome(target, before, "stopped", f"{store.root} is not the store the daemon serves from", pin)
    deadline = time.monotonic() + (2 * cfg.hotswap.poll_s + 20 if wait_s is None else wait_s)
    while True:
        live, running = daemon_live(cfg, state_dir)
        if not running:
            return RollbackOutcome(target, before, "stopped", "the daemon is not running: it serves this version when it starts", pin)
        hotswap = live.get("hotswap") or {}
        looked = hotswap.get("looked")
        if isinstance(looked, int) and pointer is not None and looked >= pointer:
            serving = (live.get("engine") or {}).get("engine_version")
            if serving == target:
                return RollbackOutcome(target, before, "serving", "", pin)
            why = (hotswap.get("refused") or {}).get(target)
            if why:
                return RollbackOutcome(target, before, "refused", f"the daemon refused it: {why}; it still serves {serving}", pin)
        if time.monotonic() >= deadline:
            return RollbackOutcome(
                target,
                before,
                "pending",
                "the daemon has not taken it yet (it looks every [hotswap] poll_s seconds): check `edge-agent engine list`",
                pin,
            )
        time.sleep(0.2)
