"""Request bodies are counted as they stream in, whatever the headers say: over the cap, a 413 and nothing more read."""

from __future__ import annotations

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BodyLimit"]


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
                await PlainTextResponse(f"413 Request Entity Too Large: more than {cap} bytes\n", status_code=413,
                                        headers={"Connection": "close"})(scope, receive, send)
