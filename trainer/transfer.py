"""Trainer side of engine transfer: offer the newest signed engine version to every daemon, serve its chunks,
and keep the fleet list.

A ROUTER socket takes ``hello`` from any number of daemons (see :mod:`edge_agent.transfer.protocol`). A daemon
whose version is not the newest, and that has not refused it, gets an ``offer`` (at once after a publish, else at
most every ``offer_every_s``); it then asks for the files chunk by chunk and this side only answers, so a slow
daemon is never flooded. Only signed versions are offered. Malformed frames are dropped, counted and logged.

Over CURVE a device is its certificate: a hello in a name other than its key's is refused (so rows exist only for
enrolled devices, one each), a fetch is answered only for a version offered to that device, and a revoked device is
refused from its next message on, marked revoked in the fleet list and disconnected at once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from edge_agent.handoff.protocol import decode_or_drop
from edge_agent.handoff.transport import Authenticator, Link, peer_name, rebind, server_socket
from edge_agent.log import get_logger
from edge_agent.transfer.protocol import CHUNK_MAX, decode, encode
from edge_agent.worker import Worker
from engines.store import MANIFEST, SIGNATURE_FILE, EngineStore, StoreError
from trainer.rollout import Rollout

__all__ = ["EngineServer", "Peer"]


@dataclass
class Peer:
    name: str
    identity: bytes = b""
    address: str = ""
    last_seen: float = 0.0
    engine_version: str = ""
    queue: int = 0
    refused: dict = field(default_factory=dict)
    offered: dict = field(default_factory=dict)  # version -> monotonic time of the last offer
    bytes_sent: int = 0
    last_result: dict | None = None
    pinned: str = ""  # the version a rollback pinned the device to ("" if none)
    report: dict = field(default_factory=dict)  # how its engine in service has done: since, photos, errors, agreement
    granted: set = field(default_factory=set)  # versions offered to it: the only ones whose chunks it is sent
    revoked: bool = False  # its key was revoked: nothing more is taken from it or sent to it

    def describe(self, samples: int = 0) -> dict:
        return {
            "name": self.name,
            "address": self.address,
            "last_seen": round(self.last_seen, 1),
            "engine_version": self.engine_version,
            "queue": self.queue,
            "samples_received": samples,
            "refused": self.refused,
            "bytes_sent": self.bytes_sent,
            "last_result": self.last_result,
            "pinned": self.pinned,
            "serving": self.report,
            "revoked": self.revoked,
        }


class EngineServer(Worker):
    thread_name = "engine-server"

    def __init__(
        self, store: EngineStore, link: Link, offer_every_s: float = 10.0, rollout: Rollout | None = None, parallel: int = 32
    ) -> None:
        """Serves ``store`` on ``link.transfer``; ``rollout``: who may be offered a new version when (None: everyone at
        once); ``parallel``: most devices being sent a version at once (each holds at most its window of chunks in
        the trainer's send queue, so this bounds the trainer's memory; the others are offered as transfers end)."""
        super().__init__()
        self.store, self.link, self.offer_every_s, self.rollout, self.parallel = store, link, offer_every_s, rollout, parallel
        self._active: dict[bytes, float] = {}  # identity -> monotonic time of its last offer or fetch
        self.log = get_logger("transfer.server", endpoint=link.transfer)
        self.counters = {"hellos": 0, "offers": 0, "chunks": 0, "bytes": 0, "malformed": 0, "missing": 0, "refused": 0}
        self.peers: dict[str, Peer] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._offer_now = threading.Event()
        self._unsigned_logged: set[str] = set()
        self._renamed: set[str] = set()  # devices (by key) that said another name than their key's (logged once each)
        self._manifests: dict[str, dict] = {}  # version -> manifest, read once (a version never changes)
        self.auth: Authenticator | None = None

    def handshakes_refused(self) -> list[dict]:
        """Peers whose CURVE handshake was refused (a device with keys this trainer does not accept), newest first."""
        if self.auth is None:
            return []
        rows = [{"address": a, **r} for a, r in list(self.auth.refused.items())]
        return sorted(rows, key=lambda r: -r["last"])

    def start(self) -> None:
        super().start()
        self._ready.wait(10)

    def announce(self, version: str) -> None:
        """A version was published: offer it to every daemon now."""
        self._offer_now.set()

    def fleet(self, samples_by_device: dict[str, int] | None = None) -> list[dict]:
        samples_by_device = samples_by_device or {}
        now_wall, now = time.time(), time.monotonic()
        with self._lock:
            rows = [
                p.describe(samples_by_device.get(p.name, 0)) | {"last_seen": round(now_wall - (now - p.last_seen), 1)}
                for p in self.peers.values()
            ]
        return sorted(rows, key=lambda r: r["name"])

    # ---- loop -----------------------------------------------------------------
    def _run(self) -> None:
        import zmq

        ctx = zmq.Context()
        s = self.link
        auth = self.auth = Authenticator(ctx, s.curve.authorized_dir, s.transfer) if s.curve and s.transfer.startswith("tcp://") else None
        router = server_socket(ctx, zmq.ROUTER, s.transfer, s.curve)
        router.setsockopt(zmq.SNDHWM, 1000)
        self._ready.set()
        self.log.info("listening")
        next_judge = 0.0
        revocations = auth.poll() if auth is not None else 0
        try:
            while not self._stop.is_set():
                if auth is not None and auth.poll() != revocations:  # a device revoked: cut it off, drop every connection
                    revocations = auth.revocations
                    with self._lock:
                        for peer in self.peers.values():
                            if peer.name in auth.revoked:
                                peer.revoked = True
                                self._active.pop(peer.identity, None)
                    router = rebind(router, ctx, zmq.ROUTER, s.transfer, s.curve)
                    router.setsockopt(zmq.SNDHWM, 1000)
                    self.log.warning("connections_dropped", reason="a device was revoked", revoked=sorted(auth.revoked))
                if self.rollout is not None and time.monotonic() >= next_judge:
                    next_judge = time.monotonic() + 1.0
                    self._judge_rollout()
                if self._offer_now.is_set():
                    self._offer_now.clear()
                    with self._lock:
                        for peer in self.peers.values():
                            peer.offered.clear()
                            self._maybe_offer(router, peer)
                if router.poll(200):
                    frames = router.recv_multipart(copy=False)
                    self._handle(router, frames)
        finally:
            router.close(0)
            if auth is not None:
                auth.stop()
            ctx.term()

    def _judge_rollout(self) -> None:
        """Let the rollout look at the connected devices; offer the version to the rest once the canaries pass."""
        try:
            version = self.store.current()
        except StoreError:
            return
        now = time.monotonic()
        with self._lock:
            connected = {p.name: p for p in self.peers.values() if now - p.last_seen < 60}
            promoted = self.rollout.judge(version, connected)
        if promoted:
            self._offer_now.set()

    def rollout_state(self) -> dict | None:
        """The rollout of the version in service, as the Fleet page shows it (None: not staged)."""
        if self.rollout is None or not self.rollout.settings.staged:
            return None
        with self._lock:
            return self.rollout.describe()

    def _offer_of(self, version: str) -> tuple[bytes, str] | None:
        """``version``'s manifest bytes and signature text; None if it is unsigned (daemons would refuse it)."""
        vdir = self.store.root / version
        try:
            return (vdir / MANIFEST).read_bytes(), (vdir / SIGNATURE_FILE).read_text()
        except FileNotFoundError:
            if version not in self._unsigned_logged:
                self._unsigned_logged.add(version)
                self.log.warning("not_offered", engine_version=version, reason="unsigned: daemons would refuse it")
            return None

    def _maybe_offer(self, router, peer: Peer) -> None:
        """Offer the version in service to ``peer`` unless it runs it, refused it, or had it offered lately (checked
        on every hello, so the files are read only once an offer is due)."""
        try:
            version = self.store.current()
        except StoreError:
            return
        if not peer.identity or peer.revoked or peer.engine_version == version or version in peer.refused:
            return
        if self.rollout is not None and not self.rollout.allowed(peer.name, version):
            return  # a staged rollout: not this device's turn yet
        now = time.monotonic()
        for ident, seen in list(self._active.items()):  # a transfer silent for long is over (the device went away)
            if now - seen > 30:
                del self._active[ident]
        if peer.identity not in self._active and len(self._active) >= self.parallel:
            return  # every transfer slot busy: offered when one ends
        if time.monotonic() - peer.offered.get(version, -1e9) < self.offer_every_s:
            return
        offer = self._offer_of(version)
        if offer is None:
            return
        manifest, signature = offer
        peer.offered[version] = time.monotonic()
        peer.granted = {*list(peer.granted)[-7:], version}  # bounded: the newest few
        self._active[peer.identity] = time.monotonic()
        router.send_multipart([peer.identity, *encode("offer", {"version": version, "signature": signature}, manifest)])
        self.counters["offers"] += 1
        self.log.info("engine_offered", engine_version=version, device=peer.name, running=peer.engine_version)

    def _sender(self, identity: bytes, who: str | None) -> Peer | None:
        """The fleet row a message belongs to: its key's device over CURVE, else the row that said hello on this
        connection (``ipc://``: the daemon on this machine)."""
        if who is not None:
            return self.peers.get(who)
        return next((p for p in self.peers.values() if p.identity == identity), None)

    def _refuse(self, what: str, **fields) -> None:
        self.counters["refused"] += 1
        if self.counters["refused"] <= 20 or self.counters["refused"] % 1000 == 0:
            self.log.warning(what, refused_so_far=self.counters["refused"], **fields)

    def _handle(self, router, frames) -> None:
        identity = frames[0].bytes
        address = "this machine (ipc)"
        if not self.link.transfer.startswith("ipc://"):
            try:
                address = frames[1].get("Peer-Address")
            except Exception:  # a transport without one
                address = ""
        who = peer_name(frames[1]) if self.auth is not None and len(frames) > 1 else None
        if self.auth is not None and not self.auth.admits(who):
            self._refuse("revoked_device_refused", device=who, address=address)
            return
        msg = decode_or_drop([f.bytes for f in frames[1:]], CHUNK_MAX, self.counters, self.log, decoder=decode)
        if msg is None:
            return
        h = msg.header
        if msg.kind == "hello":
            if who is not None and h["name"] != who:
                if self.auth.claims_another(h["name"]) or h["name"] in self.peers:
                    self._refuse("hello_refused", device=who, claimed=h["name"], reason="a hello in another device's name")
                    return
                if who not in self._renamed:  # its [handoff] name is not its key's: it is known by its key
                    self._renamed.add(who)
                    self.log.warning(
                        "device_name_differs", device=who, says=h["name"], fix=f'set [handoff] name = "{who}" on it (or leave it empty)'
                    )
                h = {**h, "name": who}
            self.counters["hellos"] += 1
            with self._lock:
                peer = self.peers.get(h["name"])
                if peer is None:
                    peer = self.peers[h["name"]] = Peer(h["name"])
                    self.log.info("daemon_joined", device=h["name"], address=address, engine_version=h["engine_version"])
                if peer.identity not in (b"", identity):  # a new connection (the daemon restarted or reconnected):
                    self._active.pop(peer.identity, None)  # what was offered on the old one went nowhere
                    peer.offered.clear()
                peer.identity, peer.address, peer.last_seen = identity, address or peer.address, time.monotonic()
                peer.revoked = False  # admitted: its key is authorized (again)
                peer.engine_version, peer.queue = h["engine_version"], h["queue"]
                peer.refused = {str(k): str(v)[:300] for k, v in list(h["refused"].items())[:20]}
                peer.pinned = h.get("pinned", "")
                peer.report = {k: h[k] for k in ("since", "photos", "errors", "agreement") if k in h}
                self._maybe_offer(router, peer)
        elif msg.kind == "fetch":
            with self._lock:
                peer = self._sender(identity, who)
                granted = peer is not None and h["version"] in peer.granted
            if not granted:
                self._refuse("fetch_refused", device=who or peer and peer.name, engine_version=h["version"], reason="never offered to it")
                router.send_multipart([identity, *encode("missing", {"version": h["version"], "reason": "not offered to this device"})])
                return
            if identity in self._active:
                self._active[identity] = time.monotonic()
            self._serve(router, identity, h)
        elif msg.kind == "result":
            with self._lock:
                peer = self._sender(identity, who)
                if peer is not None:
                    peer.last_result = {"version": h["version"], "ok": h["ok"], "reason": h["reason"][:300]}
                if self._active.pop(identity, None) is not None:  # a slot is free: the next device waiting
                    for waiting in self.peers.values():
                        if waiting.identity not in self._active and len(self._active) < self.parallel:
                            self._maybe_offer(router, waiting)
            log = self.log.info if h["ok"] else self.log.warning
            log(
                "engine_delivery_result",
                engine_version=h["version"],
                device=peer.name if peer else "?",
                ok=h["ok"],
                reason=h["reason"][:300],
            )
        else:
            self.counters["malformed"] += 1
            self.log.warning("unexpected_message", kind=msg.kind)

    def _serve(self, router, identity: bytes, h: dict) -> None:
        version, name, offset, length = h["version"], h["file"], h["offset"], h["length"]
        try:
            manifest = self._manifests.get(version) or self._manifests.setdefault(version, self.store.read_manifest(version))
            meta = manifest["files"].get(name)
            if meta is None:
                raise StoreError(f"{version} has no file {name!r}")
            if offset >= meta["bytes"]:
                raise StoreError(f"offset {offset} beyond {name}'s {meta['bytes']} bytes")
            with open(self.store.root / version / name, "rb") as fh:
                fh.seek(offset)
                data = fh.read(length)
        except (StoreError, OSError) as exc:
            self.counters["missing"] += 1
            router.send_multipart([identity, *encode("missing", {"version": version, "reason": str(exc)[:300]})])
            return
        router.send_multipart([identity, *encode("chunk", {"version": version, "file": name, "offset": offset}, self._payload(data, h))])
        self.counters["chunks"] += 1
        self.counters["bytes"] += len(data)
        with self._lock:
            peer = next((p for p in self.peers.values() if p.identity == identity), None)
            if peer is not None:
                peer.bytes_sent += len(data)

    def _payload(self, data: bytes, request: dict) -> bytes:
        """The chunk as sent (a seam for the tests that alter one in flight)."""
        return data
