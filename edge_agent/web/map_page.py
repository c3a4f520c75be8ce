"""The Map page: the season's photos drawn where they were taken (:mod:`edge_agent.web.field_map`), filtered as
the Photos page is (a class, a range of days, a plant), and to one kind of dot (``show``: those with a disease...)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from edge_agent.imageheader import HeaderError, read_header
from edge_agent.names import pretty_class
from edge_agent.web._heap import trim_heap
from edge_agent.web.context import BadParameter, WebContext, page_filters
from edge_agent.web.field_map import STATES, Backdrop, MapPoint, field_map, state_of
from engines.durable import read_at_most

__all__ = ["MAP_POINTS", "MAP_IMAGE_BYTES", "map_routes"]

#: The most photos the map draws (the newest the filters match; days choose older ones): 2,000 keep the page under
#: half a megabyte and the web process within its 60 MB (5,000 took it to 62.5 MB; benchmarks.web).
MAP_POINTS = 2000


#: The largest image of the farm served under the map (a drone photo of a few hectares at 5 cm a pixel, as a JPEG).
MAP_IMAGE_BYTES = 32 << 20


def _image_problem(path: str) -> tuple[str, str]:
    """(why the farm's image cannot be drawn, or ""; its media type), read once for each version of the file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"[web] map_image {path}: cannot be read ({exc.strerror or exc})", ""
    return _checked(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _checked(path: str, mtime_ns: int, size: int) -> tuple[str, str]:
    """:func:`_image_problem` of one version of the file (its whole header and completeness read)."""
    try:
        data = read_at_most(path, MAP_IMAGE_BYTES)
    except OSError as exc:
        return f"[web] map_image {path}: cannot be read ({exc.strerror or exc})", ""
    if data is None:
        return f"[web] map_image {path}: larger than {MAP_IMAGE_BYTES >> 20} MB (save it smaller)", ""
    try:
        kind = read_header(data).format
    except HeaderError as exc:
        return f"[web] map_image {path}: {exc}", ""
    if kind not in ("jpeg", "png", "webp"):
        return f"[web] map_image {path}: a {kind.upper()}, which browsers do not draw (save it as JPEG or PNG)", ""
    return "", f"image/{kind}"


def _title(label: str, confidence: float, verdict: str | None, expert: str | None, plant: str | None, when: str) -> str:
    """A dot's hover text: what it shows, how sure, its plant, when it was taken."""
    if expert:
        what = f"{pretty_class(expert)} (the expert's label)"
    elif verdict in ("unsure", "unknown"):
        what = f"{STATES[verdict][1]} (best guess {pretty_class(label)})"
    else:
        what = f"{pretty_class(label)} {confidence:.0%}"
    return f"{what}{f' · plant {plant}' if plant else ''} · {when}"


def map_routes(ctx: WebContext, page: Callable[..., Response], local_time: Callable[[float], str]) -> list[Route]:
    """The route of ``/map``, rendered by the app's ``page``."""

    async def field_map_page(request: Request) -> Response:
        filters = page_filters(request.query_params)
        rows, without = await run_in_threadpool(ctx.reader.places, filters, MAP_POINTS)
        said = await run_in_threadpool(ctx.reader.expert_labels, [r[0] for r in rows])
        points = [
            MapPoint(
                sha,
                lat,
                lon,
                state_of(label, verdict, said.get(sha)),
                _title(label, conf, verdict, said.get(sha), plant, local_time(when)),
                plant,
            )
            for sha, lat, lon, label, conf, verdict, plant, when in rows
        ]
        show = request.query_params.get("show", "")
        if show and show not in STATES:
            raise BadParameter(f"show: one of {', '.join(STATES)}, not {show[:20]!r}")
        counts = {key: sum(p.state == key for p in points) for key in STATES}  # the legend's, whatever is shown
        web = ctx.cfg.web
        problem = ""
        if web.map_image:
            problem, _ = await run_in_threadpool(_image_problem, web.map_image)
        backdrop = Backdrop("/map/image", *web.map_bounds) if web.map_image and not problem else None
        drawing = field_map([p for p in points if p.state == show] if show else points, backdrop=backdrop)
        shown = page(
            request,
            "map.html",
            fm=drawing,
            filters=filters,
            labels=ctx.reader.labels(),
            without=without,
            most=MAP_POINTS,
            found=len(rows),
            states=STATES,
            show=show,
            counts=counts,
            backdrop_problem=problem,
            backdrop=backdrop is not None,
        )
        trim_heap()  # the page's objects are freed: give their memory back (edge_agent.web._heap)
        return shown

    async def map_image(request: Request) -> Response:
        """The farm's image under the map (``[web] map_image``), streamed from its file (the page's memory stays small)."""
        path = ctx.cfg.web.map_image
        if not path:
            return Response("no map_image configured ([web] map_image)\n", 404, media_type="text/plain")
        problem, media = await run_in_threadpool(_image_problem, path)
        if problem:
            return Response(f"{problem}\n", 404, media_type="text/plain")
        return FileResponse(path, media_type=media, headers={"Cache-Control": "private, max-age=3600"})

    return [Route("/map", field_map_page), Route("/map/image", map_image)]
