"""A backup sealed with a passphrase: a stick that is lost or lent holds the device's keys (the trainer's signing key,
the CURVE secret, the page's secrets) in no form anyone without the passphrase can read or change unnoticed.

The archive is streamed through libsodium's ``crypto_secretstream_xchacha20poly1305`` (PyNaCl, already the engines'
signature library) in chunks of 1 MiB, under a key derived from the passphrase with Argon2id (its salt and limits in
the file's header), so no plaintext byte is ever written where the backup goes. A sealed file is read back whole and
checked chunk by chunk; a wrong passphrase, a changed byte, a truncated or extended file: :class:`SealError`.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from nacl import bindings as _na
from nacl import pwhash

from edge_agent.backup import BackupError

__all__ = ["MAGIC", "SUFFIX", "SealError", "SealingWriter", "is_sealed", "read_passphrase", "unseal"]

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


class SealingWriter:
    """A file-like object that seals what is written to it into ``raw`` (call :meth:`finish` after the last write)."""

    def __init__(self, raw, passphrase: bytes) -> None:
        salt = os.urandom(_SALT)
        self._state = _na.crypto_secretstream_xchacha20poly1305_state()
        header = _na.crypto_secretstream_xchacha20poly1305_init_push(self._state, _key(passphrase, salt, _OPS, _MEM))
        self._raw, self._buf = raw, bytearray()
        raw.write(MAGIC + salt + struct.pack(">QQ", _OPS, _MEM) + header)

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


def is_sealed(path: Path) -> bool:
    """Whether the file ``path`` is a sealed backup."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def unseal(src: Path, dst: Path, passphrase: bytes) -> None:
    """Write the archive sealed in ``src`` to ``dst``; raises :class:`SealError` (``dst`` then removed)."""
    try:
        with open(src, "rb") as f, open(dst, "wb") as out:
            head = f.read(len(MAGIC) + _SALT + 16 + _HEADER)
            if len(head) < len(MAGIC) + _SALT + 16 + _HEADER or not head.startswith(MAGIC):
                raise SealError(f"{src}: not a sealed edge-agent backup")
            salt = head[len(MAGIC) : len(MAGIC) + _SALT]
            ops, mem = struct.unpack(">QQ", head[len(MAGIC) + _SALT : len(MAGIC) + _SALT + 16])
            if not (_OPS <= ops <= pwhash.argon2id.OPSLIMIT_MAX and _MEM <= mem <= 1 << 30):  # a forged header's limits: never
                raise SealError(f"{src}: its header asks for key-derivation limits no edge-agent writes (changed?)")
            state = _na.crypto_secretstream_xchacha20poly1305_state()
            _na.crypto_secretstream_xchacha20poly1305_init_pull(state, head[-_HEADER:], _key(passphrase, salt, ops, mem))
            final, first = False, True
            while not final:
                size = f.read(4)
                if len(size) < 4:
                    raise SealError(f"{src}: cut short (its last part is missing): copy it again from where it was written")
                (n,) = struct.unpack(">I", size)
                chunk = f.read(n) if n <= _CHUNK + _ABYTES else b""
                if len(chunk) != n or n < _ABYTES:
                    raise SealError(f"{src}: damaged (a part of {n} bytes where at most {_CHUNK + _ABYTES} fit)")
                try:
                    plain, tag = _na.crypto_secretstream_xchacha20poly1305_pull(state, chunk, None)
                except Exception:  # noqa: BLE001 - libsodium's CryptoError: the wrong passphrase, or changed bytes
                    why = "the wrong passphrase, or a damaged or changed file" if first else "damaged or changed"
                    raise SealError(f"{src}: cannot be opened: {why}") from None
                out.write(plain)
                final, first = tag == _na.crypto_secretstream_xchacha20poly1305_TAG_FINAL, False
            if f.read(1):
                raise SealError(f"{src}: bytes after its end (changed?)")
    except SealError:
        Path(dst).unlink(missing_ok=True)
        raise
    except OSError as exc:
        Path(dst).unlink(missing_ok=True)
        raise SealError(f"{src}: could not be opened ({exc.strerror or exc})") from None
