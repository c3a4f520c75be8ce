"""Who may use the page: loopback without a token, anyone else with one; and CSRF for every POST.

The token is never stored, only its sha256 (``<state>/web/token.sha256``, mode 0600). A browser presents
it once as ``?token=`` (the link ``edge-agent web --new-token`` prints) and keeps it in an HttpOnly cookie.
State-changing requests are POSTs carrying the ``csrf`` field (or ``X-CSRF-Token`` header) equal to the
``edge_csrf`` cookie (a double-submit token; both cookies are SameSite=Strict).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["TokenFile", "is_local_bind", "AccessMiddleware", "csrf_ok", "TOKEN_COOKIE", "CSRF_COOKIE"]

TOKEN_COOKIE = "edge_token"
CSRF_COOKIE = "edge_csrf"
_LOCAL_CLIENTS = {"127.0.0.1", "::1"}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenFile:
    """The page's access token, stored hashed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def exists(self) -> bool:
        return self.path.is_file()

    def new(self) -> str:
        """Make a new token (the old one stops working) and return it; only its hash is written."""
        token = secrets.token_urlsafe(24)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_digest(token) + "\n")
        os.replace(tmp, self.path)
        return token

    def check(self, token: str | None) -> bool:
        if not token:
            return False
        try:
            stored = self.path.read_text().strip()
        except OSError:
            return False
        return hmac.compare_digest(stored, _digest(token))


def is_local_bind(host: str) -> bool:
    """Whether ``host`` is the default, this-machine-only address (127.0.0.1, ::1, localhost)."""
    return host in ("127.0.0.1", "::1", "localhost")


class AccessMiddleware:
    """401 without a valid token unless both the server and the client are on 127.0.0.1/::1;
    403 for a POST without the CSRF token. Sets ``request.state.csrf`` for the templates."""

    def __init__(self, app: ASGIApp, tokens: TokenFile, local_bind: bool) -> None:
        self.app = app
        self.tokens = tokens
        self.local_bind = local_bind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        client = request.client.host if request.client else ""
        token_in_url = request.query_params.get("token")
        if not (self.local_bind and client in _LOCAL_CLIENTS):
            bearer = request.headers.get("authorization", "")
            presented = token_in_url or request.cookies.get(TOKEN_COOKIE) or (bearer[7:] if bearer.lower().startswith("bearer ") else None)
            if not self.tokens.check(presented):
                why = ("no access token is set: run `edge-agent web --new-token` on the device" if not self.tokens.exists()
                       else "a valid access token is needed: open the link `edge-agent web --new-token` printed")
                await PlainTextResponse(f"401 Unauthorized: {why}\n", status_code=401,
                                        headers={"WWW-Authenticate": 'Bearer realm="edge-agent"'})(scope, receive, send)
                return
            if token_in_url:  # keep it in a cookie and take it out of the address bar (and the history)
                rest = urlencode([(k, v) for k, v in parse_qsl(request.url.query) if k != "token"])
                resp = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
                resp.set_cookie(TOKEN_COOKIE, token_in_url, max_age=365 * 86400, httponly=True, samesite="strict")
                await resp(scope, receive, send)
                return
        csrf = request.cookies.get(CSRF_COOKIE)
        if request.method == "POST":
            # the field is read by the endpoint (the body is consumed once); here only the header or a missing cookie
            if not csrf:
                await PlainTextResponse("403 Forbidden: missing CSRF cookie; reload the page and try again\n",
                                        status_code=403)(scope, receive, send)
                return
        fresh = None if csrf else secrets.token_urlsafe(18)
        scope.setdefault("state", {})["csrf"] = csrf or fresh

        async def send_with_cookie(message):
            if fresh and message["type"] == "http.response.start":
                r = Response()
                r.set_cookie(CSRF_COOKIE, fresh, httponly=False, samesite="strict")
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [
                    (k, v) for k, v in r.raw_headers if k == b"set-cookie"
                ]
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def csrf_ok(request: Request, submitted: str | None) -> bool:
    """Whether a POST carries the CSRF token of its cookie (form field ``csrf`` or header ``X-CSRF-Token``)."""
    cookie = request.cookies.get(CSRF_COOKIE)
    given = submitted or request.headers.get("x-csrf-token")
    return bool(cookie and given and hmac.compare_digest(cookie, given))
