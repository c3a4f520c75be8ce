"""What the API answers and accepts, as pydantic models: the handlers serialise through them and the OpenAPI
document is generated from them, so the two cannot drift apart."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, Field

from edge_agent.ledger_rows import ResultRow

__all__ = [
    "BackupAsked",
    "Problem",
    "Result",
    "ResultsPage",
    "Pending",
    "ReviewItemOut",
    "ReviewQueue",
    "LabelIn",
    "Labelled",
    "PlantLabelIn",
    "NotLabelled",
    "PlantLabelled",
    "PlantRenameIn",
    "PlantRenamed",
    "VisitOut",
    "EngineVersion",
    "Engines",
    "RollbackIn",
    "RolledBack",
    "Service",
    "Health",
    "Fleet",
    "AlertOut",
    "Alerts",
    "PlantOut",
    "Plants",
    "ClassOut",
    "Classes",
    "ClassNotesIn",
    "SpotLabelIn",
    "SCHEMAS",
]


def _stamp(t: float | None) -> datetime | None:
    """A time kept as seconds since the epoch, in UTC (None as it is)."""
    return None if t is None else datetime.fromtimestamp(t, timezone.utc)


class Problem(BaseModel):
    """Why a request failed."""

    error: str = Field(description="What went wrong and how to fix it.")
    status: int = Field(description="The HTTP status, repeated.")


class Result(BaseModel):
    """One photo's classification."""

    sha256: str = Field(description="The photo's SHA-256: its identity.")
    photo_id: str
    name: str | None = Field(description="The file name it arrived under (None from a camera).")
    source: str = Field(description="Where it came from: inbox (the hot folder, uploads included) or the camera's name.")
    label: str = Field(description="The class the model chose.")
    confidence: float
    verdict: Literal["confident", "unsure", "unknown"] | None = Field(
        description="confident; unsure (ask the expert); unknown (not a plant the model knows)."
    )
    verdict_reason: str | None = Field(
        None, description="Why the verdict is not confident, in words (empty when it is; null for results stored before 2026-12)."
    )
    top_k: list[tuple[str, float]] = Field(description="The best classes with their probabilities.")
    engine_version: str
    timings_ms: dict[str, float] = Field(description="Milliseconds per stage; total: from arrival to the result.")
    created: datetime = Field(description="When the result was recorded (UTC).")
    taken: datetime | None = Field(
        None, description="When the photo was taken (UTC), from its EXIF where believed; null where not known (see created)."
    )
    latitude: float | None = Field(None, description="Where the photo was taken, degrees north, from its EXIF GPS; null where not known.")
    longitude: float | None = Field(None, description="Where the photo was taken, degrees east, from its EXIF GPS; null where not known.")
    page: str = Field(description="The photo's page on this web server.")
    plant: str | None = Field(None, description="The plant it shows (the inbox subfolder it arrived in), if any.")
    expert_label: str | None = Field(None, description="The expert's label of it, where it has one (the truth the trainer learns).")

    @classmethod
    def of(cls, row: ResultRow, expert_label: str | None = None) -> Result:
        from pathlib import Path

        return cls(
            sha256=row.sha256,
            photo_id=row.photo_id,
            name=Path(row.path).name if row.path else None,
            source=row.source,
            label=row.label,
            confidence=round(row.confidence, 6),
            verdict=row.verdict,
            verdict_reason=row.verdict_reason,
            top_k=[(str(lab), round(float(p), 6)) for lab, p in row.top_k],
            engine_version=row.engine_version,
            timings_ms={k: float(v) for k, v in (row.timings or {}).items() if isinstance(v, (int, float))},
            created=datetime.fromtimestamp(row.created, timezone.utc),
            taken=_stamp(row.taken),
            latitude=row.lat,
            longitude=row.lon,
            page=f"/photo/{row.sha256}",
            plant=row.plant,
            expert_label=expert_label,
        )


class ResultsPage(BaseModel):
    """One page of results, newest first."""

    total: int = Field(description="How many results match the filters in all.")
    page: int
    size: int
    results: list[Result]


class Pending(BaseModel):
    """A photo accepted into the inbox whose result is not there yet."""

    sha256: str
    status: Literal["pending"] = "pending"
    stored_as: str = Field(description="Its name in the inbox.")
    result: str = Field(description="Where its result will be: GET this.")
    daemon_running: bool = Field(description="False: no daemon is classifying on this state directory.")


class ReviewItemOut(BaseModel):
    """A photo the expert is asked about."""

    photo_id: str
    sha256: str
    label: str | None = Field(description="The model's answer.")
    confidence: float | None
    margin: float = Field(description="Best minus second-best probability: small is unsure.")
    verdict: str | None
    top_k: list[tuple[str, float]]
    check: bool = Field(description="True: a sure answer trust covers (the label checks it): of a class not trusted yet, or an audit.")
    audit: bool = Field(False, description="True: a check of a class trusted already ([labels] audit_share of its sure answers).")
    engine_version: str | None = Field(
        None, description="The engine version whose answer this is (after a swap, the one in service: [labels] reanswer_pool)."
    )
    name: str | None = Field(None, description="The file name it arrived under (None from a camera).")
    source: str | None = Field(None, description="Where it came from: inbox (the hot folder, uploads included) or the camera's name.")
    plant: str | None = Field(None, description="The plant it shows (the inbox subfolder it arrived in), if any.")
    classified: datetime | None = Field(None, description="When the model answered it (UTC).")
    taken: datetime | None = Field(None, description="When the photo was taken (UTC), from its EXIF where believed.")
    plant_labels: dict[str, int] = Field({}, description="The classes the expert gave the plant's other photos, and how many.")
    near_labels: dict[str, int] = Field(
        {},
        description="For a photo of no plant: the classes the expert gave the photos taken within 15 m of it the same visit, and how many.",
    )


class ReviewQueue(BaseModel):
    """Today's questions for the expert, best first."""

    left_today: int | None = Field(description="Questions left in today's budget (None: no budget).")
    per_day: int
    items: list[ReviewItemOut]


class LabelIn(BaseModel):
    """The expert's answer for one photo."""

    label: str = Field(description="The photo's true class.")
    new_class: bool = Field(False, description="True: the class is new to the model (it will learn it).")


class Labelled(BaseModel):
    """A label accepted: the photo joins the expert queue for the trainer."""

    photo_id: str
    sha256: str
    label: str


class PlantLabelIn(BaseModel):
    """The expert's answer for several photos of one plant."""

    label: str = Field(description="The photos' true class.")
    new_class: bool = Field(False, description="True: the class is new to the model (it will learn it).")
    photos: list[str] | None = Field(
        None,
        max_length=500,
        description="The sha256 of each photo of the plant to label; absent: each the expert has not labelled yet "
        "(refused for a folder of more than [classify] plant_max_photos photos, which is no plant).",
    )


class PlantRenameIn(BaseModel):
    """A plant's new name (a plant that has photos already: the two are merged)."""

    to: str = Field(description="The new name: letters, digits, space, '.', '_' or '-', at most 64.")


class PlantRenamed(BaseModel):
    """The plant's photos moved to the new name."""

    old: str
    plant: str = Field(description="The new name.")
    photos: int = Field(description="How many photos moved.")
    merged: bool = Field(description="True: the new name had photos already, and the two plants are one now.")
    folder: Literal["renamed", "removed", "kept", ""] = Field(
        "",
        description="What became of the old name's inbox folder: renamed to the new name, removed (empty), kept (it holds files), or none.",
    )
    note: str = Field("", description="The same in a sentence.")


class NotLabelled(BaseModel):
    """A photo of the plant that could not be labelled, and why."""

    sha256: str
    reason: str


class PlantLabelled(BaseModel):
    """The plant's photos labelled (each joins the expert queue for the trainer), and those that could not be."""

    plant: str
    label: str
    labelled: list[Labelled]
    not_labelled: list[NotLabelled]


class EngineVersion(BaseModel):
    """One version in the engine store."""

    name: str
    current: bool
    manifest: dict[str, Any] = Field(description="The version's signed manifest (classes, metrics, sources).")


class Engines(BaseModel):
    """The engine store: what is in service and what it could go back to."""

    current: str | None
    pin: dict[str, Any] | None = Field(
        description="After a rollback: the version kept in service, and from which and when (None: the newest is used)."
    )
    versions: list[EngineVersion]


class BackupAsked(BaseModel):
    """A backup asked of the daemon: it writes it into ``dir`` at its next look, within a minute (or when it runs again)."""

    requested: float = Field(description="When it was asked for (seconds since the epoch).")
    dir: str = Field(description="[backup] dir, where it is written.")
    daemon_running: bool = Field(description="Whether the daemon runs now (else it is written when it starts).")


class RollbackIn(BaseModel):
    """Which version to put back in service (its signature and every file are checked first)."""

    to: str


class RolledBack(BaseModel):
    """The store's current version, the pin that keeps it there, and whether the daemon serves it."""

    current: str
    pin: dict[str, Any] | None
    state: Literal["serving", "refused", "pending", "stopped"] = Field(
        description="serving: the daemon serves it (200); stopped: no daemon runs, it serves it when it starts (200); "
        "pending: the daemon has not taken it yet (202); refused: the daemon will not serve it (409, with the reason)."
    )
    reason: str = Field("", description="Why it is not served yet, or not at all.")


class Service(BaseModel):
    """A service's status file as it wrote it, and whether it is running."""

    running: bool
    status: dict[str, Any]


class Health(BaseModel):
    """The daemon, the trainer, the queues, the disk and the board."""

    daemon: Service
    trainer: Service
    counts: dict[str, int] = Field(description="Results, queue rows and bytes in results.sqlite.")
    disk_free_bytes: int
    board: dict[str, Any] = Field(description="Temperatures (degrees C) and power (W) where the board gives them.")
    next_publish: dict[str, Any] | None = Field(
        None, description="What the next published version waits for, in a sentence and by class (a trainer on this machine)."
    )
    retention: dict[str, Any] | None = Field(None, description="Photos kept, what retention pruned, the disk floor (the daemon).")


class Fleet(BaseModel):
    """The daemons the trainer on this machine serves, its staged rollout and the connections it refused."""

    trainer_running: bool
    devices: list[dict[str, Any]]
    rollout: dict[str, Any] | None = None
    handshakes_refused: list[dict[str, Any]] = []


class AlertOut(BaseModel):
    """An alert raised by the [alerts] rules."""

    id: int
    created: datetime
    device: str
    label: str
    confidence: float
    verdict: str
    photo_id: str
    page: str


class Alerts(BaseModel):
    """Recent alerts, newest first, and the delivery counters."""

    alerts: list[AlertOut]


#: What the API says of a visit that is not one plant.
_NOT_ONE = (
    "Why its photos are not one plant (more than [classify] plant_max_photos, or taken far apart by their GPS): they are "
    "judged and alert one by one; null where they may be one."
)


class VisitOut(BaseModel):
    """One visit of a plant (its photos with no gap of more than [classify] plant_visit_gap_h) and its diagnosis."""

    began: datetime = Field(description="When its first photo was taken (UTC; when classified where its EXIF says not).")
    photos: int
    label: str = Field(description="The class its photos point to together; where the expert labelled any, the expert's.")
    probability: float = Field(description="The combined probability of that class (of the expert's labels, the share naming it).")
    verdict: Literal["confident", "unsure", "unknown"]
    reason: str
    expert: int = Field(0, description="Its photos the expert labelled.")
    latitude: float | None = Field(
        None, description="Where its photos were taken (their EXIF GPS, the median), degrees north; null where not known."
    )
    longitude: float | None = Field(None, description="The same, degrees east.")
    not_one_plant: str | None = Field(None, description=_NOT_ONE)


class PlantOut(BaseModel):
    """One plant: its photos' answers combined into one diagnosis (edge_agent.plants)."""

    plant: str = Field(description="Its name: the inbox subfolder its photos arrived in.")
    photos: int = Field(description="All its photos.")
    visit_photos: int = Field(
        description="Its photos of the newest visit (after a gap of more than [classify] plant_visit_gap_h): those the diagnosis combines."
    )
    label: str = Field(description="The class its newest visit's photos point to together; where the expert labelled any, the expert's.")
    probability: float = Field(description="The combined probability of that class (of the expert's labels, the share naming it).")
    verdict: Literal["confident", "unsure", "unknown"] = Field(description="The plant's verdict.")
    reason: str = Field(description="Why that verdict, in words.")
    agreeing: int = Field(description="Photos whose own answer is the plant's class.")
    top_k: list[tuple[str, float]] = Field(description="The model's classes, its photos combined.")
    expert: int = Field(0, description="Its photos the expert labelled (0: the diagnosis is the model's).")
    last: datetime = Field(description="When it was last photographed (UTC): its newest photo's EXIF time, else when classified.")
    latitude: float | None = Field(
        None, description="Where its newest visit's photos were taken (their EXIF GPS, the median), degrees north; null where not known."
    )
    longitude: float | None = Field(None, description="The same, degrees east.")
    not_one_plant: str | None = Field(None, description=_NOT_ONE)
    results: list[Result] | None = Field(None, description="Its photos' own results (one plant's page only).")
    visits: list[VisitOut] | None = Field(
        None, description="Each of its visits, the newest first, with its diagnosis (one plant's page only)."
    )


class Plants(BaseModel):
    """The plants photographed, the most recent first."""

    plants: list[PlantOut]


class ClassOut(BaseModel):
    """A class the model knows (or the expert made), with the project's or the farm's notes on it."""

    label: str = Field(description="The model's name for it (what results' label and top_k give).")
    crop: str = Field(description="The plant it is of (the first part of its name); empty for a one-part name.")
    title: str = Field(description="As the farmer reads it: the notes' name for it, else the condition's part of its name.")
    disease: bool = Field(description="False for a healthy class.")
    known: bool = Field(description="The model in service answers it (false: a class only the expert has used so far).")
    photos: int = Field(description="Photos kept that the model answered as it.")
    sure: int = Field(description="Of them, those answered sure (verdict confident).")
    labelled: int = Field(description="Photos the expert labelled as it.")
    found: int = Field(0, description="Photos it was found on: a sure answer the expert did not correct, or the expert's label.")
    plants: int = Field(0, description="Plants it was found on.")
    first: datetime | None = Field(None, description="When the first photo it was found on was taken (else classified).")
    last: datetime | None = Field(None, description="When the last photo it was found on was taken (else classified).")
    cause: str = Field("", description="What causes it.")
    look_for: str = Field("", description="What to look for on the plant to confirm it by eye.")
    spread: str = Field("", description="How and when it spreads.")
    act: str = Field("", description="What is done about it (general advice: ask the local extension service before spraying).")
    urgency: str = Field("", description="Why it cannot wait; empty where it can.")
    looks_like: list[str] = Field([], description="Classes it is often confused with.")
    source: str = Field("", description="Where to read more (a web address).")

    @classmethod
    def of(cls, v) -> ClassOut:
        """From a :class:`edge_agent.web.class_pages.ClassView`."""
        note = v.note
        text = {k: getattr(note, k) for k in ("cause", "look_for", "spread", "act", "urgency", "source")} if note else {}
        looks = list(note.looks_like) if note else []
        return cls(
            label=v.label,
            crop=v.crop,
            title=v.title,
            disease=v.disease,
            known=v.known,
            photos=v.season.photos,
            sure=v.season.sure,
            labelled=v.season.labelled,
            found=v.season.found,
            plants=v.season.plants,
            first=_stamp(v.season.first),
            last=_stamp(v.season.last),
            looks_like=looks,
            **text,
        )


class ClassNotesIn(BaseModel):
    """This farm's notes on a class (what the class's page writes): each key given replaces the shipped note's; one
    absent or empty shows the note below it."""

    name: str = Field("", max_length=2000, description="The farm's name for the class.")
    look_for: str = Field("", max_length=2000, description="What to look for on the plant to confirm it.")
    cause: str = Field("", max_length=2000, description="What causes it.")
    spread: str = Field("", max_length=2000, description="How and when it spreads.")
    act: str = Field("", max_length=2000, description="What is done about it.")
    urgency: str = Field("", max_length=2000, description="Why it cannot wait; empty where it can.")
    source: str = Field("", max_length=2000, description="Where to read more (a web address).")


class SpotLabelIn(BaseModel):
    """The expert's answer for several photos of one spot (taken within 15 m of a photo, the same visit)."""

    label: str = Field(description="The photos' true class.")
    new_class: bool = Field(False, description="True: the class is new to the model (it will learn it).")
    photos: list[str] = Field(
        max_length=500, description="The sha256 of each photo of the spot to label (as /api/v1/results?near= gives them)."
    )


class Classes(BaseModel):
    """Every class the model in service knows, crop by crop."""

    classes: list[ClassOut]


SCHEMAS: tuple[type[BaseModel], ...] = (
    BackupAsked,
    Problem,
    Result,
    ResultsPage,
    Pending,
    ReviewQueue,
    LabelIn,
    Labelled,
    PlantLabelIn,
    PlantLabelled,
    PlantRenameIn,
    PlantRenamed,
    Engines,
    RollbackIn,
    RolledBack,
    Health,
    Fleet,
    Alerts,
    Plants,
    PlantOut,
    Classes,
    ClassOut,
    ClassNotesIn,
    SpotLabelIn,
)
