"""ZeroMQ sockets for the hand-off: ``ipc://`` in a 0700 directory, or ``tcp://`` with CURVE.

CURVE keys are ZeroMQ certificate files (``edge-trainer keys DIR`` writes a
pair for each side). The trainer (server) has a secret key and a folder of the
public keys it accepts; a daemon (client) has its own key pair and the
trainer's public key. Over ``tcp://`` without keys both sides refuse to start:
unauthenticated peers are never accepted.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from engines.errors import EdgeAgentError

__all__ = [
    "CurveKeys",
    "Link",
    "client_socket",
    "server_socket",
    "default_endpoints",
    "TransportError",
    "Authenticator",
    "peer_name",
    "rebind",
    "HandshakeWatch",
    "send_nowait",
]


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


#: Seconds after a change of the authorized-keys folder during which it is read again twice a second.
SETTLE_S = 2.0


class Authenticator:
    """ZAP handler accepting only the CURVE public keys in ``authorized_dir``, read again whenever the folder
    changes (``edge-trainer device add`` / ``revoke`` take effect without a restart); every refused handshake is
    logged with the peer's address (once a minute per address) and counted in :attr:`refused`.

    A device is its certificate: the handshake binds the connection to the name of the key file that matched
    (``<name>.key``), and every message on it carries that name as its ZeroMQ ``User-Id`` (:func:`peer_name`). The
    socket's owner asks :meth:`admits` of each message, so a revoked device's messages are refused from the moment
    its key leaves the folder, and :meth:`revocations` tells it when to drop every connection (:meth:`rebind`)."""

    def __init__(self, ctx, authorized_dir: str, endpoint: str = "") -> None:
        from edge_agent.log import get_logger

        if not Path(authorized_dir).is_dir():
            raise TransportError(f"CURVE authorized-keys folder {authorized_dir!r} does not exist")
        self.dir = Path(authorized_dir)
        self.log = get_logger("handoff.auth", endpoint=endpoint)
        #: address -> {"count", "last" (epoch s), "reason"}: handshakes refused since start.
        self.refused: dict[str, dict] = {}
        self._keys: dict[bytes, str] = {}  # z85 public key -> device name
        self._names: frozenset[str] = frozenset()
        self._stamp: tuple | None = None
        self._look_again: float | None = None  # monotonic time to read the folder again though its mtime is unchanged
        self._unreadable: set[str] = set()  # key files already reported unreadable
        #: Names whose key left the folder since start (revoked), and how many times that happened.
        self.revoked: set[str] = set()
        self.revocations = 0
        self._auth = _make_authenticator(ctx, self)
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self)

    def _current_keys(self) -> dict[bytes, str]:
        """The authorized keys and their names, read again when the folder changes (its mtime: a key added,
        replaced or removed; one stat per call, however many devices), and twice a second while the folder changed
        in the last :data:`SETTLE_S` seconds or holds an unreadable key: a key copied in by hand is written after
        its name appears (the folder's mtime does not change again), and two changes within the filesystem's
        timestamp granularity leave one mtime."""
        import zmq.auth

        try:
            stamp = self.dir.stat().st_mtime_ns
        except OSError:
            stamp = None
        if stamp != self._stamp or (self._look_again is not None and time.monotonic() >= self._look_again):
            keys, unreadable = {}, set()
            for path in sorted(self.dir.glob("*.key")) if stamp is not None else []:
                try:
                    keys[zmq.auth.load_certificate(path)[0]] = path.name[: -len(".key")]
                except (OSError, ValueError):
                    unreadable.add(path.name)
                    if path.name not in self._unreadable:
                        self.log.warning("authorized_key_unreadable", file=str(path), action="read again until it is whole")
            self._unreadable = unreadable
            recent = stamp is not None and time.time_ns() - stamp < SETTLE_S * 1e9
            self._look_again = time.monotonic() + 0.5 if unreadable or recent else None
            names = frozenset(keys.values())
            gone = self._names - names
            if gone and self._stamp is not None:
                self.revoked |= gone
                self.revocations += 1
                self.log.warning("devices_revoked", devices=sorted(gone), action="their messages are refused and their connections dropped")
            self.revoked -= names  # added again
            self._keys, self._names, self._stamp = keys, names, stamp
        return self._keys

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook: is this client key (z85) authorized now?"""
        return key in self._current_keys()

    def name_of(self, key: bytes) -> str:
        """The device name of an authorized raw public key ("" if none): the ZAP User-Id of its connection."""
        import zmq.utils.z85

        return self._current_keys().get(zmq.utils.z85.encode(key), "")

    def admits(self, name: str | None) -> bool:
        """Whether a message bound to ``name`` (its :func:`peer_name`) may be taken now: that device's key is still
        authorized (a revoke takes effect at the next message, not the next handshake)."""
        self._current_keys()
        return bool(name) and name in self._names

    def claims_another(self, name: str) -> bool:
        """Whether ``name`` is another enrolled device's (authorized or revoked): a message in that name from a
        different key is an impersonation, not a misconfigured ``[handoff] name``."""
        self._current_keys()
        return name in self._names or name in self.revoked or (self.dir.parent / "revoked" / f"{name}.key").is_file()

    def poll(self) -> int:
        """Look at the folder now (a revoke with no message since still counts); returns :attr:`revocations`."""
        self._current_keys()
        return self.revocations

    def _denied(self, address: str, reason: str) -> None:
        rec = self.refused.setdefault(address, {"count": 0, "last": 0.0, "reason": reason})
        rec["count"] += 1
        if not 0 <= time.time() - rec["last"] <= 60:  # once a minute (a clock set back silences nothing)
            self.log.warning(
                "handshake_refused",
                address=address,
                reason=reason,
                refused_so_far=rec["count"],
                fix=f"a device whose key is not in {self.dir}: edge-trainer device add NAME, then give it the files",
            )
        rec["last"], rec["reason"] = time.time(), reason
        if len(self.refused) > 256:  # bounded: the oldest address goes
            del self.refused[min(self.refused, key=lambda a: self.refused[a]["last"])]

    def stop(self) -> None:
        self._auth.stop()


def peer_name(frame) -> str | None:
    """The device name ZAP bound to the connection ``frame`` (a received ``zmq.Frame``) came on: the name of the
    certificate it shook hands with; None where no CURVE handshake took place (``ipc://``)."""
    try:
        name = frame.get("User-Id")
    except Exception:  # noqa: BLE001 - zmq.ZMQError (EINVAL) on a connection with no ZAP: no name
        return None
    return name or None


def rebind(sock, ctx, kind: int, endpoint: str, curve: CurveKeys | None, tries: int = 50):
    """``sock`` closed (every connection on it dropped) and a new one bound to ``endpoint``; peers that may still
    connect reconnect on their own. Retries while the port is still held by the old socket."""
    import zmq

    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint  # the port a "*" bind was given
    sock.close(0)
    for attempt in range(tries):
        try:
            return server_socket(ctx, kind, endpoint, curve)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or attempt == tries - 1:
                raise
            time.sleep(0.02)
    raise AssertionError("unreachable")


def _make_authenticator(ctx, owner: Authenticator):
    """A pyzmq ThreadAuthenticator that tells ``owner`` of each refused handshake and the peer's address."""
    from zmq.auth.thread import ThreadAuthenticator

    class _Reporting(ThreadAuthenticator):
        _address = ""

        async def handle_zap_message(self, msg):
            self._address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else "?"
            return await super().handle_zap_message(msg)

        def curve_user_id(self, client_public_key: bytes) -> str:
            return owner.name_of(client_public_key)

        def _send_zap_reply(self, request_id, status_code, status_text, user_id="anonymous"):
            if status_code != b"200":
                owner._denied(self._address or "?", status_text.decode("utf-8", "replace"))
            return super()._send_zap_reply(request_id, status_code, status_text, user_id)

    return _Reporting(ctx)


_MONITORS = itertools.count()


def _monitor(sock, events: int):
    """A PAIR socket receiving ``sock``'s events, on an inproc address used once: pyzmq's default names it after the
    socket's file descriptor, which a new socket reuses while libzmq still holds the closed one's address (a sender
    that replaced a refused socket died of "Address already in use")."""
    return sock.get_monitor_socket(events, addr=f"inproc://edge-agent.monitor-{os.getpid()}-{next(_MONITORS)}")


class HandshakeWatch:
    """A client socket's monitor, read without blocking: whether its CURVE handshake with the trainer has worked,
    so that a device with the wrong keys says so instead of waiting in silence."""

    def __init__(self, sock, endpoint: str, refused_after_s: float = 10.0) -> None:
        import zmq

        events = (
            zmq.EVENT_CONNECTED
            | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        )
        self.endpoint, self.refused_after_s, self._events = endpoint, refused_after_s, events
        self.monitor = _monitor(sock, events)
        self.connected = False
        self.handshake_ok = False
        self.failures = 0
        self._trying_since: float | None = None  # first TCP connection since the last handshake that worked
        self._born = time.monotonic()
        self._failed_at: float | None = None  # the last refused handshake not yet answered by a new socket

    def poll(self) -> None:
        """Read the events waiting."""
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                ev = recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if ev == zmq.EVENT_CONNECTED:
                self.connected = True
                if self._trying_since is None and not self.handshake_ok:
                    self._trying_since = time.monotonic()
            elif ev == zmq.EVENT_DISCONNECTED:
                self.connected, self.handshake_ok = False, False
            elif ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshake_ok, self._trying_since, self.failures = True, None, 0
            else:
                self.failures += 1
                self._failed_at = time.monotonic()
                if self._trying_since is None:
                    self._trying_since = time.monotonic()

    def needs_new_socket(self, after_s: float = 5.0) -> bool:
        """True ``after_s`` after a refused handshake: ZeroMQ never retries a connection whose handshake the peer
        refused, so the owner makes a new socket (and calls :meth:`watch`) to learn when the trainer takes its key."""
        return self._failed_at is not None and time.monotonic() - self._failed_at > after_s

    def watch(self, sock) -> None:
        """Follow ``sock`` (the new socket) instead, keeping what is known of the link."""
        events = self._events
        self.monitor.close(0)
        self.monitor = _monitor(sock, events)
        self._failed_at, self.connected = None, False

    def problem(self) -> str | None:
        """None while the link works (or has not had time to); else what is wrong, in words."""
        if self.handshake_ok:
            return None
        if self._trying_since is not None and (self.failures or time.monotonic() - self._trying_since > self.refused_after_s):
            return (
                f"trainer unreachable: handshake refused? ({self.endpoint} accepts the connection but not this device's "
                "keys: is this device's public key in the trainer's authorized folder (edge-trainer device add), and "
                "curve_server_key the trainer's public key?)"
            )
        if self._trying_since is None and not self.connected and time.monotonic() - self._born > self.refused_after_s:
            return f"trainer unreachable: no connection to {self.endpoint}"
        return None

    def close(self) -> None:
        self.monitor.close(0)


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
