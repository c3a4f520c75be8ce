"""Backup and restore: one file that puts a device back on a new SD card or a new board, serving the same engine
with the same keys and history.

``edge-agent backup`` writes a ``.tar.gz`` (mode 0600: it holds secrets) with ``backup.json`` first, naming every
file with its sha256: the results ledger and the alert outbox (consistent copies through SQLite's backup API, taken
while the daemon runs), the engine store, the trainer's signing key and samples, the page's token hashes and CSRF
secret, the golden photos, the label queue and review pool, and, with ``--photos``, ``processed/``. The
configuration file, the CURVE keys and the farm's notes file and Map image the configuration names, kept outside the
state directory, go in too, under ``outside/``, with the paths they came from (the notes written on the page are in
the state directory: ``class-notes.toml``). Thumbnails, status files and ``quarantine/`` are left out (remade, or not worth keeping).
Each file is archived as it was when listed (the databases copied, the rest hard-linked), so a daemon that goes on
meanwhile cannot make a file differ from its recorded hash; the state directory records the last backup written of
it (:data:`RECORD`: what ``status``, the Health page and the daemon's schedule, :mod:`edge_agent.backup_schedule`, read).
Given a passphrase, the archive is sealed as it is written (:mod:`edge_agent._backup_seal`), and a restore needs it.

``edge-agent restore`` takes such a file into a state directory that holds no results yet (``--force`` first moves
an existing one aside): every member must be a plain file named in ``backup.json`` with the hash it records, or
nothing is written. Files that lived outside the state directory are put under ``<state>/restored/`` and their
original paths printed, for the operator to copy back (they may need root).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import tarfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edge_agent.config import AppConfig
from engines.durable import atomic_write
from engines.errors import EdgeAgentError

__all__ = [
    "BackupError",
    "BackupSealed",
    "BackupStopped",
    "Restored",
    "backup",
    "last_backup",
    "planned_bytes",
    "restore",
    "FORMAT",
    "RECORD",
]

FORMAT = 1
MANIFEST = "backup.json"
#: The state directory's record of the last backup written of it (or restored into it): what ``status``, the Health
#: page and the daemon's schedule read.
RECORD = "last-backup.json"
#: SQLite files copied through the backup API (a plain copy of a live WAL database may be torn).
DATABASES = ("results.sqlite", "alerts.sqlite", "trainer/samples.sqlite", "trainer/unlabelled.sqlite")
#: What a backup leaves out: remade on demand, the services' live status, or not worth keeping.
SKIPPED = ("web/thumbs", "quarantine", "inbox", "restored", "status.json", "trainer/status.json", "run", ".tmp-", RECORD)


class BackupError(EdgeAgentError):
    """A backup could not be written, or a file is not a backup this version can restore (nothing was changed)."""


class BackupStopped(BackupError):
    """A backup was given up half-way because its taker is stopping (nothing was written)."""


class BackupSealed(BackupError):
    """A backup sealed with a passphrase was to be restored without one (nothing was changed)."""


@dataclass(frozen=True)
class Restored:
    """What :func:`restore` put where."""

    state_dir: Path
    files: int
    outside: dict[str, str]  # where each file from outside the state directory is now -> where it came from
    moved_aside: Path | None


def _skipped(rel: str, photos: bool) -> bool:
    if not photos and (rel == "processed" or rel.startswith("processed/")):
        return True
    return any(rel == s or rel.startswith(s + "/") or Path(rel).name.startswith(".tmp-") for s in SKIPPED) or rel.endswith(
        ("-wal", "-shm", ".lock")
    )


def _sqlite_copy(src: Path, dst: Path) -> Path:
    """A consistent copy of the SQLite database ``src`` (the writer may go on) at ``dst``: a season's ledger is
    streamed into the archive from disk, never held in memory (the daemon takes backups too)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    con, out = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30), sqlite3.connect(dst)
    try:
        con.backup(out)
    finally:
        out.close()
        con.close()
    return dst


def _outside_files(cfg: AppConfig, state_dir: Path) -> dict[str, Path]:
    """The configuration file, the CURVE keys and the farm's own files the configuration names (its notes on the
    classes, its image for the Map) that live outside ``state_dir``: name in the backup -> path."""
    paths = [cfg.source, cfg.handoff.curve_secret_key, cfg.handoff.curve_server_key, cfg.web.class_notes, cfg.web.map_image]
    out: dict[str, Path] = {}
    for p in [Path(x).expanduser().absolute() for x in paths if x]:
        if p.is_file() and not p.resolve().is_relative_to(state_dir.resolve()):
            out[f"outside/{len(out)}/{p.name}"] = p
    if cfg.handoff.curve_authorized_dir:
        folder = Path(cfg.handoff.curve_authorized_dir).expanduser().absolute()
        if folder.is_dir() and not folder.resolve().is_relative_to(state_dir.resolve()):
            n = len(out)
            for key in sorted(folder.glob("*.key")):
                out[f"outside/{n}/authorized/{key.name}"] = key
    return out


def _snapshot(members: dict[str, Path], folder: Path) -> dict[str, Path]:
    """``members`` as they are now, each read later from ``folder``: the databases copied through SQLite's backup
    API, every other file hard-linked (a file the daemon replaces or deletes while the archive is written is read
    as it was when listed, so its recorded sha256 holds; a file on another disk is read where it is). A file gone
    since it was listed is left out."""
    out: dict[str, Path] = {}
    for i, (name, src) in enumerate(members.items()):
        if name in DATABASES:
            out[name] = _sqlite_copy(src, folder / name.replace("/", "-"))
            continue
        link = folder / "files" / str(i)
        link.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, link)
        except FileNotFoundError:
            continue
        except OSError:  # another disk (an outside store, the configuration), or links refused: read in place
            link = src
        out[name] = link
    return out


def _members(cfg: AppConfig, state_dir: Path, photos: bool) -> tuple[dict[str, Path], dict[str, str]]:
    """What a backup of ``state_dir`` holds (name in the backup -> file; the live databases as they are) and the files
    from outside it (name -> the path they came from)."""
    if not (state_dir / "results.sqlite").is_file() and not (state_dir / "engines").is_dir():
        raise BackupError(f"{state_dir} holds no results and no engines: is it the state directory (--state-dir)?")
    members: dict[str, Path] = {}
    for folder, dirs, files in os.walk(state_dir):
        rel_dir = Path(folder).relative_to(state_dir).as_posix()
        under = "" if rel_dir == "." else f"{rel_dir}/"
        dirs[:] = sorted(d for d in dirs if not _skipped(f"{under}{d}", photos))
        for name in sorted(files):
            rel = f"{under}{name}"
            path = Path(folder) / name
            if _skipped(rel, photos) or path.is_symlink() or not path.is_file():
                continue
            members[rel] = path
    if cfg.store.path:
        store = Path(cfg.store.resolved())
        for f in sorted(store.rglob("*")):
            if f.is_file() and not f.is_symlink() and not _skipped(f.name, True):
                members[f"outside/store/{f.relative_to(store).as_posix()}"] = f
    if cfg.backup.passphrase_file:  # never the passphrase in the backup it seals
        secret = Path(cfg.backup.passphrase_file).expanduser().resolve()
        members = {name: p for name, p in members.items() if p.resolve() != secret}
    outside = {name: str(p) for name, p in _outside_files(cfg, state_dir).items()}
    members.update({name: Path(p) for name, p in outside.items()})
    if cfg.store.path:
        outside["outside/store"] = str(Path(cfg.store.resolved()))
    return members, outside


def planned_bytes(cfg: AppConfig, state_dir: Path, photos: bool = False) -> int:
    """The bytes of the files a backup of ``state_dir`` would hold: what its archive takes at most, give or take
    the tar headers (photos and engines do not compress; the databases do)."""
    total = 0
    for path in _members(cfg, Path(state_dir), photos)[0].values():
        try:
            total += path.stat().st_size
        except OSError:  # gone since it was listed (a photo pruned): not in the backup either
            pass
    return total


def backup(
    cfg: AppConfig,
    state_dir: Path,
    out: Path,
    photos: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
    passphrase: bytes | None = None,
) -> dict:
    """Write the backup of ``state_dir`` to ``out`` (atomically, mode 0600; sealed with ``passphrase`` where one is
    given, :mod:`edge_agent._backup_seal`), record it in the state directory (:data:`RECORD`) and return its manifest;
    raises :class:`BackupStopped`, having written nothing, where ``should_stop()`` turns true on the way (the daemon
    stopping)."""
    from edge_agent import __version__
    from edge_agent._backup_seal import SealingWriter

    state_dir = Path(state_dir)
    members, outside = _members(cfg, state_dir, photos)
    copies = state_dir / f".tmp-backup-{os.getpid()}-{threading.get_ident()}"
    out = Path(out)
    tmp = out.with_name(f".tmp-{os.getpid()}-{out.name}")
    try:
        members = _snapshot(members, copies)
        files = {}
        for name, src in members.items():
            h, size = hashlib.sha256(), 0
            with open(src, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
                    size += len(chunk)
            files[name] = {"sha256": h.hexdigest(), "bytes": size}
            if should_stop():
                raise BackupStopped(f"{out}: not written, stopped while reading {name}")
        manifest = {
            "format": FORMAT,
            "edge_agent": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "created_s": time.time(),
            "state_dir": str(state_dir.resolve()),
            "photos": photos,
            "files": files,
            "outside": outside,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as raw:
            sink = SealingWriter(raw, passphrase) if passphrase else raw
            with tarfile.open(fileobj=sink, mode="w:gz", compresslevel=1) as tar:
                _add(tar, MANIFEST, json.dumps(manifest, indent=2).encode())
                for name, src in members.items():
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = files[name]["bytes"], int(src.stat().st_mtime), 0o600
                    with open(src, "rb") as f:
                        tar.addfile(info, f)
                    if should_stop():
                        raise BackupStopped(f"{out}: not written, stopped while writing {name}")
            if passphrase:
                sink.finish()
            raw.flush()
            os.fsync(raw.fileno())  # the archive's end too, before it takes its name
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BackupError(f"{out}: could not write the backup: {exc.strerror or exc}") from None
    except sqlite3.Error as exc:  # a database locked past 30 s, or no room for its copy in the state directory
        raise BackupError(f"{state_dir}: could not copy a database for the backup ({exc}); nothing written") from None
    except (BackupError, tarfile.TarError):
        tmp.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(copies, ignore_errors=True)
    taken = {"time": manifest["created_s"], "path": str(out.resolve()), "bytes": out.stat().st_size, "files": len(files)}
    _record(state_dir, taken | {"sealed": bool(passphrase)})
    return manifest


def last_backup(state_dir: Path) -> dict | None:
    """The last backup written of ``state_dir`` (or restored into it): ``{"time", "path", "bytes", "files"}`` and
    ``"restored"`` (when it was restored here), or None where none is recorded or the record is unreadable."""
    try:
        data = json.loads((Path(state_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("time"), (int, float)) and isinstance(data.get("path"), str)
    return data if ok else None


def _record(state_dir: Path, taken: dict) -> None:
    """Write :data:`RECORD` atomically; a disk too full for it leaves the record before (the backup itself is whole)."""
    try:
        atomic_write(state_dir / RECORD, json.dumps(taken).encode())
    except OSError:
        pass


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
    tar.addfile(info, io.BytesIO(data))


def _safe(name: str) -> bool:
    p = PurePosixPath(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and "\\" not in name and "\x00" not in name


def restore(archive: Path, state_dir: Path, force: bool = False, passphrase: bytes | None = None) -> Restored:
    """Put the backup ``archive`` into ``state_dir`` (see the module's docstring), opening it with ``passphrase``
    where it is sealed; raises BackupError, having changed nothing, for a file that is not a whole, untampered backup
    (:class:`BackupSealed` where it is sealed and no passphrase was given), or a state directory that already holds
    results."""
    from edge_agent._backup_seal import is_sealed, unseal

    archive, state_dir = Path(archive), Path(state_dir)
    if not is_sealed(archive):
        return _restore(archive, archive, state_dir, force)
    if passphrase is None:
        raise BackupSealed(f"{archive}: sealed with a passphrase: give it (--passphrase-file FILE, or typed when asked)")
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    plain = state_dir.with_name(f".tmp-unsealed-{os.getpid()}-{state_dir.name}.tar.gz")
    try:
        unseal(archive, plain, passphrase)
        return _restore(plain, archive, state_dir, force)
    finally:
        plain.unlink(missing_ok=True)


def _restore(source: Path, archive: Path, state_dir: Path, force: bool) -> Restored:
    """:func:`restore` of the archive in the file ``source`` (``archive`` itself, or it unsealed)."""
    try:
        tar = tarfile.open(source, mode="r:gz")
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise BackupError(f"{archive}: not a readable backup ({exc})") from None
    with tar:
        try:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isfile() or first.size > 64 << 20:
                raise BackupError(f"{archive}: not an edge-agent backup (no {MANIFEST} first)")
            manifest = json.loads(tar.extractfile(first).read())
        except (tarfile.TarError, EOFError, ValueError, OSError) as exc:
            raise BackupError(f"{archive}: not a readable backup ({exc})") from None
        if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
            raise BackupError(f"{archive}: backup format {manifest.get('format')!r}, this version restores format {FORMAT}")
        files: dict = manifest["files"]
        if not all(_safe(n) for n in files):
            raise BackupError(f"{archive}: a member names a path outside the state directory: refused")
        if (state_dir / "results.sqlite").is_file() and not force:
            raise BackupError(
                f"{state_dir} already holds a results ledger: restore into a new state directory, or pass --force to move "
                "this one aside first"
            )
        staging = state_dir.with_name(f".tmp-restore-{os.getpid()}-{state_dir.name}")
        shutil.rmtree(staging, ignore_errors=True)
        seen = set()
        try:
            for member in tar:
                name = member.name
                if member is first or (name == MANIFEST and member.offset == first.offset):
                    continue  # read above
                if name not in files or name in seen or not member.isfile():
                    raise BackupError(f"{archive}: member {name!r} is not a file the backup lists: refused")
                seen.add(name)
                dst = staging / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                h = hashlib.sha256()
                with tar.extractfile(member) as src, open(dst, "wb") as out:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        h.update(chunk)
                        out.write(chunk)
                if h.hexdigest() != files[name]["sha256"]:
                    raise BackupError(f"{archive}: {name} does not match its recorded sha256 (damaged or tampered): nothing restored")
            if seen != set(files):
                missing = sorted(set(files) - seen)[:3]
                raise BackupError(f"{archive}: incomplete, {len(set(files) - seen)} files missing (e.g. {missing}): nothing restored")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise BackupError(f"{archive}: damaged ({exc}): nothing restored") from None
        except BackupError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
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
    created = manifest.get("created_s")
    if isinstance(created, (int, float)):  # the backup restored is this state's last one (from before 2026-12-03: unknown)
        size = archive.stat().st_size
        _record(state_dir, {"time": created, "path": str(archive.resolve()), "bytes": size, "files": len(files), "restored": time.time()})
    outside = {}
    for name, original in (manifest.get("outside") or {}).items():
        if name == "outside/store":
            outside[str(state_dir / "restored" / "outside" / "store")] = original
        else:
            outside[str(state_dir / "restored" / name)] = original
    return Restored(state_dir, len(files), outside, aside)
