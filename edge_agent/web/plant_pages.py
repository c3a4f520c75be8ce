"""The Plants pages: every plant's diagnosis from its photos together (the most recently photographed first, found by
name, or only those with a disease or left unsure), and one plant's page, which waits for photos just uploaded and
labels the photos the expert picks with one class."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from itertools import islice
from pathlib import Path
from urllib.parse import quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from edge_agent.export import plant_csv_lines
from edge_agent.plant_rename import FOLDER_FATES, Renamed
from edge_agent.plants import PLANT_NAME, PLANT_VIEWS, PlantDiagnosis
from edge_agent.web.context import WebContext, parse_int

__all__ = ["PLANT_CARDS", "PLANTS_SHOWN", "plant_routes"]

#: The most photos of one plant the Plants page shows.
PLANT_CARDS = 48
#: The most plants the plants CSV holds (the most recently photographed).
PLANTS_EXPORTED = 100_000
#: The most plants the Plants page lists (the most recently photographed; a name search finds the others).
PLANTS_SHOWN = 50

Page = Callable[..., Response]
Form = Callable[..., Awaitable]


def _waiting(inbox: Path, plant: str, most: int = 1000) -> int:
    """How many files wait in ``plant``'s inbox folder (up to ``most``; 0 for a name that is no folder name)."""
    folder = inbox / plant
    if not re.fullmatch(PLANT_NAME, plant) or not folder.is_dir():
        return 0
    try:
        return sum(1 for _, f in zip(range(most), folder.iterdir()) if not f.name.startswith(".") and f.is_file())
    except OSError:
        return 0


def _local(t: float) -> str:
    """A time as the page shows it: local, to the minute."""
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def plant_routes(ctx: WebContext, page: Page, problem: Callable[[Request, int, str], Response], form: Form) -> list[Route]:
    """The routes of ``/plants``, ``/plants/<name>``, its labels and its name, rendered by the app's ``page`` and
    ``problem``, the writes' forms read by its ``form`` (the token's role and the CSRF token checked)."""

    def plant_view(name: str, rows: list, d: PlantDiagnosis, said: dict[str, str], every_visit: bool = False) -> dict:
        """One plant as its section shows it: the diagnosis, the newest visit's photos (``rows``: those, or with
        ``every_visit`` all its photos, as its own page shows the newest of any visit; a folder of thousands is no plant)."""
        one = not d.not_one  # a folder of many plants: nothing ticked
        newest = rows[len(rows) - d.photos :]  # the visit diagnosed
        visit = {r.sha256 for r in newest}  # the photos diagnosed; earlier ones dimmed
        shown = (rows if every_visit else newest)[-PLANT_CARDS:]
        return {
            "plant": name,
            "rows": shown,
            "older": d.photos + d.earlier - len(shown),
            "said": said,
            "last_local": _local(max(r.when for r in rows)),  # when last photographed (taken, else classified)
            "one": one,
            "visit": visit,
            **d.as_dict(),
            "photos": d.photos + d.earlier,
            "visit_photos": d.photos,
        }

    async def plants(request: Request) -> Response:
        match = request.query_params.get("q", "").strip()[:64]
        show = request.query_params.get("show", "")
        show = show if show in PLANT_VIEWS else ""

        def read() -> tuple[list[dict], int]:
            plants = ctx.plants(match, show, PLANTS_SHOWN)
            found = [plant_view(*p) for p in islice(plants, PLANTS_SHOWN)]
            if not show and len(found) == PLANTS_SHOWN:
                return found, ctx.reader.plant_count(match)
            return found, len(found) + sum(1 for _ in plants)  # a view: the rest in it counted too

        found, total = await run_in_threadpool(read)
        return page(request, "plants.html", plants=found, total=total, match=match, shown=PLANTS_SHOWN, show=show, views=PLANT_VIEWS)

    async def plants_csv(request: Request) -> Response:
        """Each visit of every plant (whose name holds ``q``) with its diagnosis, as a CSV file for a spreadsheet: the
        season of each tree, the most recently photographed plant first, its visits oldest first."""
        match = request.query_params.get("q", "").strip()[:64]

        def each_visit():
            k = len(ctx.classes())
            for name, _, _ in ctx.reader.plants(PLANTS_EXPORTED, match):
                for began, d in reversed(ctx.visits(ctx.reader.plant(name), k)):
                    yield name, began, d

        headers = {"Content-Disposition": f'attachment; filename="edge-agent-plants-{datetime.now():%Y-%m-%d}.csv"'}
        return StreamingResponse(plant_csv_lines(each_visit()), media_type="text/csv; charset=utf-8", headers=headers)

    async def plant(request: Request) -> Response:
        name = request.path_params["plant"]
        rows = await run_in_threadpool(ctx.reader.plant, name)
        if not rows:
            if waiting := await run_in_threadpool(_waiting, ctx.inbox, name):  # uploaded a moment ago: not classified yet
                return page(request, "plant.html", pl=None, name=name, waiting=waiting)
            if (known := await run_in_threadpool(ctx.reader.plant_named, name)) is not None:  # typed in another case
                return RedirectResponse(f"/plants/{quote(known)}", status_code=303)
            why = "a plant is a folder in the inbox, or photos uploaded under one plant name (see Plants)"
            return problem(request, 404, f"No photos of a plant named {name[:64]!r}: {why}.")
        classes = ctx.classes()
        k = len(classes)
        d, said = await run_in_threadpool(ctx.plant, rows, k)
        history = [(_local(began), e) for began, e in (await run_in_threadpool(ctx.visits, rows, k))[1:]]  # the earlier visits
        q = request.query_params
        done = {"labelled": min(parse_int(q.get("labelled")), PLANT_CARDS), "missed": min(parse_int(q.get("missed")), PLANT_CARDS)}
        pl = plant_view(name, rows, d, said, every_visit=True)
        renamed, fate = q.get("renamed", "")[:64], q.get("folder", "")
        folder_note = Renamed(renamed, name, 0, False, fate).folder_note if fate in FOLDER_FATES else ""
        return page(
            request,
            "plant.html",
            pl=pl,
            history=history,
            classes=classes,
            done=done,
            as_class=q.get("as", "")[:200],
            renamed=renamed,
            folder_note=folder_note,
        )

    async def plant_label(request: Request) -> Response:
        """The expert's label for the photos of a plant ticked on its page (each as a photo's own label is)."""
        name = request.path_params["plant"]
        data = await form(request, "label", fields=PLANT_CARDS + 8)
        photos = [str(sha) for sha in data.getlist("photo")]
        label = str(data.get("label", ""))
        done = await run_in_threadpool(ctx.label_plant, name, label, data.get("new_class") == "1", photos)  # Refused / BadParameter: shown
        to = f"/plants/{quote(name)}?" + urlencode({"labelled": len(done.labelled), "missed": len(done.missed), "as": done.label})
        return RedirectResponse(to, status_code=303)

    async def plant_rename(request: Request) -> Response:
        """A plant renamed, or merged into another, from its page."""
        data = await form(request, "label")
        done = await run_in_threadpool(
            ctx.rename_plant, request.path_params["plant"], str(data.get("to", ""))
        )  # Refused / BadParameter: shown
        return RedirectResponse(
            f"/plants/{quote(done.new)}?" + urlencode({"renamed": done.old[:64], "folder": done.folder}), status_code=303
        )

    return [
        Route("/plants", plants),
        Route("/plants.csv", plants_csv),
        Route("/plants/{plant}", plant),
        Route("/plants/{plant}/label", plant_label, methods=["POST"]),
        Route("/plants/{plant}/rename", plant_rename, methods=["POST"]),
    ]
