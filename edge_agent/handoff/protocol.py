"""The wire format between the daemon and the trainer (ZeroMQ multipart messages).

Every message is ``[MAGIC, kind, header]`` plus, for samples, ``[photo bytes]``.
The header is a small JSON object. Anything else (wrong magic, unknown kind,
bad JSON, missing fields, oversized frames) raises :class:`ProtocolError`; the
receiving side counts it, logs it and carries on.

Kinds:

* ``sample`` (daemon -> trainer): ``{"id", "kind": "pseudo"|"expert", "label", "confidence", "engine_version", "ext"}``
  and optionally ``"device"`` (the daemon's name) + photo
* ``ack`` (trainer -> daemon): ``{"id"}``, sent only after the sample is stored durably
* ``heartbeat`` (both ways): ``{"role", "time"}``
* ``engine`` (trainer PUB -> daemon SUB): ``{"version"}``, a new engine was published
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

__all__ = ["MAGIC", "Message", "ProtocolError", "encode", "decode", "decode_or_drop", "parse_frames", "MAX_HEADER_BYTES", "DEFAULT_MAX_PAYLOAD"]

MAGIC = b"EDGE1"
MAX_HEADER_BYTES = 16 * 1024
DEFAULT_MAX_PAYLOAD = 32 * 1024 * 1024
_ID = re.compile(r"^[0-9a-f]{64}$")
_EXT = re.compile(r"^\.[a-z0-9]{1,5}$")

_REQUIRED = {
    "sample": {"id": str, "kind": str, "label": str, "confidence": (int, float), "engine_version": str, "ext": str},
    "ack": {"id": str},
    "heartbeat": {"role": str, "time": (int, float)},
    "engine": {"version": str},
}


class ProtocolError(ValueError):
    """A message that does not follow the protocol."""


@dataclass
class Message:
    kind: str
    header: dict
    payload: bytes | None = field(default=None, repr=False)


def encode(kind: str, header: dict, payload: bytes | None = None, magic: bytes = MAGIC, kinds: dict | None = None) -> list[bytes]:
    """The frames of a message (``magic`` and ``kinds``: another protocol's, e.g. engine transfer's)."""
    if kind not in (kinds if kinds is not None else _REQUIRED):
        raise ProtocolError(f"unknown message kind {kind!r}")
    frames = [magic, kind.encode(), json.dumps(header, separators=(",", ":")).encode()]
    if payload is not None:
        frames.append(payload)
    return frames


def parse_frames(frames: list[bytes], magic: bytes, required: dict[str, dict], max_payload: int) -> Message:
    """The checks every edge-agent protocol shares: 3 or 4 frames, the magic, a known kind, a JSON object header with
    the kind's required fields of the right types, a payload within ``max_payload`` (raises :class:`ProtocolError`)."""
    if len(frames) < 3 or len(frames) > 4:
        raise ProtocolError(f"expected 3 or 4 frames, got {len(frames)}")
    if frames[0] != magic:
        raise ProtocolError("bad magic (not an edge-agent peer, or another protocol version)")
    try:
        kind = bytes(frames[1]).decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("message kind is not ASCII") from None
    if kind not in required:
        raise ProtocolError(f"unknown message kind {kind[:32]!r}")
    if len(frames[2]) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(frames[2])} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = json.loads(bytes(frames[2]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    for key, typ in required[kind].items():
        if not isinstance(header.get(key), typ) or isinstance(header.get(key), bool) and typ is not bool:
            raise ProtocolError(f"{kind}: field {key!r} missing or of the wrong type")
    payload = bytes(frames[3]) if len(frames) == 4 else None
    if payload is not None and len(payload) > max_payload:
        raise ProtocolError(f"{kind} of {len(payload)} bytes exceeds the {max_payload}-byte limit")
    return Message(kind, header, payload)


def decode(frames: list[bytes], max_payload: int = DEFAULT_MAX_PAYLOAD) -> Message:
    """Parse and validate a multipart message (raises :class:`ProtocolError`)."""
    msg = parse_frames(frames, MAGIC, _REQUIRED, max_payload)
    kind, header, payload = msg.kind, msg.header, msg.payload
    if kind == "sample":
        if payload is None or not payload:
            raise ProtocolError("sample without photo bytes")
        if not _ID.match(header["id"]):
            raise ProtocolError("sample id is not a sha256 hex digest")
        if header["kind"] not in ("pseudo", "expert"):
            raise ProtocolError(f"sample kind {header['kind'][:16]!r} is not pseudo or expert")
        if not _EXT.match(header["ext"]):
            raise ProtocolError("bad file extension")
        if not 0.0 <= float(header["confidence"]) <= 1.0:
            raise ProtocolError("confidence outside [0, 1]")
        if not header["label"] or len(header["label"]) > 200:
            raise ProtocolError("bad label")
        if not isinstance(header.get("device", ""), str) or len(header.get("device", "")) > 64:
            raise ProtocolError("bad device name")
    elif payload is not None:
        raise ProtocolError(f"{kind} carries no payload")
    if kind == "ack" and not _ID.match(header["id"]):
        raise ProtocolError("ack id is not a sha256 hex digest")
    return msg


def decode_or_drop(frames: list[bytes], max_payload: int, counters: dict, log, decoder=None) -> Message | None:
    """``decoder`` (default :func:`decode`), or ``None`` for a malformed message, which is counted
    (``counters["malformed"]``) and logged: garbage never takes a peer down."""
    try:
        return (decoder or decode)(frames, max_payload)
    except ProtocolError as exc:
        counters["malformed"] += 1
        log.warning("malformed_message", error=str(exc), frames=len(frames))
        return None
