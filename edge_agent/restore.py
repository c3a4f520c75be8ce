"""Restore and check a backup (:mod:`edge_agent.backup`): nothing is put in place, and nothing is called whole, that
is not every file the backup lists with the sha256 it records.

``edge-agent restore`` takes a backup into a state directory that holds no results yet (``--force`` first moves an
existing one aside): every member must be a plain file named in ``backup.json`` with the hash it records, and every
shared file it names (:mod:`edge_agent._backup_files`) must be in the folder beside it with its hash, or nothing is
written. Files that lived outside the state directory are put under ``<state>/restored/`` and their original paths
printed, for the operator to copy back (they may need root). ``edge-agent restore --check`` reads a backup the same
way and writes nothing: what a farm runs now and then on its stick (a stick that fails, or a counterfeit one that
claims more room than it has, gives back other bytes than were written).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edge_agent._backup_files import open_shared, shared_name_ok
from edge_agent._backup_seal import Unsealer, is_sealed, unseal
from edge_agent.backup import FORMATS, MANIFEST, BackupError, BackupSealed, write_record
from engines.durable import fsync_dir, sync_filesystem
from engines.store import sha256_stream

__all__ = ["Checked", "Restored", "check", "read_manifest", "restore"]


@dataclass(frozen=True)
class Restored:
    """What :func:`restore` put where."""

    state_dir: Path
    files: int
    shared: int  # of them, read from the shared files beside the archive
    outside: dict[str, str]  # where each file from outside the state directory is now -> where it came from
    moved_aside: Path | None
    salvaged: dict | None = None  # what a salvaged backup lacks (:mod:`edge_agent._backup_salvage`)


@dataclass(frozen=True)
class Checked:
    """What :func:`check` read: every file the backup lists, each with the hash it records."""

    files: int
    shared: int
    bytes: int
    created_s: float | None
    salvaged: dict | None = None  # what a salvaged backup lacks (:mod:`edge_agent._backup_salvage`)


def _unsealer(passphrase: bytes | Unsealer | None) -> Unsealer | None:
    return passphrase if isinstance(passphrase, Unsealer) or passphrase is None else Unsealer(passphrase)


def _open(archive: Path, unsealer: Unsealer | None):
    """The backup ``archive``'s bytes as a stream (unsealed as read where it is sealed)."""
    if is_sealed(archive):
        if unsealer is None:
            raise BackupSealed(f"{archive}: sealed with a passphrase: give it (--passphrase-file FILE, or typed when asked)")
        return unsealer.open(archive)
    try:
        return open(archive, "rb")
    except OSError as exc:
        raise BackupError(f"{archive}: not a readable backup ({exc.strerror or exc})") from None


def read_manifest(archive: Path, passphrase: bytes | Unsealer | None = None) -> dict:
    """The manifest of the backup ``archive`` (read from its start, unsealed with ``passphrase`` where it is
    sealed); raises :class:`BackupError` (:class:`BackupSealed` where it is sealed and no passphrase is given)."""
    archive = Path(archive)
    with _open(archive, _unsealer(passphrase)) as src:
        try:
            with tarfile.open(fileobj=src, mode="r|gz") as tar:
                return _manifest_of(tar, archive)[1]
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise BackupError(f"{archive}: not a readable backup ({exc})") from None


def _manifest_of(tar: tarfile.TarFile, archive: Path) -> tuple[tarfile.TarInfo, dict]:
    """The first member of the backup being read by ``tar`` and the manifest it holds; raises :class:`BackupError`."""
    import json

    try:
        first = tar.next()
        if first is None or first.name != MANIFEST or not first.isfile() or first.size > 64 << 20:
            raise BackupError(f"{archive}: not an edge-agent backup (no {MANIFEST} first)")
        manifest = json.loads(tar.extractfile(first).read())
    except (tarfile.TarError, EOFError, ValueError, OSError, zlib.error) as exc:
        raise BackupError(f"{archive}: not a readable backup ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS or not isinstance(manifest.get("files"), dict):
        what = manifest.get("format") if isinstance(manifest, dict) else None
        raise BackupError(f"{archive}: backup format {what!r}, this version restores formats {', '.join(map(str, FORMATS))}")
    if not all(_safe(n) for n in manifest["files"]):
        raise BackupError(f"{archive}: a member names a path outside the state directory: refused")
    return first, manifest


def _safe(name: str) -> bool:
    p = PurePosixPath(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and "\\" not in name and "\x00" not in name


def _shared_sources(archive: Path, manifest: dict, unsealer: Unsealer | None) -> dict[str, Path]:
    """Where each file the backup ``archive`` keeps among its shared files is (name -> path), all there; raises
    :class:`BackupError` saying what is missing and what to do (nothing is restored)."""
    names = {n: m["shared"] for n, m in manifest["files"].items() if isinstance(m, dict) and "shared" in m}
    if not names:
        return {}
    root_name = manifest.get("shared_dir")
    if not all(isinstance(s, str) and isinstance(root_name, str) and shared_name_ok(root_name, s) for s in names.values()):
        raise BackupError(f"{archive}: a shared file is named outside its folder: refused")
    root = archive.parent / root_name
    missing = sorted({s for s in names.values() if not (root / s).is_file()})
    if missing:
        where = f"{root} lacks {len(missing)} of them (e.g. {missing[0]})" if root.is_dir() else f"{root} is not there"
        raise BackupError(
            f"{archive}: its photos and engines are kept in the folder {root_name} beside it, and {where}: copy that folder "
            "whole from the stick beside the backup; nothing restored"
        )
    if unsealer is None and any(s.endswith(".sealed") for s in names.values()):
        raise BackupSealed(f"{archive}: its shared files are sealed with a passphrase: give it (--passphrase-file FILE)")
    return {n: root / s for n, s in names.items()}


def _read_checked(src, out, sha256: str, archive: Path, name: str) -> int:
    """Copy the open file ``src`` to ``out`` (None: read only), checking that its bytes hash to ``sha256``; the
    bytes read; raises :class:`BackupError`."""
    digest, size = sha256_stream(src, out)
    if digest != sha256:
        raise BackupError(f"{archive}: {name} does not match its recorded sha256 (damaged or tampered): nothing restored")
    return size


def _read_all(
    tar: tarfile.TarFile,
    archive: Path,
    unsealer: Unsealer | None,
    sink: Callable[[str], object],
    ready: Callable[[dict], None] = lambda manifest: None,
    before_read: Callable[[Path], None] = lambda path: None,
) -> tuple[dict, int, int]:
    """Read the backup ``tar`` is reading, every member and every shared file, each checked against its hash, each
    into ``sink(name)`` (a context manager giving a file to write, or None: read only), once ``ready(manifest)`` has
    not raised; its manifest, the shared files read and the bytes read; raises :class:`BackupError`."""
    first, manifest = _manifest_of(tar, archive)
    files: dict = manifest["files"]
    shared = _shared_sources(archive, manifest, unsealer)
    ready(manifest)
    seen, size = set(), 0
    try:
        for member in tar:
            name = member.name
            if member is first or (name == MANIFEST and member.offset == first.offset):
                continue  # read above
            if name not in files or name in seen or name in shared or not member.isfile():
                raise BackupError(f"{archive}: member {name!r} is not a file the backup lists: refused")
            seen.add(name)
            with tar.extractfile(member) as src, sink(name) as out:
                size += _read_checked(src, out, files[name]["sha256"], archive, name)
        if seen != set(files) - set(shared):
            lost = set(files) - set(shared) - seen
            raise BackupError(f"{archive}: incomplete, {len(lost)} files missing (e.g. {sorted(lost)[:3]}): nothing restored")
        for name, path in shared.items():
            before_read(path)
            with open_shared(path, unsealer) as src, sink(name) as out:
                size += _read_checked(src, out, files[name]["sha256"], archive, name)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise BackupError(f"{archive}: damaged ({exc}): nothing restored") from None
    return manifest, len(shared), size


def check(archive: Path, passphrase: bytes | None = None) -> Checked:
    """Read the backup ``archive`` whole from its disk (not from memory), every file it lists (and every shared file
    beside it) checked against its sha256, writing nothing; raises :class:`BackupError` saying what is wrong (:class:`BackupSealed` where it is
    sealed and no passphrase was given)."""
    from edge_agent._backup_readback import drop_cached

    archive, unsealer = Path(archive), _unsealer(passphrase)
    drop_cached(archive)  # read from the disk, not from memory
    with _open(archive, unsealer) as raw:
        try:
            tar = tarfile.open(fileobj=raw, mode="r|gz")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise BackupError(f"{archive}: not a readable backup ({exc})") from None
        with tar:
            manifest, shared, size = _read_all(tar, archive, unsealer, lambda name: contextlib.nullcontext(), before_read=drop_cached)
    created = manifest.get("created_s")
    return Checked(len(manifest["files"]), shared, size, created if isinstance(created, (int, float)) else None, _salvaged(manifest))


def _salvaged(manifest: dict) -> dict | None:
    """What the backup lacks where it was salvaged from a failing card, else None."""
    found = manifest.get("salvaged")
    return found if isinstance(found, dict) else None


def restore(archive: Path, state_dir: Path, force: bool = False, passphrase: bytes | None = None) -> Restored:
    """Put the backup ``archive`` into ``state_dir`` (see the module's docstring), opening it with ``passphrase``
    where it is sealed; raises BackupError, having changed nothing, for a file that is not a whole, untampered backup
    (:class:`BackupSealed` where it is sealed and no passphrase was given), one whose shared files are not beside it,
    or a state directory that already holds results."""
    archive, state_dir = Path(archive), Path(state_dir)
    unsealer = _unsealer(passphrase)
    if not is_sealed(archive):
        return _restore(archive, archive, state_dir, force, unsealer)
    if unsealer is None:
        raise BackupSealed(f"{archive}: sealed with a passphrase: give it (--passphrase-file FILE, or typed when asked)")
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    plain = state_dir.with_name(f".tmp-unsealed-{os.getpid()}-{state_dir.name}.tar.gz")
    try:
        unseal(archive, plain, unsealer)
        return _restore(plain, archive, state_dir, force, unsealer)
    finally:
        plain.unlink(missing_ok=True)


def _restore(source: Path, archive: Path, state_dir: Path, force: bool, unsealer: Unsealer | None) -> Restored:
    """:func:`restore` of the archive in the file ``source`` (``archive`` itself, or it unsealed)."""
    try:
        tar = tarfile.open(source, mode="r:gz")
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise BackupError(f"{archive}: not a readable backup ({exc})") from None

    def ready(manifest: dict) -> None:
        if (state_dir / "results.sqlite").is_file() and not force:
            raise BackupError(
                f"{state_dir} already holds a results ledger: restore into a new state directory, or pass --force to move "
                "this one aside first"
            )

    staging = state_dir.with_name(f".tmp-restore-{os.getpid()}-{state_dir.name}")
    shutil.rmtree(staging, ignore_errors=True)

    def into(name: str):
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        return open(staging / name, "wb")

    with tar:
        try:
            manifest, shared, _ = _read_all(tar, archive, unsealer, into, ready)
        except BackupError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    files = manifest["files"]
    sync_filesystem(staging)  # on the new card before it takes its name
    aside = None
    if state_dir.exists() and any(state_dir.iterdir()):
        aside = state_dir.with_name(f"{state_dir.name}.before-restore-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(state_dir, aside)
    elif state_dir.exists():
        state_dir.rmdir()
    if (staging / "outside").is_dir():
        (staging / "restored").mkdir(exist_ok=True)
        os.replace(staging / "outside", staging / "restored" / "outside")
    os.replace(staging, state_dir)
    fsync_dir(state_dir.parent)
    created = manifest.get("created_s")
    if isinstance(created, (int, float)):  # the backup restored is this state's last one (from before 2026-12-03: unknown)
        size = archive.stat().st_size + sum(p.stat().st_size for p in _shared_sources(archive, manifest, unsealer).values())
        write_record(
            state_dir, {"time": created, "path": str(archive.resolve()), "bytes": size, "files": len(files), "restored": time.time()}
        )
    outside = {}
    for name, original in (manifest.get("outside") or {}).items():
        if name == "outside/store":
            outside[str(state_dir / "restored" / "outside" / "store")] = original
        else:
            outside[str(state_dir / "restored" / name)] = original
    return Restored(state_dir, len(files), shared, outside, aside, _salvaged(manifest))
