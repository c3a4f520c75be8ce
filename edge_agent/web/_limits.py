"""Limits that keep a small device's page answering: bodies counted as they stream in (over the cap, a 413 and nothing
more read), a cap on open connections and a deadline for a connection's first request (idle sockets are closed), and
one log line a minute for what was refused instead of one per connection."""

from __future__ import annotations

import time

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BodyLimit", "guarded_protocol", "raise_file_limit"]


class _TooLarge(Exception):
    """The body passed its cap while being read."""


class BodyLimit:
    """Caps every request body at ``default`` bytes, and ``paths``' (path -> bytes) at their own: counted on the bytes
    received (a ``Transfer-Encoding: chunked`` body with a small ``Content-Length`` included), so nothing over the cap
    is ever spooled to a temporary file."""

    def __init__(self, app: ASGIApp, default: int, paths: dict[str, int]) -> None:
        self.app, self.default, self.paths = app, default, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.paths.get(scope.get("path", ""), self.default)
        seen = 0
        started = False

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    raise _TooLarge
            return message

        async def tracked(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if not started:
                await PlainTextResponse(
                    f"413 Request Entity Too Large: more than {cap} bytes\n", status_code=413, headers={"Connection": "close"}
                )(scope, receive, send)


def raise_file_limit(wanted: int) -> int:
    """Raise this process's open-file limit towards ``wanted`` (up to the hard limit); returns the limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(max(soft, wanted), hard if hard != resource.RLIM_INFINITY else wanted)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return max(soft, target)


def guarded_protocol(max_connections: int, idle_s: float, log):
    """uvicorn's h11 protocol with a cap on open connections (beyond it the connection that has waited longest without
    sending a request is closed to make room, or the new one when none waits) and a deadline for each connection's
    first whole request (uvicorn times out only idle connections that already made one)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    refused = {"count": 0, "logged": 0.0}
    waiting: dict = {}  # connections yet to send a whole request, oldest first

    def note(why: str) -> None:
        refused["count"] += 1
        now = time.monotonic()
        if now - refused["logged"] >= 60:
            log.warning("connections_closed", count=refused["count"], why=why, max_connections=max_connections)
            refused["logged"], refused["count"] = now, 0

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._first_request = None
            if len(self.connections) > max_connections:
                if waiting:  # make room: the connection that has waited longest without asking anything goes
                    oldest = next(iter(waiting))
                    note("open connections over the cap: the longest idle closed")
                    oldest._close_idle()
                else:
                    note("open connections over the cap, all busy: the new one closed")
                    transport.close()
                    return
            waiting[self] = None
            self._first_request = self.loop.call_later(idle_s, self._no_request)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None:  # a whole request came: uvicorn's own timers from here on
                self._stop_waiting()

        def _stop_waiting(self) -> None:
            waiting.pop(self, None)
            if self._first_request is not None:
                self._first_request.cancel()
                self._first_request = None

        def _close_idle(self) -> None:
            self._stop_waiting()
            if not self.transport.is_closing():
                self.transport.close()

        def _no_request(self) -> None:
            self._first_request = None
            if self.cycle is None:
                note(f"no request within {idle_s:g} s")
                self._close_idle()

        def connection_lost(self, exc) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

    return GuardedH11Protocol
