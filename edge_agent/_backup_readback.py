"""What a backup writes onto a stick is read back from the stick itself, not from memory: a failing stick, or a
counterfeit one that claims more room than it holds, gives back other bytes than were written, and the backup is then
a failure said the day it is written, not a file that will not restore the day it is needed.

Every byte written passes a :class:`HashingWriter`; once the file is synced, its pages are dropped from the page cache
(``posix_fadvise(DONTNEED)``: clean pages go) and :func:`read_back` reads it again from the disk and compares.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from edge_agent.backup import BackupError
from engines.store import sha256_stream

__all__ = ["HashingWriter", "ReadBackMismatch", "drop_cached", "read_back", "uncached"]


class ReadBackMismatch(BackupError):
    """A file written onto the backup's disk was read back different, or shorter (it was deleted)."""


class HashingWriter:
    """A file-like object that writes into ``raw`` and hashes what passes."""

    mode = "wb"

    def __init__(self, raw) -> None:
        self._raw, self._h, self.size = raw, hashlib.sha256(), 0

    def write(self, data) -> int:
        self._h.update(data)
        self.size += len(data)
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def uncached(f) -> None:
    """Drop the open file ``f``'s clean pages from the page cache, so what is read next comes from the disk."""
    try:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):  # (a file system or platform without it: read as it comes)
        pass


def drop_cached(path: Path) -> None:
    """Drop the file ``path``'s clean pages from the page cache (see :func:`uncached`); nothing where it cannot be opened."""
    try:
        with open(path, "rb") as f:
            uncached(f)
    except OSError:
        pass


def read_back(path: Path, sha256: str, size: int) -> None:
    """Read the synced file ``path`` again from its disk; raises :class:`ReadBackMismatch` (the file deleted) where
    its bytes are not the ``size`` bytes hashing to ``sha256`` that were written."""
    try:
        with open(path, "rb") as f:
            uncached(f)
            digest, n = sha256_stream(f)
    except OSError as exc:
        why = f"could not be read back ({exc.strerror or exc})"
    else:
        if n == size and digest == sha256:
            return
        why = f"read back from its disk {n} bytes unlike the {size} written"
    Path(path).unlink(missing_ok=True)
    raise ReadBackMismatch(
        f"{path}: {why}: a failing stick, or a counterfeit one that holds less than it claims (check it with f3 or "
        "h2testw): use another; nothing of it kept"
    )
