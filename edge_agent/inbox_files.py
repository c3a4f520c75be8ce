"""What happens to a photo file: put into the inbox, moved out of it when done, or quarantined with its reason.

Nothing here overwrites a file: a name already taken becomes ``name-1.ext``, ``name-2.ext``... The pipeline calls
:class:`InboxFiles` only after a photo's result is committed; the web page's upload calls :func:`place`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Literal

from engines.durable import atomic_write

__all__ = ["InboxFiles", "move_out", "free_name", "place", "places", "where_now"]

After = Literal["move", "delete", "leave"]

#: link(2) errors meaning "no hard link here" (FAT, fs.protected_hardlinks for another user's file, link limit).
_NO_LINK = {errno.EPERM, errno.EACCES, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}


class InboxFiles:
    """A state directory's ``processed/`` and ``quarantine/`` folders, and the ``[inbox] after`` rule."""

    def __init__(self, state_dir: Path, after: After) -> None:
        self.after = after
        self.processed_dir = state_dir / "processed"
        self.quarantine_dir = state_dir / "quarantine"
        self._day_dir: Path | None = None

    def finish(self, path: Path) -> None:
        """A photo whose result is stored leaves the inbox as ``after`` says (raises OSError; it then stays)."""
        if self.after == "leave":
            return
        if self.after == "delete":
            path.unlink(missing_ok=True)
            return
        day_dir = self.processed_dir / datetime.now().strftime("%Y-%m-%d")
        try:
            if day_dir != self._day_dir:
                day_dir.mkdir(parents=True, exist_ok=True)
                self._day_dir = day_dir
            move_out(path, day_dir)
        except OSError:
            self._day_dir = None  # someone may have removed processed/: make it again next time
            raise

    def quarantine(self, name: str, tag: str, reason: dict, path: Path | None = None, data: bytes | None = None) -> Path:
        """Move ``path`` (or write ``data``) into quarantine under ``name``, with ``reason`` beside it as JSON; returns
        where it went (raises OSError where the photo could not go). A name too long for the reason file's suffix is
        cut, ``tag`` and the suffix kept. The photo first, each file whole or not at all: on a full disk the photo
        still leaves the inbox (a rename takes no room), and a reason that cannot be written is left to the results
        database and the log rather than as an empty file."""
        if len(os.fsencode(name)) > 180:  # room for "-N" and ".reason.json" under the 255-byte name limit
            name = os.fsdecode(os.fsencode(name)[:120]) + f"-{tag}{Path(name).suffix[:10]}"
        dst = free_name(self.quarantine_dir / name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if path is not None:
            if path.exists() or path.is_symlink():
                shutil.move(str(path), dst)
        elif data is not None:
            atomic_write(dst, data, durable=False)
        try:
            atomic_write(dst.with_name(dst.name + ".reason.json"), (json.dumps(reason, indent=2) + "\n").encode(), durable=False)
        except OSError:
            pass  # (the caller records the reason in the results database and logs it)
        return dst


def place(folder: Path, name: str, data: bytes) -> Path:
    """Write ``data`` into ``folder`` as ``name`` (or the next free name), complete or not at all: written under a
    hidden temporary name, which the hot folder ignores, synced and renamed. Raises OSError (nothing is left)."""
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write(free_name(folder / name), data)


def move_out(src: Path, folder: Path) -> Path:
    """Move ``src`` into ``folder`` under a free name (``name-1.ext``... if taken); returns where it went.

    On the same filesystem this is link + unlink rather than rename: inotify then reports a deletion, which the
    folder source does not subscribe to, instead of a rename out of the inbox, which watchdog holds for half a
    second (and scans for on every later rename in) to pair it with a rename in that never comes. A name already
    linked to ``src`` (a crash between the two steps) is reused. No hard links there: rename; another
    filesystem: copy and delete."""
    for dst in _names(folder / src.name):
        try:
            os.link(src, dst, follow_symlinks=False)
        except FileExistsError:
            if _same_file(src, dst):
                break
            continue
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                dst = free_name(dst)
                shutil.move(str(src), dst)
                return dst
            if exc.errno in _NO_LINK:
                dst = free_name(dst)
                os.rename(src, dst)
                return dst
            raise
        break
    os.unlink(src)
    return dst


def _same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _names(path: Path):
    """``path``, then ``name-1.ext``, ``name-2.ext``...; OSError once they run out."""
    yield path
    for i in range(1, 100000):
        yield path.with_name(f"{path.stem}-{i}{path.suffix}")
    raise OSError(f"no free name for {path}")


def free_name(path: Path) -> Path:
    """The first of ``path``, ``name-1.ext``, ``name-2.ext``... that does not exist."""
    return next(p for p in _names(path) if not p.exists())


def places(state_root: Path, path: str, created: float, variants: int = 20):
    """Where a photo that arrived as ``path`` at ``created`` may be now, most likely first: where it arrived, then
    ``processed/<day>/`` (the day it was classified, or the next: moved just past midnight) under its name or the
    free names a second photo of that name gets (``stem-1.ext``, ...)."""
    from datetime import timedelta
    from itertools import islice

    yield Path(path)
    day = datetime.fromtimestamp(created)
    for d in (day, day + timedelta(days=1)):
        yield from islice(_names(state_root / "processed" / d.strftime("%Y-%m-%d") / Path(path).name), variants)


def where_now(state_root: Path, path: str | None, created: float) -> Path | None:
    """The first of :func:`places` that exists (None: deleted, pruned, or a camera frame that was never a file)."""
    if not path:
        return None
    return next((p for p in places(state_root, path, created) if p.is_file()), None)
