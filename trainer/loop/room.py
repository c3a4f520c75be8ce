"""A retrain starts only where the disk has room for the version it writes, so a full disk costs no minutes of
training that end in a failed publish, and the trainer says what it waits for until there is room."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from engines.store import EngineStore, StoreError

__all__ = ["MARGIN", "RoomWatch", "room_needed"]

#: Bytes kept free beyond a version's own: the strategy's memory, the status file, the logs.
MARGIN = 16 << 20
#: A version's size where the store has none in service to measure (about EfficientNet-Lite0's: FP32, INT8, weights).
_VERSION_GUESS = 40 << 20


def room_needed(store: EngineStore) -> int:
    """Bytes a retrain writes on the store's disk: a version the size of the one in service twice (built in a
    temporary folder, then published beside it), and :data:`MARGIN`."""
    try:
        folder = store.root / store.current()
        size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    except (StoreError, OSError):
        size = _VERSION_GUESS
    return 2 * size + MARGIN


class RoomWatch:
    """Whether a retrain may start on the disk of ``store`` (:meth:`reason` is None) or why not; after a retrain that
    failed for want of room, twice the room it started with is asked before the next (the estimate was short)."""

    def __init__(self, store: EngineStore, log, free: Callable[[Path], int] = lambda p: shutil.disk_usage(p).free) -> None:
        self.store, self.log, self._free = store, log, free
        self.reason: str | None = None
        self._asked = 0  # after a failure for want of room: the bytes asked for before the next retrain

    def check(self) -> str | None:
        """Why no retrain starts now (the disk too full), or None; said in the log when it starts and when it ends."""
        need = max(room_needed(self.store), self._asked)
        try:
            free = self._free(self.store.root)
        except OSError:
            free = need  # a disk that cannot be asked: the retrain says more if it fails
        reason = (
            None
            if free >= need
            else f"the disk is full: a retrain writes about {need >> 20} MiB and {free >> 20} MiB is free; "
            "it starts once there is room (the labels wait)"
        )
        if bool(reason) != bool(self.reason):
            self.log.warning("retrain_waits_for_room", reason=reason) if reason else self.log.info("retrain_room_again")
        self.reason = reason
        return reason

    def failed_for_room(self) -> None:
        """A retrain failed on a full disk: ask twice the room it started with before the next."""
        self._asked = 2 * max(room_needed(self.store), self._asked)

    def succeeded(self) -> None:
        self._asked = 0
