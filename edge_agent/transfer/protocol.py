"""Wire format of engine transfer (daemon DEALER <-> trainer ROUTER), in the hand-off's framing.

Every message is ``[MAGIC, kind, header]`` plus a payload for ``offer`` and ``chunk``:

* ``hello`` (daemon -> trainer, every heartbeat): ``{"name", "engine_version", "queue"}`` and ``"refused"``
  (version -> reason, from the wire or its own disk): who it is, what it serves, how much it has not delivered yet,
  what it will not take; optionally ``"pinned"`` (the version a rollback pinned it to, "" if none) and how the
  engine in service has done since it began serving: ``"since"``, ``"photos"``, ``"errors"``, ``"agreement"``.
* ``offer`` (trainer -> daemon): ``{"version", "signature"}`` + the version's manifest.json bytes. The daemon checks
  the signature against its trusted keys before it asks for a single byte.
* ``fetch`` (daemon -> trainer): ``{"version", "file", "offset", "length"}``: at most ``window`` outstanding (flow
  control by credit: the trainer only ever answers).
* ``chunk`` (trainer -> daemon): ``{"version", "file", "offset"}`` + bytes.
* ``missing`` (trainer -> daemon): ``{"version", "reason"}``: a fetch it cannot answer (version gone, bad range).
* ``result`` (daemon -> trainer): ``{"version", "ok", "reason"}``: installed, or refused and why.
"""

from __future__ import annotations

import re

from edge_agent.handoff.protocol import VERSION, Field, Message, ProtocolError, parse_frames
from edge_agent.handoff.protocol import encode as _encode
from edge_agent.names import DEVICE_NAME

__all__ = ["MAGIC", "KINDS", "CHUNK_MAX", "encode", "decode", "Message", "ProtocolError"]

MAGIC = b"EDGEX1"
CHUNK_MAX = 4 * 1024 * 1024
MANIFEST_MAX = 1024 * 1024
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: A hello lists at most this many refused versions (the daemon sends its newest).
MAX_REFUSED = 64
_OFFSET = Field(int, lo=0, hi=2**40)

KINDS = {
    "hello": {
        "name": Field(str, max_len=64, pattern=DEVICE_NAME),
        "engine_version": Field(str, max_len=32),
        "queue": Field(int, lo=0, hi=2**40),
        "refused": Field(dict, max_len=MAX_REFUSED),
        "pinned": Field(str, required=False, max_len=32),
        "since": Field(float, required=False, lo=0.0, hi=1e11),
        "photos": Field(int, required=False, lo=0, hi=2**40),
        "errors": Field(int, required=False, lo=0, hi=2**40),
        "agreement": Field(float, required=False, lo=-1.0, hi=1.0),
    },
    "offer": {"version": Field(str, pattern=VERSION), "signature": Field(str, max_len=1024)},
    "fetch": {
        "version": Field(str, pattern=VERSION),
        "file": Field(str, pattern=_FILE),
        "offset": _OFFSET,
        "length": Field(int, lo=1, hi=CHUNK_MAX),
    },
    "chunk": {"version": Field(str, pattern=VERSION), "file": Field(str, pattern=_FILE), "offset": _OFFSET},
    "missing": {"version": Field(str, pattern=VERSION), "reason": Field(str, max_len=500)},
    "result": {"version": Field(str, pattern=VERSION), "ok": Field(bool), "reason": Field(str, max_len=500)},
}


def encode(kind: str, header: dict, payload: bytes | None = None) -> list[bytes]:
    return _encode(kind, header, payload, magic=MAGIC, kinds=KINDS)


def decode(frames: list[bytes], max_payload: int = CHUNK_MAX) -> Message:
    """Parse and validate a transfer message (raises :class:`ProtocolError`)."""
    msg = parse_frames(frames, MAGIC, KINDS, max(max_payload, MANIFEST_MAX))
    h = msg.header
    if msg.kind == "hello":
        if not h["name"]:
            raise ProtocolError("hello: empty name")
        if not all(isinstance(k, str) and VERSION.match(k) and isinstance(v, str) and len(v) <= 500 for k, v in h["refused"].items()):
            raise ProtocolError("hello: 'refused' must map version names to reasons of at most 500 characters")
    if msg.kind in ("offer", "chunk"):
        if not msg.payload:
            raise ProtocolError(f"{msg.kind} without payload")
        if msg.kind == "offer" and len(msg.payload) > MANIFEST_MAX:
            raise ProtocolError("offer: manifest too large")
        if msg.kind == "chunk" and len(msg.payload) > max_payload:
            raise ProtocolError("chunk too large")
    elif msg.payload is not None:
        raise ProtocolError(f"{msg.kind} carries no payload")
    return msg
