"""The wire format between the daemon and the trainer (ZeroMQ multipart messages).

Every message is ``[MAGIC, kind, header]`` plus, for samples, ``[photo bytes]``.
The header is a small JSON object. Anything else (wrong magic, unknown kind,
bad JSON, missing fields, oversized frames) raises :class:`ProtocolError`; the
receiving side counts it, logs it and carries on.

Kinds:

* ``sample`` (daemon -> trainer): ``{"id", "kind": "pseudo"|"expert"|"unlabelled", "label", "confidence",
  "engine_version", "ext"}`` and optionally ``"device"`` (the daemon's name) and, for an unlabelled photo, ``"verdict"``
  (its ``label`` is then the model's answer, not a label) + photo
* ``ack`` (trainer -> daemon): ``{"id", "kind", "label"}``, sent only after the sample is stored durably; ``kind`` and
  ``label`` are the sample's (trainers before them send ``{"id"}``): the daemon deletes only that label, not a newer
  one the expert wrote of the same photo while it was in flight
* ``refused`` (trainer -> daemon): ``{"id", "reason", "kind", "label"}``, a sample the trainer will never take (its
  label names a class it cannot accept); the daemon keeps the photo aside, out of the delivery queue
* ``heartbeat`` (both ways): ``{"role", "time"}``; the trainer's adds ``"state"`` (idle, retraining, ...), ``"version"``
  (the version in service), ``"published"`` (when it was published), ``"stores_labels"`` (false while it cannot store
  the labels it is sent: a full disk) and ``"waits_for_room"`` (true while no retrain can start for want of room on its
  disk): what a device's page shows of the trainer, and what its alerts say; and ``"lost"`` (comma-separated photo ids,
  at most :data:`LOST_ASKED`): photos whose expert labels the trainer lost with a rotted page, which a device that
  holds them queues again; and ``"withdraws"`` (true from a trainer that takes ``withdraw`` messages)
* ``engine`` (trainer PUB -> daemon SUB): ``{"version"}``, a new engine was published
* ``withdraw`` (daemon -> trainer): ``{"id", "label", "engine_version"}``, a pseudo-label delivered before, taken back
  (the expert found a sure answer of its class by its engine wrong: :mod:`edge_agent.review.withdraw`); sent only to a
  trainer whose heartbeat says ``"withdraws": true``. The trainer drops that pseudo-label, where it still holds it as
  such, and keeps its photo as an unlabelled one
* ``withdrawn`` (trainer -> daemon): ``{"id", "label"}``, sent once the withdrawal is durable (or there was nothing
  to withdraw: the photo labelled by the expert since, or never stored)
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field

from edge_agent.names import DEVICE_NAME
from engines.errors import EdgeAgentError

__all__ = [
    "MAGIC",
    "Field",
    "Message",
    "ProtocolError",
    "encode",
    "decode",
    "decode_or_drop",
    "parse_frames",
    "MAX_HEADER_BYTES",
    "DEFAULT_MAX_PAYLOAD",
    "VERSION",
]

MAGIC = b"EDGE1"
MAX_HEADER_BYTES = 16 * 1024
DEFAULT_MAX_PAYLOAD = 32 * 1024 * 1024
#: Integers on the wire have at most this many digits (a 5,000-digit one is a frame to drop, not a number to parse).
MAX_INT_DIGITS = 15
_ID = re.compile(r"^[0-9a-f]{64}$")
#: A trainer's heartbeat names at most this many photos whose labels it lost (a rotted page), for the devices to say again.
LOST_ASKED = 64
_EXT = re.compile(r"^\.[a-z0-9]{1,5}$")
VERSION = re.compile(r"^v\d{4,9}$")


@dataclass(frozen=True)
class Field:
    """One header field: its JSON type and bounds (numbers in ``[lo, hi]``; strings and objects at most ``max_len``
    characters or entries, matching ``pattern`` or one of ``choices``)."""

    type: type
    required: bool = True
    lo: float | None = None
    hi: float | None = None
    max_len: int | None = None
    pattern: re.Pattern | None = None
    choices: tuple[str, ...] | None = None

    def check(self, kind: str, name: str, value) -> object:
        """``value`` as this field's type, or :class:`ProtocolError` naming the kind and field."""
        if isinstance(value, bool) != (self.type is bool) or not isinstance(value, (int, float) if self.type is float else self.type):
            raise ProtocolError(f"{kind}: field {name!r} missing or of the wrong type")
        if self.type in (int, float):
            value = self.type(value)
            if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
                raise ProtocolError(f"{kind}: field {name!r} outside [{self.lo}, {self.hi}]")
        if self.max_len is not None and isinstance(value, (str, dict)) and len(value) > self.max_len:
            raise ProtocolError(f"{kind}: field {name!r} longer than {self.max_len}")
        if isinstance(value, str):
            if self.pattern is not None and not self.pattern.fullmatch(value):
                raise ProtocolError(f"{kind}: field {name!r} is not a valid value")
            if self.choices is not None and value not in self.choices:
                raise ProtocolError(f"{kind}: field {name!r} is not one of {', '.join(self.choices)}")
        return value


#: The label an ack or a refusal answers for (optional: trainers before it name the photo alone).
_ANSWERED = {
    "kind": Field(str, required=False, choices=("pseudo", "expert", "unlabelled")),
    "label": Field(str, required=False, max_len=200),
}

_SCHEMAS = {
    "sample": {
        "id": Field(str, pattern=_ID),
        "kind": Field(str, choices=("pseudo", "expert", "unlabelled")),
        "label": Field(str, max_len=200),
        "confidence": Field(float, lo=0.0, hi=1.0),
        "engine_version": Field(str, max_len=32),
        "ext": Field(str, pattern=_EXT),
        "device": Field(str, required=False, max_len=64, pattern=DEVICE_NAME),
        "verdict": Field(str, required=False, choices=("confident", "unsure", "unknown")),
    },
    "ack": {"id": Field(str, pattern=_ID), **_ANSWERED},
    "refused": {"id": Field(str, pattern=_ID), "reason": Field(str, max_len=300), **_ANSWERED},
    "heartbeat": {
        "role": Field(str, max_len=32),
        "time": Field(float, lo=0.0, hi=1e11),
        "state": Field(str, required=False, max_len=32),
        "version": Field(str, required=False, max_len=32),
        "published": Field(float, required=False, lo=0.0, hi=1e11),
        "stores_labels": Field(bool, required=False),
        "waits_for_room": Field(bool, required=False),
        "lost": Field(str, required=False, max_len=LOST_ASKED * 65, pattern=re.compile(r"[0-9a-f]{64}(,[0-9a-f]{64})*")),
        "withdraws": Field(bool, required=False),
    },
    "withdraw": {"id": Field(str, pattern=_ID), "label": Field(str, max_len=200), "engine_version": Field(str, max_len=32)},
    "withdrawn": {"id": Field(str, pattern=_ID), "label": Field(str, max_len=200)},
    "engine": {"version": Field(str, pattern=VERSION)},
}


class ProtocolError(EdgeAgentError, ValueError):
    """A message that does not follow the protocol."""


@dataclass
class Message:
    kind: str
    header: dict
    payload: bytes | None = field(default=None, repr=False)


def encode(kind: str, header: dict, payload: bytes | None = None, magic: bytes = MAGIC, kinds: dict | None = None) -> list[bytes]:
    """The frames of a message (``magic`` and ``kinds``: another protocol's, e.g. engine transfer's)."""
    if kind not in (kinds if kinds is not None else _SCHEMAS):
        raise ProtocolError(f"unknown message kind {kind!r}")
    frames = [magic, kind.encode(), json.dumps(header, separators=(",", ":")).encode()]
    if payload is not None:
        frames.append(payload)
    return frames


def _no_constant(name: str):
    raise ProtocolError(f"header holds {name}, not a finite number")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ProtocolError(f"header holds an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError("header holds a number too large for a float")
    return value


def parse_frames(frames: list[bytes], magic: bytes, schemas: dict[str, dict[str, Field]], max_payload: int) -> Message:
    """The checks every edge-agent protocol shares: 3 or 4 frames, the magic, a known kind, a JSON object header whose
    fields each pass their :class:`Field` (type and bounds; fields the kind does not name are dropped), a payload
    within ``max_payload``. Raises :class:`ProtocolError`, whatever the bytes: no other exception leaves here."""
    if len(frames) < 3 or len(frames) > 4:
        raise ProtocolError(f"expected 3 or 4 frames, got {len(frames)}")
    if frames[0] != magic:
        raise ProtocolError("bad magic (not an edge-agent peer, or another protocol version)")
    try:
        kind = bytes(frames[1]).decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("message kind is not ASCII") from None
    if kind not in schemas:
        raise ProtocolError(f"unknown message kind {kind[:32]!r}")
    if len(frames[2]) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(frames[2])} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        raw = json.loads(bytes(frames[2]), parse_int=_int, parse_float=_float, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; so is int()'s
        raise ProtocolError(f"header is not JSON: {str(exc)[:120]}") from None
    if not isinstance(raw, dict):
        raise ProtocolError("header is not a JSON object")
    header = {}
    for name, spec in schemas[kind].items():
        if name in raw:
            header[name] = spec.check(kind, name, raw[name])
        elif spec.required:
            raise ProtocolError(f"{kind}: field {name!r} missing or of the wrong type")
    payload = bytes(frames[3]) if len(frames) == 4 else None
    if payload is not None and len(payload) > max_payload:
        raise ProtocolError(f"{kind} of {len(payload)} bytes exceeds the {max_payload}-byte limit")
    return Message(kind, header, payload)


def decode(frames: list[bytes], max_payload: int = DEFAULT_MAX_PAYLOAD) -> Message:
    """Parse and validate a multipart message (raises :class:`ProtocolError`)."""
    msg = parse_frames(frames, MAGIC, _SCHEMAS, max_payload)
    if msg.kind == "sample":
        if not msg.payload:
            raise ProtocolError("sample without photo bytes")
        if not msg.header["label"].strip():
            raise ProtocolError("sample: empty label")
    elif msg.payload is not None:
        raise ProtocolError(f"{msg.kind} carries no payload")
    return msg


#: A peer's malformed frames are logged at most once in this many seconds (with how many came since).
LOG_INTERVAL_S = 10.0
_last_logged: dict[int, list] = {}  # id(counters) -> [time logged, frames since]


def decode_or_drop(frames: list[bytes], max_payload: int, counters: dict, log, decoder=None) -> Message | None:
    """``decoder`` (default :func:`decode`), or ``None`` for a malformed message, which is counted
    (``counters["malformed"]``) and logged at most once per :data:`LOG_INTERVAL_S`: garbage never takes a peer down,
    nor floods its log."""
    try:
        return (decoder or decode)(frames, max_payload)
    except ProtocolError as exc:
        counters["malformed"] += 1
        seen = _last_logged.setdefault(id(counters), [float("-inf"), 0])
        seen[1] += 1
        now = time.monotonic()
        if now - seen[0] >= LOG_INTERVAL_S:
            log.warning("malformed_message", error=str(exc), frames=len(frames), malformed_since_last_logged=seen[1])
            seen[0], seen[1] = now, 0
        return None
