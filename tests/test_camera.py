"""Camera source against a real MJPEG-over-HTTP stream on loopback and a video file."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edge_agent.config import CameraSection
from edge_agent.sources.camera import CameraError, CameraSource, gstreamer_available

from .conftest import trusted_store
from .daemon_helpers import DaemonProc, db_rows, wait_until
from .mjpeg_server import MjpegServer


@pytest.fixture
def frames(plantvillage) -> list[bytes]:
    return [p.read_bytes() for p in sorted(plantvillage.rglob("*.jpg"))[:200:40]]


class Frames:
    def __init__(self):
        self.got: list[tuple[str, bytes]] = []

    def __call__(self, name, data):
        self.got.append((name, data))


def test_mjpeg_stream_dies_and_comes_back(frames):
    server = MjpegServer(frames, fps=20).start()
    port = server.port
    sink = Frames()
    cam = CameraSource(CameraSection(source=server.url, interval_s=0.1, stale_s=1.0, backoff_initial_s=0.2, backoff_max_s=0.5), sink)
    cam.start()
    try:
        wait_until(lambda: len(sink.got) >= 3, 15, "frames from the stream")
        name, data = sink.got[0]
        assert name == f"camera:{server.url}"
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert img.shape == (256, 256, 3)
        server.stop()  # the camera dies
        wait_until(lambda: cam.counters["reconnects"] >= 1 and not cam.connected, 15, "stale detection")
        wait_until(lambda: cam.counters["open_failures"] >= 1, 15, "failed reopen while down")
        before = len(sink.got)
        server = MjpegServer(frames, fps=20, port=port).start()  # and comes back
        wait_until(lambda: len(sink.got) > before + 2, 20, "frames after reconnect")
        assert cam.connected and cam.alive()
    finally:
        cam.stop()
        server.stop()


def test_video_file_source(frames, tmp_path):
    path = tmp_path / "field.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (256, 256))
    assert writer.isOpened()
    for data in frames * 4:
        writer.write(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR))
    writer.release()
    sink = Frames()
    cam = CameraSource(CameraSection(source=str(path), interval_s=0.0, stale_s=0.5, backoff_initial_s=0.1), sink)
    cam.start()
    try:
        wait_until(lambda: cam.counters["frames"] >= 20, 10, "frames from the file")
        wait_until(lambda: cam.counters["reconnects"] >= 1, 10, "end of file noticed and reopened")
    finally:
        cam.stop()
    assert len(sink.got) >= 20


def test_unopenable_device_backs_off_and_keeps_trying(tmp_path):
    sink = Frames()
    cam = CameraSource(CameraSection(source=str(tmp_path / "no-such-video0"), backoff_initial_s=0.1, backoff_max_s=0.2), sink)
    cam.start()
    try:
        wait_until(lambda: cam.counters["open_failures"] >= 3, 10, "repeated open attempts")
        assert cam.alive() and not sink.got
    finally:
        cam.stop()


@pytest.mark.skipif(gstreamer_available(), reason="this OpenCV has GStreamer: the error path does not apply")
def test_gstreamer_pipeline_without_gstreamer_says_so():
    with pytest.raises(CameraError, match="no GStreamer support"):
        CameraSource(CameraSection(source="videotestsrc ! videoconvert ! appsink"), lambda *a: None)
    with pytest.raises(CameraError, match="no GStreamer support"):
        CameraSource(CameraSection(source="jetson-csi"), lambda *a: None)


def test_daemon_classifies_camera_frames(frames, tmp_path, tiny_store, signing_key):
    server = MjpegServer(frames, fps=10).start()
    try:
        d = DaemonProc(
            tmp_path / "state",
            {
                "store": trusted_store(tiny_store, signing_key),
                "inbox": {"enabled": False},
                "camera": {"enabled": True, "source": server.url, "interval_s": 0.3},
            },
        ).start()
        d.wait_ready()
        wait_until(lambda: db_rows(d.state, "SELECT COUNT(*) FROM results")[0][0] >= 3, 30, "camera results")
        sources = {r[0] for r in db_rows(d.state, "SELECT source FROM results")}
        assert sources == {f"camera:{server.url}"}
        assert d.terminate() == 0
    finally:
        server.stop()
