"""The files a device's backups in one folder share: a photo or an engine is written onto the stick once, under its
sha256, and every backup that holds it names it there, so a day's backup writes what is new since the last (not a
season's photos every day) and no file it writes outgrows the 4 GiB a FAT32 stick takes.

They live in ``<dir>/edge-agent-<device>.files/``: ``<ab>/<sha256>`` as they are, or, in a sealed backup,
``<ab>/<tag>-<salt>.sealed``, sealed under the key of the backup that added them and named by a tag keyed with it
(:func:`~edge_agent._backup_seal.name_tag`: a sealed stick does not tell one who has the same photo that it is
there; its salt in the name: a passphrase changed since starts new copies, and the backups sealed with the old one
still restore with it; sealed files of backups before keyed names, ``<sha256>-<salt>.sealed``, still restore, and
are written once more under a keyed name by the next backup). Every
file is written under a temporary name and renamed whole; one is taken as there only at the size it must have (and,
sealed, where the passphrase opens its salt's files). A file no backup in the folder names is deleted once the
backups naming it are, and never while a backup there cannot be read (its files are kept until it is deleted itself).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from edge_agent._backup_readback import HashingWriter, drop_cached, read_back
from edge_agent._backup_seal import Sealer, SealError, Unsealer, name_tag, sealed_size
from engines.errors import EdgeAgentError
from engines.store import sha256_stream

__all__ = ["SHARED_MIN", "NotItsHash", "SharedFiles", "open_shared", "referenced", "shared_name_ok", "shared_root"]

#: Files at least this large are shared (photos, engines); smaller ones and the databases go into each archive.
SHARED_MIN = 64 << 10
_NAME = re.compile(r"(?P<sha>[0-9a-f]{64})(?:-(?P<salt>[0-9a-f]{32})\.sealed)?")
_ROOT = re.compile(r"edge-agent-[A-Za-z0-9_.-]+\.files")


def shared_root(folder: Path, device: str) -> Path:
    """Where the backups of ``device`` in ``folder`` keep the files they share."""
    return Path(folder) / f"edge-agent-{device}.files"


def shared_name_ok(root_name: str, name: str) -> bool:
    """Whether a manifest's shared folder and file name are ones a backup writes (no path leads elsewhere)."""
    head, _, tail = name.partition("/")
    m = _NAME.fullmatch(tail)
    return bool(_ROOT.fullmatch(root_name)) and bool(m) and head == m["sha"][:2]


class NotItsHash(EdgeAgentError):
    """A file to be kept as a shared file read as other bytes than the hash it was given (it changed unseen)."""


class SharedFiles:
    """The shared files of one device's backups in one folder (see the module), for one backup's writing."""

    def __init__(self, root: Path, sealer: Sealer | None = None, unsealer: Unsealer | None = None) -> None:
        self.root, self.sealer, self.unsealer = Path(root), sealer, unsealer
        self._salt_keys: dict[str, bytes] | None = None  # salt -> key, for the salts this passphrase opens (listed once)

    def size_of(self, name: str, plain_bytes: int) -> int:
        """The bytes on the stick of the shared file ``name`` that holds ``plain_bytes``."""
        return sealed_size(plain_bytes) if name.endswith(".sealed") else plain_bytes

    def find(self, sha: str, plain_bytes: int) -> str | None:
        """The name of a whole shared file holding the bytes ``sha`` that this backup may name, or None."""
        if self.sealer is None:
            return f"{sha[:2]}/{sha}" if _size(self.root / sha[:2] / sha) == plain_bytes else None
        for salt, key in self._keys().items():
            n = f"{name_tag(key, sha)}-{salt}.sealed"
            if _size(self.root / n[:2] / n) == sealed_size(plain_bytes):
                return f"{n[:2]}/{n}"
        return None

    def _keys(self) -> dict[str, bytes]:
        """The keys of the salts the sealed files here are under that this passphrase opens (each tried once on one of
        its files), this backup's own first: the folder is listed once a backup."""
        if self._salt_keys is None:
            self._salt_keys = {self.sealer.salt.hex(): self.sealer.key}
            one: dict[str, Path] = {}
            try:
                heads = sorted(os.listdir(self.root))
            except OSError:
                heads = []
            for head in heads:
                try:
                    names = sorted(os.listdir(self.root / head))
                except OSError:
                    continue
                for n in names:
                    m = _NAME.fullmatch(n)
                    if m and m["salt"] and m["salt"] not in one:
                        one[m["salt"]] = self.root / head / n
            for salt, path in one.items():
                if salt in self._salt_keys:
                    continue
                try:  # whether this passphrase opens the files of this salt: tried on one of them
                    with self.unsealer.open(path) as reader:
                        reader.read(1)
                    self._salt_keys[salt] = self.unsealer.key_of(path)
                except SealError:
                    continue
        return self._salt_keys

    def put(self, src: Path, sha: str) -> str:
        """Write the file ``src`` (whose bytes hash to ``sha``) as a shared file, read it back from the disk, and return
        its name; raises OSError, :class:`~edge_agent._backup_readback.ReadBackMismatch`, or :class:`NotItsHash` where
        the bytes read from ``src`` do not hash to ``sha`` (nothing kept)."""
        name = self.sealer.shared_name(sha) if self.sealer else sha
        folder = self.root / name[:2]
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{os.getpid()}-{name}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as raw, open(src, "rb") as f:
                hashed = HashingWriter(raw)
                sink = self.sealer.writer(hashed) if self.sealer else hashed
                read = HashingWriter(sink) if self.sealer else hashed  # (unsealed, what is written is what was read)
                shutil.copyfileobj(f, read, 1 << 20)
                if read.hexdigest() != sha:
                    raise NotItsHash(f"{src}: its bytes are not those its recorded sha256 {sha} says")
                if self.sealer:
                    sink.finish()
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(tmp, folder / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        read_back(folder / name, hashed.hexdigest(), hashed.size)
        return f"{name[:2]}/{name}"

    def damaged(self, named: dict[str, str], should_stop: Callable[[], bool] = lambda: False) -> list[str] | None:
        """The shared files of ``named`` (name -> the sha256 of what it holds) that do not read back from the disk (not
        from memory) as what they hold, or are not there; None where ``should_stop()`` turned true on the way."""
        bad = []
        for name, sha in sorted(named.items()):
            if should_stop():
                return None
            path = self.root / name
            drop_cached(path)
            try:
                with open_shared(path, self.unsealer) as f:
                    if sha256_stream(f)[0] != sha:
                        bad.append(name)
            except (OSError, SealError):
                bad.append(name)
        return bad

    def collect(self, keep: Iterable[str]) -> tuple[int, int]:
        """Delete the shared files not in ``keep`` (names as the manifests give them) and any left half-written;
        returns how many files and bytes were deleted. Nothing else in the folder is touched."""
        keep, files, freed = set(keep), 0, 0
        try:
            heads = sorted(os.listdir(self.root))
        except OSError:
            return 0, 0
        for head in heads:
            folder = self.root / head
            if not re.fullmatch(r"[0-9a-f]{2}", head) or not folder.is_dir():
                continue
            for n in sorted(os.listdir(folder)):
                if (_NAME.fullmatch(n) and f"{head}/{n}" not in keep) or n.startswith(".tmp-"):  # (.tmp-: a backup killed)
                    freed += _size(folder / n) or 0
                    (folder / n).unlink(missing_ok=True)
                    files += 1
            try:
                folder.rmdir()  # (only where now empty)
            except OSError:
                pass
        return files, freed


def open_shared(path: Path, unsealer: Unsealer | None):
    """The shared file ``path`` opened for reading what it holds (unsealed as read where it is sealed); raises OSError,
    or :class:`~edge_agent._backup_seal.SealError` (a sealed one and no passphrase: ``unsealer`` None)."""
    if not path.name.endswith(".sealed"):
        return open(path, "rb")
    if unsealer is None:
        raise SealError(f"{path}: sealed with a passphrase, and none given")
    return unsealer.open(path)


def referenced(archives: Iterable[Path], read_manifest: Callable[[Path], dict]) -> set[str]:
    """The shared files the manifests of ``archives`` name; raises what ``read_manifest`` raises for one it cannot read."""
    names: set[str] = set()
    for archive in archives:
        for meta in (read_manifest(archive).get("files") or {}).values():
            if isinstance(meta, dict) and isinstance(meta.get("shared"), str):
                names.add(meta["shared"])
    return names


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
