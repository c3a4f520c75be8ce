"""What every request of the page and the API needs: the configuration, the state directory, what the services
report, the writes (a label, a plant's labels or name, a rollback), and the parameters' checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import date
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from edge_agent.capture_place import NEAR_M, Place, parse_place
from edge_agent.class_notes import PAGE_NOTES, ClassNotes, NotesError, NotesSource
from edge_agent.config import AppConfig
from edge_agent.farm_notes import save_note
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.plant_rename import NoSuchPlant, PlantRenameError, Renamed, rename_plant
from edge_agent.plants import PLANTS_LOOKED_AT, PlantDiagnosis, diagnose, in_view, not_one_plant, visit_of, visits
from edge_agent.results import ResultsDB
from edge_agent.review.queue import LabelError, PhotoNotQueued, PlantLabelled, label_photo, label_photos, label_plant, wanted_classes
from edge_agent.rollback import RollbackOutcome
from edge_agent.state import StateLayout, as_stopped, daemon_live, resolve_store, served, store_to_read, trainer_live
from edge_agent.web.queries import Filters, Reader
from engines.errors import EdgeAgentError
from engines.store import StoreError

__all__ = ["WebContext", "BadParameter", "Refused", "page_filters", "parse_day", "parse_int", "parse_near"]

T = TypeVar("T")


@dataclass
class WebContext:
    """What every request needs: the configuration and where the daemon keeps things."""

    cfg: AppConfig
    state: StateLayout
    inbox: Path
    bind: str

    @property
    def reader(self) -> Reader:
        return Reader(self.state.db)

    def store(self):
        """The daemon's store to look at, as it is (:func:`edge_agent.state.store_to_read`)."""
        return store_to_read(self.cfg, self.state.root)

    def store_to_change(self):
        """The daemon's store for a rollback or an unpin, made from the shipped store where it is not there yet."""
        return resolve_store(self.cfg, self.state.root)

    def classes(self) -> list[str]:
        return self.store().open(verify=False).classes

    @cached_property
    def notes_source(self) -> NotesSource:
        """Where the notes on the classes come from: the shipped ones, ``[web] class_notes`` and the page's own file."""
        return NotesSource(self.cfg.web.class_notes, self.page_notes)

    @cached_property
    def notes_below_page(self) -> NotesSource:
        """The notes without the page's own file: what a key the page leaves empty shows."""
        return NotesSource(self.cfg.web.class_notes)

    @property
    def page_notes(self) -> Path:
        """The farm's notes written on the page (:mod:`edge_agent.farm_notes`)."""
        return self.state.root / PAGE_NOTES

    @property
    def notes(self) -> ClassNotes:
        """The notes on the classes as their files are now (the first read raises
        :class:`~edge_agent.class_notes.NotesError`)."""
        return self.notes_source.current()

    def plant(self, rows: list, num_classes: int, labelled: dict[str, str] | None = None) -> tuple[PlantDiagnosis, dict[str, str]]:
        """A plant's diagnosis from its stored ``rows`` and the expert's labels of them (sha256 -> class; read here
        unless ``labelled`` holds them, and others')."""
        if labelled is None:
            said = self.reader.expert_labels([r.sha256 for r in rows])
        else:
            said = {r.sha256: labelled[r.sha256] for r in rows if r.sha256 in labelled}
        cl = self.cfg.classify
        return diagnose(rows, num_classes, self.cfg.labels.pseudo_threshold, said, cl.plant_max_photos, cl.plant_visit_gap_s), said

    def spot(self, row: ResultRow, num_classes: int) -> tuple[PlantDiagnosis, list[ResultRow], dict[str, str]] | None:
        """The answers of the photos taken within :data:`NEAR_M` metres of ``row``, a photo of no plant, within a visit's
        time of it, combined as a plant's are (the same tree and its neighbours photographed without a folder a tree),
        with those photos and the expert's labels of them; None where it has no place, is a plant's, or fewer than two
        (or more than ``plant_max_photos``) are there."""
        rows = self.spot_rows(row)
        if rows is None:
            return None
        said = self.reader.expert_labels([r.sha256 for r in rows])
        return diagnose(rows, num_classes, self.cfg.labels.pseudo_threshold, said, self.cfg.classify.plant_max_photos), rows, said

    def spot_rows(self, row: ResultRow) -> list[ResultRow] | None:
        """The photos of :meth:`spot` (``row``'s own included), in time order; None where it has none."""
        cl = self.cfg.classify
        if row.plant or row.place is None:
            return None
        rows = self.reader.near_visit(row.place, NEAR_M, row.when, cl.plant_visit_gap_s, cl.plant_max_photos + 1)
        return None if len(rows) < 2 or not_one_plant([r.place for r in rows], cl.plant_max_photos) else rows

    def visits(self, rows: list, num_classes: int) -> list[tuple[float, PlantDiagnosis]]:
        """Each visit of a plant (its stored ``rows``, oldest first; :func:`~edge_agent.plants.visits`), the newest
        first: when it began, and its photos' diagnosis."""
        said = self.reader.expert_labels([r.sha256 for r in rows])
        cl, sure = self.cfg.classify, self.cfg.labels.pseudo_threshold
        spans = visits([r.when for r in rows], cl.plant_visit_gap_s)
        return [
            (rows[v.start].when, diagnose(rows[v.start : v.stop], num_classes, sure, said, cl.plant_max_photos)) for v in reversed(spans)
        ]

    def unlabelled_beside(self, sha256: str) -> tuple[str, int] | None:
        """The plant of photo ``sha256`` and how many photos of its visit the expert has not labelled (None: a photo of
        no plant, or of a visit that is not one plant: too large, or taken far apart)."""
        row = self.reader.photo(sha256)
        if row is None or not row.plant:
            return None
        rows, cl = self.reader.plant(row.plant), self.cfg.classify
        i = next((k for k, r in enumerate(rows) if r.sha256 == sha256), -1)
        span = visit_of([r.when for r in rows], i, cl.plant_visit_gap_s)
        if not_one_plant([rows[k].place for k in span], cl.plant_max_photos):
            return None
        said = self.reader.expert_labels([rows[k].sha256 for k in span])
        return row.plant, sum(rows[k].sha256 not in said for k in span)

    def plants(self, match: str, view: str, limit: int) -> Iterator[tuple[str, list, PlantDiagnosis, dict[str, str]]]:
        """The plants photographed whose name holds ``match``, the most recent first, each with its newest visit's
        photos, diagnosis (``earlier``: the plant's other photos) and the expert's labels: the ``limit`` most recent, or,
        for a ``view`` (:data:`~edge_agent.plants.PLANT_VIEWS`), those in it of the
        :data:`~edge_agent.plants.PLANTS_LOOKED_AT` most recent (each one's diagnosis made to choose)."""
        k = len(self.classes())  # read once, not once a plant
        names = [name for name, _, _ in self.reader.plants(PLANTS_LOOKED_AT if view else limit, match)]
        for at in range(0, len(names), 50):  # (read 50 plants at a time: a page shows 50)
            visits = self.reader.newest_visits(names[at : at + 50], self.cfg.classify.plant_visit_gap_s)
            labelled = self.reader.expert_labels([r.sha256 for rows, _ in visits.values() for r in rows])
            for name in names[at : at + 50]:
                rows, photos = visits.get(name, ([], 0))
                if not rows:
                    continue  # (its photos pruned between the two reads)
                d, said = self.plant(rows, k, labelled)
                d = replace(d, earlier=photos - len(rows))
                if in_view(d.verdict, d.label, view):
                    yield name, rows, d, said

    def db(self, readonly: bool = True) -> ResultsDB | None:
        if not self.state.db.is_file():
            return None
        return ResultsDB(self.state.db, readonly=readonly)

    def daemon(self) -> tuple[dict, bool]:
        """The daemon's status and whether it runs."""
        return daemon_live(self.cfg, self.state.root)

    def trainer(self) -> tuple[dict, bool]:
        """The trainer's status and whether it runs (on this machine)."""
        return trainer_live(self.cfg, self.state.root)

    def wanted(self) -> set[str]:
        """The classes the next publish waits for (the review queue asks about them first)."""
        return wanted_classes(self.trainer()[0])

    def trainer_view(self) -> dict:
        """The trainer as this machine knows it: ``where`` "here" (a trainer on this state directory: its own status,
        with the fleet it serves), "remote" (the daemon's hand-off to a trainer elsewhere: connected, last heard, its
        state and last publish, from its heartbeats), or "none"."""
        st, up = self.trainer()
        if st:
            return {
                "where": "here",
                "up": up,
                "state": _trainer_state(st) if up else "not running",
                "status": st if up else as_stopped(st),
                "fleet": st.get("fleet") or [],
                "rollout": st.get("rollout"),
                "handshakes_refused": st.get("handshakes_refused") or [],
            }
        daemon, daemon_up = self.daemon()
        h = daemon.get("handoff") if daemon_up else None
        if h and (h.get("trainer") or {}).get("remote"):
            t = h["trainer"]
            return {
                "where": "remote",
                "up": bool(h.get("trainer_alive")),
                "state": t.get("state") if h.get("trainer_alive") else "unreachable",
                "endpoint": t.get("endpoint"),
                "heard": t.get("heard"),
                "version": t.get("version"),
                "published": t.get("published"),
                "problem": h.get("problem"),
                "status": {},
                "fleet": [],
            }
        return {"where": "none", "up": False, "state": "not running", "status": st, "fleet": []}

    def counts(self) -> dict[str, int]:
        """Results, queue rows and the label queue's bytes ({} before the daemon's first start)."""
        db = self.db()
        if db is None:
            return {}
        try:
            return {**db.counts(), "queue_bytes": db.queue_bytes()}
        finally:
            db.close()

    def current(self) -> str | None:
        """The engine version in service (None when the store has none)."""
        return self.served()["serving"]

    def served(self) -> dict:
        """Which version serves, the store's pointer, the versions refused and the pin (:func:`edge_agent.state.served`)."""
        try:
            return served(self.cfg, self.state.root, self.store())
        except StoreError:
            return {"serving": None, "current": None, "running": False, "refused": {}, "pinned": None}

    def label(self, ref: str, label: str, new_class: bool = False) -> QueueEntry:
        """The expert's label for a photo of the review queue (the page's and the API's; ``review label``'s function).

        Raises :class:`Refused` (404: no such photo in the queue) or :class:`BadParameter` (an unknown class)."""
        quota = self.cfg.labels.max_spool_mb << 20
        return self._on_ledger(lambda db: label_photo(db, self.state.queue, quota, self.classes(), ref, label, new_class))

    def label_plant(self, plant: str, label: str, new_class: bool = False, photos: list[str] | None = None) -> PlantLabelled:
        """The expert's label for several photos of one plant (``photos``; None: each the expert has not labelled).

        Raises :class:`Refused` (404: no such plant) or :class:`BadParameter` (an unknown class, a stray photo)."""
        quota, cl = self.cfg.labels.max_spool_mb << 20, self.cfg.classify
        gap = cl.plant_visit_gap_s
        return self._on_ledger(
            lambda db: label_plant(db, self.state.queue, quota, self.classes(), plant, label, new_class, photos, cl.plant_max_photos, gap)
        )

    def label_spot(self, sha256: str, label: str, new_class: bool, photos: list[str]) -> PlantLabelled:
        """The expert's label for the photos of photo ``sha256``'s spot (:meth:`spot`) ticked on its page, each as a
        photo's own label is.

        Raises :class:`Refused` (404: no such photo, or it has no spot) or :class:`BadParameter` (an unknown class, no
        photo ticked, a photo not of the spot)."""
        row = self.reader.photo(sha256)
        rows = self.spot_rows(row) if row is not None else None
        if rows is None:
            raise Refused(404, "no photos taken beside this one (within 15 m, the same visit) to label together")
        chosen = list(dict.fromkeys(photos))
        if not chosen:
            raise BadParameter("no photo ticked: tick the photos of this spot to label")
        spot = {r.sha256 for r in rows}
        if stray := [sha for sha in chosen if sha not in spot]:
            raise BadParameter(f"{stray[0][:16]!r} is not a photo of this spot: nothing labelled")
        quota = self.cfg.labels.max_spool_mb << 20
        return self._on_ledger(
            lambda db: PlantLabelled("", label, *label_photos(db, self.state.queue, quota, self.classes(), chosen, label, new_class))
        )

    def write_notes(self, label: str, texts: dict[str, str]) -> None:
        """This farm's notes on ``label`` written to the page's file (:func:`edge_agent.farm_notes.save_note`).

        Raises :class:`Refused` (404: a class the model does not know and the expert has not named) or
        :class:`BadParameter` (a text a note does not take, a file that cannot be read or written)."""
        if label not in self.classes() and not self.reader.expert_named(label):
            raise Refused(404, f"the model knows no class {label[:100]!r} (the Diseases page and GET /api/v1/classes list them)")
        try:
            save_note(self.page_notes, label, texts)
        except NotesError as exc:
            raise BadParameter(str(exc)) from None

    def rename_plant(self, old: str, new: str) -> Renamed:
        """Plant ``old``'s photos moved to ``new`` (:func:`edge_agent.plant_rename.rename_plant`).

        Raises :class:`Refused` (404: no such plant) or :class:`BadParameter` (not a plant's name, the same name)."""
        return self._on_ledger(lambda db: rename_plant(db, old, new, self.inbox, self.reader.plant_named))

    def _on_ledger(self, write: Callable[[ResultsDB], T]) -> T:
        """``write`` on the writable ledger, its refusals as the page and the API answer them (404: no such photo or
        plant; 400: the rest)."""
        db = self.db(readonly=False)
        if db is None:
            raise Refused(404, "no results yet: has the daemon run with this state directory?")
        try:
            return write(db)
        except (PhotoNotQueued, NoSuchPlant) as exc:
            raise Refused(404, str(exc)) from None
        except (LabelError, PlantRenameError) as exc:
            raise BadParameter(str(exc)) from None
        finally:
            db.close()

    def rollback(self, to: str) -> RollbackOutcome:
        """Put version ``to`` back in service after checking every file and the signature, pin it, and wait for the
        daemon to serve it (:func:`edge_agent.rollback.roll_back`).

        Raises :class:`Refused` (404: no such version; 409: it fails the check)."""
        from edge_agent.rollback import roll_back
        from edge_agent.trust import daemon_trust

        store = self.store_to_change()
        if to not in store.versions():
            raise Refused(404, f"no engine version {to!r} in {store.root}")
        try:
            return roll_back(self.cfg, self.state.root, store, to, daemon_trust(self.cfg, self.state.root))
        except StoreError as exc:
            raise Refused(409, f"cannot put {to} in service: {exc}") from None


def _trainer_state(st: dict) -> str:
    """A running trainer's state as its tile heads it: what stops it first (labels not stored, no room to retrain)."""
    if st.get("store_problem"):
        return "labels not stored"
    return "waiting for room" if st.get("waiting_for_room") else st.get("state")


class BadParameter(EdgeAgentError, ValueError):
    """A query or form parameter out of its range: answered 400 with the reason."""


class Refused(BadParameter):
    """A request answered with a status other than 400 (404, 409, 413, 415, 422, 507), with the reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_day(text: str | None) -> date | None:
    """A day from ``YYYY-MM-DD`` between 1970 (a board without a clock) and 2999 (None when empty); raises :class:`BadParameter`."""
    if not text:
        return None
    try:
        day = date.fromisoformat(text[:10])
    except ValueError:
        raise BadParameter(f"not a day (YYYY-MM-DD): {text[:20]!r}") from None
    if not 1970 <= day.year <= 2999:
        raise BadParameter(f"no photos can be from {day.isoformat()}")
    return day


def page_filters(q) -> Filters:
    """The Photos and Map pages' filters from a query: a class, a range of days, a plant, near a place."""
    near, within = parse_near(q)
    return Filters(
        q.get("label", ""), parse_day(q.get("from")), parse_day(q.get("to")), plant=q.get("plant", "")[:64], near=near, within_m=within
    )


def parse_near(q) -> tuple[Place | None, int]:
    """A query's ``near`` (latitude,longitude; None when empty) and ``within`` (metres, 1 to 10,000; 15 when empty);
    raises :class:`BadParameter`."""
    within = parse_int(q.get("within"), default=NEAR_M, hi=10_000)
    if within < 1:
        raise BadParameter("within: at least 1 metre")
    text = q.get("near", "")
    if not text:
        return None, within
    try:
        return parse_place(text), within
    except ValueError as exc:
        raise BadParameter(f"near: {exc}") from None


def parse_int(text: str | None, default: int = 0, hi: int = 1_000_000) -> int:
    """A whole number in 0..``hi`` (``default`` when empty); raises :class:`BadParameter`."""
    if not text:
        return default
    if len(text) > 12 or not text.strip().isdigit() or int(text) > hi:
        raise BadParameter(f"not a number from 0 to {hi}: {text[:20]!r}")
    return int(text)
