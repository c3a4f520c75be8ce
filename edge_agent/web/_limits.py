"""Limits that keep a small device's page answering: bodies counted as they stream in (over the cap, a 413 and nothing
more read), a cap on open connections and a deadline for a connection's first request (idle sockets are closed), and
one log line a minute for what was refused instead of one per connection."""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from edge_agent.web._errors import refusal

__all__ = ["BodyLimit", "guarded_protocol", "raise_file_limit"]


class _TooLarge(Exception):
    """The body passed its cap while being read."""


class BodyLimit:
    """Caps every request body at ``default`` bytes, and ``paths``' (path -> bytes) at their own: counted on the bytes
    received (a ``Transfer-Encoding: chunked`` body with a small ``Content-Length`` included), so nothing over the cap
    is ever spooled to a temporary file. A body that may pass ``large`` bytes (said so by its ``Content-Length``, or
    chunked) waits for one of ``slots`` places, at most ``wait_s`` (then 503 and Retry-After): however many arrive at
    once, a small board holds at most ``slots`` of them in memory or in temporary files."""

    def __init__(
        self, app: ASGIApp, default: int, paths: dict[str, int], large: int = 8 << 20, slots: int = 2, wait_s: float = 60.0
    ) -> None:
        self.app, self.default, self.paths = app, default, paths
        self.large, self.slots, self.wait_s = large, slots, wait_s
        self._slots: asyncio.Semaphore | None = None  # made on the server's event loop
        #: Bodies that waited for a place, and those refused after waiting ``wait_s``.
        self.counters = {"waited": 0, "refused": 0}

    def _is_large(self, scope: Scope, cap: int) -> bool:
        if cap <= self.large or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return False
        length = dict(scope.get("headers", [])).get(b"content-length")
        return length is None or not length.isdigit() or int(length) > self.large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        cap = self.paths.get(path, self.default)
        if not self._is_large(scope, cap):
            await self._capped(scope, receive, send, cap)
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.slots)
        if not self._slots.locked():
            await self._slots.acquire()  # a place is free: taken at once
        else:
            self.counters["waited"] += 1
            try:
                await asyncio.wait_for(self._slots.acquire(), self.wait_s)
            except asyncio.TimeoutError:
                self.counters["refused"] += 1
                why = f"{self.slots} large uploads are being received already; try again in a minute"
                await refusal(path, 503, why, {"Retry-After": "30", "Connection": "close"})(scope, receive, send)
                return
        try:
            await self._capped(scope, receive, send, cap)
        finally:
            self._slots.release()

    async def _capped(self, scope: Scope, receive: Receive, send: Send, cap: int) -> None:
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
                why = f"the body is larger than {cap} bytes"
                await refusal(scope.get("path", ""), 413, why, {"Connection": "close"})(scope, receive, send)


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
