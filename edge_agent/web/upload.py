"""Photos dropped on the page go into the inbox, as if copied there, after the checks any arriving file meets.

The name a browser sends is never used as a path: the file is stored as ``upload-<time>-<sha256[:12]>.<ext>``,
the extension taken from the format its header declares. It is written by :func:`edge_agent.inbox_files.place`:
under a hidden temporary name (which the hot folder ignores), renamed when complete, so the daemon never reads
half an upload. What the header check refuses (too large, too many pixels, not an image, truncated) is refused at once with the reason;
what passes and still fails to decode is quarantined by the daemon, with its reason, like any other file.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_agent.imageheader import ImageRejected, ImageTooLarge, check_image
from edge_agent.inbox_files import place
from edge_agent.plants import folder_named, name_problem, tidy_name
from edge_agent.storage_errors import FULL_DISK, NO_ROOM

__all__ = ["Outcome", "plant_folder", "store_upload", "EXTENSIONS"]

EXTENSIONS = {"jpeg": ".jpg", "png": ".png", "bmp": ".bmp", "webp": ".webp", "tiff": ".tif", "heif": ".heic"}


@dataclass(frozen=True)
class Outcome:
    name: str  # as the browser named it (shown, never used as a path)
    status: int  # 201 stored, 413 too large, 415 not an image we take, 507 no room, 500 the inbox cannot be written
    sha256: str | None = None
    stored_as: str | None = None
    error: str | None = None


def store_upload(name: str, data: bytes, inbox: Path, max_file_bytes: int, max_pixels: int) -> Outcome:
    """Check one uploaded file and put it into ``inbox``; the outcome says where it went or why not."""
    shown = (name or "unnamed").replace("\\", "/").rsplit("/", 1)[-1][:120]
    if len(data) > max_file_bytes:
        return Outcome(shown, 413, error=f"file too large: more than {max_file_bytes} bytes (the [preprocess] max_file_bytes cap)")
    try:
        header = check_image(data, max_file_bytes, max_pixels)
    except ImageTooLarge as exc:
        return Outcome(shown, 413, error=str(exc))
    except ImageRejected as exc:
        return Outcome(shown, 415, error=str(exc))
    sha = hashlib.sha256(data).hexdigest()
    try:
        final = place(inbox, f"upload-{time.strftime('%Y%m%d-%H%M%S')}-{sha[:12]}{EXTENSIONS[header.format]}", data)
    except OSError as exc:
        if exc.errno in NO_ROOM:
            return Outcome(shown, 507, sha, error=FULL_DISK)
        return Outcome(shown, 500, sha, error=f"could not store the photo in {inbox}: {exc.strerror or exc}")
    return Outcome(shown, 201, sha, final.name)


def plant_folder(inbox: Path, plant: str | None, known: Callable[[str], str | None] = lambda _: None) -> Path:
    """Where uploads of ``plant`` go: its subfolder of the inbox (made on first use; the inbox for no plant). A name
    that differs only in case or spaces from a folder in the inbox, or from a plant already photographed (``known``:
    its stored name, matched in any case), is that plant: a phone's keyboard writes "Tree 12" for the laptop's
    "tree 12". Raises ValueError for a name that is not a plain folder name."""
    plant = tidy_name(plant or "")
    if not plant:
        return inbox
    problem = name_problem(plant)
    if problem:
        raise ValueError(problem)
    folder = inbox / (folder_named(inbox, plant) or known(plant) or plant)
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o2770)  # as the inbox: the service's group may drop photos
    return folder
