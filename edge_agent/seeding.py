"""A new device's engine store gets the shipped releases before the one that serves after READY=1, not before it.

A daemon's first start copies only the release that serves into ``<state>/engines`` (the first start on a
2-core machine spent about 0.3 s of its 0.9 s to READY=1 copying all 107 MB of the shipped store; on an SD card,
seconds) and names the others in :data:`PENDING`; :func:`seed_rest` then copies each, verified against its
manifest and installed beside the one in service (never put in service), so ``edge-agent engine rollback`` reaches
them as before. A version the store already holds is left as it is; a start killed half-way copies the rest at the
next start; a disk without room for a version keeps the file and says so, and the version in service is untouched.
Only the marker's versions are copied: a store seeded in full, or one whose marker is done, is never refilled.
Where the release that serves cannot be served (a damaged file, a runtime that rejects it), the older releases are
copied at once and tried, as they were when the first start copied them all (:func:`or_older_releases`).
"""

from __future__ import annotations

import fcntl
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engines.store import EngineStore, StoreError

__all__ = ["PENDING", "install_shipped", "or_older_releases", "seed_rest", "start_seed_rest"]

#: In a store's root: the shipped releases its first start left to copy after READY=1, one a line.
PENDING = "shipped-pending"

#: Room a copy leaves on the state disk beyond the version's own bytes (the photos and the ledger need it more).
_SPARE_BYTES = 256 << 20


def _pending(store: EngineStore) -> list[str]:
    try:
        return [line.strip() for line in (store.root / PENDING).read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


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
            (store.root / PENDING).write_text("".join(f"{v}\n" for v in left))
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
