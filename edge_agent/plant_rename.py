"""A plant renamed, or two names of one tree merged: its photos' records move to the new name, nothing else changes.

A plant's name is the inbox folder (or the upload name) its photos came under, so a name typed wrong ("tree 21" for
"tree 12") makes a plant of its own. Renaming moves every result of the old name to the new one (a name already
photographed: the two are merged, their visits interleaved by time); the photos, their labels and the trainer's
samples are not touched, since none of them holds the name. A new name typed in another case or spacing than a
plant's or an inbox folder's is that plant. The old name's inbox folder, where the photos came in, is renamed too
when it is empty (or removed, when the new name has a folder already), so photos dropped in it later are the new
plant's; a folder that still holds files is left as it is, and the answer says so (photos that arrive later in it
are the old plant again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_agent.plants import folder_named, name_problem, tidy_name
from edge_agent.results import ResultsDB
from engines.errors import EdgeAgentError

__all__ = ["FOLDER_FATES", "NoSuchPlant", "PlantRenameError", "Renamed", "rename_plant"]


class PlantRenameError(EdgeAgentError, ValueError):
    """The plant cannot be renamed so (no such plant, a name that is no folder name, the same name)."""


class NoSuchPlant(PlantRenameError):
    """No photo has the plant name given."""


#: What became of the old name's inbox folder (:attr:`Renamed.folder`), in words after "its inbox folder".
FOLDER_FATES = {
    "renamed": "{old}/ is {new}/ now: photos dropped in it are {new}'s",
    "removed": "{old}/ was empty and is removed: drop {new}'s photos in {new}/",
    "kept": "{old}/ still holds files, so it is left as it is: photos that arrive in it are plant {old} again; move them to {new}/",
    "": "",
}


@dataclass(frozen=True)
class Renamed:
    """What a rename did: how many photos moved, whether they joined a plant that had photos already, and what became
    of the old name's inbox folder (a key of :data:`FOLDER_FATES`; "": there is none)."""

    old: str
    new: str
    photos: int
    merged: bool
    folder: str = ""

    @property
    def folder_note(self) -> str:
        """What became of the old name's inbox folder, in a sentence ("" where it had none)."""
        fate = FOLDER_FATES[self.folder].format(old=self.old, new=self.new)
        return f"Its inbox folder {fate}." if fate else ""


def rename_plant(
    db: ResultsDB, old: str, new: str, inbox: Path | None = None, known: Callable[[str], str | None] = lambda _: None
) -> Renamed:
    """Move every photo of plant ``old`` to plant ``new`` (merging where ``new`` has photos; a name that differs only in
    case or spacing from a folder in ``inbox`` or a plant ``known`` by its stored name is that one), then its inbox
    folder (see the module). Raises :class:`PlantRenameError`, changing nothing, where ``old`` has no photos or ``new``
    is not a plant's name."""
    new = tidy_name(new)
    problem = name_problem(new)
    if problem:
        raise PlantRenameError(f"{new[:70]!r} is not a plant's name: {problem}")
    folder = folder_named(inbox, new) if inbox is not None else None  # the inbox's folder of that name, in any case
    same = folder or known(new)
    if same and same != old:  # another plant's name typed in another case: that plant
        new = same
    if new == old:
        raise PlantRenameError(f"the plant is named {old!r} already")
    merged = bool(db.plant_photos(new))
    moved = db.rename_plant(old, new)
    if not moved:
        raise NoSuchPlant(f"no photos of a plant named {old[:64]!r}")
    return Renamed(old, new, moved, merged, _move_folder(inbox, old, new, folder) if inbox is not None else "")


def _move_folder(inbox: Path, old: str, new: str, folder: str | None) -> str:
    """The old name's inbox folder renamed to the new name where it is empty (removed where the new one's, ``folder``,
    exists); what became of it (:data:`FOLDER_FATES`). A folder that cannot be changed (permissions, a file dropped in
    it meanwhile) is kept."""
    src = inbox / old
    if src.is_symlink() or not src.is_dir():
        return ""
    dst = inbox / (folder if folder and folder != old else new)  # the same folder: a name put right in case only
    try:
        if dst.is_dir():
            src.rmdir()  # refused where it is not empty
            return "removed"
        if any(src.iterdir()):
            return "kept"
        src.rename(dst)  # a photo dropped meanwhile moves with it, and is the new plant's
        return "renamed"
    except OSError:
        return "kept"
