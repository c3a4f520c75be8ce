"""Daemon side of the hand-off: deliver queued labels to the trainer, with acknowledgements.

A queued item (pseudo-label or expert label) leaves the daemon's disk only when
the trainer has acknowledged it, i.e. stored it durably. Unacknowledged items
are resent after ``ack_timeout_s``, doubling up to ``backoff_max_s``; ids are the
photos' sha256, so the trainer stores a resend only once. Heartbeats tell each
side whether the other is alive; nothing but heartbeats is sent while the
trainer is silent, so no backlog piles up inside ZeroMQ. Malformed frames are
counted and logged, never fatal. The same thread listens for engine
announcements on a SUB socket.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from edge_agent.config import HandoffSection
from edge_agent.handoff._no_place import without_place
from edge_agent.handoff.protocol import decode_or_drop, encode
from edge_agent.handoff.reduce import reduced
from edge_agent.handoff.transport import HandshakeWatch, Link, client_socket, send_nowait
from edge_agent.handoff.unlabelled import allowed_by, choose
from edge_agent.ledger_rows import QueueEntry
from edge_agent.log import get_logger
from edge_agent.results import ResultsDB
from edge_agent.review.queue import today
from edge_agent.spool import PhotoSpool
from edge_agent.worker import Worker

__all__ = ["Sender", "sample_header"]


@dataclass
class _InFlight:
    sent: float
    attempts: int
    file: str
    verdict: str | None = None  # an unlabelled photo (its verdict); None: a label
    kind: str | None = None  # the label sent (pseudo or expert) and its class: an ack is for them, not for a newer one
    label: str | None = None


def sample_header(entry: QueueEntry, file: str, device: str = "") -> dict:
    """The hand-off header of a queued label: what the trainer stores with the photo."""
    header = {
        "id": entry.sha256,
        "kind": entry.kind,
        "label": entry.label,
        "confidence": float(entry.confidence if entry.confidence is not None else 1.0),
        "engine_version": entry.engine_version or "",
        "ext": Path(file).suffix.lower() or ".jpg",
    }
    return {**header, "device": device} if device else header


class Sender(Worker):
    thread_name = "handoff-sender"

    def __init__(
        self,
        db: ResultsDB,
        spool: PhotoSpool,
        settings: HandoffSection,
        link: Link,
        device: str = "",
        on_engine: Callable[[str], None] | None = None,
        on_lost: Callable[[list[str]], None] | None = None,
    ) -> None:
        """``device``: this daemon's name, sent with each sample (the trainer's fleet list counts them by it);
        ``on_lost(ids)``: the photos whose labels the trainer says it lost (a heartbeat's ``lost``)."""
        super().__init__()
        self.db = db
        self.spool = spool
        self.settings, self.link, self.device = settings, link, device
        self.on_engine = on_engine or (lambda version: None)
        self.on_lost = on_lost or (lambda ids: None)
        self.log = get_logger("handoff.sender", endpoint=link.endpoint)
        self.counters = {
            "sent": 0,
            "resent": 0,
            "acked": 0,
            "malformed": 0,
            "heartbeats_in": 0,
            "announcements": 0,
            "refused": 0,
            "unlabelled_sent": 0,
            "unlabelled_acked": 0,
            "withdrawals_sent": 0,
            "withdrawn": 0,
        }
        self.trainer_seen = 0.0
        #: What the socket monitor says is wrong with the link (wrong keys, no connection), None when it works.
        self.link_problem: str | None = None
        #: The trainer as its last heartbeat described it: state, version in service, published, heard (epoch s).
        self.trainer_info: dict = {}
        self._inflight: dict[str, _InFlight] = {}
        self._unlabelled_next = 0.0  # monotonic time of the next look for unlabelled photos to hand over
        self._withdrawing: dict[str, _InFlight] = {}  # withdrawals sent, not yet answered
        self._withdraw_next = 0.0  # monotonic time of the next look for withdrawals to send

    @property
    def trainer_alive(self) -> bool:
        return time.monotonic() - self.trainer_seen < 3 * self.settings.heartbeat_s

    def status(self) -> dict:
        out = {**self.counters, "trainer_alive": self.trainer_alive, "in_flight": len(self._inflight)}
        if self.link_problem and not self.trainer_alive:
            out["problem"] = self.link_problem
        out["trainer"] = {**self.trainer_info, "endpoint": self.link.endpoint, "remote": not self.link.endpoint.startswith("ipc://")}
        return out

    # ---- loop ---------------------------------------------------------------
    def _run(self) -> None:
        import zmq

        ctx = zmq.Context()
        dealer = client_socket(ctx, zmq.DEALER, self.link.endpoint, self.link.curve)
        sub = client_socket(ctx, zmq.SUB, self.link.announce, self.link.curve)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(sub, zmq.POLLIN)
        next_hb = 0.0
        was_alive = False
        watch = None
        if self.link.curve is not None and self.link.endpoint.startswith("tcp://"):
            watch = HandshakeWatch(dealer, self.link.endpoint, max(10.0, 3 * self.settings.heartbeat_s))
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if watch is not None:
                    watch.poll()
                    if watch.needs_new_socket():  # refused once, never retried by ZeroMQ: try again with new sockets
                        for sock in (dealer, sub):
                            poller.unregister(sock)
                            sock.close(0)
                        dealer = client_socket(ctx, zmq.DEALER, self.link.endpoint, self.link.curve)
                        sub = client_socket(ctx, zmq.SUB, self.link.announce, self.link.curve)
                        sub.setsockopt(zmq.SUBSCRIBE, b"")
                        poller.register(dealer, zmq.POLLIN)
                        poller.register(sub, zmq.POLLIN)
                        watch.watch(dealer)
                    problem = watch.problem()
                    if problem != self.link_problem:
                        (self.log.error if problem else self.log.info)("trainer_link", problem=problem or "none: handshake done")
                        self.link_problem = problem
                if now >= next_hb:
                    self._send(dealer, encode("heartbeat", {"role": "daemon", "time": time.time()}))
                    next_hb = now + self.settings.heartbeat_s
                alive = self.trainer_alive
                if alive != was_alive:
                    self.log.info("trainer_alive" if alive else "trainer_silent", queued=len(self.db.queued_for_delivery(10**9)))
                    was_alive = alive
                if alive:
                    self._deliver(dealer, now)
                    self._deliver_withdrawals(dealer, now)
                for sock, _ in poller.poll(200):
                    for _ in range(500):  # what is waiting, in one go (a flood of garbage must not starve real messages)
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(frames)
        except Exception as exc:  # never take the daemon down; the health check sees the dead thread
            self.log.error("sender_crashed", error=repr(exc))
            self.db.damaged(exc)  # a rotted page of the label queue: the daemon then stops, its next start sets it aside
            raise
        finally:
            if watch is not None:
                watch.close()
            dealer.close(0)
            sub.close(0)
            ctx.term()

    def _send(self, sock, frames: list[bytes]) -> bool:
        return send_nowait(sock, frames)

    def _deliver(self, sock, now: float) -> None:
        s = self.settings
        for sha, item in list(self._inflight.items()):
            wait = min(s.ack_timeout_s * 2 ** (item.attempts - 1), s.backoff_max_s)
            if now - item.sent >= wait:
                entry = self.db.queue_entry(sha) if item.verdict is None else None  # (relabelled meanwhile: as it is now)
                if entry is not None and entry.kind == "review":  # a pseudo-label taken back in flight: the trainer may hold
                    self._inflight.pop(sha)  # it (an ack lost), so it is withdrawn there too, never sent again as a label
                    self.db.withdraw_delivered(sha, item.label or entry.label or "", entry.engine_version or "")
                    continue
                if self._send_item(sock, sha, entry.file if entry else item.file, entry=entry, resend=True, verdict=item.verdict):
                    item.sent, item.attempts = now, item.attempts + 1
                    if entry is not None:
                        item.file, item.kind, item.label = entry.file, entry.kind, entry.label
        room = s.window - len(self._inflight)
        if room <= 0:
            return
        waiting = self.db.queued_for_delivery(room + len(self._inflight))
        for entry in waiting:
            if entry.sha256 in self._inflight:
                continue
            if self._send_item(sock, entry.sha256, entry.file, entry=entry):
                self._inflight[entry.sha256] = _InFlight(now, 1, entry.file, kind=entry.kind, label=entry.label)
                room -= 1
                if room == 0:
                    return
        if not waiting:
            self._deliver_unlabelled(sock, now)

    def _deliver_withdrawals(self, sock, now: float) -> None:
        """Delivered pseudo-labels taken back (:mod:`edge_agent.review.withdraw`), sent to a trainer that takes them
        (its heartbeat's ``withdraws``), a window at a time, again with the samples' backoff until it answers; the next
        window as soon as one is answered, else a look every few seconds."""
        if not self.trainer_info.get("withdraws") or now < self._withdraw_next:
            return
        s = self.settings
        self._withdraw_next = now + min(s.ack_timeout_s, 5.0)
        for sha, label, version in self.db.withdrawals_due(s.window):
            item = self._withdrawing.get(sha)
            if item is not None and now - item.sent < min(s.ack_timeout_s * 2 ** (item.attempts - 1), s.backoff_max_s):
                continue
            if self._send(sock, encode("withdraw", {"id": sha, "label": label, "engine_version": version})):
                self._withdrawing[sha] = _InFlight(now, (item.attempts if item else 0) + 1, "", label=label)
                self.counters["withdrawals_sent"] += 1

    def _deliver_unlabelled(self, sock, now: float) -> None:
        """One photo nobody labelled, when no label waits and none is in flight (:mod:`edge_agent.handoff.unlabelled`)."""
        per_day = self.settings.unlabelled_per_day
        if per_day <= 0 or now < self._unlabelled_next or any(i.verdict is not None for i in self._inflight.values()):
            return
        sent = self.db.unlabelled_sent_since(*today())
        chosen = choose(self.db.unlabelled_candidates(4 * per_day), sent, per_day, allowed_by(per_day))
        if not chosen:
            self._unlabelled_next = now + 60.0  # the day's share is sent, or nothing new: look again in a minute
            return
        entry, verdict = chosen[0]
        if self._send_item(sock, entry.sha256, entry.file, entry=entry, verdict=verdict):
            self._inflight[entry.sha256] = _InFlight(now, 1, entry.file, verdict)

    def _send_item(self, sock, sha: str, file: str, entry=None, resend: bool = False, verdict: str | None = None) -> bool:
        """Send a queued label, or with ``verdict`` a review-pool photo unlabelled; False when it was not sent."""
        entry = entry or self.db.queue_entry(sha)
        if entry is None or (verdict is not None and entry.kind != "review"):  # acknowledged, labelled or pruned meanwhile
            self._inflight.pop(sha, None)
            return False
        try:
            data = Path(file).read_bytes()
        except FileNotFoundError:
            data = None
        if data is None or hashlib.sha256(data).hexdigest() != sha:  # gone, or changed on disk since it was queued
            if not self.db.remove_queued_entry(replace(entry, file=file)):  # relabelled since read (its file moved):
                return False  # sent at the next look as it is now
            self.log.error(
                "queued_photo_missing" if data is None else "queued_photo_changed",
                photo_id=entry.photo_id,
                file=file,
                action="dropped from queue",
            )
            self._inflight.pop(sha, None)
            return False
        header = sample_header(entry, file, self.device)
        copy = reduced(data, self.settings.photo_side, keep_exif=self.settings.send_place)  # not a season of phone photos
        if copy is not None:
            data, ext = copy
            header |= {"ext": ext}
        elif not self.settings.send_place:  # where the farm's trees stand stays on the farm
            data, ext = without_place(data)
            header |= {"ext": ext} if ext else {}
        if len(data) > self.settings.max_payload_mb << 20:  # a frame the trainer drops unread would be resent for ever
            self._too_large(entry, len(data), verdict)
            return False
        if verdict is not None:
            header |= {"kind": "unlabelled", "verdict": verdict}
        ok = self._send(sock, encode("sample", header, data))
        if ok:
            self.counters["resent" if resend else "unlabelled_sent" if verdict is not None else "sent"] += 1
        return ok

    def _handle(self, frames: list[bytes]) -> None:
        msg = decode_or_drop(frames, self.settings.max_payload_mb << 20, self.counters, self.log)
        if msg is None:
            return
        if msg.kind == "heartbeat":
            self.counters["heartbeats_in"] += 1
            self.trainer_seen = time.monotonic()
            h = msg.header
            kept = ("state", "version", "published", "stores_labels", "waits_for_room", "withdraws")
            self.trainer_info = {k: h[k] for k in kept if k in h} | {"heard": round(time.time(), 1)}
            if h.get("lost"):
                self.on_lost(h["lost"].split(","))
        elif msg.kind in ("ack", "refused"):
            self.trainer_seen = time.monotonic()
            self._answered(msg.kind, msg.header)
        elif msg.kind == "withdrawn":
            self.trainer_seen = time.monotonic()
            if self._withdrawing.pop(msg.header["id"], None) is not None and not self._withdrawing:
                self._withdraw_next = 0.0  # the window answered: the next one now
            if self.db.confirm_withdrawn(msg.header["id"]):
                self.counters["withdrawn"] += 1
        elif msg.kind == "engine":
            self.counters["announcements"] += 1
            self.log.info("engine_announced", version=msg.header["version"])
            self.on_engine(msg.header["version"])
        else:
            self.counters["malformed"] += 1
            self.log.warning("unexpected_message", kind=msg.kind)

    def _answered(self, answer: str, header: dict) -> None:
        """The trainer's ack or refusal of a sample: only the label it answers for leaves the queue.

        A trainer names the label it answers for (older ones do not: then it is the one in flight). An answer for an
        older label than the one queued now (relabelled while in flight) leaves the newer queued, sent next; an answer
        with nothing in flight that names no label (a second answer, to a resend) changes nothing; an unlabelled
        photo stays in the review pool whatever the answer."""
        sha = header["id"]
        item = self._inflight.pop(sha, None)
        entry = self.db.queue_entry(sha)
        if entry is None:
            return
        sent_as = header.get("kind") or (item.kind if item is not None else None)
        if answer == "ack" and sent_as == "pseudo" and entry.kind == "review" and (item is None or item.verdict is None):
            # taken back while in flight (:mod:`edge_agent.review.withdraw`): the trainer now holds it, so withdrawn there
            self.db.withdraw_delivered(sha, header.get("label") or entry.label or "", entry.engine_version or "")
            return
        if (item is not None and item.verdict is not None) or entry.kind == "review" or header.get("kind") == "unlabelled":
            if item is not None and item.verdict is not None:  # counted in the day's share, never offered again
                self.db.mark_unlabelled_sent(sha, entry.label or "", item.verdict)
                if answer == "ack":
                    self.counters["unlabelled_acked"] += 1
                else:
                    self.log.warning("unlabelled_refused", photo_id=entry.photo_id, reason=header["reason"])
            return
        if "kind" in header and "label" in header:
            sent = (header["kind"], header["label"])
        elif item is not None and item.kind:
            sent = (item.kind, item.label)
        else:
            self.log.debug("answer_for_nothing_in_flight", photo_id=entry.photo_id, answer=answer)
            return
        if (entry.kind, entry.label) != sent:  # the newer is sent at the next look; the trainer takes it in place
            self.log.info("label_changed_in_flight", photo_id=entry.photo_id, sent=sent[1], now=entry.label, answer=answer)
        elif answer == "ack":
            # the file first, the row after (the row is what says "still queued"), in one transaction with the check
            # that the row is still this label: an expert relabelling it this instant, from the page, waits, then
            # finds it delivered and queues it again (review.queue.label_photo)
            if self.db.remove_queued_entry(entry, lambda: self.spool.remove(Path(entry.file)), delivered=True):
                self.counters["acked"] += 1
                self.log.debug("delivered", photo_id=entry.photo_id, kind=entry.kind)
        else:
            self._refused(entry, header["reason"])

    def _too_large(self, entry: QueueEntry, size: int, verdict: str | None) -> None:
        """A photo larger than a hand-off frame carries: a label is refused here (kept aside, as the trainer's refusals
        are), a photo nobody labelled is counted as offered and stays in the review pool; neither blocks the rest."""
        self._inflight.pop(entry.sha256, None)
        why = (
            f"the photo is {size / 2**20:.1f} MiB as sent, more than a hand-off frame carries ([handoff] max_payload_mb = "
            f"{self.settings.max_payload_mb}); [handoff] photo_side (now {self.settings.photo_side}) reduces a larger photo"
        )
        if verdict is None:
            self._refused(entry, why, by="the hand-off")
            return
        self.db.mark_unlabelled_sent(entry.sha256, entry.label or "", verdict)
        self.log.warning("unlabelled_refused", photo_id=entry.photo_id, reason=why)

    def _refused(self, entry: QueueEntry, reason: str, by: str = "the trainer") -> None:
        """``by`` will never take this label: its photo is kept in the spool's ``refused/`` folder, recorded with the
        reason (``edge-agent status`` counts it among the quarantined), and leaves the delivery queue."""
        why = f"{by} refused the {entry.kind} label {entry.label!r}: {reason}"
        kept: dict[str, str | None] = {}

        def aside() -> None:
            try:
                kept["to"] = str(self.spool.move(Path(entry.file), "refused"))
            except OSError as exc:
                kept["to"], kept["problem"] = None, str(exc)

        if not self.db.remove_queued_entry(entry, aside):  # relabelled this instant: sent again as it is now
            return
        if "problem" in kept:
            why = f"{why} (the photo could not be moved aside: {kept['problem']})"
        self.db.add_quarantine(entry.file, kept["to"], why, source="trainer")
        self.counters["refused"] += 1
        self.log.warning("sample_refused", photo_id=entry.photo_id, kind=entry.kind, label=entry.label, reason=reason, kept=kept["to"])
