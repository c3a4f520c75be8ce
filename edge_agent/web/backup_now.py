"""The page's and the API's "Back up now": a backup into ``[backup] dir`` asked of the daemon's schedule, which writes
it at its next look (within a minute), as it writes the daily ones (:mod:`edge_agent.backup_schedule`)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from edge_agent.backup_schedule import request_backup
from edge_agent.web.context import Refused, WebContext

__all__ = ["ask", "backup_routes"]


def ask(ctx: WebContext) -> dict:
    """Ask the daemon for a backup now; ``{"requested", "dir", "daemon_running"}``; raises :class:`Refused` (409) where
    no ``[backup] dir`` is set, (507) where the state directory cannot be written."""
    if not ctx.cfg.backup.dir:
        raise Refused(
            409,
            "no [backup] dir is set, so there is nowhere to write it: set it to a USB stick's folder (docs/operations.md), "
            "or run edge-agent backup --out FILE on the device",
        )
    try:
        when = request_backup(ctx.state.root)
    except OSError as exc:
        raise Refused(507, f"{ctx.state.root}: could not ask the daemon for a backup ({exc.strerror or exc})") from None
    return {"requested": when, "dir": ctx.cfg.backup.dir, "daemon_running": ctx.daemon()[1]}


def backup_routes(ctx: WebContext, form) -> list[Route]:
    """The Health page's "Back up now" form's route (``form``: the app's CSRF- and role-checked form reader)."""

    async def backup_now(request: Request) -> Response:
        await form(request, "admin")
        await run_in_threadpool(ask, ctx)
        return RedirectResponse("/health#backup", status_code=303)

    return [Route("/health/backup", backup_now, methods=["POST"])]
