"""The Diseases pages: every class the model in service knows, crop by crop, with the season's photos of it, and one
class's page: what causes it, what to look for to confirm it by eye, how it spreads and what is done about it
(:mod:`edge_agent.class_notes`), beside the photos the model answered as it and where it was found; and the farm's own
notes on it written there (:mod:`edge_agent.farm_notes`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from edge_agent.class_notes import ClassNote, ClassNotes, NotesError
from edge_agent.farm_notes import page_note
from edge_agent.names import describe_class, is_disease
from edge_agent.web.context import WebContext
from edge_agent.web.queries import ClassSeason

__all__ = ["ClassView", "NOTE_FIELDS", "class_views", "season_classes", "class_routes"]


@dataclass(frozen=True)
class ClassView:
    """One class as the Diseases pages, the API and ``edge-agent classes`` show it."""

    label: str
    crop: str  # the plant part of its name ("Tomato")
    title: str  # as the farmer reads it (a farm's name for it, else the condition's part of its name)
    disease: bool
    known: bool  # the model in service answers it (else: a class only the expert has used, or only notes describe)
    note: ClassNote | None
    season: ClassSeason = ClassSeason()  # its photos kept: answered, sure, labelled, found (on how many plants, when)


def class_views(notes: ClassNotes, classes: list[str], seasons: dict[str, ClassSeason]) -> list[ClassView]:
    """``classes`` (the model's) and any other the expert has labelled photos as (``seasons``, :meth:`Reader.per_class
    <edge_agent.web.queries.Reader.per_class>`), crop by crop, each with its notes."""
    known = set(classes)
    labels = classes + sorted(label for label, season in seasons.items() if label not in known and season.labelled)
    views = []
    for label in labels:
        crop, condition = describe_class(label)
        crop = crop if crop != condition else ""
        views.append(
            ClassView(
                label, crop, notes.title(label), is_disease(label), label in known, notes.get(label), seasons.get(label, ClassSeason())
            )
        )
    return sorted(views, key=lambda v: (v.crop.lower(), not v.disease, v.title.lower()))


def season_classes(ctx: WebContext) -> list[ClassView]:
    """:func:`class_views` of the model in service and the photos kept on ``ctx``'s state directory."""
    return class_views(ctx.notes, ctx.classes(), ctx.reader.per_class() if ctx.state.db.exists() else {})


def class_routes(
    ctx: WebContext, page: Callable[..., Response], problem: Callable[[Request, int, str], Response], form: Callable[..., Awaitable]
) -> list[Route]:
    """The routes of ``/classes``, ``/classes/<class>`` and its farm's notes, rendered by the app's ``page`` and
    ``problem``, the notes' form read by its ``form`` (the token's role and the CSRF token checked)."""

    async def classes_page(request: Request) -> Response:
        views = await run_in_threadpool(season_classes, ctx)
        crops: dict[str, list[ClassView]] = {}
        for v in views:
            crops.setdefault(v.crop, []).append(v)
        return page(
            request,
            "classes.html",
            crops=crops,
            diseases=sum(v.disease and v.known for v in views),
            stray=ctx.notes.unknown_to([v.label for v in views]),
            notes_file=ctx.cfg.web.class_notes,
        )

    async def class_page(request: Request) -> Response:
        label = request.path_params["label"]
        views = await run_in_threadpool(season_classes, ctx)
        view = next((v for v in views if v.label == label), None)
        if view is None:
            return problem(request, 404, f"the model knows no class {label[:100]!r}: the Diseases page lists those it knows")
        same_crop = [v for v in views if v.crop == view.crop and v.disease and v.label != label and v.known]
        plants = await run_in_threadpool(ctx.reader.found_on, label) if view.season.plants else []
        own, own_problem = {}, ""
        try:
            own = await run_in_threadpool(page_note, ctx.page_notes, label)
        except NotesError as exc:  # a hand edit gone wrong: said above the form, which then refuses to write over it
            own_problem = str(exc)
        return page(
            request,
            "class.html",
            v=view,
            same_crop=same_crop,
            plants=plants,
            notes_file=ctx.cfg.web.class_notes,
            own=own,
            own_problem=own_problem,
            under=_under(ctx, label),
            saved=request.query_params.get("saved"),
            keys=NOTE_FIELDS,
        )

    async def class_notes_post(request: Request) -> Response:
        """This farm's notes on a class, written on its page (each key over the shipped note's)."""
        label = request.path_params["label"]
        data = await form(request, "label")
        texts = {key: str(data.get(key, "")) for key, _ in NOTE_FIELDS}
        await run_in_threadpool(ctx.write_notes, label, texts)  # Refused / BadParameter: shown
        return RedirectResponse(f"/classes/{quote(label)}?saved=1", status_code=303)

    return [
        Route("/classes", classes_page),
        Route("/classes/{label}", class_page),
        Route("/classes/{label}/notes", class_notes_post, methods=["POST"]),
    ]


#: The keys of a note the page writes, with what each is called there, in the order shown.
NOTE_FIELDS = (
    ("name", "The farm's name for it"),
    ("look_for", "Look for"),
    ("cause", "Cause"),
    ("spread", "How it spreads"),
    ("act", "What to do"),
    ("urgency", "Urgent because (empty: it can wait)"),
    ("source", "Read more (a web address)"),
)


def _under(ctx: WebContext, label: str) -> ClassNote:
    """The note below the page's own: the shipped one with ``[web] class_notes`` over it (the placeholders)."""
    return ctx.notes_below_page.get(label) or ClassNote(label)
