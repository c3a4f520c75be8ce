"""The JSON API, ``/api/v1``: what the page shows and does, for programs (Home Assistant, a farm's own service).

Each endpoint needs a role (:mod:`edge_agent.web.auth`); every answer is JSON, errors too (``{"error", "status"}``);
the OpenAPI document is served at ``/api/v1/openapi.json`` (:mod:`edge_agent.web.api.openapi`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_agent.web.api.endpoints import ENDPOINTS, Endpoint
from edge_agent.web.api.openapi import PREFIX, document
from edge_agent.web.auth import allowed, csrf_ok, forbidden_text
from edge_agent.web.context import BadParameter, Refused, WebContext

__all__ = ["PREFIX", "api_routes", "problem"]


def problem(status: int, message: str) -> JSONResponse:
    """An error as the API answers it."""
    return JSONResponse({"error": message, "status": status}, status_code=status)


def _route(ctx: WebContext, ep: Endpoint) -> Route:
    async def endpoint(request: Request) -> Response:
        if not allowed(request, ep.role):
            return problem(403, forbidden_text(request.state.role, ep.role))
        if ep.method == "POST" and not csrf_ok(request, None):
            return problem(403, "a POST from a browser needs its page's X-CSRF-Token header; a program sends a Bearer token")
        try:
            out = await ep.handler(ctx, request)
        except BadParameter as exc:  # Refused carries its own status
            return problem(exc.status if isinstance(exc, Refused) else 400, str(exc))
        return out if isinstance(out, Response) else JSONResponse(out.model_dump(mode="json"))

    endpoint.__name__ = ep.handler.__name__
    return Route(PREFIX + ep.path, endpoint, methods=[ep.method])


def api_routes(ctx: WebContext) -> list[Route]:
    """The API's routes, and its OpenAPI document at ``/api/v1/openapi.json``."""
    doc = document()

    async def openapi(request: Request) -> Response:
        return JSONResponse(doc)

    async def not_found(request: Request) -> Response:
        return problem(404, f"no such API endpoint: {request.method} {request.url.path} (GET {PREFIX}/openapi.json lists them)")

    return [
        *(_route(ctx, ep) for ep in ENDPOINTS),
        Route(PREFIX + "/openapi.json", openapi),
        Route(PREFIX + "/{rest:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
