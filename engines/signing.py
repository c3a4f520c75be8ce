"""Ed25519 signatures on engine versions: who published a version, checked before a daemon serves it.

A version is signed by signing its ``manifest.json`` bytes; the manifest lists every file's sha256, so the
signature covers every file. The signature sits beside the manifest in ``manifest.sig``::

    {"format": 1, "key": "<public key, 64 hex>", "signature": "<128 hex>"}

Keys are files of hex text: ``<name>.key`` holds the 32-byte secret seed (mode 0600), ``<name>.pub`` the public
key. The trainer makes its key on first start; the project's public key is :data:`PROJECT_KEY` (its secret half
is kept out of the repository and signs the shipped default model).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engines.durable import atomic_write, read_at_most
from engines.errors import EdgeAgentError
from engines.store import MANIFEST, SIGNATURE_FILE, TamperedError

__all__ = [
    "SIGNATURE",
    "PROJECT_KEY",
    "PROJECT_KEYS",
    "UntrustedVersion",
    "NotAKey",
    "SigningKey",
    "TrustedKeys",
    "load_key",
    "load_or_create_key",
    "sign_manifest",
    "signature_of",
    "read_public_key",
    "sign_version",
]

SIGNATURE = SIGNATURE_FILE
#: The project's release key (signs the shipped model since the 38-class release; its secret half is kept outside
#: the repository, ../shared/release/), and the earlier project key, whose secret half was lost: still trusted, so
#: state directories made before keep serving what it signed.
PROJECT_KEY = Path(__file__).resolve().parent / "keys" / "edge-agent-release.pub"
PROJECT_KEYS = {
    PROJECT_KEY: "the edge-agent project (release key)",
    PROJECT_KEY.with_name("edge-agent-project.pub"): "the edge-agent project (earlier key, before the 38-class release)",
}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class UntrustedVersion(TamperedError):
    """A version without a valid signature from a trusted key."""


class NotAKey(EdgeAgentError, ValueError):
    """A key given as neither 64 hex characters nor a readable file holding them."""


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 secret key and where it came from."""

    seed: bytes = field(repr=False)
    path: Path | None = None

    @property
    def public_hex(self) -> str:
        import nacl.signing

        return nacl.signing.SigningKey(self.seed).verify_key.encode().hex()

    def sign(self, data: bytes) -> bytes:
        import nacl.signing

        return nacl.signing.SigningKey(self.seed).sign(data).signature


def load_key(path: str | os.PathLike) -> SigningKey:
    """The secret key at ``path`` (``*.key``); FileNotFoundError if there is none."""
    path = Path(path)
    text = path.read_text().strip()
    if not _HEX64.match(text):
        raise NotAKey(f"{path}: not an edge-agent signing key (64 hex characters expected)")
    return SigningKey(bytes.fromhex(text), path)


def load_or_create_key(path: str | os.PathLike, remake_unfinished: bool = False) -> SigningKey:
    """The secret key at ``path`` (``*.key``), made (0600, with its ``.pub`` beside it, both on the disk before it is
    returned) if missing; with ``remake_unfinished``, also where the file is empty and its ``.pub`` empty or missing (a
    power cut as it was made, before this wrote it durably: no signature it made can be checked by anyone)."""
    path = Path(path)
    if path.is_file() and not (remake_unfinished and _unfinished(path)):
        return load_key(path)
    import nacl.signing

    seed = bytes(nacl.signing.SigningKey.generate())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # (an unfinished one)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(seed.hex() + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    key = SigningKey(seed, path)
    atomic_write(path.with_suffix(".pub"), (key.public_hex + "\n").encode())  # (durable: it fsyncs the folder too)
    return key


def _unfinished(path: Path) -> bool:
    """Whether the key file ``path`` and its ``.pub`` hold nothing (a power cut while they were made)."""
    pub = path.with_suffix(".pub")
    try:
        return not path.read_bytes().strip() and (not pub.exists() or not pub.read_bytes().strip())
    except OSError:
        return False


#: The most of a ``.pub`` file read: a key is 64 hex characters and a line end.
_KEY_FILE_BYTES = 4096


def read_public_key(value: str | os.PathLike) -> str:
    """A public key given as 64 hex characters or as a ``.pub`` file holding them."""
    text = str(value).strip()
    if _HEX64.match(text):
        return text
    try:
        raw = read_at_most(Path(text).expanduser(), _KEY_FILE_BYTES)
    except OSError as exc:
        raise NotAKey(f"trusted key {value!r}: neither 64 hex characters nor a readable key file ({exc})") from None
    text = raw.decode("ascii", errors="replace").strip() if raw is not None else ""
    if not _HEX64.match(text):
        raise NotAKey(f"{value}: not an edge-agent public key (64 hex characters expected)")
    return text


def sign_manifest(manifest: bytes, key: SigningKey) -> bytes:
    """The ``manifest.sig`` document for ``manifest`` (the exact bytes of manifest.json)."""
    doc = {"format": 1, "key": key.public_hex, "signature": key.sign(manifest).hex()}
    return (json.dumps(doc) + "\n").encode()


def sign_version(vdir: Path, key: SigningKey) -> None:
    """Write ``manifest.sig`` for the version in ``vdir`` (whose files the caller has verified)."""
    atomic_write(vdir / SIGNATURE, sign_manifest((vdir / MANIFEST).read_bytes(), key))


def signature_of(vdir: Path) -> dict | None:
    try:
        doc = json.loads((vdir / SIGNATURE).read_text())
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass
class TrustedKeys:
    """The public keys a daemon accepts versions from: hex key -> where the trust came from."""

    keys: dict[str, str] = field(default_factory=dict)
    #: A key file that may appear later (the trainer on the same state directory makes its key on its first start,
    #: perhaps after the daemon started): read when a version signed by an unknown key is checked.
    later: Path | None = None

    def _load_later(self) -> None:
        if self.later is not None and self.later.is_file():
            try:
                self.keys.setdefault(read_public_key(self.later), f"the trainer on this state directory ({self.later})")
            except ValueError:
                pass

    def stamp(self, vdir: Path) -> tuple:
        """When what decides ``vdir``'s trust last changed: its signature file and the key file that may appear
        later. A refused version is worth checking again only once this differs."""
        stamps = []
        for path in (vdir / SIGNATURE, self.later):
            try:
                stamps.append(path.stat().st_mtime_ns if path is not None else None)
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    @classmethod
    def default(cls, configured: Iterable[str] = (), local_trainer_key: Path | None = None, project: bool = True) -> "TrustedKeys":
        """The project's key, the key of a trainer on the same state directory (if it made one), and the configured ones."""
        keys: dict[str, str] = {}
        for path, who in PROJECT_KEYS.items() if project else ():
            if path.is_file():
                keys[read_public_key(path)] = who
        for value in configured:
            try:
                keys.setdefault(read_public_key(value), f"configured ({value})")
            except NotAKey as exc:
                raise NotAKey(f"[store] trusted_keys: {exc}") from None
        trust = cls(keys, later=local_trainer_key)
        trust._load_later()
        return trust

    def check(self, vdir: Path, manifest: bytes | None = None) -> str:
        """Who signed the version in ``vdir`` (a trusted key's description); :class:`UntrustedVersion` otherwise."""
        import nacl.exceptions
        import nacl.signing

        name = vdir.name
        doc = signature_of(vdir)
        if doc is None:
            raise UntrustedVersion(f"{name}: not signed (no {SIGNATURE}); refusing to serve it")
        key, sig = doc.get("key"), doc.get("signature")
        if not isinstance(key, str) or not _HEX64.match(key) or not isinstance(sig, str) or not re.fullmatch(r"[0-9a-f]{128}", sig):
            raise UntrustedVersion(f"{name}: {SIGNATURE} is malformed; refusing to serve it")
        if key not in self.keys:
            self._load_later()
        if key not in self.keys:
            raise UntrustedVersion(
                f"{name}: signed by key {key[:16]}..., which this device does not trust "
                f"(add it to [store] trusted_keys); refusing to serve it"
            )
        data = manifest if manifest is not None else (vdir / MANIFEST).read_bytes()
        try:
            nacl.signing.VerifyKey(bytes.fromhex(key)).verify(data, bytes.fromhex(sig))
        except nacl.exceptions.BadSignatureError:
            raise UntrustedVersion(
                f"{name}: the signature does not match its manifest (altered after signing); refusing to serve it"
            ) from None
        return self.keys[key]
