"""Photos the trainer stored larger than ``[handoff] photo_side`` (received before the hand-off reduced them, from a
device that does not, or before the side was made smaller) are reduced to it once, a few at a time between retrains,
so a season's phone photos take about a tenth of the trainer's disk and of each backup from then on.

A photo is reduced as the hand-off reduces it (:func:`edge_agent.handoff.reduce.reduced`, its EXIF kept as the
device sent it) and keeps its id and label; one that cannot be decoded, or whose copy would be no smaller, stays as
it is. Nothing runs during a retrain (the service steps this between them), and a row deleted or moved meanwhile
keeps what it has (:func:`engines.durable.replace_row_file`). The side every stored photo was checked against is
recorded in the label store, so a restart checks them again only where the pass was cut short or the side changed.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from edge_agent.handoff.reduce import reduced
from trainer.loop.unlabelled_pool import UnlabelledPool
from trainer.samples import SampleStore

__all__ = ["DONE_KEY", "StoredPhotos"]

#: The label store's state key holding the side every stored photo has been checked against.
DONE_KEY = "photos_reduced_to"

#: After a photo could not be written (a full disk), the pass starts again this much later.
_RETRY_S = 600.0


class StoredPhotos:
    """The pass over the label store's and the unlabelled pool's photos (see the module)."""

    def __init__(self, samples: SampleStore, pool: UnlabelledPool, side: int, log) -> None:
        self.samples, self.pool, self.side, self.log = samples, pool, side, log
        self.done = side <= 0 or samples.get_state(DONE_KEY) == str(side)
        self.reduced = 0
        self.bytes_before = self.bytes_after = 0
        self._todo: list[tuple[SampleStore | UnlabelledPool, str, str]] | None = None
        self._not_before = 0.0
        self._failed = ""  # why the pass waits (after a failure)

    def status(self) -> dict | None:
        """While a pass runs: photos left to check and what was reduced so far, and while it waits after a failure, why
        and for how long (``paused``, ``again_in_s``); None when none runs."""
        wait = self._not_before - time.monotonic()
        if self.done or (self._todo is None and wait <= 0):
            return None
        out = {"left": len(self._todo or ()), "reduced": self.reduced, "bytes_saved": self.bytes_before - self.bytes_after}
        return out | ({"paused": self._failed, "again_in_s": round(wait)} if wait > 0 else {})

    def step(self, budget_s: float = 0.5) -> None:
        """Check and reduce stored photos for about ``budget_s`` seconds (one at least); the pass ends recorded as done.
        A disk or database that fails (full, not writable, locked) stops the pass with every photo as it was, tried again
        :data:`_RETRY_S` later; a photo that fails on its own stays as it is."""
        if self.done or time.monotonic() < self._not_before:
            return
        try:
            self._step(budget_s)
        except (OSError, sqlite3.Error) as exc:
            self._failed = f"{type(exc).__name__}: {exc}"[:300]
            self.log.warning("stored_photo_not_reduced", error=self._failed, next=f"in {_RETRY_S:.0f} s")
            self._todo, self._not_before = None, time.monotonic() + _RETRY_S

    def _step(self, budget_s: float) -> None:
        if self._todo is None:
            self._todo = [(self.samples, s.id, s.file) for s in self.samples.all()]
            self._todo += [(self.pool, p.id, p.file) for p in self.pool.photos()]
            self._todo.reverse()  # oldest first: the largest are from before the hand-off reduced them
        until = time.monotonic() + budget_s
        while self._todo:  # one photo at least
            store, row_id, file = self._todo[-1]
            try:
                self._one(store, row_id, file)
            except (OSError, sqlite3.Error):
                raise
            except Exception as exc:  # noqa: BLE001 - a decoder's failure on this photo: it stays as it is
                self.log.warning("stored_photo_not_reduced", file=file, error=f"{type(exc).__name__}: {exc}", kept="as it is")
            self._todo.pop()
            if time.monotonic() >= until:
                break
        if not self._todo:
            self.samples.set_state(DONE_KEY, str(self.side))
            self.done = True
            if self.reduced:
                self.log.info(
                    "stored_photos_reduced", photos=self.reduced, side=self.side, mb_before=round(self.bytes_before / 1e6, 1),
                    mb_after=round(self.bytes_after / 1e6, 1),
                )  # fmt: skip

    def _one(self, store: SampleStore | UnlabelledPool, row_id: str, file: str) -> None:
        try:
            data = Path(file).read_bytes()
        except FileNotFoundError:  # deleted since the pass listed it (an old pseudo-label, an evicted photo)
            return
        copy = reduced(data, self.side, keep_exif=True)
        if copy is not None and store.replace_photo(row_id, file, *copy):
            self.reduced += 1
            self.bytes_before += len(data)
            self.bytes_after += len(copy[0])
