"""The golden photos: recent confident photos and the class the engine in service gave them, kept across restarts.

A new engine version must agree with them before it serves (:func:`edge_agent.hotswap.verify_candidate`), at a hot
swap and at start-up alike, so a version whose class list does not match its network (reversed, swapped, renamed)
is refused however it arrives. ``<state>/golden.npz`` holds the photos (float16), their class indices and the
version that labelled them.
"""

from __future__ import annotations

import io
from collections import deque
from pathlib import Path

import numpy as np

from edge_agent.log import get_logger
from engines.durable import atomic_write

__all__ = ["Golden", "GoldenSet", "load_golden", "save_golden"]

#: (network input, class index of the version that labelled it)
Golden = list[tuple[np.ndarray, int]]


def save_golden(path: Path, golden: Golden, version: str) -> None:
    """Write ``golden`` labelled by ``version`` (raises OSError: a full disk only means the next start checks less)."""
    buf = io.BytesIO()
    np.savez(
        buf, x=np.stack([g for g, _ in golden]).astype(np.float16), y=np.array([c for _, c in golden], np.int64), version=np.array(version)
    )
    atomic_write(path, buf.getvalue(), durable=False)


def load_golden(path: Path, size: int | None = None) -> tuple[str, Golden] | None:
    """The version and photos in ``path`` (None if there is none), photos ``size`` pixels square if given. Raises
    ValueError for a truncated or malformed file."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            version, x, y = str(f["version"]), f["x"].astype(np.float32), f["y"]
    except Exception as exc:  # noqa: BLE001 - zip, pickle and key errors alike: a file not to trust
        raise ValueError(f"{path}: unreadable ({exc!r})") from None
    if (
        x.ndim != 4
        or x.shape[1] != 3
        or (size is not None and x.shape[2:] != (size, size))
        or len(x) != len(y)
        or y.ndim != 1
        or (y < 0).any()
    ):
        raise ValueError(f"{path}: shape {x.shape} / {len(y)} labels")
    return version, list(zip(x, (int(c) for c in y)))


class GoldenSet:
    """The last ``size`` confident photos of the engine in service, written to ``path`` once per change and read back
    at the next start for that same engine."""

    def __init__(self, path: Path, size: int = 16) -> None:
        self.path = path
        self._photos: deque = deque(maxlen=size)
        self._saved = True
        self.log = get_logger("golden")

    def photos(self) -> Golden:
        """Recent confident photos (preprocessed) with the running engine's class index."""
        return list(self._photos)

    def __len__(self) -> int:
        return len(self._photos)

    def add(self, tensor: np.ndarray, index: int) -> None:
        self._photos.append((tensor, index))
        self._saved = False

    def restart(self) -> None:
        """A new engine serves: the photos it has not labelled no longer count."""
        self._photos.clear()
        self._saved = False

    def load(self, version: str, size: int) -> None:
        """Photos ``version`` labelled before a restart; a file of another version, or a broken one, is ignored."""
        try:
            found = load_golden(self.path, size)
        except ValueError as exc:  # truncated or tampered: not worth refusing to start over
            self.log.warning("golden_file_ignored", file=str(self.path), error=str(exc))
            return
        if found is not None and found[0] == version:
            self._photos.extend(found[1])

    def save(self, version: str) -> None:
        """Write the photos labelled by ``version``, if they changed since the last write."""
        if self._saved or not self._photos:
            return
        try:
            save_golden(self.path, list(self._photos), version)
            self._saved = True
        except OSError as exc:  # a full disk: the check just starts empty after the next restart
            self.log.warning("golden_save_failed", error=str(exc))
