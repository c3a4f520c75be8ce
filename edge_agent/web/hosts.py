"""The page answers only to its own names, and takes writes only from its own pages: the defence against DNS rebinding.

A web site open in a browser on the device (a laptop, a Jetson's desktop) can make its own name resolve to 127.0.0.1
and then drive this page as if it were its own origin. Such a request carries the site's name in ``Host``, so every
request's ``Host`` must be one of the page's names: ``localhost``, this machine's host name (and ``<name>.local``), the
bind address, ``[web] hosts``, or any IP address (a name is what rebinding needs; a browser that asks for an address
is on that address's own origin). Every write (any method but GET, HEAD, OPTIONS) must also come from the page
itself: its ``Origin``, when a browser sends one, is the request's own scheme and ``Host``, and ``Sec-Fetch-Site``,
when sent, says same-origin (or none: typed by the user). Programs (curl, Home Assistant) send neither and are
judged by their token alone. The same rule Jupyter and Home Assistant apply.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from edge_agent.web._errors import refusal

__all__ = ["HostCheck", "host_name", "page_names"]

_PORT = re.compile(r":\d{1,5}")
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


def page_names(bind: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names the page answers to besides IP addresses: localhost, this machine's names, the bind address and ``extra``."""
    names = {"localhost"}
    for name in (socket.gethostname(), socket.getfqdn()):
        name = name.lower().rstrip(".")
        if name:
            short = name.split(".")[0]
            names |= {name, short, f"{short}.local"}
    if bind not in ("", "0.0.0.0", "::"):
        names.add(bind.lower())
    names |= {e.lower().rstrip(".") for e in extra if e}
    return frozenset(names)


def host_name(value: str) -> str | None:
    """The name in a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lowercased; None when malformed."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        if end < 0 or (v[end + 1 :] and not _PORT.fullmatch(v[end + 1 :])):
            return None
        return v[1:end]
    name, colon, port = v.partition(":")
    if colon and not (port.isdigit() and len(port) <= 5):
        return None
    return name.rstrip(".") or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostCheck:
    """403 for a request whose ``Host`` is not one of the page's names, and for a write from another origin."""

    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app = app
        self.names = names

    def _host_ok(self, name: str | None) -> bool:
        return name is not None and (name in self.names or _is_ip(name))

    def why_refused(self, scope: Scope) -> str | None:
        """Why this request is refused (None: it is not)."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if not self._host_ok(host_name(host)):
            shown = host.encode("ascii", "backslashreplace").decode()[:100]
            return (
                f"this page does not answer to the name {shown!r} (it answers to localhost, this machine's name, "
                "an IP address and [web] hosts): add the name to [web] hosts if it is yours"
            )
        if scope["method"] in _SAFE:
            return None
        origin = headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin)
            if origin == "null" or parts.netloc.lower() != host.strip().lower() or parts.scheme not in ("http", "https"):
                shown = origin.encode("ascii", "backslashreplace").decode()[:100]
                return f"a write from another site ({shown!r}) is refused: use this page's own form, or a program's Bearer token"
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return f"a write from a {site} page is refused: use this page's own form"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (why := self.why_refused(scope)) is not None:
            await refusal(scope.get("path", ""), 403, why)(scope, receive, send)
            return
        await self.app(scope, receive, send)
