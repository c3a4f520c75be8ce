"""The page's routes: recent photos, the review queue, how far to trust each class, engines, health, upload;
and where the JSON API (:mod:`edge_agent.web.api`) and ``/metrics`` are mounted.

Everything is rendered on the server from the state directory the daemon and trainer write; the only writes
are an expert's label (the same :func:`~edge_agent.review.queue.label_photo` as ``edge-agent review label``),
a rollback (the same :meth:`~engines.store.EngineStore.rollback` as ``edge-agent engine rollback``) and
photos put into the inbox.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from datetime import datetime
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from edge_agent.backup import last_backup
from edge_agent.backup_schedule import backup_lines, requested
from edge_agent.board import as_reported
from edge_agent.capture_place import NEAR_M, geo_uri
from edge_agent.export import csv_lines
from edge_agent.imageheader import ImageRejected
from edge_agent.ledger_check import check_line, request_check
from edge_agent.log import get_logger
from edge_agent.names import pretty_class
from edge_agent.results import LedgerUnreadable
from edge_agent.review.checks import standing, trust_table
from edge_agent.review.queue import Beside, left_today, others_labelled, to_ask
from edge_agent.state import last_written
from edge_agent.storage_errors import READ_ONLY_DISK, storage_problem
from edge_agent.web import charts
from edge_agent.web._errors import refusal, storage_refusal
from edge_agent.web._limits import BodyLimit
from edge_agent.web.api import api_routes
from edge_agent.web.api.endpoints import recent_alerts
from edge_agent.web.auth import AccessMiddleware, Tokens, allowed, csrf_ok, csrf_secret, forbidden_text, is_local_bind
from edge_agent.web.backup_now import backup_routes
from edge_agent.web.class_pages import class_routes
from edge_agent.web.context import BadParameter, Refused, WebContext, page_filters, parse_int
from edge_agent.web.hosts import HostCheck, page_names
from edge_agent.web.map_page import map_routes
from edge_agent.web.metrics import CONTENT_TYPE as METRICS_TYPE
from edge_agent.web.metrics import render as render_metrics
from edge_agent.web.photo_pages import photo_routes
from edge_agent.web.photos import SIZES, PhotoFiles, is_sha256
from edge_agent.web.plant_pages import plant_routes
from edge_agent.web.upload import plant_folder, store_upload
from engines.durable import read_only_disk

__all__ = ["create_app", "WebContext"]

HERE = Path(__file__).parent
MAX_FILES_PER_UPLOAD = 50


def verdict_text(verdict: str | None) -> str:
    """What the farmer reads for a verdict that is not ``confident``."""
    from edge_agent.verdict import PHRASES

    text = PHRASES.get(verdict or "", "")
    return text[:1].upper() + text[1:]


def score_class(probability: float, verdict: str | None) -> str:
    """How a score is coloured: low under 0.6; high from 0.9, beside a sure answer only (a guess's 100 % is no finding)."""
    if probability < 0.6:
        return "low"
    return "high" if probability >= 0.9 and verdict not in ("unsure", "unknown") else ""


def local_time(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def shown_name(row) -> str:
    """A result's photo as people know it: the file name it arrived under, else its source (a camera)."""
    return Path(row.path).name if row.path else row.source


#: How many plant names the Upload page's name field offers (the most recently photographed).
KNOWN_PLANTS_OFFERED = 500


def create_app(ctx: WebContext) -> Starlette:
    ctx.notes.labels()  # a notes file that cannot be used stops the page at start (NotesError), not at a photo
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals.update(
        colour=charts.class_colour,
        sizes=SIZES,
        visit_gap_h=ctx.cfg.classify.plant_visit_gap_h,
        near_m=NEAR_M,
        notes=ctx.notes_source,  # read again when a file changes (a farm's file, the page's own)
    )
    templates.env.filters.update(
        pretty=pretty_class,
        localtime=local_time,
        localday=lambda t: datetime.fromtimestamp(t).strftime("%d %b %Y"),
        shown_name=shown_name,
        verdict_text=verdict_text,
        score_class=score_class,
        geo=lambda p: geo_uri(*p),
    )
    files = PhotoFiles(ctx.state.root, ctx.inbox, ctx.reader, ctx.cfg.preprocess.max_file_bytes, ctx.cfg.preprocess.max_pixels)

    def page(request: Request, template: str, status: int = 200, **context) -> Response:
        try:
            review_n = nav_review()
        except (sqlite3.DatabaseError, OSError):
            if template != "problem.html":
                raise
            review_n = 0  # the page that says the records cannot be read (a failing disk) must still show
        return templates.TemplateResponse(
            request, template, {"csrf": request.state.csrf, "nav_review": review_n, **context}, status_code=status
        )

    def nav_review() -> int:
        """What the review page would ask today, for the menu: the pool, capped by what is left of the budget."""
        db = ctx.db()
        if db is None:
            return 0
        try:
            left = left_today(db, ctx.cfg.labels.review_per_day)
            pool = db.counts()["review_queue"]
        finally:
            db.close()
        return pool if left is None else min(pool, left)

    def problem(request: Request, status: int, message: str) -> Response:
        return page(request, "problem.html", status=status, message=message, code=status)

    def refused(request: Request, role: str) -> Response | None:
        """403 when the request's token may not do what ``role`` may (None when it may)."""
        if allowed(request, role):
            return None
        return problem(request, 403, forbidden_text(request.state.role, role))

    async def form(request: Request, role: str, fields: int = 20):
        """A write's form, once the request's token may do what ``role`` may and the form's CSRF token is right; else
        :class:`Refused` (403), shown as a page."""
        if not allowed(request, role):
            raise Refused(403, forbidden_text(request.state.role, role))
        data = await request.form(max_files=0, max_fields=fields)
        if not csrf_ok(request, data.get("csrf")):
            raise Refused(403, "the form is stale (CSRF token missing or wrong): reload the page")
        return data

    # ---- recent photos ------------------------------------------------------
    async def photos(request: Request) -> Response:
        q = request.query_params
        filters = page_filters(request.query_params)
        pg = parse_int(q.get("page"))
        size = ctx.cfg.web.page_size
        rows, total = ctx.reader.recent(filters, pg, size)
        return page(
            request,
            "photos.html",
            photos=rows,
            said=ctx.reader.expert_labels([r.sha256 for r in rows]),
            total=total,
            page=pg,
            pages=max(1, -(-total // size)),
            filters=filters,
            labels=ctx.reader.labels(),
            query=q,
        )

    async def photos_csv(request: Request) -> Response:
        """The Photos page's photos (its filters; every page of them) as a CSV file for a spreadsheet."""
        name = f"edge-agent-photos-{datetime.now():%Y-%m-%d}.csv"
        headers = {"Content-Disposition": f'attachment; filename="{name}"'}
        return StreamingResponse(
            csv_lines(ctx.reader.each(page_filters(request.query_params))), media_type="text/csv; charset=utf-8", headers=headers
        )

    async def image(request: Request) -> Response:
        size, sha = request.path_params["size"], request.path_params["sha"]
        if size not in SIZES or not is_sha256(sha):
            return Response("no such image\n", 404, media_type="text/plain")
        try:
            data = await run_in_threadpool(files.image, sha, size)
        except (ImageRejected, OSError) as exc:
            return Response(f"{exc}\n", 422, media_type="text/plain")
        if data is None:
            return Response("the daemon kept no copy of this photo\n", 404, media_type="text/plain")
        return Response(data, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=86400"})

    # ---- review -------------------------------------------------------------
    async def review(request: Request) -> Response:
        db = ctx.db()
        items, left, beside = [], None, Beside([])
        i = parse_int(request.query_params.get("i"))
        if db is not None:
            try:
                items = to_ask(db, ctx.cfg.labels.review_per_day, wanted=ctx.wanted(), policy=ctx.cfg.labels)
                left = left_today(db, ctx.cfg.labels.review_per_day)
                if i < len(items):
                    beside = others_labelled(db, items[i], ctx.cfg.classify.plant_max_photos, ctx.cfg.classify.plant_visit_gap_s)
            finally:
                db.close()
        item = items[i] if i < len(items) else None
        done_sha = sha if is_sha256(sha := request.query_params.get("sha", "")) else None
        return page(
            request,
            "review.html",
            item=item,
            beside=await run_in_threadpool(ctx.unlabelled_beside, done_sha) if done_sha else None,  # the plant's other photos
            same_plant=dict(beside.labels),
            same_of="of this plant" if beside.of == "plant" else f"taken within {NEAR_M} m of it",
            i=i,
            n=len(items),
            left=left,
            per_day=ctx.cfg.labels.review_per_day,
            classes=ctx.classes(),
            done=request.query_params.get("done"),
            done_sha=done_sha,
        )

    async def review_label(request: Request) -> Response:
        data = await form(request, "label")
        sha, label = str(data.get("photo", "")), str(data.get("label", ""))
        entry = await run_in_threadpool(ctx.label, sha, label, data.get("new_class") == "1")  # Refused: its status page
        return RedirectResponse(f"/review?i={parse_int(data.get('i'))}&done={entry.photo_id}&sha={entry.sha256}", status_code=303)

    async def trust(request: Request) -> Response:
        db = ctx.db()
        rows, table, columns, withdrawn = [], {}, [], {}
        if db is not None:
            try:
                rows, table, columns = trust_table(db, ctx.cfg.labels)
                withdrawn = db.withdrawn_counts()
            finally:
                db.close()
        labels = sum(r.labelled for r in rows)
        fresh = standing("", [], ctx.cfg.labels).needed  # right checks a class never checked needs
        return page(
            request,
            "trust.html",
            rows=rows,
            confusion=table,
            columns=columns,
            labels=labels,
            policy=ctx.cfg.labels,
            fresh=fresh,
            withdrawn=withdrawn,
        )

    # ---- engines ------------------------------------------------------------
    async def engines(request: Request) -> Response:
        store = ctx.store()
        versions = [{"name": v, **store.read_manifest(v)} for v in reversed(store.versions())]
        trainer, trainer_up = ctx.trainer()
        view = ctx.served()
        return page(
            request,
            "engines.html",
            versions=versions,
            current=view["serving"],
            served=view,
            trainer=trainer,
            trainer_up=trainer_up,
            tv=ctx.trainer_view(),
            rolled=request.query_params.get("rolled"),
            pin=view["pinned"],
        )

    async def rollback(request: Request) -> Response:
        data = await form(request, "admin")
        to = str(data.get("to", ""))
        if data.get("confirm") != "yes":
            return problem(request, 400, "a rollback must be confirmed")
        done = await run_in_threadpool(ctx.rollback, to)  # files and signature checked, then the daemon waited for
        return RedirectResponse(f"/engines?rolled={done.to}", status_code=303)

    async def unpin(request: Request) -> Response:
        await form(request, "admin")
        await run_in_threadpool(ctx.store_to_change().unpin)
        return RedirectResponse("/engines", status_code=303)

    # ---- health -------------------------------------------------------------
    async def health(request: Request) -> Response:
        daemon, daemon_up = ctx.daemon()
        trainer, trainer_up = ctx.trainer()
        reader = ctx.reader
        disk = shutil.disk_usage(ctx.state.root if ctx.state.root.exists() else Path("."))
        view = ctx.served()
        now = time.time()
        per_day = reader.per_day_per_class(14)
        totals: dict[str, int] = {}
        for day in per_day.values():
            for label, n in day.items():
                totals[label] = totals.get(label, 0) + n
        return page(
            request,
            "health.html",
            legend=sorted(totals.items(), key=lambda kv: -kv[1]),
            daemon=daemon,
            daemon_up=daemon_up,
            read_only=READ_ONLY_DISK if read_only_disk(ctx.state.root) else None,
            daemon_last=None if daemon_up else last_written(daemon),
            records=check_line(daemon.get("ledger_check"), now) if daemon_up else None,
            records_damaged=bool(((daemon.get("ledger_check") or {}).get("last") or {}).get("damaged")),
            trainer=trainer,
            trainer_up=trainer_up,
            counts=ctx.counts(),
            quota=ctx.cfg.labels.max_spool_mb << 20,
            disk=disk,
            last_hour=reader.photos_since(now - 3600),
            last_day=reader.photos_since(now - 86400),
            per_day_svg=charts.photos_per_day(per_day, 14),
            top1_svg=charts.top1_same_photos(charts.same_photo_rows(ctx.store(), view["serving"])),
            served=view,
            tv=ctx.trainer_view(),
            quarantine=reader.recent_quarantine(),
            now=now,
            board=as_reported(daemon, daemon_up),
            alerts=recent_alerts(ctx, 3).alerts,
            notes_problem=(ctx.notes, ctx.notes_source.problem)[1],  # read now: a file changed since is checked
            backup=backup_lines(
                ctx.cfg.backup, last_backup(ctx.state.root), daemon.get("backup") if daemon_up else None, now, requested(ctx.state.root)
            ),
            backup_dir=ctx.cfg.backup.dir,
        )

    # ---- fleet --------------------------------------------------------------
    async def fleet(request: Request) -> Response:
        return page(request, "fleet.html", tv=ctx.trainer_view(), now=time.time())

    # ---- upload -------------------------------------------------------------
    def known_plants() -> list[str]:
        """The plants photographed, the most recent first, for the Upload page's name field to offer (no name typed twice)."""
        return [name for name, _, _ in ctx.reader.plants(KNOWN_PLANTS_OFFERED)]

    async def upload_page(request: Request) -> Response:
        return page(request, "upload.html", cap=ctx.cfg.preprocess.max_file_bytes, outcomes=None, known_plants=known_plants())

    async def upload(request: Request) -> Response:
        if (no := refused(request, "label")) is not None:
            return no
        cap = ctx.cfg.preprocess.max_file_bytes
        length = request.headers.get("content-length")
        if length is None:
            return problem(request, 411, "an upload must say its length (Content-Length)")
        if not length.isdigit() or int(length) > MAX_FILES_PER_UPLOAD * cap + (1 << 20):
            return problem(request, 413, f"upload too large: at most {MAX_FILES_PER_UPLOAD} photos of {cap} bytes each")
        data = await request.form(max_files=MAX_FILES_PER_UPLOAD, max_fields=5)
        if not csrf_ok(request, data.get("csrf")):
            return problem(request, 403, "the form is stale (CSRF token missing or wrong): reload the page")
        try:
            folder = plant_folder(ctx.inbox, str(data.get("plant") or ""), ctx.reader.plant_named)
        except ValueError as exc:
            return problem(request, 400, str(exc))
        outcomes = []
        for f in data.getlist("photos"):
            if not hasattr(f, "read"):
                continue
            body = await f.read(cap + 1)
            outcomes.append(await run_in_threadpool(store_upload, f.filename or "", body, folder, cap, ctx.cfg.preprocess.max_pixels))
            await f.close()
        if not outcomes:
            return problem(request, 400, "no photo in the upload (field 'photos')")
        stored = [o for o in outcomes if o.status == 201]
        status = 201 if stored else outcomes[0].status
        plant = folder.name if stored and folder != ctx.inbox else None
        return page(request, "upload.html", status=status, cap=cap, outcomes=outcomes, plant=plant, known_plants=known_plants())

    async def metrics(request: Request) -> Response:
        return Response(await run_in_threadpool(render_metrics, ctx), media_type=METRICS_TYPE)

    async def root(request: Request) -> Response:
        return RedirectResponse("/photos", status_code=302)

    routes = [
        Route("/", root),
        Route("/photos", photos),
        Route("/photos.csv", photos_csv),
        *photo_routes(ctx, page, problem, form),
        Route("/img/{size}/{sha}", image),
        Route("/review", review),
        Route("/review/label", review_label, methods=["POST"]),
        Route("/trust", trust),
        *plant_routes(ctx, page, problem, form),
        *map_routes(ctx, page, local_time),
        *class_routes(ctx, page, problem, form),
        *backup_routes(ctx, form),
        Route("/engines", engines),
        Route("/engines/rollback", rollback, methods=["POST"]),
        Route("/engines/unpin", unpin, methods=["POST"]),
        Route("/health", health),
        Route("/fleet", fleet),
        Route("/upload", upload_page),
        Route("/upload", upload, methods=["POST"]),
        Route("/metrics", metrics),
        *api_routes(ctx),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    tokens = Tokens(ctx.state.root / "web")

    async def bad_parameter(request: Request, exc: BadParameter) -> Response:
        return problem(request, exc.status if isinstance(exc, Refused) else 400, str(exc))

    def answer(request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        """A refusal in the request's shape: JSON on the API (and before the page knows the request's role), else the page."""
        if request.url.path.startswith("/api/") or "role" not in request.scope.get("state", {}):
            return refusal(request.url.path, status, message, headers)
        return problem(request, status, message)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        """Starlette's own refusals (no such page, wrong method, a malformed multipart body) in this page's shape."""
        return answer(request, exc.status_code, str(exc.detail), exc.headers)

    async def server_error(request: Request, exc: Exception) -> Response:
        get_logger("web").error("web_request_failed", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return refusal(request.url.path, 500, "the device could not answer this request; its log says why (journalctl -u edge-agent)")

    async def storage_failed(request: Request, exc: Exception) -> Response:
        """A write the disk or the records did not take (a full disk: 507; locked: 503), or a damaged page met (503:
        the daemon is asked to read the ledger whole), said as such; else 500."""
        found = storage_problem(exc, ctx.state.root)  # (the folder, for Python 3.10's codeless errors)
        if found == "damaged":
            request_check(ctx.state.root)
        said = storage_refusal(found)
        if said is None:
            return await server_error(request, exc)
        status, message, headers = said
        get_logger("web").error("web_write_failed", path=request.url.path, status=status, error=f"{type(exc).__name__}: {exc}")
        return answer(request, status, message, headers)

    async def ledger_unreadable(request: Request, exc: LedgerUnreadable) -> Response:
        """503 while a database cannot be read (locked past the wait): said, never shown as an empty list."""
        get_logger("web").warning("web_database_unreadable", path=request.url.path, error=str(exc))
        message = "the device's records could not be read just now (another process holds them locked): try again in a few seconds"
        return refusal(request.url.path, 503, message, {"Retry-After": "5"})

    return Starlette(
        routes=routes,
        middleware=[
            Middleware(HostCheck, names=page_names(ctx.bind, ctx.cfg.web.hosts)),
            Middleware(
                BodyLimit,
                default=1 << 20,
                paths={
                    "/upload": MAX_FILES_PER_UPLOAD * ctx.cfg.preprocess.max_file_bytes + (1 << 20),
                    "/api/v1/classify": ctx.cfg.preprocess.max_file_bytes + (1 << 20),
                },
            ),
            Middleware(
                AccessMiddleware, tokens=tokens, local_bind=is_local_bind(ctx.bind), secret=csrf_secret(ctx.state.root / "web" / "csrf.key")
            ),
        ],
        exception_handlers={
            BadParameter: bad_parameter,
            HTTPException: http_error,
            LedgerUnreadable: ledger_unreadable,
            sqlite3.DatabaseError: storage_failed,
            OSError: storage_failed,
            Exception: server_error,
        },
    )
