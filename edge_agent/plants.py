"""Several photos of one plant, one diagnosis: the photos' evidence combined, and a verdict for the plant.

A *plant* is a subfolder of the inbox (``inbox/<plant>/<photo>``; ``POST /api/v1/classify?plant=NAME`` puts an
upload there). Each photo's answer is a ranked list of classes with probabilities (``[classify] top_k`` of them);
a class a photo did not list gets an even share of what the listed ones leave. The plant's probability for each class
is the product of its photos' (their log-probabilities summed, then normalised: each photo counted as independent
evidence), so three photos that lean the same way make a sure answer and one odd photo does not overturn two.

The plant's verdict: ``unknown`` where more than half its photos are; ``confident`` where the combined probability
reaches ``[labels] pseudo_threshold``, no photo was sure of another class, at least half of them name the plant's
class and at least half are ``confident`` of it on their own (each photo's verdict also checks that it looks like
the photos the class was trained on, which a product of probabilities cannot: measured on field photos, combining
alone made plants of an unknown disease sure); otherwise ``unsure``, with the reason (the photos disagree, or the
evidence is not enough).

A plant is photographed again over a season: its photos taken more than ``[classify] plant_visit_gap_h`` (12) hours
apart are separate *visits* (:func:`visits`; when taken is the photo's EXIF time where it is believed, else when it was
classified: :mod:`edge_agent.capture_time`), and a diagnosis combines one visit's photos only (the newest, for the plant as
it is now), so a tree healthy in May and sick in August is diagnosed sick, and alerts again at each visit.

A subfolder with more photos than ``[classify] plant_max_photos`` (12) in one visit is not taken as one plant (a
camera's folder synced into the inbox would otherwise be one "plant" of thousands of photos, alerting once in its
life), nor one whose photos were taken far apart (two or more over :data:`PLANT_SPREAD_M` metres from where the
visit's photos were taken, by their EXIF GPS: a phone's album of a walk round the farm under a name of its own):
its photos are judged, and alert, one by one, and the Plants page says why (:func:`not_one_plant`). A subfolder named as a phone or
camera names its photo folder (``DCIM``, ``Camera``, ``100APPLE``: :data:`CAMERA_FOLDER`) is no plant however few
photos a day it brings: its photos stand alone. Where the expert has labelled any of the plant's
photos, the expert's word is the plant's diagnosis (the label named most, ``confident``, with how many photos said
what), the model's combined classes kept beside it.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from edge_agent.capture_place import distance_m, middle
from edge_agent.log import display_name
from edge_agent.names import class_phrase, is_disease

__all__ = [
    "PlantDiagnosis",
    "combine",
    "diagnose",
    "in_view",
    "labels_of_others",
    "plant_of",
    "not_one_plant",
    "PLANT_SPREAD_M",
    "visits",
    "newest_visit",
    "visit_of",
    "visit_window",
    "PLANT_NAME",
    "PLANT_NAME_RULE",
    "CAMERA_FOLDER",
    "tidy_name",
    "name_problem",
    "folder_named",
    "PLANT_VIEWS",
    "PLANTS_LOOKED_AT",
]

#: A plant's name as the API takes it: a folder name in the inbox (no path, no hidden file).
PLANT_NAME = r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}"
#: :data:`PLANT_NAME` in words, for refusals.
PLANT_NAME_RULE = "letters, digits, space, '.', '_' or '-', at most 64, not starting with '.'"


#: Names phones and cameras give their photo folders (DCF's "100APPLE" and "101NIKON", Android's "Camera", Windows'
#: "Camera Roll", ...): such a folder synced into the inbox holds many plants' photos, so it is no plant.
CAMERA_FOLDER = re.compile(r"(?i:dcim|camera|camera roll|screenshots|pictures|photos|whatsapp images)|[1-9][0-9]{2}[A-Z0-9_]{5}")


def name_problem(name: str) -> str | None:
    """Why ``name`` (as :func:`tidy_name` leaves it) cannot name a new plant, in words; None where it can."""
    if not re.fullmatch(PLANT_NAME, name):
        return f"a plant's name is a folder name: {PLANT_NAME_RULE}"
    if CAMERA_FOLDER.fullmatch(name):
        return (
            f"{name!r} is how a phone or camera names its photo folder, and such a folder in the inbox is taken as "
            "photos on their own, not one plant: name the plant otherwise (its row and number)"
        )
    return None


def tidy_name(name: str) -> str:
    """A plant's name as typed, spaces typed twice or at either end taken out (other whitespace is kept, and refused)."""
    return re.sub(" +", " ", name.strip(" "))


def folder_named(inbox: Path, plant: str, most: int = 10_000) -> str | None:
    """The name of the inbox's subfolder that is ``plant`` in any case and spacing (the first ``most`` entries read)."""
    key = plant.casefold()
    try:
        for _, entry in zip(range(most), os.scandir(inbox)):
            if entry.is_dir() and tidy_name(entry.name).casefold() == key:
                return entry.name
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class PlantDiagnosis:
    """The combined answer for one plant's photos."""

    label: str
    probability: float
    verdict: str  # confident | unsure | unknown
    reason: str
    photos: int
    agreeing: int  # photos whose own answer is the plant's class
    top_k: list[tuple[str, float]]  # the model's classes, its photos combined
    expert: int = 0  # photos the expert labelled: where any, the most named label is the plant's (the verdict confident)
    earlier: int = 0  # photos of earlier visits, not combined (:func:`visits`)
    place: tuple[float, float] | None = None  # where its photos were taken (their EXIF GPS, the median); None: not known
    not_one: str = ""  # why the visit's photos are not one plant (:func:`not_one_plant`); "": they may be

    def as_dict(self) -> dict:
        return {
            "label": self.label,
            "probability": round(self.probability, 4),
            "verdict": self.verdict,
            "reason": self.reason,
            "photos": self.photos,
            "agreeing": self.agreeing,
            "top_k": [[c, round(p, 4)] for c, p in self.top_k],
            "expert": self.expert,
            "earlier": self.earlier,
            "latitude": self.place[0] if self.place else None,
            "longitude": self.place[1] if self.place else None,
            "not_one_plant": self.not_one or None,
        }


def plant_of(path: str | os.PathLike | None, inbox: str | os.PathLike) -> str | None:
    """The plant a photo belongs to: the inbox subfolder it arrived in (None: straight in the inbox, in a camera's
    photo folder, :data:`CAMERA_FOLDER`, or elsewhere)."""
    if not path:
        return None
    try:
        rel = Path(path).relative_to(inbox)
    except ValueError:
        return None
    if len(rel.parts) < 2 or CAMERA_FOLDER.fullmatch(rel.parts[0]):
        return None
    return display_name(rel.parts[0])[:200]  # a non-UTF-8 folder name escaped


def combine(answers: Sequence[tuple[Sequence[Sequence], str | None]], num_classes: int, sure: float = 0.9, top: int = 3) -> PlantDiagnosis:
    """One diagnosis from the photos' ``(top_k, verdict)``; ``num_classes``: how many classes the model has (for the
    share of an unlisted class); ``sure``: the least combined probability of a confident plant."""
    if not answers:
        raise ValueError("a plant needs at least one photo")
    classes = sorted({str(c) for top_k, _ in answers for c, _ in top_k})
    logp = dict.fromkeys(classes, 0.0)
    log_unlisted = 0.0  # a class no photo listed: each photo's even share of what it left
    for top_k, _ in answers:
        listed = {str(c): max(float(p), 1e-6) for c, p in top_k}
        rest = max(1e-6, 1.0 - sum(listed.values())) / max(1, num_classes - len(listed))
        log_unlisted += math.log(rest)
        for c in classes:
            logp[c] += math.log(listed.get(c, rest))
    unlisted = max(0, num_classes - len(classes))
    peak = max([*logp.values(), log_unlisted])
    weights = {c: math.exp(v - peak) for c, v in logp.items()}
    total = sum(weights.values()) + unlisted * math.exp(log_unlisted - peak)
    ranked = sorted(((c, w / total) for c, w in weights.items()), key=lambda cp: -cp[1])
    label, prob = ranked[0]
    n = len(answers)
    own = [str(top_k[0][0]) if top_k else "" for top_k, _ in answers]
    agreeing = sum(c == label for c in own)
    unknown = sum(v == "unknown" for _, v in answers)
    against = [c for (top_k, v), c in zip(answers, own) if v == "confident" and c != label]
    sure_of_it = sum(v == "confident" and c == label for (_, v), c in zip(answers, own))
    if unknown * 2 > n:
        verdict, reason = "unknown", f"{unknown} of {n} photos are unlike anything the model knows"
    elif against:
        verdict, reason = "unsure", f"the photos disagree: one is sure of {class_phrase(against[0])}"
    elif agreeing * 2 < n:
        verdict, reason = "unsure", f"the photos disagree: {agreeing} of {n} name {class_phrase(label)}"
    elif sure_of_it * 2 < n:
        verdict, reason = "unsure", f"{sure_of_it} of {n} photos are sure of it on their own (half are needed)"
    elif prob >= sure:
        verdict, reason = "confident", f"{sure_of_it} of {n} photos are sure of it; together {prob:.0%}"
    else:
        verdict, reason = "unsure", f"together {prob:.0%}, below {sure:.0%}"
    return PlantDiagnosis(label, prob, verdict, reason, n, agreeing, ranked[:top])


def visits(taken: Sequence[float], gap_s: float) -> list[range]:
    """A plant's photos (when each was taken, :attr:`edge_agent.ledger_rows.ResultRow.when`, oldest first) as visits:
    index ranges split where photos are more than ``gap_s`` apart (0: one visit)."""
    starts = [0] + [i for i in range(1, len(taken)) if gap_s > 0 and taken[i] - taken[i - 1] > gap_s]
    return [range(a, b) for a, b in zip(starts, [*starts[1:], len(taken)])] if taken else []


def visit_window(when: float, gap_s: float) -> tuple[float, float]:
    """The times a photo taken at ``when`` shares a visit with at most (``gap_s`` either side; the whole season where
    ``gap_s`` is 0, as :func:`visits` takes it), for a query by time."""
    return (when - gap_s, when + gap_s) if gap_s > 0 else (0.0, 1e18)


def visit_of(taken: Sequence[float], i: int, gap_s: float) -> range:
    """The visit (:func:`visits`) that holds photo ``i`` of photos taken at ``taken`` (-1: the newest)."""
    i %= len(taken)
    return next(v for v in visits(taken, gap_s) if i in v)


def newest_visit(rows: Sequence, gap_s: float) -> list:
    """The rows (each with ``when``, :attr:`edge_agent.ledger_rows.ResultRow.when`, oldest first) of the newest visit
    (:func:`visits`)."""
    return list(rows[visit_of([r.when for r in rows], -1, gap_s).start :]) if rows else []


#: How far (metres) from where a visit's photos were taken (their median place) two of them may be and still be of
#: one plant: a tree's crown spans a few metres and a phone's fix under leaves is good to 5-20 m (a fix said to be
#: more than 50 m off is not kept), while a walk round a farm spans hundreds; one stray fix alone does not count.
PLANT_SPREAD_M = 60.0


def not_one_plant(places: Sequence[tuple[float, float] | None], limit: int) -> str:
    """Why the photos of one visit of a folder (``places``: each one's, None where not known) are not one plant: more
    than ``limit`` of them (``[classify] plant_max_photos``; 0: no limit), or two or more taken over
    :data:`PLANT_SPREAD_M` metres from where the others were; "" where they may be."""
    if 0 < limit < len(places):
        return f"{len(places)} photos, more than [classify] plant_max_photos ({limit})"
    mid = middle(places)
    far = sorted((distance_m(mid, p) for p in places if p is not None), reverse=True) if mid else []
    if len(far) >= 2 and far[1] > PLANT_SPREAD_M:
        k = sum(d > PLANT_SPREAD_M for d in far)
        where = f"{len(far)} photos with a position" if len(far) < len(places) else f"{len(far)} photos"
        return f"{k} of its {where} were taken more than {PLANT_SPREAD_M:.0f} m from the middle of them (up to {far[0]:.0f} m)"
    return ""


def diagnose(
    rows, num_classes: int, sure: float = 0.9, expert: Mapping[str, str] | None = None, limit: int = 0, gap_s: float = 0
) -> PlantDiagnosis:
    """:func:`combine` over the newest visit (``gap_s``: :func:`visits`) of a plant's stored results (oldest first,
    :class:`edge_agent.ledger_rows.ResultRow`); where the expert labelled any of its photos (``expert``: sha256 -> class),
    the expert's word is the plant's diagnosis instead. A visit that is no plant (:func:`not_one_plant`: more than
    ``limit`` photos, or taken far apart) is not combined into a verdict (``unsure``, saying why)."""
    earlier = len(rows)
    rows = newest_visit(rows, gap_s)
    earlier -= len(rows)
    places = [getattr(r, "place", None) for r in rows]
    why = not_one_plant(places, limit)
    place = None if why else middle(places)  # a folder of many plants: nowhere
    return replace(_diagnose(rows, num_classes, sure, expert, why), earlier=earlier, place=place, not_one=why)


def _diagnose(rows, num_classes: int, sure: float, expert: Mapping[str, str] | None, why_not_one: str) -> PlantDiagnosis:
    """:func:`diagnose` of one visit's ``rows`` (``why_not_one``: :func:`not_one_plant`'s reason, "" for a plant)."""
    model = combine([(r.top_k, r.verdict) for r in rows], num_classes, sure)
    if why_not_one:  # nor does one photo's expert label speak for the folder
        return replace(
            model,
            verdict="unsure",
            reason=f"{why_not_one}: not taken as one plant, its photos are judged one by one (a folder of many plants?)",
        )
    said = [expert[r.sha256] for r in rows if expert and r.sha256 in expert]
    if not said:
        return model
    named = Counter(said).most_common()  # the most named first; a tie: the one labelled on the earlier photo
    label, k = named[0]
    also = "".join(f", {n} {class_phrase(c)}" for c, n in named[1:])
    return replace(
        model,
        label=label,
        probability=k / len(said),
        verdict="confident",
        reason=f"the expert labelled {len(said)} of {len(rows)} photos: {k} {class_phrase(label)}{also}",
        agreeing=sum(bool(r.top_k) and str(r.top_k[0][0]) == label for r in rows),
        expert=len(said),
    )


#: The views of plants by their diagnosis: "" every plant, "sick" sure of a disease (or so labelled by the expert),
#: "unsure" (unsure or unknown).
PLANT_VIEWS = {"": "every plant", "sick": "with a disease", "unsure": "not sure what they have"}
#: The most recently photographed plants a view looks at (each one's diagnosis is made to choose).
PLANTS_LOOKED_AT = 1000


def in_view(verdict: str, label: str, view: str) -> bool:
    """Whether a plant diagnosed ``label`` with ``verdict`` belongs in ``view`` (:data:`PLANT_VIEWS`)."""
    if view == "sick":
        return verdict == "confident" and is_disease(label)
    if view == "unsure":
        return verdict in ("unsure", "unknown")
    return True


def labels_of_others(
    places: Sequence[tuple[float, float] | None], said: Mapping[str, str], photo: str, limit: int = 0
) -> list[tuple[str, int]]:
    """The expert's labels (``said``: sha256 -> class) of a plant's other photos than ``photo``, the most given first;
    none for a visit that is no plant (its photos' ``places``, :func:`not_one_plant`)."""
    if not_one_plant(places, limit):
        return []
    return Counter(label for sha, label in said.items() if sha != photo).most_common()
