"""The Map page: the season's photos drawn where they were taken (:mod:`edge_agent.web.field_map`), filtered as
the Photos page is (a class, a range of days, a plant), and to one kind of dot (``show``: those with a disease...)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_agent.names import pretty_class
from edge_agent.web._heap import trim_heap
from edge_agent.web.context import BadParameter, WebContext, page_filters
from edge_agent.web.field_map import STATES, MapPoint, field_map, state_of

__all__ = ["MAP_POINTS", "map_routes"]

#: The most photos the map draws (the newest the filters match; days choose older ones): 2,000 keep the page under
#: half a megabyte and the web process within its 60 MB (5,000 took it to 62.5 MB; benchmarks.web).
MAP_POINTS = 2000


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
        drawing = field_map([p for p in points if p.state == show] if show else points)
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
        )
        trim_heap()  # the page's objects are freed: give their memory back (edge_agent.web._heap)
        return shown

    return [Route("/map", field_map_page)]
