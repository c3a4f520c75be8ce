"""Photo bytes for the label queues (pseudo-labels, expert review), kept crash-safely on disk.

Each item is ``<root>/<kind>/<sha256><ext>``, written to a temporary name,
fsynced, renamed and the directory fsynced, so a file with its final name is
always complete. A photo that came from a file the daemon owns from now on (the
inbox photo is moved or deleted afterwards) is hard-linked instead of copied when
it is still the very file that was read (same inode, size and mtime): no second
copy on the SD card, and far less filesystem work per photo. The index (label,
confidence, engine version) is a row in the results database committed in the
same transaction as the result; a file is named by its content hash, so writing
it again after a crash is harmless.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import NamedTuple

from edge_agent.storage_errors import NO_ROOM
from engines.durable import atomic_write, fsync_dir, sync_filesystem
from engines.errors import EdgeAgentError

__all__ = ["PhotoSpool", "QueueFull", "SpoolItem", "Origin"]


class Origin(NamedTuple):
    """The file a photo's bytes were read from, as it was before the read."""

    path: Path
    ino: int
    mtime_ns: int


class SpoolItem(NamedTuple):
    kind: str
    sha256: str
    data: bytes
    ext: str = ".jpg"
    origin: Origin | None = None  # link this file instead of writing ``data``, if it is unchanged


class QueueFull(EdgeAgentError):
    """The queue's disk quota (or the disk itself) is full; the item was not queued."""


class PhotoSpool:
    """Durable photo files under a byte quota."""

    def __init__(self, root: str | Path, max_bytes: int, used_bytes: int = 0) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._used = used_bytes
        self._lock = threading.Lock()
        for kind in ("pseudo", "review", "expert"):
            (self.root / kind).mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob("*/.tmp-*"):
            stale.unlink(missing_ok=True)

    @property
    def used_bytes(self) -> int:
        return self._used

    def path_for(self, kind: str, sha256: str, ext: str) -> Path:
        return self.root / kind / f"{sha256}{ext}"

    def put_many(self, items: list[SpoolItem]) -> list[Path | None]:
        """Write (or link) items with one durability barrier for the whole batch.

        Items are taken in order while they fit the quota; the rest get ``None``. A full
        disk keeps nothing of the batch and raises :class:`QueueFull`."""
        out: list[Path | None] = []
        written: list[Path] = []
        reserved = 0
        try:
            for kind, sha, data, ext, origin in items:
                final = self.path_for(kind, sha, ext)
                if final in written or (final.exists() and final.stat().st_size == len(data)):
                    out.append(final)  # a repeat in the batch, or already there from before a crash
                    continue
                with self._lock:
                    if self._used + len(data) > self.max_bytes:
                        out.append(None)
                        continue
                    self._used += len(data)
                reserved += len(data)
                if origin is None or not _link(origin, final, len(data)):
                    atomic_write(final, data, durable=False)
                written.append(final)
                out.append(final)
            if written:
                sync_filesystem(self.root, written)
        except OSError as exc:
            with self._lock:
                self._used -= reserved
            for f in written:
                f.unlink(missing_ok=True)
            if exc.errno in NO_ROOM:
                raise QueueFull(f"disk full while queuing: {exc}") from None
            raise
        return out

    def move(self, src: Path, kind: str) -> Path:
        """Move an item to another kind's folder (a review item that an expert labelled)."""
        dst = self.root / kind / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
        fsync_dir(dst.parent)
        return dst

    def remove(self, path: Path) -> None:
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return
        with self._lock:
            self._used = max(0, self._used - size)


def _link(origin: Origin, final: Path, size: int) -> bool:
    """Hard-link ``origin`` as ``final`` if it is still the file that was read; False: write the bytes instead
    (another filesystem, no hard links there (FAT), the file changed or vanished, ``final`` exists)."""
    try:
        os.link(origin.path, final, follow_symlinks=False)
    except OSError:
        return False
    try:
        st = os.lstat(final)
        if (st.st_ino, st.st_mtime_ns, st.st_size) == (origin.ino, origin.mtime_ns, size):
            return True
    except OSError:
        pass
    final.unlink(missing_ok=True)
    return False
