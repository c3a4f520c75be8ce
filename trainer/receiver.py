"""Trainer side of the hand-off: store what arrives, acknowledge it, announce new engines.

A ROUTER socket takes samples from any number of daemons; each is stored
durably (:class:`~trainer.samples.SampleStore`) before its ``ack`` goes back, a photo larger than ``[handoff]
photo_side`` reduced to it as the hand-off of a device since 2026-12-04 sends it (:mod:`edge_agent.handoff.reduce`).
Heartbeats are answered, so a daemon knows the trainer is alive. Malformed or
oversized frames are dropped, counted and logged. A PUB socket announces each
published engine version.

Over CURVE a message is its key's (:class:`~edge_agent.handoff.transport.Authenticator`): a sample in another
device's name is refused, and a revoked device's messages are dropped from the revoke on (no ack, no heartbeat
answered) and its connections, with every other, dropped at once (the others reconnect on their own).

A sample's label must name a class of the engine in service, except an expert's label for a new class, which is
taken only where ``new_classes`` allows it (the trainer allows it on its local socket, where the sender is the
daemon on the same machine, and over TCP only with ``[trainer] fleet_new_classes``); anything else is answered
``refused`` with the reason, never stored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from edge_agent.config import HandoffSection
from edge_agent.handoff.protocol import decode_or_drop, encode
from edge_agent.handoff.reduce import reduced
from edge_agent.handoff.transport import Authenticator, Link, peer_name, rebind, server_socket
from edge_agent.log import get_logger
from edge_agent.names import class_name_problem
from edge_agent.storage_errors import storage_problem
from edge_agent.worker import Worker
from trainer.loop.unlabelled_pool import UnlabelledPool
from trainer.samples import SampleStore

__all__ = ["Receiver"]


class Receiver(Worker):
    thread_name = "handoff-receiver"

    def __init__(
        self,
        store: SampleStore,
        settings: HandoffSection,
        link: Link,
        new_classes: bool = True,
        on_sample: Callable[[], None] | None = None,
        classes: Callable[[], Collection[str]] | None = None,
        describe: Callable[[], dict] | None = None,
        pool: UnlabelledPool | None = None,
    ) -> None:
        """``describe``: the trainer's state, version in service and publish time, sent with each heartbeat; ``pool``:
        where unlabelled photos go (None: they are refused)."""
        super().__init__()
        self.pool = pool
        self.describe = describe or (lambda: {})
        self.store = store
        self.settings, self.link, self.new_classes = settings, link, new_classes
        self.on_sample = on_sample or (lambda: None)
        self.classes = classes  # the engine in service's classes (None: labels are not checked)
        self.log = get_logger("handoff.receiver", endpoint=link.endpoint)
        self.counters = {
            "received": 0,
            "duplicates": 0,
            "malformed": 0,
            "store_errors": 0,
            "announced": 0,
            "refused": 0,
            "revoked": 0,
            "impersonations": 0,
            "unlabelled": 0,
            "withdrawn": 0,
        }
        self.peers: dict[bytes, float] = {}
        self.by_device: dict[str, int] = {}  # new samples per daemon name (samples carry it)
        #: Why samples cannot be stored now (``error``, ``full``: the disk, ``since``), None while they can.
        self.store_problem: dict | None = None
        self._announce: list[str] = []
        self.auth: Authenticator | None = None
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
        s = self.link
        auth = self.auth = Authenticator(ctx, s.curve.authorized_dir, s.endpoint) if s.curve and s.endpoint.startswith("tcp://") else None
        router = server_socket(ctx, zmq.ROUTER, s.endpoint, s.curve)
        pub = server_socket(ctx, zmq.PUB, s.announce, s.curve)
        self._ready.set()
        self.log.info("listening", announce=s.announce)
        revocations = auth.poll() if auth is not None else 0
        try:
            while not self._stop.is_set():
                if auth is not None and auth.poll() != revocations:  # a device revoked: drop every connection
                    revocations = auth.revocations
                    router = rebind(router, ctx, zmq.ROUTER, s.endpoint, s.curve)
                    pub = rebind(pub, ctx, zmq.PUB, s.announce, s.curve)
                    self.log.warning("connections_dropped", reason="a device was revoked", revoked=sorted(auth.revoked))
                with self._lock:
                    pending, self._announce = self._announce, []
                for version in pending:
                    pub.send_multipart(encode("engine", {"version": version}))
                    self.counters["announced"] += 1
                if router.poll(200):
                    frames = router.recv_multipart(copy=False)
                    admitted, who = self._admitted(frames)
                    if admitted:
                        self._handle(router, [f.bytes for f in frames], who)
        finally:
            router.close(0)
            pub.close(0)
            if auth is not None:
                auth.stop()
            ctx.term()

    def _admitted(self, frames) -> tuple[bool, str | None]:
        """Whether a message may be taken, and the device name its key binds it to (None without CURVE): over CURVE,
        only from a device whose key is authorized now (a revoked one is refused from its next message on, and told
        nothing)."""
        if self.auth is None or len(frames) < 2:
            return True, None
        who = peer_name(frames[1])
        if self.auth.admits(who):
            return True, who
        self.counters["revoked"] += 1
        if self.counters["revoked"] == 1 or self.counters["revoked"] % 1000 == 0:
            self.log.warning("revoked_device_refused", device=who, refused_so_far=self.counters["revoked"])
        return False, who

    def _handle(self, router, frames: list[bytes], who: str | None = None) -> None:
        """One message; ``who``: the device its CURVE key names (None on ``ipc://``)."""
        peer, body = frames[0], frames[1:]
        msg = decode_or_drop(body, self.settings.max_payload_mb << 20, self.counters, self.log)
        if msg is None:
            return
        claimed = msg.header.get("device", who) if msg.kind == "sample" else who
        if who is not None and claimed != who and self.auth.claims_another(claimed):
            self.counters["impersonations"] += 1
            self.log.warning(
                "sample_refused", id=msg.header["id"][:16], device=who, claimed=msg.header["device"], reason="in another device's name"
            )
            self._answer(router, peer, "refused", msg.header, reason=f"sent with {who}'s key in another device's name")
            return
        if who is not None and msg.kind == "sample":
            msg.header["device"] = who  # a sample is its key's device's (a name of no device is taken as its key's)
        self.peers[peer] = time.monotonic()
        if msg.kind == "heartbeat":
            beat = {"role": "trainer", "time": time.time(), **self.describe(), "withdraws": True}
            router.send_multipart([peer, *encode("heartbeat", beat)])
        elif msg.kind == "withdraw":
            self._withdraw(router, peer, msg.header, who)
        elif msg.kind == "sample":
            why = self._refusal(msg.header)
            if why is not None:
                self.counters["refused"] += 1
                self.log.warning(
                    "sample_refused",
                    id=msg.header["id"][:16],
                    kind=msg.header["kind"],
                    label=msg.header["label"][:100],
                    device=msg.header.get("device"),
                    reason=why,
                )
                self._answer(router, peer, "refused", msg.header, reason=why)
                return
            try:
                header, photo = self._as_kept(msg.header, msg.payload)
                if msg.header["kind"] == "unlabelled":  # (one labelled already is acknowledged, not kept twice)
                    new = not self.store.has(msg.header["id"]) and self.pool.add(header, photo)
                else:
                    new = self.store.add(header, photo)
                    if self.pool is not None:
                        self.pool.discard(msg.header["id"])  # labelled now: the label says more
            except Exception as exc:  # disk full...: no ack, the daemon keeps it and resends
                self.counters["store_errors"] += 1
                since = (self.store_problem or {}).get("since", time.time())
                problem = storage_problem(exc, self.store.root)
                self.store_problem = {"error": repr(exc)[:300], "full": problem == "full", "damaged": problem == "damaged", "since": since}
                self.log.error("sample_store_failed", error=repr(exc), id=msg.header["id"][:16])
                return
            self.store_problem = None
            unlabelled = msg.header["kind"] == "unlabelled"
            self.counters["duplicates" if not new else "unlabelled" if unlabelled else "received"] += 1
            self._answer(router, peer, "ack", msg.header)
            if new and not unlabelled:
                device = msg.header.get("device") or "?"
                self.by_device[device] = self.by_device.get(device, 0) + 1
                self.log.debug("sample_stored", id=msg.header["id"][:16], kind=msg.header["kind"], label=msg.header["label"])
                self.on_sample()
        else:
            self.counters["malformed"] += 1
            self.log.warning("unexpected_message", kind=msg.kind)

    def _withdraw(self, router, peer: bytes, header: dict, who: str | None = None) -> None:
        """A device takes back a pseudo-label it delivered (:mod:`edge_agent.review.withdraw`): it is no longer trained
        on, its photo kept in the unlabelled pool where the trainer keeps one (deleted where not), and ``withdrawn``
        answered once that is durable; a sample that is not that pseudo-label (an expert label since, never stored,
        over CURVE another device's: ``who``, its key's name, must have delivered it) is left as it is and answered
        all the same. A disk that fails is not answered: the device sends it again."""
        try:
            gone = self.store.withdraw(header["id"], header["label"], header["engine_version"], who)
            if gone is not None:
                self._keep_unlabelled(gone)
        except Exception as exc:  # noqa: BLE001 - a full or damaged disk: no answer, the device asks again later
            self.counters["store_errors"] += 1
            self.log.error("withdraw_failed", error=repr(exc), id=header["id"][:16])
            return
        if gone is not None:
            self.counters["withdrawn"] += 1
            self.log.info("pseudo_label_withdrawn", id=header["id"][:16], label=header["label"], engine_version=header["engine_version"])
        router.send_multipart([peer, *encode("withdrawn", {"id": header["id"], "label": header["label"]})])

    def _keep_unlabelled(self, sample) -> None:
        """A withdrawn pseudo-label's photo, into the unlabelled pool where the trainer keeps one
        (:meth:`trainer.loop.unlabelled_pool.UnlabelledPool.keep_withdrawn`), else deleted (the label was the point)."""
        try:
            if self.pool is not None:
                self.pool.keep_withdrawn(sample)
            else:
                Path(sample.file).unlink(missing_ok=True)
        except Exception as exc:  # noqa: BLE001 - the photo is lost to the pool, not the withdrawal
            self.log.warning("withdrawn_photo_not_kept", id=sample.id[:16], error=repr(exc))

    def _as_kept(self, header: dict, photo: bytes) -> tuple[dict, bytes]:
        """The sample as stored: a photo larger than ``[handoff] photo_side`` reduced to it (a device from before its
        hand-off reduced photos, or one with ``photo_side = 0``), its EXIF kept as the device sent it; a photo stored
        already is not reduced again (a resend, a corrected label)."""
        if self.store.has(header["id"]):
            return header, photo
        try:
            copy = reduced(photo, self.settings.photo_side, keep_exif=True)
        except Exception as exc:  # noqa: BLE001 - a saving never costs a label: the photo is kept as sent
            self.log.warning("photo_not_reduced", id=header["id"][:16], error=f"{type(exc).__name__}: {exc}", kept="as sent")
            copy = None
        return (header, photo) if copy is None else ({**header, "ext": copy[1]}, copy[0])

    @property
    def problem_state(self) -> str | None:
        """The state a heartbeat tells the devices while samples cannot be stored (it takes the trainer's own), or None."""
        if self.store_problem is None:
            return None
        return "labels not stored: disk full" if self.store_problem["full"] else "labels not stored"

    def _answer(self, router, peer: bytes, answer: str, sample: dict, **extra) -> None:
        """An ack or a refusal naming the label it answers for: the device keeps a newer label of the photo queued."""
        header = {"id": sample["id"], **extra, "kind": sample["kind"], "label": sample["label"]}
        router.send_multipart([peer, *encode(answer, header)])

    def _refusal(self, header: dict) -> str | None:
        """Why a sample's label cannot be taken, or None."""
        if header["kind"] == "unlabelled":
            if self.pool is None or self.pool.max_photos <= 0:
                return "this trainer keeps no unlabelled photos ([trainer] unlabelled_pool = 0)"
            if self.store.has(header["id"]):
                return None  # labelled already: acknowledged, not kept twice (_handle)
        if self.classes is None:
            return None
        label = header["label"]
        try:
            known = self.classes()
        except Exception as exc:  # no engine to check against: take it, as before there were checks
            self.log.warning("classes_unavailable", error=repr(exc))
            return None
        if label in known:
            return None
        if header["kind"] != "expert":
            what = "a pseudo-label" if header["kind"] == "pseudo" else "the model's answer to an unlabelled photo"
            return f"{what} must name one of the engine's {len(known)} classes"
        if not self.new_classes:
            return "new classes are taken from the trainer's own device only ([trainer] fleet_new_classes = true allows the fleet)"
        problem = class_name_problem(label)
        return f"not a class name: {problem}" if problem else None
