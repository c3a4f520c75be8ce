"""Who may use the page and the API: loopback without a token, anyone else with one; each token has a role; CSRF.

Roles: ``read`` (see everything, change nothing), ``label`` (also label photos and upload them: an expert) and
``admin`` (also roll back and unpin engines). Each role has one token; ``edge-agent web --new-token --role R`` makes
it (``admin`` when no role is named), and a client on 127.0.0.1 talking to a page bound there is ``admin`` unless it
presents a token. A program sends its token as ``Authorization: Bearer``: such a request cannot come from another
site's page (a browser adds that header only for this page's own scripts), so it needs no CSRF token.

The token is never stored, only its sha256 (``<state>/web/token.sha256``, mode 0600). A browser presents
it once as ``?token=`` (the link ``edge-agent web --new-token`` prints) and keeps it in an HttpOnly cookie.
State-changing requests are POSTs carrying the ``csrf`` field (or ``X-CSRF-Token`` header): an HMAC, with this
installation's secret (``<state>/web/csrf.key``, 0600), of the browser's session (the ``edge_session`` cookie: random,
HttpOnly, SameSite=Strict). Cookies are not isolated by port, so a page on another port of the same host can read a
script-visible cookie or set one of its own; it can do neither with the session cookie's HMAC, which only the
pages this server renders carry.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from edge_agent.web._errors import refusal
from engines.durable import atomic_write

__all__ = [
    "ROLES",
    "TokenFile",
    "Tokens",
    "is_local_bind",
    "AccessMiddleware",
    "csrf_ok",
    "csrf_secret",
    "allowed",
    "forbidden_text",
    "TOKEN_COOKIE",
    "SESSION_COOKIE",
]

#: Each role may do what the ones before it may.
ROLES = ("read", "label", "admin")

TOKEN_COOKIE = "edge_token"
SESSION_COOKIE = "edge_session"
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
        atomic_write(self.path, (_digest(token) + "\n").encode(), mode=0o600)  # on the disk before it is shown
        return token

    def check(self, token: str | None) -> bool:
        if not token:
            return False
        try:
            stored = self.path.read_text().strip()
        except OSError:
            return False
        return hmac.compare_digest(stored, _digest(token))


class Tokens:
    """One token per role under ``<state>/web``: ``token.sha256`` (admin), ``token-label.sha256``, ``token-read.sha256``."""

    def __init__(self, web_dir: Path) -> None:
        self.files = {role: TokenFile(web_dir / ("token.sha256" if role == "admin" else f"token-{role}.sha256")) for role in ROLES}

    def exists(self) -> bool:
        return any(f.exists() for f in self.files.values())

    def new(self, role: str = "admin") -> str:
        """A new token for ``role`` (that role's previous one stops working)."""
        return self.files[role].new()

    def role_of(self, token: str | None) -> str | None:
        """The role ``token`` gives, or None."""
        for role in reversed(ROLES):
            if self.files[role].check(token):
                return role
        return None


def allowed(request: Request, role: str) -> bool:
    """Whether the request's token (or a loopback client) may do what ``role`` may."""
    have = getattr(request.state, "role", None)
    return have in ROLES and ROLES.index(have) >= ROLES.index(role)


def forbidden_text(have: str, need: str) -> str:
    """Why a token with role ``have`` was refused something that needs ``need``, and how to get one that may."""
    return (
        f"this token's role is '{have}'; this needs '{need}' or above: on the device, `edge-agent web --new-token --role {need}` makes one"
    )


def csrf_secret(path: Path) -> bytes:
    """This installation's CSRF secret at ``path`` (made once, 0600)."""
    try:
        secret = path.read_bytes()
        if len(secret) >= 32:
            return secret
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, secrets.token_bytes(32), mode=0o600)
    return path.read_bytes()


def _csrf_of(secret: bytes, session: str) -> str:
    return hmac.new(secret, session.encode(), hashlib.sha256).hexdigest()[:40]


def is_local_bind(host: str) -> bool:
    """Whether ``host`` is the default, this-machine-only address (127.0.0.1, ::1, localhost)."""
    return host in ("127.0.0.1", "::1", "localhost")


class AccessMiddleware:
    """401 without a valid token unless both the server and the client are on 127.0.0.1/::1; 403 for a POST
    without a session (and, checked by the endpoint, its CSRF token) unless it carries a Bearer token.
    Sets ``request.state`` ``role``, ``bearer`` and ``csrf`` (for the templates)."""

    def __init__(self, app: ASGIApp, tokens: Tokens, local_bind: bool, secret: bytes) -> None:
        self.app = app
        self.tokens = tokens
        self.local_bind = local_bind
        self.secret = secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        client = request.client.host if request.client else ""
        token_in_url = request.query_params.get("token")
        auth = request.headers.get("authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        presented = bearer or token_in_url or request.cookies.get(TOKEN_COOKIE)
        role = self.tokens.role_of(presented) if presented else None
        loopback = self.local_bind and client in _LOCAL_CLIENTS
        if role is None and (bearer is not None or not loopback):  # a wrong Bearer token is refused even on loopback
            if not self.tokens.exists():
                why = "no access token is set: run `edge-agent web --new-token` on the device"
            elif bearer is not None:
                why = "the Bearer token is not valid (make one with `edge-agent web --new-token --role read|label|admin`)"
            else:
                why = "a valid access token is needed: open the link `edge-agent web --new-token` printed"
            headers = {"WWW-Authenticate": 'Bearer realm="edge-agent"'}
            await refusal(request.url.path, 401, why, headers)(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["role"] = role or "admin"  # no token, on loopback: this machine's own user
        state["bearer"] = role is not None and bearer is not None
        if state["bearer"]:  # a program: no cookies, no CSRF
            state["csrf"] = state["csrf_expected"] = ""
            await self.app(scope, receive, send)
            return
        if token_in_url and role is not None:  # keep it in a cookie and take it out of the address bar (and the history)
            rest = urlencode([(k, v) for k, v in parse_qsl(request.url.query) if k != "token"])
            local = "/" + request.url.path.lstrip("/\\")  # never "//host" or "/\\host": a browser leaves the site for those
            resp = RedirectResponse(local + (f"?{rest}" if rest else ""), status_code=303)
            resp.set_cookie(TOKEN_COOKIE, token_in_url, max_age=365 * 86400, httponly=True, samesite="strict")
            await resp(scope, receive, send)
            return
        session = request.cookies.get(SESSION_COOKIE)
        if request.method == "POST" and not session:
            # the field is read by the endpoint (the body is consumed once); here only a missing session
            if request.url.path.startswith("/api/"):  # a program: it sends a token
                why = "an API write sends its token as Authorization: Bearer (`edge-agent web --new-token --role label|admin` makes one)"
                answer = refusal(request.url.path, 401, why, {"WWW-Authenticate": 'Bearer realm="edge-agent"'})
            else:
                answer = refusal(request.url.path, 403, "no session cookie; reload the page and try again")
            await answer(scope, receive, send)
            return
        fresh = None if session and 16 <= len(session) <= 64 else secrets.token_urlsafe(24)
        state["csrf"] = _csrf_of(self.secret, fresh or session)
        state["csrf_expected"] = None if fresh else state["csrf"]  # a POST is checked against the session it came with

        async def send_with_cookie(message):
            if fresh and message["type"] == "http.response.start":
                r = Response()
                r.set_cookie(SESSION_COOKIE, fresh, httponly=True, samesite="strict")
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(k, v) for k, v in r.raw_headers if k == b"set-cookie"]
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def csrf_ok(request: Request, submitted: str | None) -> bool:
    """Whether a POST carries its session's CSRF token (form field ``csrf`` or header ``X-CSRF-Token``), or is a
    program's (a valid Bearer token)."""
    if getattr(request.state, "bearer", False):
        return True
    expected = getattr(request.state, "csrf_expected", None)
    given = submitted or request.headers.get("x-csrf-token")
    return bool(expected and given and hmac.compare_digest(expected, str(given)))
