"""A retrain starts only where the disks it writes on have room for the version it makes, so a full disk costs no
minutes of training that end in a failed publish, and the trainer says what it waits for until there is room."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from engines.store import EngineStore, StoreError

__all__ = ["MARGIN", "RoomWatch", "room_needed"]

#: Bytes kept free beyond a version's own: the strategy's memory, the status file, the logs.
MARGIN = 16 << 20
#: A version's size where the store has none in service to measure (about EfficientNet-Lite0's: FP32, INT8, weights).
_VERSION_GUESS = 40 << 20


def _version_bytes(store: EngineStore) -> int:
    try:
        folder = store.root / store.current()
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    except (StoreError, OSError):
        return _VERSION_GUESS


def room_needed(store: EngineStore, temp: Path | None = None) -> dict[Path, int]:
    """The bytes a retrain writes on each disk, by a folder on it: a version the size of the one in service built in
    the temporary folder (``temp``, the system's by default) and published into the store, and :data:`MARGIN` on
    each; twice the version on the store's disk where the two are one disk."""
    size = _version_bytes(store)
    temp = Path(temp or tempfile.gettempdir())
    try:
        one_disk = os.stat(store.root).st_dev == os.stat(temp).st_dev
    except OSError:  # a store not made yet: its parent's disk, as the first publish will find it
        one_disk = True
    if one_disk:
        return {store.root: 2 * size + MARGIN}
    return {store.root: size + MARGIN, temp: size + MARGIN}


class RoomWatch:
    """Whether a retrain may start (:meth:`check` is None) or why not; after a retrain that failed for want of room,
    twice the room it started with is asked before the next (the estimate was short)."""

    def __init__(
        self, store: EngineStore, log, free: Callable[[Path], int] = lambda p: shutil.disk_usage(p).free, temp: Path | None = None
    ) -> None:
        self.store, self.log, self._free, self._temp = store, log, free, temp
        self.reason: str | None = None
        self._factor = 1  # 2 after a failure for want of room, 4 after two, ...: until a retrain runs to its end

    def check(self) -> str | None:
        """Why no retrain starts now (a disk too full), or None; said in the log when it starts and when it ends."""
        reason = None
        for folder, need in room_needed(self.store, self._temp).items():
            need *= self._factor
            try:
                free = self._free(folder)
            except OSError:
                continue  # a disk that cannot be asked: the retrain says more if it fails
            if free < need:
                where = "the disk" if folder == self.store.root else f"the disk of {folder} (where a retrain builds its version)"
                reason = (
                    f"{where} is full: a retrain writes about {need >> 20} MiB there and {free >> 20} MiB is free; "
                    "it starts once there is room (the labels wait)"
                )
                break
        if bool(reason) != bool(self.reason):
            self.log.warning("retrain_waits_for_room", reason=reason) if reason else self.log.info("retrain_room_again")
        self.reason = reason
        return reason

    def failed_for_room(self) -> None:
        """A retrain failed on a full disk: ask twice the room it started with before the next."""
        self._factor = min(self._factor * 2, 64)

    def succeeded(self) -> None:
        self._factor = 1
