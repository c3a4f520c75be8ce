"""A photo's page: its answer and why, where and when it was taken, the photos taken beside it (This spot) and what
to look for to confirm its answer (:mod:`edge_agent.class_notes`); and its writes: the expert's label for it, and for
the photos of its spot ticked on it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from edge_agent.web.context import WebContext, parse_int
from edge_agent.web.photos import is_sha256
from edge_agent.web.queries import Filters

__all__ = ["OTHER_GUESS", "photo_routes"]

#: How likely (the model's probability) another class must be for a photo it is not sure of to name it too.
OTHER_GUESS = 0.05


def photo_routes(
    ctx: WebContext, page: Callable[..., Response], problem: Callable[[Request, int, str], Response], form: Callable[..., Awaitable]
) -> list[Route]:
    """The routes of ``/photo/<sha256>`` and its labels, rendered by the app's ``page`` and ``problem``, the writes'
    forms read by its ``form`` (the token's role and the CSRF token checked)."""

    async def photo(request: Request) -> Response:
        sha = request.path_params["sha"]
        if not is_sha256(sha):
            return problem(request, 404, "no such photo")
        found = ctx.reader.photo(sha)
        queued = ctx.reader.queue_file(sha)
        said = ctx.reader.expert_labels([sha]).get(sha) if found else None
        name = request.query_params.get("name", "")
        quarantined = ctx.reader.quarantined(name) if name and found is None else None
        queued = queued[0] if queued else None
        classes = ctx.classes() if found else []
        near = ctx.reader.count(Filters(near=found.place)) if found and found.place else 0  # itself included
        spot, spot_rows, spot_said = (ctx.spot(found, len(classes)) if found else None) or (None, [], {})
        shown = said or (found.label if found and found.verdict != "unknown" else "")  # a photo unlike any it knows: none
        about = ctx.notes.get(shown) if shown else None
        # not sure, and not labelled: the other guesses the model gave weight to, each by its first sign to look for
        others = (
            [n for c, p in found.top_k[1:3] if p >= OTHER_GUESS and (n := ctx.notes.get(c))]
            if found and found.verdict == "unsure" and not said
            else []
        )
        return page(
            request,
            "photo.html",
            sha=sha,
            photo=found,
            queued=queued,
            said=said,
            quarantined=quarantined,
            name=name,
            classes=classes,
            near=near,
            spot=spot,
            spot_rows=spot_rows,
            spot_said=spot_said,
            about=about,
            others=others,
            labelled=request.query_params.get("labelled"),
            spot_labelled=parse_int(request.query_params.get("spot_labelled"), default=-1),
            spot_missed=parse_int(request.query_params.get("spot_missed")),
        )

    async def photo_label(request: Request) -> Response:
        """The expert's label for any photo still kept, from its page (a sure answer that is wrong, a label corrected)."""
        sha = request.path_params["sha"]
        data = await form(request, "label")
        if not is_sha256(sha):
            return problem(request, 404, "no such photo")
        await run_in_threadpool(ctx.label, sha, str(data.get("label", "")), data.get("new_class") == "1")  # Refused / BadParameter: shown
        return RedirectResponse(f"/photo/{sha}?labelled=1", status_code=303)

    async def photo_label_spot(request: Request) -> Response:
        """The expert's label for the photos of a photo's spot (taken within 15 m of it, the same visit) ticked on its
        page: the same tree photographed without a folder a tree, labelled at once."""
        sha = request.path_params["sha"]
        data = await form(request, "label", fields=ctx.cfg.classify.plant_max_photos + 8)
        if not is_sha256(sha):
            return problem(request, 404, "no such photo")
        photos, label = [str(p) for p in data.getlist("photo")], str(data.get("label", ""))
        done = await run_in_threadpool(ctx.label_spot, sha, label, data.get("new_class") == "1", photos)  # Refused / BadParameter: shown
        to = f"/photo/{sha}?" + urlencode({"spot_labelled": len(done.labelled), "spot_missed": len(done.missed)})
        return RedirectResponse(to, status_code=303)

    return [
        Route("/photo/{sha}", photo),
        Route("/photo/{sha}/label", photo_label, methods=["POST"]),
        Route("/photo/{sha}/label-spot", photo_label_spot, methods=["POST"]),
    ]
