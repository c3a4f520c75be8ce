"""Camera source: frames from OpenCV VideoCapture, every ``interval_s`` seconds.

``source`` may be a device index (``"0"``), a V4L2 path (``/dev/video0``), an
RTSP or HTTP (MJPEG) URL, a video file, a GStreamer pipeline (any string with
``!``), or ``"jetson-csi"`` for the Jetson CSI camera through nvarguscamerasrc.
A stream that stops delivering frames for ``stale_s`` is reopened with
exponential backoff. The OpenCV wheels on PyPI are built without GStreamer
(a Jetson's system OpenCV has it); that is detected from OpenCV's build
information and reported plainly.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

import cv2

from edge_agent.config import CameraSection
from edge_agent.log import get_logger
from edge_agent.worker import Worker
from engines.errors import EdgeAgentError

__all__ = ["CameraSource", "JETSON_CSI_PIPELINE", "gstreamer_available", "CameraError"]

#: nvarguscamerasrc (Jetson CSI camera) -> BGR frames for appsink.
JETSON_CSI_PIPELINE = (
    "nvarguscamerasrc sensor-id=0 ! video/x-raw(memory:NVMM),width=1920,height=1080,framerate=30/1 ! "
    "nvvidconv ! video/x-raw,format=BGRx ! videoconvert ! video/x-raw,format=BGR ! appsink drop=true max-buffers=1"
)


class CameraError(EdgeAgentError, RuntimeError):
    """The camera cannot be opened for a reason retrying will not fix."""


def gstreamer_available() -> bool:
    """Whether this OpenCV build includes the GStreamer backend."""
    m = re.search(r"GStreamer:\s*(\S+)", cv2.getBuildInformation())
    return bool(m) and m.group(1).upper() not in ("NO",)


class CameraSource(Worker):
    """Captures a frame every ``interval_s`` and calls ``emit(name, jpeg_bytes)``."""

    thread_name = "source-camera"
    join_timeout_s = 10.0

    def __init__(self, settings: CameraSection, emit: Callable[[str, bytes], None]) -> None:
        super().__init__()
        self.settings = settings
        self.emit = emit
        self.name = f"camera:{settings.source}"
        self.log = get_logger("source.camera", camera=settings.source)
        self.counters = {"frames": 0, "emitted": 0, "reconnects": 0, "open_failures": 0, "stale": 0}
        self.connected = False
        #: Set after the first attempt to open the camera, whatever its outcome.
        self.first_attempt = threading.Event()
        self._cap = None
        self._target, self._backend = self._resolve(settings.source)

    @staticmethod
    def _resolve(source: str) -> tuple[object, int]:
        if source == "jetson-csi":
            source = JETSON_CSI_PIPELINE
        if "!" in source:
            if not gstreamer_available():
                raise CameraError(
                    "this OpenCV build has no GStreamer support (the opencv-python wheels from PyPI never do), so the "
                    f"pipeline {source!r} cannot be opened; on a Jetson use the system OpenCV (python3-opencv from "
                    "JetPack) in the virtual environment (--system-site-packages), or use a V4L2 device or URL"
                )
            return source, cv2.CAP_GSTREAMER
        if source.isdigit():
            return int(source), cv2.CAP_ANY
        return source, cv2.CAP_ANY

    def open(self) -> bool:
        if isinstance(self._target, str) and "://" in self._target:
            # Network streams: bound FFmpeg's open/read waits so a dead server is noticed as stale.
            ms = int(self.settings.stale_s * 1000)
            params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, ms, cv2.CAP_PROP_READ_TIMEOUT_MSEC, ms]
            cap = cv2.VideoCapture(self._target, cv2.CAP_FFMPEG, params)
        else:
            cap = cv2.VideoCapture(self._target, self._backend)
        if not cap.isOpened():
            cap.release()
            self.counters["open_failures"] += 1
            return False
        self._cap = cap
        self.connected = True
        return True

    def _close(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None
        self.connected = False

    def _run(self) -> None:
        backoff = self.settings.backoff_initial_s
        next_emit = 0.0
        while not self._stop.is_set():
            if self._cap is None:
                opened = self.open()
                self.first_attempt.set()
                if not opened:
                    self.log.warning("camera_open_failed", retry_in_s=round(backoff, 1), **self.counters)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.settings.backoff_max_s)
                    continue
                self.log.info("camera_connected", **self.counters)
                last_frame = time.monotonic()
            ok, frame = self._cap.read()
            now = time.monotonic()
            if not ok or frame is None:
                if now - last_frame > self.settings.stale_s or not self._cap.isOpened():
                    self.counters["stale"] += 1
                    self.counters["reconnects"] += 1
                    self.log.warning("camera_stale", seconds_without_frame=round(now - last_frame, 1), **self.counters)
                    self._close()
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.settings.backoff_max_s)
                else:
                    self._stop.wait(0.05)
                continue
            last_frame = now
            backoff = self.settings.backoff_initial_s
            self.counters["frames"] += 1
            if now >= next_emit:
                next_emit = now + self.settings.interval_s
                ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, self.settings.jpeg_quality])
                if ok:
                    self.counters["emitted"] += 1
                    self.emit(self.name, buf.tobytes())
        self._close()
