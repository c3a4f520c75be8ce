"""Daemon side of engine transfer: take the trainer's newest engine version, verified, into the local store.

Every heartbeat the daemon says hello (its name, the version it serves, its undelivered queue, the versions it
refused). When the trainer offers a version, the manifest's signature is checked against the trusted keys
before a single byte is asked for; then the files are fetched in chunks, at most ``window`` requests
outstanding, into ``<store>/.incoming/<version>/``, each file checked against the signed manifest's sha256 once
complete. A complete version is moved into the store atomically and put in service; the hot-swap watcher then
loads it with its own checks. After a disconnect, a restart of either side or a kill, the transfer resumes
from the bytes already on disk. A version already in the store (a trainer on the same state directory) costs
no transfer: the same offer, answered at once.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.config import HandoffSection
from edge_agent.handoff.protocol import decode_or_drop
from edge_agent.handoff.transport import HandshakeWatch, Link, client_socket, send_nowait
from edge_agent.log import get_logger
from edge_agent.transfer.protocol import MAX_REFUSED, decode, encode
from edge_agent.worker import Worker
from engines.durable import fsync_file
from engines.store import MANIFEST, MAX_FILE_BYTES, SIGNATURE_FILE, EngineStore, OfferRefused, StoreError, sha256_file

__all__ = ["EngineFetcher"]


@dataclass
class _Download:
    version: str
    signature: str
    files: list[tuple[str, int, str]]  # name, bytes, sha256 (manifest order)
    dir: Path
    next: dict[str, int] = field(default_factory=dict)  # file -> next offset to request
    outstanding: deque = field(default_factory=deque)  # (file, offset, length) requested, in order
    last_progress: float = 0.0
    resumed_bytes: int = 0
    received_bytes: int = 0


class EngineFetcher(Worker):
    thread_name = "engine-fetcher"

    def __init__(
        self,
        store: EngineStore,
        trust,
        settings: HandoffSection,
        link: Link,
        name: str,
        serving: Callable[[], str],
        queue_depth: Callable[[], int] = lambda: 0,
        on_installed: Callable[[str], None] = lambda version: None,
        stall_s: float = 10.0,
        refused_here: Callable[[], dict] = dict,
        report: Callable[[], dict] = dict,
    ) -> None:
        """``name``: this daemon in the trainer's fleet list; ``stall_s``: a transfer with no chunk for this long asks
        again; ``refused_here``: versions on this device's disk it refused to serve (version -> reason); ``report``:
        the serving report a hello carries (``since``, ``photos``, ``errors``, ``agreement``)."""
        super().__init__()
        self.refused_here, self.report = refused_here, report
        self.store, self.trust, self.settings, self.link, self.name = store, trust, settings, link, name
        self.chunk_bytes, self.window, self.stall_s = settings.transfer_chunk_kb << 10, settings.transfer_window, stall_s
        self.serving, self.queue_depth, self.on_installed = serving, queue_depth, on_installed
        self.log = get_logger("transfer.fetcher", endpoint=link.transfer, device=name)
        self.counters = {
            "offers": 0,
            "installed": 0,
            "refused": 0,
            "chunks": 0,
            "bytes": 0,
            "resumed_bytes": 0,
            "malformed": 0,
            "stalls": 0,
            "errors": 0,
        }
        self.refused: dict[str, str] = {}
        self._refused_sig: dict[str, str] = {}
        self._held_back: set[str] = set()  # refused by policy (older, or pinned): offered again once that changes
        self.trainer_seen = 0.0
        self._job: _Download | None = None

    def status(self) -> dict:
        job = self._job
        return {
            **self.counters,
            "refused": self.all_refused(),
            "downloading": None
            if job is None
            else {"version": job.version, "bytes": job.received_bytes + job.resumed_bytes, "of": sum(b for _, b, _ in job.files)},
        }

    # ---- loop -----------------------------------------------------------------
    def _run(self) -> None:
        import zmq

        ctx = zmq.Context()
        sock = client_socket(ctx, zmq.DEALER, self.link.transfer, self.link.curve)
        watch = None
        if self.link.curve is not None and self.link.transfer.startswith("tcp://"):
            watch = HandshakeWatch(sock, self.link.transfer)
        next_hello = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if watch is not None:
                    watch.poll()
                    if watch.needs_new_socket():  # a refused handshake is never retried by ZeroMQ: a new socket is
                        sock.close(0)
                        sock = client_socket(ctx, zmq.DEALER, self.link.transfer, self.link.curve)
                        watch.watch(sock)
                        next_hello = 0.0
                if now >= next_hello:
                    self._release_held_back()
                    self._send(sock, encode("hello", self.hello()))
                    next_hello = now + self.settings.heartbeat_s
                job = self._job
                if job is not None and now - job.last_progress > self.stall_s:
                    self.counters["stalls"] += 1
                    self.log.warning("transfer_stalled", engine_version=job.version, action="asking again")
                    for f, off, _ in job.outstanding:  # ask again from the first byte not yet written
                        job.next[f] = min(job.next[f], off)
                    job.outstanding.clear()
                    job.last_progress = now
                    self._fill(sock)
                if sock.poll(200):
                    frames = sock.recv_multipart()
                    try:
                        self._handle(sock, frames)
                    except Exception as exc:  # noqa: BLE001 - one message's bug or I/O error must not stop transfers
                        self.counters["errors"] += 1
                        self.log.error("transfer_message_failed", error=repr(exc))
                        self._job = None  # start the transfer over at the next offer
        finally:
            if watch is not None:
                watch.close()
            sock.close(0)
            ctx.term()

    def all_refused(self) -> dict[str, str]:
        """Every version this device refuses: those offered on the wire and those on its own disk, newest last."""
        merged = {**{str(k): str(v) for k, v in dict(self.refused_here()).items()}, **self.refused}
        return dict(sorted(merged.items())[-MAX_REFUSED:])

    def hello(self) -> dict:
        """What this device tells the trainer every heartbeat."""
        pin = self.store.pin()
        return {
            "name": self.name,
            "engine_version": self.serving(),
            "queue": int(self.queue_depth()),
            "refused": {k: v[:500] for k, v in self.all_refused().items()},
            "pinned": str(pin.get("version", "?"))[:32] if pin else "",
            **{k: v for k, v in self.report().items() if k in ("since", "photos", "errors", "agreement")},
        }

    def _send(self, sock, frames: list[bytes]) -> bool:
        return send_nowait(sock, frames)

    def _handle(self, sock, frames: list[bytes]) -> None:
        msg = decode_or_drop(frames, self.chunk_bytes, self.counters, self.log, decoder=decode)
        if msg is None:
            return
        self.trainer_seen = time.monotonic()
        if msg.kind == "offer":
            self._on_offer(sock, msg.header["version"], msg.header["signature"], msg.payload)
        elif msg.kind == "chunk":
            self._on_chunk(sock, msg.header, msg.payload)
        elif msg.kind == "missing":
            if self._job is not None and self._job.version == msg.header["version"]:
                self.log.warning("transfer_abandoned", engine_version=msg.header["version"], reason=msg.header["reason"])
                self._job = None
        else:
            self.counters["malformed"] += 1
            self.log.warning("unexpected_message", kind=msg.kind)

    # ---- an offer ---------------------------------------------------------------
    def _on_offer(self, sock, version: str, signature: str, manifest: bytes) -> None:
        self.counters["offers"] += 1
        if self._job is not None and self._job.version == version:
            return
        if self._refused_sig.get(version) == signature:
            return  # refused before, and nothing changed
        if version == self.serving():
            self._send(sock, encode("result", {"version": version, "ok": True, "reason": "in service"}))
            return
        here = self.refused_here().get(version)
        if here is not None:  # on this disk already, and refused when it was tried: the trainer must know why
            self._refuse(sock, version, signature, here)
            return
        why = self.store.offer_refusal(version)
        if why is not None:  # a downgrade, or a version a local rollback turned away
            self._refuse(sock, version, signature, why, policy=True)
            return
        if version in self.store.versions():  # newer, already here: verified (signature included) before it serves
            try:
                self.store.set_current(version, trust=self.trust, offered=True)  # lifts a pin it is newer than
                self.on_installed(version)
                self._send(sock, encode("result", {"version": version, "ok": True, "reason": "already in the store"}))
            except StoreError as exc:
                self._refuse(sock, version, signature, str(exc), policy=isinstance(exc, OfferRefused))
            return
        incoming = self.store.incoming(version)
        try:
            doc = json.loads(manifest)
            if not isinstance(doc, dict) or doc.get("version") != version or not isinstance(doc.get("files"), dict):
                raise ValueError("the manifest does not describe this version")
            files = [(str(n), int(m["bytes"]), str(m["sha256"])) for n, m in doc["files"].items()]
            if any("/" in n or n.startswith(".") or n in (MANIFEST, SIGNATURE_FILE) for n, _, _ in files):
                raise ValueError("the manifest names a file outside the version")
            if any(not 0 <= size <= MAX_FILE_BYTES for _, size, _ in files):
                raise ValueError(f"a file is larger than {MAX_FILE_BYTES >> 20} MiB, the most a version's file may be")
        except (ValueError, KeyError, TypeError) as exc:
            self._refuse(sock, version, signature, f"{version}: unusable manifest ({exc})")
            return
        incoming.mkdir(parents=True, exist_ok=True)
        if not (incoming / MANIFEST).is_file() or (incoming / MANIFEST).read_bytes() != manifest:
            for f in incoming.iterdir():  # another manifest under this name: start over
                f.unlink()
            (incoming / MANIFEST).write_bytes(manifest)
        (incoming / SIGNATURE_FILE).write_text(signature)
        if self.trust is not None:
            try:
                signer = self.trust.check(incoming, manifest)
            except StoreError as exc:
                self._refuse(sock, version, signature, str(exc))
                return
            self.log.info("engine_offered", engine_version=version, signed_by=signer)
        job = _Download(version, signature, files, incoming, last_progress=time.monotonic())
        for name, size, _ in files:
            part = incoming / name
            have = part.stat().st_size if part.is_file() else 0
            have = min(have - have % self.chunk_bytes, size)
            if part.is_file():
                os.truncate(part, have)
            job.next[name] = have
            job.resumed_bytes += have
        self.counters["resumed_bytes"] += job.resumed_bytes
        if job.resumed_bytes:
            self.log.info("transfer_resumed", engine_version=version, bytes_on_disk=job.resumed_bytes)
        self._job = job
        self._fill(sock)
        self._maybe_finish(sock)

    def _fill(self, sock) -> None:
        job = self._job
        if job is None:
            return
        for name, size, _ in job.files:
            while len(job.outstanding) < self.window and job.next[name] < size:
                off = job.next[name]
                length = min(self.chunk_bytes, size - off)
                if not self._send(sock, encode("fetch", {"version": job.version, "file": name, "offset": off, "length": length})):
                    return  # not connected: the stall timer asks again
                job.outstanding.append((name, off, length))
                job.next[name] = off + length
            if len(job.outstanding) >= self.window:
                return

    # ---- a chunk ------------------------------------------------------------------
    def _on_chunk(self, sock, header: dict, data: bytes) -> None:
        job = self._job
        if job is None or header["version"] != job.version or not job.outstanding:
            return  # late, for an abandoned or finished transfer
        name, off, length = job.outstanding[0]
        if (header["file"], header["offset"]) != (name, off) or len(data) != length:
            return  # stale (asked again after a stall): the in-order answer comes later
        job.outstanding.popleft()
        part = job.dir / name
        with open(part, "r+b" if part.exists() else "wb") as fh:
            fh.seek(off)
            fh.write(data)
        job.received_bytes += len(data)
        job.last_progress = time.monotonic()
        self.counters["chunks"] += 1
        self.counters["bytes"] += len(data)
        size, sha = next((b, h) for n, b, h in job.files if n == name)
        if off + length == size:
            fsync_file(part)
            digest = sha256_file(part)
            if digest != sha:
                part.unlink()
                self._refuse(
                    sock,
                    job.version,
                    job.signature,
                    f"{job.version}/{name}: sha256 {digest[:12]}... of the received file does not match the "
                    f"signed manifest ({sha[:12]}...): altered in transit; refusing the version",
                )
                return
        self._fill(sock)
        self._maybe_finish(sock)

    def _maybe_finish(self, sock) -> None:
        job = self._job
        if job is None or job.outstanding or any(job.next[n] < b for n, b, _ in job.files):
            return
        try:
            # checks every file against the manifest first (resumed ones included), and the offer's policy again
            # under the store's lock: a rollback made while the bytes came in turns it away
            self.store.install(job.version, offered=True)
        except StoreError as exc:
            self._refuse(sock, job.version, job.signature, str(exc), policy=isinstance(exc, OfferRefused))
            return
        self._job = None
        self.counters["installed"] += 1
        self.log.info("engine_received", engine_version=job.version, bytes=job.received_bytes, resumed_bytes=job.resumed_bytes)
        self._send(sock, encode("result", {"version": job.version, "ok": True, "reason": "installed"}))
        self.on_installed(job.version)

    def _release_held_back(self) -> None:
        """Versions refused by policy that the store would now take (a pin lifted, a rollback further back): no
        longer listed as refused, so the trainer offers them again."""
        for version in list(self._held_back):
            if self.store.offer_refusal(version) is None:
                self._held_back.discard(version)
                self.refused.pop(version, None)
                self._refused_sig.pop(version, None)

    def _refuse(self, sock, version: str, signature: str, reason: str, policy: bool = False) -> None:
        """Tell the trainer ``version`` is refused and why; one refused by ``policy`` (a downgrade, a rollback's pin)
        is held back, and offered again once the store would take it (:meth:`_release_held_back`)."""
        if policy:
            self._held_back.add(version)
        self.refused[version] = reason[:500]
        self._refused_sig[version] = signature
        self.counters["refused"] += 1
        self.log.error("engine_refused", candidate=version, reason=reason, source="transfer")
        if self._job is not None and self._job.version == version:
            self._job = None
        shutil.rmtree(self.store.incoming(version), ignore_errors=True)
        self._send(sock, encode("result", {"version": version, "ok": False, "reason": reason[:500]}))
