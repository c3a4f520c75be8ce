"""The API's endpoints: each one's method, path, role, parameters and models in one table, which both the
routes and the OpenAPI document are built from."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import islice

from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_agent.board import as_reported
from edge_agent.capture_place import NEAR_M
from edge_agent.plants import PLANT_NAME, PLANT_VIEWS, PlantDiagnosis
from edge_agent.results import query_readonly
from edge_agent.review.queue import PlantLabelled, left_today, others_labelled, to_ask
from edge_agent.web.api import schemas as s
from edge_agent.web.backup_now import ask
from edge_agent.web.class_pages import season_classes
from edge_agent.web.context import BadParameter, Refused, WebContext, parse_day, parse_int, parse_near
from edge_agent.web.photos import is_sha256
from edge_agent.web.queries import Filters
from edge_agent.web.upload import plant_folder, store_upload

__all__ = ["Param", "Endpoint", "ENDPOINTS", "MAX_WAIT_S", "recent_alerts"]

MAX_WAIT_S = 120
MAX_PAGE_SIZE = 200
Handler = Callable[[WebContext, Request], Awaitable[BaseModel | Response]]


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # query | path
    description: str
    type: str = "string"
    pattern: str = ""  # a string's regular expression in the document (what a valid value looks like)


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # under /api/v1
    role: str  # read | label | admin
    summary: str
    handler: Handler
    response: type[BaseModel] | None
    params: tuple[Param, ...] = ()
    body: type[BaseModel] | str | None = None  # a model (JSON) or "image" (a photo's bytes)
    errors: dict[int, str] = field(default_factory=dict)
    extra: dict[int, tuple[type[BaseModel], str]] = field(default_factory=dict)


async def _json_body(request: Request, model: type[BaseModel]) -> BaseModel:
    raw = await request.body()
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "body"
        raise BadParameter(f"{where}: {first.get('msg', 'invalid')} (send JSON like {model.model_json_schema().get('required')})") from None


# ---- results --------------------------------------------------------------------
def _plant_name(q, key: str) -> str:
    """The query's ``key``, a plant's name or part of one; refused past 64 characters (no plant's name is longer)."""
    value = q.get(key, "")
    if len(value) > 64:
        raise BadParameter(f"{key}: at most 64 characters (a plant's name is no longer)")
    return value


async def results(ctx: WebContext, request: Request) -> s.ResultsPage:
    q = request.query_params
    verdict = q.get("verdict", "")
    if verdict not in ("", "confident", "unsure", "unknown"):
        raise BadParameter(f"verdict must be confident, unsure or unknown, not {verdict[:20]!r}")
    near, within = parse_near(q)
    filters = Filters(q.get("label", ""), parse_day(q.get("from")), parse_day(q.get("to")), verdict, _plant_name(q, "plant"), near, within)
    page, size = parse_int(q.get("page")), parse_int(q.get("size"), default=ctx.cfg.web.page_size, hi=MAX_PAGE_SIZE)
    rows, total = await run_in_threadpool(ctx.reader.recent, filters, page, max(1, size))
    said = await run_in_threadpool(ctx.reader.expert_labels, [r.sha256 for r in rows])
    return s.ResultsPage(total=total, page=page, size=max(1, size), results=[s.Result.of(r, said.get(r.sha256)) for r in rows])


async def result(ctx: WebContext, request: Request) -> s.Result:
    sha = request.path_params["sha256"]
    if not is_sha256(sha):
        raise Refused(404, "not a photo's sha256 (64 hex digits)")
    row = await run_in_threadpool(ctx.reader.photo, sha)
    if row is None:
        raise Refused(404, f"no result for {sha}: not classified (yet), or never seen")
    said = await run_in_threadpool(ctx.reader.expert_labels, [sha])
    return s.Result.of(row, said.get(sha))


async def classify(ctx: WebContext, request: Request) -> s.Result | Response:
    q = request.query_params
    wait = parse_int(q.get("wait"), default=30, hi=MAX_WAIT_S)
    cap = ctx.cfg.preprocess.max_file_bytes
    if (request.headers.get("content-type") or "").startswith("multipart/form-data"):
        form = await request.form(max_files=1, max_fields=2)
        f = form.get("photo")
        if not hasattr(f, "read"):
            raise BadParameter("a multipart upload needs the photo in the field 'photo' (curl -F photo=@leaf.jpg)")
        name, data = f.filename or "", await f.read(cap + 1)
    else:
        name, data = q.get("name", "upload"), await request.body()
    if not data:
        raise BadParameter("no photo: send its bytes as the body (curl --data-binary @leaf.jpg) or as -F photo=@leaf.jpg")
    outcome = await run_in_threadpool(store_upload, name, data, _plant_folder(ctx, q.get("plant")), cap, ctx.cfg.preprocess.max_pixels)
    if outcome.status != 201:
        raise Refused(outcome.status, outcome.error or "not stored")
    deadline = time.monotonic() + wait
    while True:
        row = await run_in_threadpool(ctx.reader.photo, outcome.sha256)
        if row is not None:
            return s.Result.of(row)
        reason = await run_in_threadpool(ctx.reader.quarantined, outcome.stored_as)
        if reason:
            raise Refused(422, f"the daemon could not classify it: {reason}")
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    _, running = ctx.daemon()
    pending = s.Pending(
        sha256=outcome.sha256, stored_as=outcome.stored_as, result=f"/api/v1/results/{outcome.sha256}", daemon_running=running
    )
    return JSONResponse(pending.model_dump(mode="json"), status_code=202)


def _plant_folder(ctx: WebContext, plant: str | None):
    """Where an upload goes: the inbox, or with ``plant`` that plant's subfolder of it."""
    try:
        return plant_folder(ctx.inbox, plant, ctx.reader.plant_named)
    except ValueError as exc:
        raise BadParameter(f"plant: {exc}") from None


# ---- plants -----------------------------------------------------------------------
def _plant(name: str, rows, d: PlantDiagnosis, said: dict[str, str], visits: list | None = None) -> s.PlantOut:
    """One plant as the API gives it; with ``visits`` (:meth:`WebContext.visits`), its photos' results and its visits."""
    return s.PlantOut(
        plant=name,
        last=datetime.fromtimestamp(max(r.when for r in rows), timezone.utc),
        results=[s.Result.of(r, said.get(r.sha256)) for r in rows] if visits is not None else None,
        visits=[s.VisitOut(began=datetime.fromtimestamp(t, timezone.utc), **v.as_dict()) for t, v in visits]
        if visits is not None
        else None,
        **{**d.as_dict(), "photos": d.photos + d.earlier, "visit_photos": d.photos},
    )


def _plants(ctx: WebContext, limit: int, match: str, view: str) -> s.Plants:
    return s.Plants(plants=[_plant(*p) for p in islice(ctx.plants(match, view, limit), limit)])


async def plants(ctx: WebContext, request: Request) -> s.Plants:
    q = request.query_params
    match, view = _plant_name(q, "q").strip(), q.get("show", "")
    if view not in PLANT_VIEWS:
        raise BadParameter(f"show must be sick or unsure, not {view[:20]!r}")
    return await run_in_threadpool(_plants, ctx, parse_int(q.get("limit"), default=50, hi=500), match, view)


async def plant(ctx: WebContext, request: Request) -> s.PlantOut:
    name = request.path_params["plant"]
    rows = await run_in_threadpool(ctx.reader.plant, name)
    if not rows:
        raise Refused(404, f"no photos of a plant named {name[:64]!r} (a plant is an inbox subfolder, or ?plant= on classify)")
    k = len(ctx.classes())
    d, said = await run_in_threadpool(ctx.plant, rows, k)
    return _plant(name, rows, d, said, await run_in_threadpool(ctx.visits, rows, k))


# ---- review ---------------------------------------------------------------------
def _review(ctx: WebContext) -> s.ReviewQueue:
    per_day = ctx.cfg.labels.review_per_day
    db = ctx.db()
    if db is None:
        return s.ReviewQueue(left_today=None if per_day <= 0 else per_day, per_day=per_day, items=[])
    try:
        items, left = to_ask(db, per_day, wanted=ctx.wanted(), policy=ctx.cfg.labels), left_today(db, per_day)
        limit, gap = ctx.cfg.classify.plant_max_photos, ctx.cfg.classify.plant_visit_gap_s
        out = []
        for it in items:
            beside = others_labelled(db, it, limit, gap)
            labels = {f"{beside.of}_labels": dict(beside.labels)} if beside.of else {}
            out.append(s.ReviewItemOut(**it.as_json(), **labels))
    finally:
        db.close()
    return s.ReviewQueue(left_today=left, per_day=per_day, items=out)


async def review(ctx: WebContext, request: Request) -> s.ReviewQueue:
    return await run_in_threadpool(_review, ctx)


async def review_label(ctx: WebContext, request: Request) -> s.Labelled:
    body = await _json_body(request, s.LabelIn)
    entry = await run_in_threadpool(ctx.label, request.path_params["photo"], body.label, body.new_class)
    return s.Labelled(photo_id=entry.photo_id, sha256=entry.sha256, label=body.label.strip())


async def plant_label(ctx: WebContext, request: Request) -> s.PlantLabelled:
    body = await _json_body(request, s.PlantLabelIn)
    if body.photos and not all(is_sha256(sha) for sha in body.photos):
        raise BadParameter("photos: each a photo's sha256 (64 hex digits, as /api/v1/plants/{plant} gives them)")
    return _labelled(await run_in_threadpool(ctx.label_plant, request.path_params["plant"], body.label, body.new_class, body.photos))


def _labelled(done: PlantLabelled) -> s.PlantLabelled:
    """What labelling several photos at once did (a plant's, a spot's), as the API answers it."""
    return s.PlantLabelled(
        plant=done.plant,
        label=done.label,
        labelled=[s.Labelled(photo_id=e.photo_id, sha256=e.sha256, label=done.label) for e in done.labelled],
        not_labelled=[s.NotLabelled(sha256=sha, reason=why) for sha, why in done.missed],
    )


async def spot_label(ctx: WebContext, request: Request) -> s.PlantLabelled:
    body = await _json_body(request, s.SpotLabelIn)
    sha = request.path_params["sha256"]
    if not is_sha256(sha) or not all(is_sha256(p) for p in body.photos):
        raise BadParameter("the photo and each of photos: a photo's sha256 (64 hex digits)")
    return _labelled(await run_in_threadpool(ctx.label_spot, sha, body.label, body.new_class, body.photos))


async def plant_rename(ctx: WebContext, request: Request) -> s.PlantRenamed:
    body = await _json_body(request, s.PlantRenameIn)
    done = await run_in_threadpool(ctx.rename_plant, request.path_params["plant"], body.to)
    return s.PlantRenamed(old=done.old, plant=done.new, photos=done.photos, merged=done.merged, folder=done.folder, note=done.folder_note)


# ---- engines --------------------------------------------------------------------
def _engines(ctx: WebContext) -> s.Engines:
    store, current = ctx.store(), ctx.current()
    versions = [s.EngineVersion(name=v, current=v == current, manifest=store.read_manifest(v)) for v in reversed(store.versions())]
    return s.Engines(current=current, pin=store.pin(), versions=versions)


async def engines(ctx: WebContext, request: Request) -> s.Engines:
    return await run_in_threadpool(_engines, ctx)


async def rollback(ctx: WebContext, request: Request) -> s.RolledBack | Response:
    body = await _json_body(request, s.RollbackIn)
    done = await run_in_threadpool(ctx.rollback, body.to)
    out = s.RolledBack(current=done.to, pin=done.pin, state=done.state, reason=done.reason)
    if done.state in ("serving", "stopped"):
        return out
    return JSONResponse(out.model_dump(mode="json"), status_code=202 if done.state == "pending" else 409)


async def backup_now(ctx: WebContext, request: Request) -> s.BackupAsked:
    return s.BackupAsked(**await run_in_threadpool(ask, ctx))


# ---- health, fleet, alerts ------------------------------------------------------
def _health(ctx: WebContext) -> s.Health:
    (daemon, daemon_up), (trainer, trainer_up) = ctx.daemon(), ctx.trainer()
    root = ctx.state.root if ctx.state.root.exists() else ctx.state.root.parent
    return s.Health(
        daemon=s.Service(running=daemon_up, status=daemon),
        trainer=s.Service(running=trainer_up, status=trainer),
        counts=ctx.counts(),
        disk_free_bytes=shutil.disk_usage(root).free,
        board=as_reported(daemon, daemon_up),
        next_publish=trainer.get("next_publish") if trainer else None,
        retention=daemon.get("retention") if daemon_up else None,
    )


async def health(ctx: WebContext, request: Request) -> s.Health:
    return await run_in_threadpool(_health, ctx)


async def fleet(ctx: WebContext, request: Request) -> s.Fleet:
    tv = ctx.trainer_view()
    if tv["where"] != "here":
        return s.Fleet(trainer_running=False, devices=[])
    return s.Fleet(
        trainer_running=tv["up"], devices=tv["fleet"], rollout=tv.get("rollout"), handshakes_refused=tv.get("handshakes_refused") or []
    )


def recent_alerts(ctx: WebContext, limit: int) -> s.Alerts:
    """The newest ``limit`` alerts of the ledger (the Health page shows a few)."""
    path = ctx.state.root / "alerts.sqlite"
    rows = query_readonly(
        path, "SELECT id, created, device, label, confidence, verdict, photo_id, sha256 FROM alerts ORDER BY id DESC LIMIT ?", (limit,)
    )
    out = [
        s.AlertOut(
            id=i,
            created=datetime.fromtimestamp(t, timezone.utc),
            device=d,
            label=lab,
            confidence=c,
            verdict=v,
            photo_id=p,
            page=f"/photo/{sha}",
        )
        for i, t, d, lab, c, v, p, sha in rows
    ]
    return s.Alerts(alerts=out)


async def alerts(ctx: WebContext, request: Request) -> s.Alerts:
    return await run_in_threadpool(recent_alerts, ctx, parse_int(request.query_params.get("limit"), default=50, hi=1000))


async def classes(ctx: WebContext, request: Request) -> s.Classes:
    return s.Classes(classes=[s.ClassOut.of(v) for v in await run_in_threadpool(season_classes, ctx)])


async def class_notes(ctx: WebContext, request: Request) -> s.ClassOut:
    body = await _json_body(request, s.ClassNotesIn)
    await run_in_threadpool(ctx.write_notes, request.path_params["label"], body.model_dump())
    return await one_class(ctx, request)


async def one_class(ctx: WebContext, request: Request) -> s.ClassOut:
    label = request.path_params["label"]
    view = next((v for v in await run_in_threadpool(season_classes, ctx) if v.label == label), None)
    if view is None:
        raise Refused(404, f"the model knows no class {label[:100]!r} (GET /api/v1/classes lists them)")
    return s.ClassOut.of(view)


_DAY = "A local day, YYYY-MM-DD (inclusive), of when the photo was taken (its EXIF), else classified."
#: The path parameter of one plant's endpoints.
_PLANT = (Param("plant", "path", "The plant's name (its inbox subfolder).", pattern="^" + PLANT_NAME + "$"),)

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "GET",
        "/results",
        "read",
        "Results, newest first, filtered and paged.",
        results,
        s.ResultsPage,
        (
            Param("label", "query", "Only this class."),
            Param("verdict", "query", "Only this verdict: confident, unsure or unknown."),
            Param("plant", "query", "Only this plant's photos (its name, as /plants lists it)."),
            Param("from", "query", _DAY),
            Param("to", "query", _DAY),
            Param("near", "query", "Only photos taken near this place (its EXIF GPS): latitude,longitude in degrees."),
            Param("within", "query", f"How near to ``near``, in metres (1 to 10000; default {NEAR_M}).", "integer"),
            Param("page", "query", "Page number from 0.", "integer"),
            Param("size", "query", f"Results per page (1 to {MAX_PAGE_SIZE}; default [web] page_size).", "integer"),
        ),
    ),
    Endpoint(
        "GET",
        "/results/{sha256}",
        "read",
        "One photo's result, by its sha256.",
        result,
        s.Result,
        (Param("sha256", "path", "The photo's SHA-256 (as /results and classify give it).", pattern="^[0-9a-f]{64}$"),),
        errors={404: "Not classified (yet)."},
    ),
    Endpoint(
        "POST",
        "/classify",
        "label",
        "Put a photo into the inbox and wait for its result.",
        classify,
        s.Result,
        (
            Param("wait", "query", f"Seconds to wait for the result (0 to {MAX_WAIT_S}, default 30).", "integer"),
            Param("name", "query", "The photo's file name, when its bytes are the body."),
            Param(
                "plant",
                "query",
                "The plant it shows: photos sent with the same name get one diagnosis (/plants).",
                pattern="^" + PLANT_NAME + "$",
            ),
        ),
        body="image",
        errors={
            413: "Larger than [preprocess] max_file_bytes or max_pixels.",
            415: "Not an image edge-agent reads.",
            422: "The daemon quarantined it (the reason is given).",
            500: "The inbox could not be written for another reason than room (the folder and the system's error named).",
            503: "Two large uploads are being received already; try again after Retry-After.",
            507: "No room in the inbox: the device's disk is full.",
        },
        extra={202: (s.Pending, "Accepted; the result was not ready within wait.")},
    ),
    Endpoint(
        "GET",
        "/plants",
        "read",
        "The plants photographed (inbox subfolders), the most recent first, each with its combined diagnosis.",
        plants,
        s.Plants,
        (
            Param("limit", "query", "At most this many (1 to 500, default 50).", "integer"),
            Param("q", "query", "Only the plants whose name holds this text, in any case (at most 64 characters)."),
            Param("show", "query", "Only the plants sure of a disease or labelled so by the expert (sick), or left unsure (unsure)."),
        ),
    ),
    Endpoint(
        "GET",
        "/plants/{plant}",
        "read",
        "One plant: its photos' answers combined into one diagnosis, and each photo's result.",
        plant,
        s.PlantOut,
        _PLANT,
        errors={404: "No photos of that plant."},
    ),
    Endpoint(
        "POST",
        "/plants/{plant}/label",
        "label",
        "Give several photos of one plant the same true class, each as a photo's own label (a later label replaces an earlier).",
        plant_label,
        s.PlantLabelled,
        _PLANT,
        body=s.PlantLabelIn,
        errors={404: "No photos of that plant."},
    ),
    Endpoint(
        "POST",
        "/plants/{plant}/rename",
        "label",
        "Rename a plant (a name typed wrong), or merge it into another: its photos' records move to the new name.",
        plant_rename,
        s.PlantRenamed,
        _PLANT,
        body=s.PlantRenameIn,
        errors={404: "No photos of that plant."},
    ),
    Endpoint(
        "POST",
        "/results/{sha256}/spot/label",
        "label",
        "Give the photos of one spot (taken within 15 m of this photo, the same visit: one tree without a folder) the same true class.",
        spot_label,
        s.PlantLabelled,
        (Param("sha256", "path", "A photo of the spot (its SHA-256).", pattern="^[0-9a-f]{64}$"),),
        body=s.SpotLabelIn,
        errors={404: "No such photo, or no photos taken beside it."},
    ),
    Endpoint("GET", "/review", "read", "Today's questions for the expert, best first.", review, s.ReviewQueue),
    Endpoint(
        "POST",
        "/review/{photo}/label",
        "label",
        "Give a photo its true class: one of the review queue, or any other still kept (a later label replaces an earlier).",
        review_label,
        s.Labelled,
        (
            Param(
                "photo",
                "path",
                "Its photo id (16 hex digits, as results give it) or sha256 (or 8+ hex digits of it).",
                pattern="^[0-9a-f]{8,64}$",
            ),
        ),
        body=s.LabelIn,
        errors={404: "No such photo, or its file is no longer kept."},
    ),
    Endpoint(
        "GET", "/classes", "read", "Every class the model knows, with what causes it, what to look for and what to do.", classes, s.Classes
    ),
    Endpoint(
        "GET",
        "/classes/{label}",
        "read",
        "One class, with the notes on it and the season's photos of it.",
        one_class,
        s.ClassOut,
        (Param("label", "path", "The model's name for it, as /classes lists it (URL-encoded)."),),
        errors={404: "The model knows no such class."},
    ),
    Endpoint(
        "POST",
        "/classes/{label}/notes",
        "label",
        "Write this farm's notes on a class (its language, its extension service's advice): each key over the shipped one.",
        class_notes,
        s.ClassOut,
        (Param("label", "path", "The model's name for it, as /classes lists it (URL-encoded)."),),
        body=s.ClassNotesIn,
        errors={404: "The model knows no such class."},
    ),
    Endpoint("GET", "/engines", "read", "The engine versions, the one in service and the pin.", engines, s.Engines),
    Endpoint(
        "POST",
        "/engines/rollback",
        "admin",
        "Put an earlier version back in service (verified first), pin it, and wait until the daemon serves it.",
        rollback,
        s.RolledBack,
        body=s.RollbackIn,
        errors={
            404: "No such version.",
            409: "It failed verification (tampered or incomplete), or the daemon refused it (state refused, with the reason).",
        },
        extra={202: (s.RolledBack, "Put in the store; the daemon had not taken it within two hot swap polls.")},
    ),
    Endpoint(
        "POST",
        "/backup",
        "admin",
        "Ask the daemon for a backup into [backup] dir now (it writes it within a minute, as the daily ones; GET /health says when).",
        backup_now,
        s.BackupAsked,
        errors={409: "No [backup] dir is set.", 507: "The state directory cannot be written."},
    ),
    Endpoint("GET", "/health", "read", "The daemon's and trainer's status, queues, disk, temperature and power.", health, s.Health),
    Endpoint("GET", "/fleet", "read", "The daemons served by a trainer on this machine.", fleet, s.Fleet),
    Endpoint(
        "GET",
        "/alerts",
        "read",
        "Recent alerts, newest first.",
        alerts,
        s.Alerts,
        (Param("limit", "query", "How many (default 50, at most 1000).", "integer"),),
    ),
)
