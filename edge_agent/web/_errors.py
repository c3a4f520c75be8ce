"""One shape for every refusal the page's middleware and router give: JSON ``{"error", "status"}`` under ``/api/``,
a line of text elsewhere (the page's own errors are rendered by its problem template)."""

from __future__ import annotations

from starlette.responses import JSONResponse, PlainTextResponse, Response

__all__ = ["refusal", "REASONS"]

REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def refusal(path: str, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """The answer refusing a request for ``path``: JSON on the API, text on the page."""
    if path.startswith("/api/"):
        return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)
    return PlainTextResponse(f"{status} {REASONS.get(status, 'Error')}: {message}\n", status_code=status, headers=headers)
