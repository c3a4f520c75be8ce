"""ZeroMQ sockets for the hand-off: ``ipc://`` in a 0700 directory, or ``tcp://`` with CURVE.

CURVE keys are ZeroMQ certificate files (``edge-trainer keys DIR`` writes a
pair for each side). The trainer (server) has a secret key and a folder of the
public keys it accepts; a daemon (client) has its own key pair and the
trainer's public key. Over ``tcp://`` without keys both sides refuse to start:
unauthenticated peers are never accepted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engines.errors import EdgeAgentError

__all__ = ["CurveKeys", "Link", "client_socket", "server_socket", "default_endpoints", "TransportError", "Authenticator", "send_nowait"]


class TransportError(EdgeAgentError, RuntimeError):
    """An endpoint or key configuration that cannot be used safely."""


@dataclass(frozen=True)
class CurveKeys:
    """secret: this side's ``*.key_secret``; server_public: the trainer's ``*.key`` (clients only);
    authorized_dir: public keys the trainer accepts (server only)."""

    secret: str
    server_public: str = ""
    authorized_dir: str = ""


@dataclass(frozen=True)
class Link:
    """Where the daemon and the trainer meet: [handoff]'s three sockets, defaults resolved, and its CURVE keys."""

    endpoint: str  # labels, daemon -> trainer (DEALER -> ROUTER)
    announce: str  # engine announcements, trainer -> daemons (PUB -> SUB)
    transfer: str = ""  # engine files, trainer -> daemons (ROUTER <- DEALER)
    curve: CurveKeys | None = None


def default_endpoints(runtime_dir: Path) -> tuple[str, str, str]:
    """(hand-off, announcements, engine transfer) as ipc:// sockets in ``runtime_dir``."""
    return (f"ipc://{runtime_dir / 'handoff.sock'}", f"ipc://{runtime_dir / 'engines.sock'}", f"ipc://{runtime_dir / 'transfer.sock'}")


def _prepare(endpoint: str, curve: CurveKeys | None) -> None:
    if endpoint.startswith("ipc://"):
        d = Path(endpoint[len("ipc://") :]).parent
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)  # only this user can reach the socket
    elif endpoint.startswith("tcp://"):
        if curve is None:
            raise TransportError(f"{endpoint}: tcp:// needs CURVE keys ([handoff] curve_* options); refusing to run unauthenticated")
    elif not endpoint.startswith("inproc://"):
        raise TransportError(f"unsupported endpoint {endpoint!r} (use ipc:// or tcp://)")


def _load(path: str):
    import zmq.auth

    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise TransportError(f"cannot read CURVE key {path}: {exc}") from None


def client_socket(ctx, kind: int, endpoint: str, curve: CurveKeys | None):
    import zmq

    _prepare(endpoint, curve)
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if kind == zmq.DEALER:
        sock.setsockopt(zmq.IMMEDIATE, 1)  # no queueing toward a peer that is not connected
        sock.setsockopt(zmq.SNDHWM, 64)
    sock.setsockopt(zmq.RECONNECT_IVL, 200)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
    if curve is not None and endpoint.startswith("tcp://"):
        public, secret = _load(curve.secret)
        server_public, _ = _load(curve.server_public)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server_public
    sock.connect(endpoint)
    return sock


class Authenticator:
    """ZAP handler accepting only the CURVE public keys in ``authorized_dir``."""

    def __init__(self, ctx, authorized_dir: str) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        if not Path(authorized_dir).is_dir():
            raise TransportError(f"CURVE authorized-keys folder {authorized_dir!r} does not exist")
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=authorized_dir)

    def stop(self) -> None:
        self._auth.stop()


def server_socket(ctx, kind: int, endpoint: str, curve: CurveKeys | None):
    import zmq

    _prepare(endpoint, curve)
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None and endpoint.startswith("tcp://"):
        public, secret = _load(curve.secret)
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.curve_server = True
    if endpoint.startswith("ipc://"):
        Path(endpoint[len("ipc://") :]).unlink(missing_ok=True)  # a stale socket file from a crash
    sock.bind(endpoint)
    return sock


def send_nowait(sock, frames: list[bytes]) -> bool:
    """Send without blocking; False when there is no connection yet (IMMEDIATE) or the peer is slow."""
    import zmq

    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False
