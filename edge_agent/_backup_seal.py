"""A backup sealed with a passphrase: a stick that is lost or lent holds the device's keys (the trainer's signing key,
the CURVE secret, the page's secrets) in no form anyone without the passphrase can read or change unnoticed.

The archive is streamed through libsodium's ``crypto_secretstream_xchacha20poly1305`` (PyNaCl, already the engines'
signature library) in chunks of 1 MiB, under a key derived from the passphrase with Argon2id (its salt and limits in
the file's header), so no plaintext byte is ever written where the backup goes. A sealed file is read back whole and
checked chunk by chunk; a wrong passphrase, a changed byte, a truncated or extended file: :class:`SealError`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from pathlib import Path

from nacl import bindings as _na
from nacl import pwhash

from edge_agent.backup import BackupError

__all__ = [
    "MAGIC",
    "SUFFIX",
    "SealError",
    "Sealer",
    "SealingWriter",
    "Unsealer",
    "UnsealingReader",
    "is_sealed",
    "name_tag",
    "read_passphrase",
    "sealed_size",
    "unseal",
]

MAGIC = b"edge-agent backup, sealed v1\n"
#: What a sealed backup's file name ends in (after ``.tar.gz``).
SUFFIX = ".sealed"
_CHUNK = 1 << 20
_ABYTES = _na.crypto_secretstream_xchacha20poly1305_ABYTES
_HEADER = _na.crypto_secretstream_xchacha20poly1305_HEADERBYTES
_SALT = pwhash.argon2id.SALTBYTES
#: Argon2id's limits: libsodium's "interactive" ones (64 MiB, 2 passes): a Pi 5 derives the key in well under a second,
#: beside a running daemon.
_OPS, _MEM = pwhash.argon2id.OPSLIMIT_INTERACTIVE, pwhash.argon2id.MEMLIMIT_INTERACTIVE
#: A sealed file's header: the magic line, the salt, the limits, secretstream's header.
_HEAD = len(MAGIC) + _SALT + 16 + _HEADER


class SealError(BackupError):
    """A passphrase that cannot be read, or a sealed backup that cannot be opened with it: the wrong one, or a file
    damaged or changed (nothing was restored)."""


def read_passphrase(path: str | os.PathLike) -> bytes:
    """The passphrase in the file ``path`` (its first line); raises :class:`SealError` naming the file and the fix."""
    p = Path(path).expanduser()
    try:
        text = p.read_bytes()[:4096].splitlines()
    except OSError as exc:
        raise SealError(f"{p}: the passphrase file cannot be read ({exc.strerror}): [backup] passphrase_file") from None
    if not text or not text[0].strip():
        raise SealError(f"{p}: the passphrase file is empty: write the passphrase on its first line ([backup] passphrase_file)")
    return text[0].strip()


def _key(passphrase: bytes, salt: bytes, ops: int, mem: int) -> bytes:
    return pwhash.argon2id.kdf(_na.crypto_secretstream_xchacha20poly1305_KEYBYTES, passphrase, salt, opslimit=ops, memlimit=mem)


def name_tag(key: bytes, sha: str) -> str:
    """The name a sealed shared file holding the bytes ``sha`` takes under ``key`` (64 hex digits): keyed, so a stick
    does not tell one who has the same photo that it is there, and the same under one key, so the next backup of that
    passphrase finds it again."""
    subkey = hashlib.blake2b(b"edge-agent shared file name", key=key, digest_size=32).digest()
    return hmac.new(subkey, bytes.fromhex(sha), hashlib.sha256).hexdigest()


class Sealer:
    """A key derived once from a passphrase under a new salt: what seals one backup's archive and the shared files it
    adds (:mod:`edge_agent._backup_files`), one Argon2id derivation for them all."""

    def __init__(self, passphrase: bytes) -> None:
        self.salt = os.urandom(_SALT)
        self.key = _key(passphrase, self.salt, _OPS, _MEM)

    def shared_name(self, sha: str) -> str:
        """The file name of a shared file holding the bytes ``sha`` sealed by this backup (:func:`name_tag`, the salt)."""
        return f"{name_tag(self.key, sha)}-{self.salt.hex()}.sealed"

    def writer(self, raw) -> SealingWriter:
        """A writer that seals into the open file ``raw``."""
        return SealingWriter(raw, self)


class SealingWriter:
    """A file-like object that seals what is written to it into ``raw`` (call :meth:`finish` after the last write)."""

    def __init__(self, raw, sealer: Sealer) -> None:
        self._state = _na.crypto_secretstream_xchacha20poly1305_state()
        header = _na.crypto_secretstream_xchacha20poly1305_init_push(self._state, sealer.key)
        self._raw, self._buf = raw, bytearray()
        raw.write(MAGIC + sealer.salt + struct.pack(">QQ", _OPS, _MEM) + header)

    def write(self, data) -> int:
        self._buf += data
        while len(self._buf) >= _CHUNK:
            self._push(bytes(self._buf[:_CHUNK]), _na.crypto_secretstream_xchacha20poly1305_TAG_MESSAGE)
            del self._buf[:_CHUNK]
        return len(data)

    def flush(self) -> None:
        """Nothing to do before :meth:`finish` (a chunk goes out whole)."""

    def _push(self, chunk: bytes, tag: int) -> None:
        sealed = _na.crypto_secretstream_xchacha20poly1305_push(self._state, chunk, None, tag)
        self._raw.write(struct.pack(">I", len(sealed)) + sealed)

    def finish(self) -> None:
        """Seal what is left as the final chunk: a file cut before it is refused on reading."""
        self._push(bytes(self._buf), _na.crypto_secretstream_xchacha20poly1305_TAG_FINAL)
        self._buf.clear()


def sealed_size(plain_bytes: int) -> int:
    """The size of the sealed file that ``plain_bytes`` bytes become."""
    full = plain_bytes // _CHUNK
    return _HEAD + full * (4 + _CHUNK + _ABYTES) + 4 + (plain_bytes - full * _CHUNK) + _ABYTES


class Unsealer:
    """Opens sealed files with one passphrase, deriving the key once for each salt met (a backup's shared files were
    sealed under the salts of the backups that added them)."""

    def __init__(self, passphrase: bytes) -> None:
        self.passphrase = passphrase
        self._keys: dict[bytes, bytes] = {}

    def key(self, src, head: bytes) -> bytes:
        """The key for the sealed file ``src`` whose first bytes are ``head``; raises :class:`SealError`."""
        if len(head) < _HEAD or not head.startswith(MAGIC):
            raise SealError(f"{src}: not a sealed edge-agent backup")
        salt = head[len(MAGIC) : len(MAGIC) + _SALT]
        ops, mem = struct.unpack(">QQ", head[len(MAGIC) + _SALT : len(MAGIC) + _SALT + 16])
        if not (_OPS <= ops <= pwhash.argon2id.OPSLIMIT_MAX and _MEM <= mem <= 1 << 30):  # a forged header's limits: never
            raise SealError(f"{src}: its header asks for key-derivation limits no edge-agent writes (changed?)")
        if head[: _HEAD - _HEADER] not in self._keys:
            self._keys[head[: _HEAD - _HEADER]] = _key(self.passphrase, salt, ops, mem)
        return self._keys[head[: _HEAD - _HEADER]]

    def key_of(self, src: Path) -> bytes:
        """The key the sealed file ``src`` was sealed under, derived from its header (its passphrase is not checked:
        :meth:`open` it for that); raises :class:`SealError`."""
        try:
            with open(src, "rb") as f:
                head = f.read(_HEAD)
        except OSError as exc:
            raise SealError(f"{src}: could not be opened ({exc.strerror or exc})") from None
        return self.key(src, head)

    def open(self, src: Path) -> UnsealingReader:
        """A reader of what the sealed file ``src`` holds; raises :class:`SealError`."""
        try:
            f = open(src, "rb")
        except OSError as exc:
            raise SealError(f"{src}: could not be opened ({exc.strerror or exc})") from None
        try:
            return UnsealingReader(f, src, self)
        except BaseException:
            f.close()
            raise


class UnsealingReader:
    """A file-like reader of a sealed file's plaintext, checked chunk by chunk as it is read (see :func:`unseal`)."""

    def __init__(self, f, src, unsealer: Unsealer) -> None:
        self._f, self._src, self._buf, self._final, self._first = f, src, bytearray(), False, True
        try:
            head = f.read(_HEAD)
        except OSError as exc:
            raise SealError(f"{src}: could not be opened ({exc.strerror or exc})") from None
        self._state = _na.crypto_secretstream_xchacha20poly1305_state()
        _na.crypto_secretstream_xchacha20poly1305_init_pull(self._state, head[-_HEADER:], unsealer.key(src, head))

    def _pull(self) -> None:
        src, f = self._src, self._f
        try:
            size = f.read(4)
            if len(size) < 4:
                raise SealError(f"{src}: cut short (its last part is missing): copy it again from where it was written")
            (n,) = struct.unpack(">I", size)
            chunk = f.read(n) if n <= _CHUNK + _ABYTES else b""
            if len(chunk) != n or n < _ABYTES:
                raise SealError(f"{src}: damaged (a part of {n} bytes where at most {_CHUNK + _ABYTES} fit)")
            try:
                plain, tag = _na.crypto_secretstream_xchacha20poly1305_pull(self._state, chunk, None)
            except Exception:  # noqa: BLE001 - libsodium's CryptoError: the wrong passphrase, or changed bytes
                why = "the wrong passphrase, or a damaged or changed file" if self._first else "damaged or changed"
                raise SealError(f"{src}: cannot be opened: {why}") from None
            self._buf += plain
            self._final, self._first = tag == _na.crypto_secretstream_xchacha20poly1305_TAG_FINAL, False
            if self._final and f.read(1):
                raise SealError(f"{src}: bytes after its end (changed?)")
        except OSError as exc:
            raise SealError(f"{src}: could not be read ({exc.strerror or exc})") from None

    def read(self, n: int = -1) -> bytes:
        while not self._final and (n < 0 or len(self._buf) < n):
            self._pull()
        n = len(self._buf) if n < 0 else min(n, len(self._buf))
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> UnsealingReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def is_sealed(path: Path) -> bool:
    """Whether the file ``path`` is a sealed backup."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def unseal(src: Path, dst: Path, passphrase: bytes | Unsealer) -> None:
    """Write the archive sealed in ``src`` to ``dst``, checked whole (the wrong passphrase, a changed byte, a file cut
    short or extended); raises :class:`SealError` (``dst`` then removed)."""
    unsealer = passphrase if isinstance(passphrase, Unsealer) else Unsealer(passphrase)
    try:
        with unsealer.open(src) as reader, open(dst, "wb") as out:
            for chunk in iter(lambda: reader.read(_CHUNK), b""):
                out.write(chunk)
    except SealError:
        Path(dst).unlink(missing_ok=True)
        raise
    except OSError as exc:
        Path(dst).unlink(missing_ok=True)
        raise SealError(f"{src}: could not be opened ({exc.strerror or exc})") from None
