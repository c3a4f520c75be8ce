"""Wire format of engine transfer (daemon DEALER <-> trainer ROUTER), in the hand-off's framing.

Every message is ``[MAGIC, kind, header]`` plus a payload for ``offer`` and ``chunk``:

* ``hello`` (daemon -> trainer, every heartbeat): ``{"name", "engine_version", "queue"}`` and ``"refused"``
  (version -> reason): who it is, what it serves, how much it has not delivered yet, what it will not take.
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

from edge_agent.handoff.protocol import Message, ProtocolError, encode as _encode, parse_frames

__all__ = ["MAGIC", "KINDS", "CHUNK_MAX", "encode", "decode", "Message", "ProtocolError"]

MAGIC = b"EDGEX1"
CHUNK_MAX = 4 * 1024 * 1024
MANIFEST_MAX = 1024 * 1024
_VERSION = re.compile(r"^v\d{4,}$")
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

KINDS = {
    "hello": {"name": str, "engine_version": str, "queue": int, "refused": dict},
    "offer": {"version": str, "signature": str},
    "fetch": {"version": str, "file": str, "offset": int, "length": int},
    "chunk": {"version": str, "file": str, "offset": int},
    "missing": {"version": str, "reason": str},
    "result": {"version": str, "ok": bool, "reason": str},
}


def encode(kind: str, header: dict, payload: bytes | None = None) -> list[bytes]:
    return _encode(kind, header, payload, magic=MAGIC, kinds=KINDS)


def decode(frames: list[bytes], max_payload: int = CHUNK_MAX) -> Message:
    """Parse and validate a transfer message (raises :class:`ProtocolError`)."""
    msg = parse_frames(frames, MAGIC, KINDS, max(max_payload, MANIFEST_MAX))
    h = msg.header
    if "version" in h and not _VERSION.match(h["version"]):
        raise ProtocolError(f"{msg.kind}: bad version name {h['version'][:16]!r}")
    if "file" in h and not _FILE.match(h["file"]):
        raise ProtocolError(f"{msg.kind}: bad file name")
    if msg.kind in ("fetch", "chunk") and h["offset"] < 0:
        raise ProtocolError(f"{msg.kind}: negative offset")
    if msg.kind == "fetch" and not 0 < h["length"] <= CHUNK_MAX:
        raise ProtocolError(f"fetch: length outside 1..{CHUNK_MAX}")
    if msg.kind == "hello" and (len(h["name"]) > 64 or not h["name"]):
        raise ProtocolError("hello: bad name")
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
