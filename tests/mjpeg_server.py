"""A real MJPEG-over-HTTP (multipart/x-mixed-replace) camera stream on loopback, for tests."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BOUNDARY = "frameboundary"


class MjpegServer:
    """Serves ``frames`` (JPEG bytes) in a loop at ``fps`` on 127.0.0.1:``port`` (0 = any free port)."""

    def __init__(self, frames: list[bytes], fps: float = 10.0, port: int = 0) -> None:
        self.frames = frames
        self.fps = fps
        self.port = port
        self.served = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream.mjpg"

    def start(self) -> "MjpegServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                i = 0
                try:
                    while not server._stop.is_set():
                        jpg = server.frames[i % len(server.frames)]
                        self.wfile.write(
                            f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpg)}\r\n\r\n".encode() + jpg + b"\r\n"
                        )
                        self.wfile.flush()
                        server.served += 1
                        i += 1
                        time.sleep(1.0 / server.fps)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    return

        self._stop.clear()

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._httpd = Server(("127.0.0.1", self.port), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """The camera dies: stop serving and drop every open connection."""
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
