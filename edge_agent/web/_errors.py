"""One shape for every refusal the page's middleware and router give: JSON ``{"error", "status"}`` under ``/api/``,
a line of text elsewhere (the page's own errors are rendered by its problem template)."""

from __future__ import annotations

from starlette.responses import JSONResponse, PlainTextResponse, Response

from edge_agent.storage_errors import DAMAGED_RECORDS, FAILING_DISK, FULL_DISK, LOCKED

__all__ = ["refusal", "storage_refusal", "REASONS"]

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
    507: "Insufficient Storage",
}


def refusal(path: str, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """The answer refusing a request for ``path``: JSON on the API, text on the page."""
    if path.startswith("/api/"):
        return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)
    return PlainTextResponse(f"{status} {REASONS.get(status, 'Error')}: {message}\n", status_code=status, headers=headers)


def storage_refusal(problem: str | None) -> tuple[int, str, dict[str, str]] | None:
    """How to refuse a write the device's storage did not take (status, message, headers) for what
    :func:`~edge_agent.storage_errors.storage_problem` found, or None where it found nothing: 507 on a full disk, 503 on
    records another process held locked past the wait, a damaged page or a disk that fails."""
    if problem == "full":
        return 507, FULL_DISK, {}
    if problem == "locked":
        return 503, LOCKED, {"Retry-After": "5"}
    if problem == "damaged":
        return 503, DAMAGED_RECORDS, {"Retry-After": "60"}
    if problem == "failing":
        return 503, FAILING_DISK, {"Retry-After": "60"}
    return None
