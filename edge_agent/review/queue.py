"""The review queue as the expert meets it: what to ask today, best first; labelling a photo, or a plant's; pruning the pool.

The daemon puts every photo below ``[labels] review_threshold`` into the pool (``<state>/queue/review``), and the
confident answers that are not pseudo-labels: the *checks* (answers trust covers, of classes that have not earned it
yet, and a trusted class's audits: :mod:`edge_agent.review.checks`) and confident answers below ``trust_confidence``,
asked as unsure ones are. The
expert is shown, at most what is left of today's ``review_per_day`` budget (local days), those checks and the
unsure photos in turn, a check first: the unsure photos ranked by :func:`edge_agent.review.rank.rank`, which spreads
them over the classes (or, with ``[labels] ask_order = "draw"``, in a fixed random draw); the checks class by class,
the audits first, then the class nearest to earning trust. In a new field half the questions thus establish (or refuse) trust class by class, and a confident
answer the expert corrects is also the label that teaches the model most; the other half go where it hesitates. A label moves the photo to the expert queue, which the hand-off
delivers to the trainer as a true label, exactly as the command line and the web page do.
"""

from __future__ import annotations

import datetime as dt
import difflib
import os
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, replace
from functools import partial
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from edge_agent.capture_place import NEAR_M
from edge_agent.inbox_files import where_now
from edge_agent.ledger_rows import Arrival, QueueEntry, iso
from edge_agent.names import class_name_problem
from edge_agent.plants import labels_of_others, not_one_plant, visit_of, visit_window
from edge_agent.results import ResultsDB
from edge_agent.review.checks import audited, check_windows, covered, nearest_first
from edge_agent.review.rank import Candidate, margin, rank
from edge_agent.spool import PhotoSpool, QueueFull, SpoolItem
from engines.durable import file_now
from engines.errors import EdgeAgentError
from engines.store import sha256_file

if TYPE_CHECKING:
    from edge_agent.config import LabelsSection

__all__ = [
    "ReviewItem",
    "LabelError",
    "PhotoNotQueued",
    "to_ask",
    "left_today",
    "label_photo",
    "label_plant",
    "label_photos",
    "PlantLabelled",
    "others_labelled",
    "Beside",
    "prune_pool",
    "drop_lost",
    "start_of_day",
    "today",
    "wanted_classes",
]


@dataclass(frozen=True)
class ReviewItem:
    entry: QueueEntry
    top_k: list
    margin: float
    verdict: str | None = None  # "unknown": unlike anything the model knows (a new class may be born here)
    check: bool = False  # an answer trust covers (:func:`covered`): the expert's label checks it
    arrival: Arrival = Arrival(None, None, None, None)  # the file, source and plant it came as, when it was classified and taken
    audit: bool = False  # a check of a class trusted already (:func:`audited`), as :func:`to_ask` found it

    def as_json(self) -> dict:
        """What ``review list --json`` prints and the API's review queue holds."""
        q, a = self.entry, self.arrival
        return {
            "photo_id": q.photo_id,
            "sha256": q.sha256,
            "label": q.label,
            "confidence": q.confidence,
            "margin": round(self.margin, 4),
            "verdict": self.verdict,
            "top_k": self.top_k,
            "check": self.check,
            "audit": self.audit,
            "engine_version": q.engine_version,
            "name": a.name,
            "source": a.source,
            "plant": a.plant,
            "classified": iso(a.created) if a.created is not None else None,
            "taken": iso(a.taken) if a.taken is not None else None,
        }


class LabelError(EdgeAgentError, ValueError):
    """The photo is not in the review queue, or the class is unknown (and not declared new)."""


class PhotoNotQueued(LabelError):
    """No photo of the review queue matches the reference given."""


def start_of_day(now: float | None = None) -> float:
    """The start of the local day ``now`` (default: now) falls in, in epoch seconds (the daily budgets' day)."""
    return today(now)[0]


def today(now: float | None = None) -> tuple[float, float]:
    """The local day ``now`` (default: now) falls in, from its start to the next day's: a daily budget counts only what
    is stamped within it (a clock set back would otherwise count the days it had run ahead as today)."""
    day = dt.date.fromtimestamp(now) if now is not None else dt.date.today()
    start = dt.datetime.combine(day, dt.time())
    return start.timestamp(), dt.datetime.combine(day + dt.timedelta(days=1), dt.time()).timestamp()


def left_today(db: ResultsDB, per_day: int) -> int | None:
    """Questions left in today's budget (None: no budget)."""
    if per_day <= 0:
        return None
    return max(0, per_day - db.expert_labels_since(*today()))


def _pool(db: ResultsDB, policy: LabelsSection) -> list[ReviewItem]:
    out = []
    for entry, top_k, verdict, arrival in db.review_pool():
        top_k = top_k or [[entry.label, entry.confidence or 0.0]]
        out.append(ReviewItem(entry, top_k, margin(top_k), verdict, covered(verdict, entry.confidence, policy), arrival))
    return out


def to_ask(db: ResultsDB, per_day: int, policy: LabelsSection, everything: bool = False, wanted: Collection[str] = ()) -> list[ReviewItem]:
    """The pool, best first: what to ask today (``everything``: the whole pool, ranked). Checks and unsure photos
    alternate while both last; within each, photos the model places in a ``wanted`` class (those whose labels would
    let the next version be published) come first, so the next publish does not starve the checks that earn trust.
    Checks (the answers the trust ``policy`` covers) go class by class: first the audits of trusted classes
    (:func:`audited`: whether pseudo-labels are still being made right), then the class nearest to earning trust
    first (:func:`nearest_first`); the unsure photos in the policy's ``ask_order``."""
    left = left_today(db, per_day)
    limit = None if everything else left
    if limit == 0:
        return []
    pool = {item.entry.sha256: item for item in _pool(db, policy)}
    checks, unsure = ([Candidate(sha, it.top_k) for sha, it in pool.items() if it.check == c] for c in (True, False))
    checks, unsure = rank(checks, None), _unsure_order(db, unsure, policy.ask_order, left or per_day)
    if checks:
        windows = check_windows(db.expert_checks(), policy)
        nearest = nearest_first({c.label: windows.get(c.label, []) for c in checks}, policy)
        place = {label: i for i, label in enumerate(nearest)}  # a trusted class is not in it: its audits go first
        audits = {c.id for c in checks if c.label not in place and audited(c.id, policy)}
        pool.update({sha: replace(pool[sha], audit=True) for sha in audits})
        checks.sort(key=lambda c: place.get(c.label, -1 if c.id in audits else len(place)))  # stable
    if wanted:
        for part in (checks, unsure):
            part.sort(key=lambda c: _guess(pool[c.id]) not in wanted)  # stable: the ranking within each part stays
    order = _alternate(checks, unsure)
    return [pool[c.id] for c in order[:limit]]


def _unsure_order(db: ResultsDB, unsure: list[Candidate], ask_order: str, new: int) -> list[Candidate]:
    """The unsure photos in the order ``[labels] ask_order`` names (:mod:`edge_agent.review.rank`; ``typical``: the
    photos :func:`~edge_agent.review.typical.typical_ids` picks for a round of ``new`` questions, 0: a default round,
    first, then the rest by margin)."""
    if ask_order == "draw":
        return rank(unsure, None, class_penalty=0.0, order="draw")
    if ask_order == "typical":
        from edge_agent.review.typical import typical_ids  # (numpy: only where the order is asked for)

        first = typical_ids([c.id for c in unsure], db.pool_distances(), new)
        picked = set(first)
        by_id = {c.id: c for c in unsure}
        return [by_id[sha] for sha in first] + rank([c for c in unsure if c.id not in picked], None)
    return rank(unsure, None)


def _guess(item: ReviewItem) -> str | None:
    return item.top_k[0][0] if item.top_k else item.entry.label


def wanted_classes(trainer_status: dict) -> set[str]:
    """The classes whose expert labels the next publish waits for, as the trainer's status says (none: no trainer)."""
    return set((trainer_status.get("next_publish") or {}).get("by_class") or {})


def _alternate(first: list, second: list) -> list:
    """``first[0], second[0], first[1], ...``; the longer list's rest at the end."""
    out = [x for pair in zip(first, second) for x in pair]
    n = min(len(first), len(second))
    return out + first[n:] + second[n:]


def _squeezed(name: str) -> str:
    return "".join(ch for ch in name.casefold() if ch.isalnum())


def _meant(label: str, classes: list[str]) -> list[str]:
    """The known classes a mistyped name most likely means: the same letters in another case or spacing, or as the
    condition alone ("apple scab"), else classes holding every word of it ("corn rust"), else the closest spellings."""
    said = _squeezed(label)
    same = [c for c in classes if _squeezed(c) == said or _squeezed(c.partition("___")[2]) == said]
    if same:
        return same[:3]
    words = [_squeezed(w) for w in re.split(r"[\W_]+", label) if len(w) >= 3]
    every_word = [c for c in classes if words and all(w in _squeezed(c) for w in words)]
    if every_word:
        return every_word[:3]
    spelt = {_squeezed(c): c for c in classes} | {_squeezed(c.partition("___")[2]): c for c in classes if "___" in c}
    return list(dict.fromkeys(spelt[s] for s in difflib.get_close_matches(said, list(spelt), n=3, cutoff=0.75)))


def label_photo(
    db: ResultsDB, queue_root: Path, quota_bytes: int, classes: list[str], ref: str, label: str, new_class: bool = False
) -> QueueEntry:
    """Give a photo its true class; it joins the expert queue for the trainer. A photo of the review pool, or any other
    photo whose file is still kept (a sure answer the expert sees is wrong, a label given before and now corrected:
    the trainer takes the newer label in place of the older).

    ``ref`` is a photo id, a sha256 prefix (8+ characters) or the photo's original path; ``queue_root`` is the state
    directory's ``queue/``. Raises :class:`LabelError`."""
    label = _checked_class(label, classes, new_class)
    entry = db.find_queued(ref)
    src = entry and file_now(entry.file, queue_root)  # (the state directory restored elsewhere)
    if src is None or not src.exists():  # in no queue, or delivered this instant (its copy deleted): from the kept copy
        entry = _queue_again(db, queue_root, quota_bytes, ref, label)
        src = Path(entry.file)
    moved = PhotoSpool(queue_root, quota_bytes).move(src, "expert")
    try:
        queued = db.mark_expert(entry.sha256, label, str(moved))
    except BaseException:  # not written (a full disk, records locked): the photo goes back to where its row says
        if moved != src:
            os.replace(moved, src)
        raise
    if not queued:  # its label delivered between the two: queued again
        entry = _queue_again(db, queue_root, quota_bytes, ref, label)
    return entry


@dataclass(frozen=True)
class PlantLabelled:
    """What labelling a plant's photos did: the photos labelled, and each one that could not be, with why."""

    plant: str
    label: str
    labelled: list[QueueEntry]
    missed: list[tuple[str, str]]  # (sha256, why): its file no longer kept, the label queue full


def label_plant(
    db: ResultsDB,
    queue_root: Path,
    quota_bytes: int,
    classes: list[str],
    plant: str,
    label: str,
    new_class: bool = False,
    photos: Collection[str] | None = None,
    limit: int = 0,
    gap_s: float = 0,
) -> PlantLabelled:
    """Give several photos of one plant the same true class, each exactly as :func:`label_photo` does.

    ``photos``: the sha256s of the plant's photos to label; None: each photo of its newest visit (``gap_s``:
    :func:`~edge_agent.plants.visits`) the expert has not labelled yet (a label given one photo is not overwritten by
    the plant's, nor last season's photos). A visit that is no plant (:func:`~edge_agent.plants.not_one_plant`: more
    than ``limit`` photos, ``[classify] plant_max_photos``, or taken far apart): its photos must be named. A photo that cannot be labelled (its file
    pruned) does not stop the others: it is in ``missed`` with why. Raises :class:`LabelError` before labelling any
    photo where the class, the plant or a photo named is wrong."""
    label = _checked_class(label, classes, new_class)
    own = db.plant_photos(plant)
    if not own:
        raise PhotoNotQueued(f"no photos of a plant named {plant[:64]!r} (see `edge-agent results --plant NAME`)")
    if photos is None:
        newest = own[visit_of([t for _, t, _ in own], -1, gap_s).start :]
        visit = [sha for sha, _, _ in newest]
        if why := not_one_plant([place for _, _, place in newest], limit):
            raise LabelError(f"{plant[:64]!r} is a folder whose newest visit is not one plant ({why}): name the photos to label")
        said = db.plant_labels(plant)
        chosen = [sha for sha in visit if sha not in said]
        if not chosen:
            raise LabelError(
                f"each photo of plant {plant[:64]!r} is labelled by the expert already: name a photo to label it again "
                "(`edge-agent review label PHOTO CLASS`; `photos` in the API)"
            )
    else:
        mine = {sha for sha, _, _ in own}
        chosen = list(dict.fromkeys(photos))  # in the order given, once each
        if not chosen:
            raise LabelError("no photo chosen: choose the photos of the plant to label")
        if stray := [sha for sha in chosen if sha not in mine]:
            raise LabelError(f"{stray[0][:16]!r} is not a photo of plant {plant[:64]!r}: nothing labelled")
    return PlantLabelled(plant, label, *label_photos(db, queue_root, quota_bytes, classes, chosen, label, new_class))


def label_photos(
    db: ResultsDB, queue_root: Path, quota_bytes: int, classes: list[str], chosen: list[str], label: str, new_class: bool = False
) -> tuple[list[QueueEntry], list[tuple[str, str]]]:
    """Each of ``chosen`` (sha256s) given ``label`` as :func:`label_photo` does: (the labelled, and each photo that could
    not be with why: its file pruned, the queue full; the others are labelled all the same). Raises :class:`LabelError`
    before labelling any where the class is wrong."""
    label = _checked_class(label, classes, new_class)
    labelled, missed = [], []
    for sha in chosen:
        try:
            labelled.append(label_photo(db, queue_root, quota_bytes, classes, sha, label, new_class))
        except LabelError as exc:
            missed.append((sha, str(exc)))
    return labelled, missed


def _checked_class(label: str, classes: list[str], new_class: bool) -> str:
    """``label`` stripped, once it is a class name the model knows (or ``new_class`` declares it new); else
    :class:`LabelError`, suggesting the name meant."""
    label = label.strip()
    if not label:
        raise LabelError("an empty class name")
    if (problem := class_name_problem(label)) is not None:
        shown = label.encode("ascii", "backslashreplace").decode()[:60]
        raise LabelError(f"{shown!r} is not a class name: {problem}")  # the trainer's words for the same refusal
    if label not in classes and not new_class:
        meant = _meant(label, classes)  # a guess says more than the whole list of names
        hint = f"Did you mean {' or '.join(map(repr, meant))}?" if meant else f"Known: {', '.join(classes)}."
        raise LabelError(f"{label!r} is not a known class. {hint} Pass --new-class to teach a new one.")
    return label


class Beside(NamedTuple):
    """What the expert said of the photos beside a question's: the classes, the most given first, and whose
    photos they are ("plant": its plant's, in the same visit; "near": taken within :data:`NEAR_M` metres of it, within
    a visit's time; "": none)."""

    labels: list[tuple[str, int]]
    of: str = ""


def others_labelled(db: ResultsDB, item: ReviewItem, limit: int, gap_s: float = 0) -> Beside:
    """The classes the expert gave the other photos of the question's plant in the question's visit (``gap_s``:
    :func:`~edge_agent.plants.visits`; none for a visit of more than ``limit`` photos:
    :func:`~edge_agent.plants.labels_of_others`); for a photo of no plant, those of the photos taken within
    :data:`NEAR_M` metres of it and ``gap_s`` of its time (the same tree, photographed without a folder a tree)."""
    plant, sha, arrival = item.arrival.plant, item.entry.sha256, item.arrival
    if plant:
        own = db.plant_photos(plant)
        if not own:
            return Beside([])
        i = next((i for i, (s, _, _) in enumerate(own) if s == sha), -1)
        v = visit_of([t for _, t, _ in own], i, gap_s)
        span = own[v.start : v.stop]
        visit = {s for s, _, _ in span}
        said = {s: label for s, label in db.plant_labels(plant).items() if s in visit}
        labels = labels_of_others([place for _, _, place in span], said, sha, limit)
        return Beside(labels, "plant" if labels else "")
    if arrival.place is None or arrival.when is None:
        return Beside([])
    said = db.labels_near(arrival.place, NEAR_M, *visit_window(arrival.when, gap_s))
    labels = Counter(label for s, label in said.items() if s != sha).most_common()
    return Beside(labels, "near" if labels else "")


def _queue_again(db: ResultsDB, queue_root: Path, quota_bytes: int, ref: str, label: str) -> QueueEntry:
    """A photo in no queue (its label delivered, or never asked about) put in the expert queue again, with the
    expert's ``label``, from the copy the state directory keeps of it (or the queue's own, where the photo's label was
    delivered just after this labelling moved it to the expert folder), so that the label can reach the trainer. (Queued
    with the model's answer first, the daemon's sender could deliver that as the expert's label before the expert's
    was written: the trainer then learnt the very answer the expert corrected.) Raises :class:`PhotoNotQueued`."""
    found = db.find_result(ref)
    if found is None and db.results_named(ref) > 1:
        raise PhotoNotQueued(f"more than one photo is named {ref!r}: give its id (the first column of `edge-agent review list`)")
    if found is None:
        raise PhotoNotQueued(f"no photo {ref!r} (see `edge-agent review list` or `edge-agent results`)")
    sha, photo_id, path, _answer, _confidence, version, created = found
    copy = next((f for f in (queue_root / "expert").glob(f"{sha}.*") if sha256_file(f) == sha), None)
    if copy is None:
        src = where_now(queue_root.parent, path, created)
        if src is None or sha256_file(src) != sha:
            raise PhotoNotQueued(
                f"photo {photo_id}: its file is no longer kept (pruned after [retention] photo_days, or a camera frame): a label needs the photo"
            )
        try:
            [copy] = PhotoSpool(queue_root, quota_bytes).put_many(
                [SpoolItem("expert", sha, src.read_bytes(), src.suffix.lower() or ".jpg")]
            )
        except (QueueFull, OSError) as exc:
            raise LabelError(f"photo {photo_id} could not be queued for the trainer: {exc}") from None
        if copy is None:
            raise LabelError(f"photo {photo_id} could not be queued: the label queue is full ([labels] max_spool_mb); start the trainer")
    entry = QueueEntry(sha, photo_id, "expert", label, 1.0, version, str(copy), copy.stat().st_size)
    db.commit([], [entry])
    return entry


def drop_lost(db: ResultsDB, queue_root: Path, policy: LabelsSection, missing_before: set[str]) -> tuple[list[str], set[str]]:
    """Drop from the pool the photos whose copy in ``queue_root`` is gone (lost with a card a salvage could not read,
    deleted by hand): the page would ask the expert about a photo it cannot show. Only those already missing at the
    pass before (``missing_before``, by sha256), so a photo being labelled this instant (its copy moved, its row not
    yet changed) stays. Returns the ids dropped and the photos missing now."""
    missing = {it.entry.sha256: it.entry for it in _pool(db, policy) if not file_now(it.entry.file, queue_root).is_file()}
    dropped = [entry.photo_id for sha, entry in missing.items() if sha in missing_before and db.remove_queued_entry(entry)]
    return dropped, set(missing)


def prune_pool(db: ResultsDB, spool: PhotoSpool, keep: int, policy: LabelsSection, max_bytes: int | None = None) -> int:
    """Drop the least informative photos beyond ``keep`` photos or ``max_bytes`` of theirs from the pool (checks and
    unsure photos alternately kept, each newest or smallest margin first), and what was kept of photos that left it
    unlabelled (their distances and newer answers: :meth:`ResultsDB.forget_left_pool`); returns how many photos left."""
    db.forget_left_pool()  # (those this pass drops: at its next)
    pool = _pool(db, policy)
    if len(pool) <= keep and (max_bytes is None or sum(it.entry.bytes for it in pool) <= max_bytes):
        return 0
    checks = sorted((it for it in pool if it.check), key=lambda it: -it.entry.created)
    unsure = sorted((it for it in pool if not it.check), key=lambda it: it.margin)
    kept = _alternate(checks, unsure)[:keep]
    if max_bytes is not None:  # as many of the most informative as the bytes allow
        kept = kept[: bisect_right(list(accumulate(it.entry.bytes for it in kept)), max_bytes)]
    kept_ids = {it.entry.sha256 for it in kept}
    drop = [it for it in pool if it.entry.sha256 not in kept_ids]
    # each only while it is still in the pool: one the expert labels this instant stays, with their label
    return sum(db.remove_queued_entry(it.entry, partial(spool.remove, Path(it.entry.file))) for it in drop)
