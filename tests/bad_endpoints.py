"""A webhook endpoint that misbehaves on purpose, one way at a time, for the tests and ``benchmarks.webhooks``.

Modes: ``ok`` (200), ``hang`` (reads the request, never answers), ``garbage`` (a status line that is not HTTP),
``drip`` (a valid status line, then headers that never end, one byte every ``drip_s``), ``cut`` (a chunked answer cut in the middle),
``redirect`` (302 to another address), ``refuse`` (closes at once). :attr:`mode` may change while it runs (an
endpoint that is fixed). Every request body it read whole is kept in :attr:`got` with its arrival time.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time

__all__ = ["BadEndpoint", "MODES"]

MODES = ("ok", "hang", "garbage", "drip", "cut", "redirect", "refuse")


class BadEndpoint:
    def __init__(self, mode: str = "ok", drip_s: float = 0.5) -> None:
        assert mode in MODES, mode
        self.mode, self.drip_s = mode, drip_s
        self.got: list[tuple[float, bytes]] = []
        self.connections = 0
        self._closing = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer.connections += 1
                sock: socket.socket = self.request
                sock.settimeout(30)
                mode = outer.mode
                if mode == "refuse":
                    return
                try:
                    body = _read_request(sock)
                except OSError:
                    return
                if mode == "ok":
                    outer.got.append((time.time(), body))
                    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                elif mode == "hang":
                    outer._closing.wait(600)
                elif mode == "garbage":
                    sock.sendall(b"HELLO THERE\r\n\r\n")
                elif mode == "drip":
                    for ch in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
                        if outer._closing.wait(outer.drip_s):
                            return
                        try:
                            sock.sendall(bytes([ch]))
                        except OSError:
                            return
                elif mode == "cut":
                    sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nonly a part")
                elif mode == "redirect":
                    sock.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/elsewhere\r\nContent-Length: 0\r\n\r\n")

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()


def _read_request(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("closed before the headers")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("closed before the body")
        body += chunk
    return body
