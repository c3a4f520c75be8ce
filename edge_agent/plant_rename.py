"""A plant renamed, or two names of one tree merged: its photos' records move to the new name, nothing else changes.

A plant's name is the inbox folder (or the upload name) its photos came under, so a name typed wrong ("tree 21" for
"tree 12") makes a plant of its own. Renaming moves every result of the old name to the new one (a name already
photographed: the two are merged, their visits interleaved by time); the photos, their labels and the trainer's
samples are not touched, since none of them holds the name. The inbox is not touched either: photos that arrive
later in the old folder are the old plant again, so the answer says to rename that folder too.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.plants import name_problem, tidy_name
from edge_agent.results import ResultsDB
from engines.errors import EdgeAgentError

__all__ = ["NoSuchPlant", "PlantRenameError", "Renamed", "rename_plant"]


class PlantRenameError(EdgeAgentError, ValueError):
    """The plant cannot be renamed so (no such plant, a name that is no folder name, the same name)."""


class NoSuchPlant(PlantRenameError):
    """No photo has the plant name given."""


@dataclass(frozen=True)
class Renamed:
    """What a rename did: how many photos moved, and whether they joined a plant that had photos already."""

    old: str
    new: str
    photos: int
    merged: bool


def rename_plant(db: ResultsDB, old: str, new: str) -> Renamed:
    """Move every photo of plant ``old`` to plant ``new`` (merging where ``new`` has photos). Raises
    :class:`PlantRenameError`, changing nothing, where ``old`` has no photos or ``new`` is not a plant's name."""
    new = tidy_name(new)
    problem = name_problem(new)
    if problem:
        raise PlantRenameError(f"{new[:70]!r} is not a plant's name: {problem}")
    if new == old:
        raise PlantRenameError(f"the plant is named {old!r} already")
    merged = bool(db.plant_photos(new))
    moved = db.rename_plant(old, new)
    if not moved:
        raise NoSuchPlant(f"no photos of a plant named {old[:64]!r}")
    return Renamed(old, new, moved, merged)
