"""Trainer side of the hand-off: store what arrives, acknowledge it, announce new engines.

A ROUTER socket takes samples from any number of daemons; each is stored
durably (:class:`~trainer.samples.SampleStore`) before its ``ack`` goes back.
Heartbeats are answered, so a daemon knows the trainer is alive. Malformed or
oversized frames are dropped, counted and logged. A PUB socket announces each
published engine version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edge_agent.handoff.protocol import decode_or_drop, encode
from edge_agent.handoff.transport import Authenticator, CurveKeys, server_socket
from edge_agent.log import get_logger
from edge_agent.worker import Worker
from trainer.samples import SampleStore

__all__ = ["Receiver", "ReceiverSettings"]


@dataclass
class ReceiverSettings:
    endpoint: str
    announce_endpoint: str
    heartbeat_s: float = 2.0
    max_payload: int = 32 * 1024 * 1024
    curve: CurveKeys | None = None


class Receiver(Worker):
    thread_name = "handoff-receiver"

    def __init__(self, store: SampleStore, settings: ReceiverSettings, on_sample: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.store = store
        self.settings = settings
        self.on_sample = on_sample or (lambda: None)
        self.log = get_logger("handoff.receiver", endpoint=settings.endpoint)
        self.counters = {"received": 0, "duplicates": 0, "malformed": 0, "store_errors": 0, "announced": 0}
        self.peers: dict[bytes, float] = {}
        self.by_device: dict[str, int] = {}  # new samples per daemon name (samples carry it)
        self._announce: list[str] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()

    def start(self) -> None:
        super().start()
        self._ready.wait(10)  # bound before the first daemon can connect

    def announce(self, version: str) -> None:
        """Tell subscribed daemons that ``version`` is published (sent from the socket thread)."""
        with self._lock:
            self._announce.append(version)

    def _run(self) -> None:
        import zmq

        ctx = zmq.Context()
        s = self.settings
        auth = Authenticator(ctx, s.curve.authorized_dir) if s.curve and s.endpoint.startswith("tcp://") else None
        router = server_socket(ctx, zmq.ROUTER, s.endpoint, s.curve)
        pub = server_socket(ctx, zmq.PUB, s.announce_endpoint, s.curve)
        self._ready.set()
        self.log.info("listening", announce=s.announce_endpoint)
        try:
            while not self._stop.is_set():
                with self._lock:
                    pending, self._announce = self._announce, []
                for version in pending:
                    pub.send_multipart(encode("engine", {"version": version}))
                    self.counters["announced"] += 1
                if router.poll(200):
                    frames = router.recv_multipart()
                    self._handle(router, frames)
        finally:
            router.close(0)
            pub.close(0)
            if auth is not None:
                auth.stop()
            ctx.term()

    def _handle(self, router, frames: list[bytes]) -> None:
        peer, body = frames[0], frames[1:]
        msg = decode_or_drop(body, self.settings.max_payload, self.counters, self.log)
        if msg is None:
            return
        self.peers[peer] = time.monotonic()
        if msg.kind == "heartbeat":
            router.send_multipart([peer, *encode("heartbeat", {"role": "trainer", "time": time.time()})])
        elif msg.kind == "sample":
            try:
                new = self.store.add(msg.header, msg.payload)
            except Exception as exc:  # disk full...: no ack, the daemon keeps it and resends
                self.counters["store_errors"] += 1
                self.log.error("sample_store_failed", error=repr(exc), id=msg.header["id"][:16])
                return
            self.counters["received" if new else "duplicates"] += 1
            router.send_multipart([peer, *encode("ack", {"id": msg.header["id"]})])
            if new:
                device = msg.header.get("device") or "?"
                self.by_device[device] = self.by_device.get(device, 0) + 1
                self.log.debug("sample_stored", id=msg.header["id"][:16], kind=msg.header["kind"], label=msg.header["label"])
                self.on_sample()
        else:
            self.counters["malformed"] += 1
            self.log.warning("unexpected_message", kind=msg.kind)
