"""A new device serves its first photo before its engine store is filled, not after.

A daemon's first start (no ``[store] path``, ``<state>/engines`` empty) opens its engine from the package's shipped
store as it is (read, never written there) and copies nothing before READY=1: on a 2-core machine copying the
release that serves (33 MB) cost about 0.1 s of the 0.58 s to READY=1, and copying the whole shipped store (107 MB)
had cost 0.3 s; on an SD card, seconds. Just after READY=1 :func:`seed_serving` copies the release that serves
into ``<state>/engines`` (every shipped release at once where an older one serves) and names the others in
:data:`PENDING`; :func:`seed_rest` then copies each, verified against its manifest and installed beside the one in
service (never put in service), so ``edge-agent engine rollback`` reaches them as before. Until the release is
copied, and for good where the state disk cannot take it, the shipped store serves (the status says what to free).
A version the store already holds is left as it is; a start killed half-way copies the rest at the next start; a
disk without room for a version keeps the file and says so, and the version in service is untouched. Only the
marker's versions are copied: a store seeded in full, or one whose marker is done, is never refilled. Where a
store the first start left half-filled cannot serve its release, the older releases are copied at once and tried
(:func:`or_older_releases`).
"""

from __future__ import annotations

import fcntl
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from engines.durable import atomic_write
from engines.store import EngineStore, StoreError

if TYPE_CHECKING:  # edge_agent.config imports this module (through edge_agent.upgrade)
    from edge_agent.config import AppConfig

__all__ = ["PENDING", "install_shipped", "or_older_releases", "seed_rest", "seed_serving", "start_seed_rest", "unseeded"]

#: In a store's root: the shipped releases its first start left to copy after READY=1, one a line.
PENDING = "shipped-pending"

#: Room a copy leaves on the state disk beyond the version's own bytes (the photos and the ledger need it more).
_SPARE_BYTES = 256 << 20


def _pending(store: EngineStore) -> list[str]:
    try:
        return [line.strip() for line in (store.root / PENDING).read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def unseeded(cfg: AppConfig, state_dir: Path) -> bool:
    """Whether a daemon on ``state_dir`` starts for the first time: no ``[store] path``, and no version in ``<state>/engines``."""
    return not cfg.store.path and not EngineStore(state_dir / "engines").versions()


def seed_serving(cfg: AppConfig, state_dir: Path, serving: str) -> tuple[EngineStore, str | None]:
    """After a first start's READY=1, ``<state>/engines`` given the shipped release ``serving`` (every shipped release
    where an older one than the shipped store's current serves), the others left to :func:`seed_rest`; or, where the
    disk cannot take it, the shipped store and the line that says what to free (:func:`edge_agent.state.resolve_store_or_shipped`)."""
    from edge_agent import state

    return state.resolve_store_or_shipped(cfg, state_dir, serving_only=serving == EngineStore(state.default_store_path()).current())


def install_shipped(store: EngineStore, shipped: Path, version: str, make_current: bool = False) -> None:
    """Copy the shipped ``version`` into ``store`` through its incoming folder and install it, checked against its
    manifest (put in service with ``make_current``); where that fails, nothing half-copied stays."""
    incoming = store.incoming(version)
    shutil.rmtree(incoming, ignore_errors=True)
    try:
        shutil.copytree(shipped / version, incoming)
        store.install(version, make_current=make_current)
    except BaseException:
        shutil.rmtree(incoming, ignore_errors=True)
        raise


def seed_rest(store: EngineStore, shipped: Path, log=None) -> list[str]:
    """Copy the shipped versions :data:`PENDING` names into ``store`` (not into service), one at a time and each
    checked against its manifest; the names copied. Versions the disk has no room for stay named for the next start."""
    if not (store.root / PENDING).exists():
        return []
    copied, left = [], []
    with open(store.root / ".seed-lock", "a+") as lock:  # a second daemon on the same store waits, then finds it done
        fcntl.flock(lock, fcntl.LOCK_EX)
        for version in _pending(store):
            src = shipped / version
            if version in store.versions() or not src.is_dir():
                continue  # already here (an earlier start), or no longer shipped
            need = sum(f.stat().st_size for f in src.iterdir() if f.is_file())
            free = shutil.disk_usage(store.root).free
            if free < need + _SPARE_BYTES:
                left.append(version)
                if log is not None:
                    log.warning("shipped_release_not_copied", engine_version=version, need_mb=need >> 20, free_mb=free >> 20)
                continue
            try:
                install_shipped(store, shipped, version)
            except (OSError, StoreError) as exc:  # the disk filled meanwhile, or a shipped file is damaged
                left.append(version)
                if log is not None:
                    log.warning("shipped_release_not_copied", engine_version=version, error=str(exc))
                continue
            copied.append(version)
        if left:
            atomic_write(store.root / PENDING, "".join(f"{v}\n" for v in left).encode())
        else:
            (store.root / PENDING).unlink(missing_ok=True)
    if copied and log is not None:
        log.info("shipped_releases_copied", versions=copied)
    return copied


T = TypeVar("T")


def or_older_releases(store: EngineStore, shipped: Path, log, open_store: Callable[[], T]) -> T:
    """``open_store()``; where no version in ``store`` can serve (:class:`StoreError`) and a first start left shipped
    releases to copy, those copied first and ``open_store()`` tried again."""
    try:
        return open_store()
    except StoreError:
        if not seed_rest(store, shipped, log):
            raise
        return open_store()


def start_seed_rest(store: EngineStore, shipped: Path, log) -> threading.Thread | None:
    """:func:`seed_rest` on a thread of its own (none where nothing is pending); a failure is logged, never raised."""
    if not (store.root / PENDING).exists():
        return None

    def run() -> None:
        try:
            seed_rest(store, shipped, log)
        except Exception as exc:  # noqa: BLE001 - a shipped release not copied never stops the daemon
            log.error("shipped_releases_not_copied", error=repr(exc))

    thread = threading.Thread(target=run, name="seed-rest", daemon=True)
    thread.start()
    return thread
