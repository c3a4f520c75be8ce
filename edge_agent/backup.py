"""Backup: one file that puts a device back on a new SD card or a new board, serving the same engine
with the same keys and history.

``edge-agent backup`` writes a ``.tar.gz`` (mode 0600: it holds secrets) with ``backup.json`` first, naming every
file with its sha256: the results ledger and the alert outbox (consistent copies through SQLite's backup API, taken
while the daemon runs), the engine store, the trainer's signing key and samples, the page's token hashes and CSRF
secret, the golden photos, the label queue and review pool, and, with ``--photos``, ``processed/``. The
configuration file, the CURVE keys and the farm's notes file and Map image the configuration names, kept outside the
state directory, go in too, under ``outside/``, with the paths they came from (the notes written on the page are in
the state directory: ``class-notes.toml``). Thumbnails, status files and ``quarantine/`` are left out (remade, or not worth keeping).
Each file is archived as it was when listed (the rest hard-linked first, then the databases copied), so a daemon
that goes on meanwhile cannot make a file differ from its recorded hash, nor a row name a photo the backup lacks; the state directory records the last backup written of
it (:data:`RECORD`: what ``status``, the Health page and the daemon's schedule, :mod:`edge_agent.backup_schedule`, read).
Given a passphrase, the archive is sealed as it is written (:mod:`edge_agent._backup_seal`), and a restore needs it.
The daemon's backups into a folder (:mod:`edge_agent.backup_folder`) keep the photos and engines once, in a folder
beside them that they share (:mod:`edge_agent._backup_files`), so each writes only what is new; a restore reads them
from there, checked against the same hashes.
``edge-agent restore`` (:mod:`edge_agent.restore`) puts it back, or checks it, file by file against those hashes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import sqlite3
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edge_agent._ledger_file import CLOSED
from edge_agent.config import AppConfig
from engines.durable import atomic_write, connect_readonly, failing_disk, read_only_disk
from engines.errors import EdgeAgentError
from engines.store import sha256_stream

__all__ = [
    "BackupError",
    "BackupSealed",
    "BackupStopped",
    "DatabaseDamaged",
    "backup",
    "card_suspect",
    "changed_unseen",
    "last_backup",
    "write_record",
    "FORMAT",
    "FORMATS",
    "RECORD",
]

#: The backup format written: 2 names shared files beside the archive (:mod:`edge_agent._backup_files`); a backup with
#: none is written as format 1, which versions before them restore too.
FORMAT = 2
FORMATS = (1, 2)
MANIFEST = "backup.json"
#: The state directory's record of the last backup written of it (or restored into it): what ``status``, the Health
#: page and the daemon's schedule read.
RECORD = "last-backup.json"
#: The state directory's record of its files' sha256 as of the last backup, each keyed by what ``stat`` said of the
#: file (size, mtime, inode): a backup reads again only the files new or changed since (a season's photos are read
#: once, not every day). A file changed less than :data:`_SETTLED_NS` before it was listed is read again next time
#: (a file's times tick coarsely: a write in the same tick would not change them).
HASHES = "backup-hashes.json"
#: The file in the state directory that asks the daemon's schedule for a backup now
#: (:func:`edge_agent.backup_schedule.request_backup`).
REQUEST = "backup-requested.json"
_SETTLED_NS = 2_000_000_000
#: What a backup says of files whose bytes changed on the card without being written.
CARD_RETURNS_OTHER_BYTES = (
    "the card returns other bytes than were written (their size and times unchanged), a card that is failing: "
    "put a new card in soon; the backups before this one hold those files as they were"
)


def changed_unseen(names: list[str]) -> str:
    """What a backup that found ``names`` changed on the card without being written says of them."""
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return f"{', '.join(names[:5])}{more}: {CARD_RETURNS_OTHER_BYTES}; this backup holds them as they read now"


#: What a backup that met a file it cannot read says to do.
_SALVAGE_HINT = (
    "A backup needs every file to read: put the card back (and fsck it), then try again; where it still fails, take off "
    "the card what still reads with `edge-agent backup --salvage --out FILE` (FILE on another disk)"
)
_SHA = re.compile(r"[0-9a-f]{64}")
#: SQLite files copied through the backup API (a plain copy of a live WAL database may be torn).
DATABASES = ("results.sqlite", "alerts.sqlite", "trainer/samples.sqlite", "trainer/unlabelled.sqlite")
#: What a backup leaves out: remade on demand, the services' live status, or not worth keeping.
SKIPPED = (
    "web/thumbs",
    "quarantine",
    "inbox",
    "restored",
    "status.json",
    "trainer/status.json",
    "run",
    ".tmp-",
    RECORD,
    HASHES,
    "backup-requested.json",
    "ledger-check-requested",
    f"results.sqlite{CLOSED}",
)


class BackupError(EdgeAgentError):
    """A backup could not be written, or a file is not a backup this version can restore (nothing was changed)."""


class BackupStopped(BackupError):
    """A backup was given up half-way because its taker is stopping (nothing was written)."""


class BackupSealed(BackupError):
    """A backup sealed with a passphrase was to be restored without one (nothing was changed)."""


#: What puts each database right once a backup has found a damaged page in it.
_DAMAGE_FIX = {
    "results.sqlite": "the daemon's next start keeps every row that can still be read in a new ledger (a daemon that takes "
    "its backups stops for it, and systemd starts it again 5 s on)",
    "alerts.sqlite": "the daemon keeps it aside and starts a new outbox (at once where it takes its backups, else at its next start)",
    "trainer/samples.sqlite": "the trainer's next start keeps the expert's labels where none is lost, or says how to get them "
    "back (a trainer that takes its backups stops for it)",
    "trainer/unlabelled.sqlite": "the trainer's next start keeps it aside and starts a new pool (a trainer that takes its "
    "backups stops for it)",
}


class DatabaseDamaged(BackupError):
    """A database the backup copies has a damaged page (a card that rots one): no backup is written, so none before
    it, which may hold the page whole, is deleted for it."""

    def __init__(self, state_dir: Path, name: str, exc: BaseException) -> None:
        super().__init__(
            f"{state_dir / name}: damaged ({exc}): no backup written, so none of the backups before it is deleted "
            f"(the newest may hold the page whole); {_DAMAGE_FIX[name]}"
        )
        #: The database, as :data:`DATABASES` names it, and what SQLite said of it.
        self.name, self.cause = name, exc


def _skipped(rel: str, photos: bool) -> bool:
    if not photos and (rel == "processed" or rel.startswith("processed/")):
        return True
    return any(rel == s or rel.startswith(s + "/") or Path(rel).name.startswith(".tmp-") for s in SKIPPED) or rel.endswith(
        ("-wal", "-shm", ".lock")
    )


def _checked_copy(state_dir: Path, name: str, src: Path, dst: Path) -> Path:
    """:func:`_sqlite_copy` of database ``name``, read whole (SQLite's quick_check: about 150 ms for a season's ledger
    here): a page a card rotted is copied as it lies, and a backup that kept it would in time be the only one left.
    Raises :class:`DatabaseDamaged` where the database itself is damaged (the ledger then no longer counts as closed
    whole, so the daemon's next start reads it whole), :class:`BackupError` where only the copy is."""
    from edge_agent._ledger_file import forget_closed
    from edge_agent.storage_errors import storage_problem
    from engines.durable import check_whole

    try:
        _sqlite_copy(src, dst)
        with contextlib.closing(sqlite3.connect(dst)) as copy:
            check_whole(copy)
        return dst
    except sqlite3.DatabaseError as exc:
        if storage_problem(exc) != "damaged":
            raise
        try:
            with contextlib.closing(connect_readonly(src)) as con:
                check_whole(con)
        except sqlite3.DatabaseError as found:
            if storage_problem(found) != "damaged":
                raise
            if name == "results.sqlite":
                forget_closed(src)
            raise DatabaseDamaged(state_dir, name, found) from None
        raise BackupError(
            f"{dst}: the copy of {src} read back damaged though the file reads whole: the disk it was copied onto may be "
            "failing; no backup written"
        ) from None


def _sqlite_copy(src: Path, dst: Path) -> Path:
    """A consistent copy of the SQLite database ``src`` (the writer may go on) at ``dst``: a season's ledger is
    streamed into the archive from disk, never held in memory (the daemon takes backups too). On a disk mounted
    read-only, where SQLite cannot open a database whose write-ahead log lies without its index (a service killed as
    the card failed), the files are copied as they lie (nothing can write them) and the copy takes in its log."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    con = connect_readonly(src)
    try:
        con.execute("SELECT 1 FROM sqlite_master LIMIT 1")
    except sqlite3.OperationalError:
        con.close()
        if not read_only_disk(src.parent):
            raise
        for suffix in ("", "-wal"):
            if Path(f"{src}{suffix}").is_file():
                shutil.copyfile(f"{src}{suffix}", f"{dst}{suffix}")
        copy = sqlite3.connect(dst)  # where it can be written: its log recovered and folded in, and removed
        try:
            copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            copy.close()
        return dst
    out = sqlite3.connect(dst)
    try:
        con.backup(out)
    finally:
        out.close()
        con.close()
    return dst


def _scratch(state_dir: Path, members: dict[str, Path], out: Path, off_the_card: bool = False) -> Path:
    """Where a backup of ``state_dir`` keeps its snapshot (the databases' copies, the files' links) while it writes
    ``out``: in the state directory (links need its disk), or beside ``out`` where the state directory's disk is
    mounted read-only or has no room for the databases' copies (a failing or full card: the files are then read
    where they lie), or ``off_the_card`` (a salvage)."""
    name = f".tmp-backup-{os.getpid()}-{threading.get_ident()}"
    if off_the_card:
        out.parent.mkdir(parents=True, exist_ok=True)
        return out.parent / name
    try:
        need = sum(p.stat().st_size for n, p in members.items() if n in DATABASES) + (16 << 20)
        room = shutil.disk_usage(state_dir).free >= need
    except OSError:
        room = False
    if room and not read_only_disk(state_dir):
        return state_dir / name
    out.parent.mkdir(parents=True, exist_ok=True)
    return out.parent / name


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


def _snapshot(
    state_dir: Path, members: dict[str, Path], folder: Path, relist: Callable[[], dict[str, Path]] = dict
) -> tuple[dict[str, Path], dict[str, tuple[int, int, int]]]:
    """``members`` as they are now, each read later from ``folder``: every file but the databases hard-linked first
    (a file the daemon replaces or deletes while the archive is written is read as it was when linked, so its
    recorded sha256 holds; a file on another disk is read where it is), then the databases copied through SQLite's
    backup API (each read whole: :func:`_checked_copy`), then the files ``relist()`` names that were not there before. Every store writes a photo before the
    row that names it, and deletes the row before the photo, so each row of a database copy names a file the
    snapshot holds, whatever the daemon and the trainer add, remove or replace meanwhile (a label's photo the trainer
    reduces, a pseudo-label dropped, a queued photo sent). A file gone since it was listed is left out. Also what
    ``stat`` said of each file but the databases before it was linked (size, mtime in ns, inode: the key of
    :data:`HASHES`)."""
    linked: dict[str, Path] = {}
    stats: dict[str, tuple[int, int, int]] = {}
    numbers = itertools.count()

    def link(name: str, src: Path) -> None:
        dst = folder / "files" / str(next(numbers))
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            st = os.stat(src)
        except FileNotFoundError:
            return
        except OSError:  # read (or refused) when archived
            st = None
        try:
            os.link(src, dst)
        except FileNotFoundError:
            return
        except OSError:  # another disk (an outside store, the configuration), or links refused: read in place
            dst = src
        if st is not None:
            stats[name] = (st.st_size, st.st_mtime_ns, st.st_ino)
        linked[name] = dst

    for name, src in members.items():
        if name not in DATABASES:
            link(name, src)
    copies = {
        name: _checked_copy(state_dir, name, src, folder / name.replace("/", "-")) for name, src in members.items() if name in DATABASES
    }
    late = {name: src for name, src in relist().items() if name not in members and name not in DATABASES}
    for name, src in late.items():
        link(name, src)
    out = {name: copies.get(name) or linked[name] for name in [*members, *late] if name in copies or name in linked}
    return out, stats


def _read_hashes(state_dir: Path) -> dict[str, list]:
    """:data:`HASHES` of ``state_dir`` (name -> [size, mtime_ns, inode, sha256]); empty where none or unreadable."""
    try:
        data = json.loads((state_dir / HASHES).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        k: v
        for k, v in data.items()
        if isinstance(v, list) and len(v) == 4 and all(type(x) is int for x in v[:3]) and isinstance(v[3], str) and _SHA.fullmatch(v[3])
    }


class _Unreadable(EdgeAgentError):
    """A file the backup takes could not be read (not an OSError: told apart from the backup's own disk failing)."""

    def __init__(self, path: Path, said: OSError | str) -> None:
        super().__init__(str(path))
        self.path, self.said = path, said if isinstance(said, str) else said.strerror or str(said)


class _Changed(EdgeAgentError):
    """Files whose bytes, read into the archive, are not those the manifest records (their hashes were read from
    :data:`HASHES`, their size and times unchanged since)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(", ".join(names))
        self.names = names


class _Reading:
    """A file being archived, whose read errors are :class:`_Unreadable`; the sha256 of what was read (``sha``)."""

    def __init__(self, path: Path) -> None:
        self.path, self.sha = path, hashlib.sha256()
        try:
            self.f = open(path, "rb")
        except OSError as exc:
            raise _Unreadable(path, exc) from None

    def read(self, size: int = -1) -> bytes:
        try:
            data = self.f.read(size)
        except OSError as exc:
            raise _Unreadable(self.path, exc) from None
        self.sha.update(data)
        return data

    def __enter__(self) -> _Reading:
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def _unreadable_error(state_dir: Path, exc: _Unreadable) -> BackupError:
    """What a backup says of a file or folder it could not read: the state directory where its disk fails a probe."""
    where = exc.path if failing_disk(state_dir) is None else state_dir
    return BackupError(
        f"{where}: could not be read for the backup ({exc.said}): its disk fails to read (see `dmesg`); nothing written. {_SALVAGE_HINT}"
    )


def _hash(src: Path) -> tuple[str, int]:
    with _Reading(src) as f:
        return sha256_stream(f)


def _members(
    cfg: AppConfig, state_dir: Path, photos: bool, unlisted: dict[str, str] | None = None
) -> tuple[dict[str, Path], dict[str, str]]:
    """What a backup of ``state_dir`` holds (name in the backup -> file; the live databases as they are) and the files
    from outside it (name -> the path they came from). A folder that cannot be listed raises the OS's error (a backup
    that left it out would restore without it), or with ``unlisted`` (a salvage) is put there (its name ending in
    ``/`` -> what the OS said)."""
    if not (state_dir / "results.sqlite").is_file() and not (state_dir / "engines").is_dir():
        raise BackupError(f"{state_dir} holds no results and no engines: is it the state directory (--state-dir)?")

    def unreadable(exc: OSError) -> None:
        if isinstance(exc, FileNotFoundError):
            return  # (a folder deleted since its parent was listed: retention's)
        if unlisted is None:
            raise _Unreadable(Path(exc.filename or state_dir), exc)
        name = Path(exc.filename).relative_to(state_dir).as_posix() if exc.filename else "."
        unlisted[f"{name}/"] = exc.strerror or str(exc)

    members: dict[str, Path] = {}
    for folder, dirs, files in os.walk(state_dir, onerror=unreadable):
        rel_dir = Path(folder).relative_to(state_dir).as_posix()
        under = "" if rel_dir == "." else f"{rel_dir}/"
        dirs[:] = sorted(d for d in dirs if not _skipped(f"{under}{d}", photos))
        for name in sorted(files):
            rel = f"{under}{name}"
            path = Path(folder) / name
            if _skipped(rel, photos):
                continue
            try:
                if path.is_symlink() or not path.is_file():
                    continue
            except OSError as exc:  # its inode cannot be read (a card that rots it)
                if unlisted is None:
                    raise _Unreadable(path, exc) from None
                unlisted[rel] = exc.strerror or str(exc)
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


def backup(
    cfg: AppConfig,
    state_dir: Path,
    out: Path,
    photos: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
    passphrase: bytes | None = None,
    shared: Path | None = None,
    room: Callable[[int, set[str]], None] = lambda need, planned: None,
    salvage: bool = False,
    *,
    _distrust: frozenset[str] = frozenset(),
) -> dict:
    """Write the backup of ``state_dir`` to ``out`` (atomically, mode 0600; sealed with ``passphrase`` where one is
    given, :mod:`edge_agent._backup_seal`), record it in the state directory (:data:`RECORD`) and return its manifest
    with ``bytes`` (what it restores) and ``written`` (what this call wrote: the archive and the new shared files);
    raises :class:`BackupStopped`, having written no archive, where ``should_stop()`` turns true on the way (the
    daemon stopping). With ``shared`` (a folder beside ``out``, :mod:`edge_agent._backup_files`), the photos and
    engines already there are named rather than written again, and the new ones are written there; ``room(need,
    planned)`` is called first with the bytes still to write and the shared files the backup will name (to make room
    without deleting those). With ``salvage`` (a card that fails some reads: :mod:`edge_agent._backup_salvage`),
    what reads is taken off the card and what does not is left out and named in the manifest's ``salvaged``; such a
    backup is not recorded as the state's last one. Every file archived is hashed as it is read: one whose bytes are
    not those its recorded hash (:data:`HASHES`) says, its size and times unchanged (a card that returns other bytes
    than were written), is read again in a second attempt and named in the result's ``changed_unseen``."""
    from edge_agent import __version__
    from edge_agent._backup_files import SHARED_MIN, NotItsHash, SharedFiles
    from edge_agent._backup_readback import HashingWriter, read_back
    from edge_agent._backup_seal import Sealer, Unsealer

    state_dir = Path(state_dir)
    unlisted: dict[str, str] | None = {} if salvage else None
    try:
        members, outside = _members(cfg, state_dir, photos, unlisted)
    except _Unreadable as exc:
        raise _unreadable_error(state_dir, exc) from None
    copies = _scratch(state_dir, members, Path(out), off_the_card=salvage)
    listed = dict(members)  # (where each file is on the card, for what is said of one that cannot be read)
    out = Path(out)
    tmp = out.with_name(f".tmp-{os.getpid()}-{out.name}")
    sealer = Sealer(passphrase) if passphrase else None
    pool = SharedFiles(shared, sealer, Unsealer(passphrase) if passphrase else None) if shared else None
    written, changed, retry = 0, [], []
    try:
        if salvage:
            from edge_agent._backup_salvage import snapshot

            members, salvaged = snapshot(state_dir, members, copies, DATABASES, unlisted)
            stats = {}
        else:
            members, stats = _snapshot(state_dir, members, copies, lambda: _members(cfg, state_dir, photos)[0])
        files, known, hashes, settled = {}, _read_hashes(state_dir), {}, time.time_ns() - _SETTLED_NS
        for name, src in members.items():
            st, hit = stats.get(name), known.get(name)
            if (
                st is not None and hit is not None and tuple(hit[:3]) == st and name not in _distrust
            ):  # read at the last backup, unchanged since
                files[name] = {"sha256": hit[3], "bytes": st[0]}
                hashes[name] = hit
            else:
                try:
                    sha, size = _hash(src)
                except _Unreadable as exc:
                    raise _Unreadable(listed[name], exc.said) from None
                files[name] = {"sha256": sha, "bytes": size}
                if st is not None and st[0] == size and st[1] < settled:
                    hashes[name] = [*st, sha]
            if should_stop():
                raise BackupStopped(f"{out}: not written, stopped while reading {name}")
        new: dict[str, list[str]] = {}  # sha256 -> the members whose bytes are to be written as one shared file
        if pool is not None:
            for name, meta in files.items():
                if name in DATABASES or meta["bytes"] < SHARED_MIN:
                    continue
                found = None if meta["sha256"] in new else pool.find(meta["sha256"], meta["bytes"])
                if found:
                    meta["shared"] = found
                else:
                    new.setdefault(meta["sha256"], []).append(name)
        planned = {m["shared"] for m in files.values() if "shared" in m}
        room(sum(m["bytes"] for m in files.values() if "shared" not in m), planned)
        for sha, names in new.items():
            try:
                shared_name = pool.put(members[names[0]], sha)
            except NotItsHash:
                raise _Changed(names) from None
            written += pool.size_of(shared_name, files[names[0]]["bytes"])
            for name in names:
                files[name]["shared"] = shared_name
            if should_stop():
                raise BackupStopped(f"{out}: not written, stopped while writing the shared file of {names[0]}")
        manifest = {
            "format": FORMAT if pool is not None else 1,
            "edge_agent": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "created_s": time.time(),
            "state_dir": str(state_dir.resolve()),
            "photos": photos,
            "files": files,
            "outside": outside,
        }
        if pool is not None:
            manifest["shared_dir"] = pool.root.name
        if salvage:
            manifest["salvaged"] = salvaged.as_manifest()
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as raw:
            hashed = HashingWriter(raw)
            sink = sealer.writer(hashed) if sealer else hashed
            with tarfile.open(fileobj=sink, mode="w:gz", compresslevel=1) as tar:
                _add(tar, MANIFEST, json.dumps(manifest, indent=2).encode())
                for name, src in members.items():
                    if "shared" in files[name]:
                        continue
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = files[name]["bytes"], int(src.stat().st_mtime), 0o600
                    try:
                        with _Reading(src) as f:
                            tar.addfile(info, f)
                    except _Unreadable as exc:
                        raise _Unreadable(listed[name], exc.said) from None
                    if f.sha.hexdigest() != files[name]["sha256"]:
                        changed.append(name)
                    if should_stop():
                        raise BackupStopped(f"{out}: not written, stopped while writing {name}")
            if changed:
                raise _Changed(changed)
            if sealer:
                sink.finish()
            raw.flush()
            os.fsync(raw.fileno())  # the archive's end too, before it takes its name
        os.replace(tmp, out)
        read_back(out, hashed.hexdigest(), hashed.size)
    except _Unreadable as exc:
        tmp.unlink(missing_ok=True)
        raise _unreadable_error(state_dir, exc) from None
    except _Changed as exc:
        tmp.unlink(missing_ok=True)
        retry = exc.names
        if _distrust:
            raise BackupError(
                f"{listed[exc.names[0]]}: read twice, other bytes each time: {CARD_RETURNS_OTHER_BYTES}; nothing written"
            ) from None
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if not salvage and failing_disk(state_dir) is not None:  # the state's disk, not the backup's (it was named as the one at fault)
            raise BackupError(
                f"{state_dir}: could not be read for the backup ({exc.strerror or exc}): its disk fails to read (see `dmesg`); "
                f"nothing written. {_SALVAGE_HINT}"
            ) from None
        big = " (its disk takes no file over 4 GiB, as FAT32: format it exFAT or ext4; the daemon's backups: [backup] shared_files on)"
        raise BackupError(f"{out}: could not write the backup: {exc.strerror or exc}{big if exc.errno == errno.EFBIG else ''}") from None
    except sqlite3.Error as exc:  # a database locked past 30 s, or no room for its copy
        raise BackupError(f"{state_dir}: could not copy a database for the backup ({exc}); nothing written") from None
    except (BackupError, tarfile.TarError):
        tmp.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(copies, ignore_errors=True)
    if retry:
        again = backup(cfg, state_dir, out, photos, should_stop, passphrase, shared, room, salvage, _distrust=frozenset(retry))
        return again | {"changed_unseen": retry}
    if salvage:  # not the state's last backup: the daemon's schedule and the Health page still ask for a whole one
        return manifest | {"bytes": out.stat().st_size, "written": out.stat().st_size}
    try:
        atomic_write(state_dir / HASHES, json.dumps(hashes).encode())
    except OSError:  # a disk too full for it: the next backup reads every file again
        pass
    size = out.stat().st_size
    on_stick = {m["shared"]: m["bytes"] for m in files.values() if "shared" in m}
    total = size + sum(pool.size_of(n, b) for n, b in on_stick.items()) if pool else size
    taken = {"time": manifest["created_s"], "path": str(out.resolve()), "bytes": total, "written": size + written, "files": len(files)}
    before = last_backup(state_dir) or {}
    checked = before.get("checked")
    if isinstance(checked, (int, float)):  # when the files on the stick last all read back whole (backup_folder)
        taken["checked"] = checked
    suspect = {"time": time.time(), "files": sorted(_distrust)} if _distrust else card_suspect(before, time.time())
    if suspect:  # said by status and the Health page for a month after it was found (on this card: a restore starts anew)
        taken["card_suspect"] = suspect
    write_record(state_dir, taken | {"sealed": bool(passphrase)})
    return manifest | {"bytes": total, "written": size + written}


#: How long status and the Health page say a backup found files changed on the card without being written.
SUSPECT_S = 30 * 86400


def card_suspect(record: dict | None, now: float) -> dict | None:
    """``{"time", "files"}`` where a backup of the last :data:`SUSPECT_S` found files changed on the card without
    being written (:data:`CARD_RETURNS_OTHER_BYTES`), from the state's record of its last backup; else None."""
    found = (record or {}).get("card_suspect")
    if not isinstance(found, dict) or not isinstance(found.get("time"), (int, float)) or not isinstance(found.get("files"), list):
        return None
    return found if 0 <= now - found["time"] < SUSPECT_S else None


def last_backup(state_dir: Path) -> dict | None:
    """The last backup written of ``state_dir`` (or restored into it): ``{"time", "path", "bytes", "files"}`` and
    ``"restored"`` (when it was restored here), or None where none is recorded or the record is unreadable."""
    try:
        data = json.loads((Path(state_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("time"), (int, float)) and isinstance(data.get("path"), str)
    return data if ok else None


def write_record(state_dir: Path, taken: dict) -> None:
    """Write :data:`RECORD` atomically; a disk too full for it leaves the record before (the backup itself is whole)."""
    try:
        atomic_write(state_dir / RECORD, json.dumps(taken).encode())
    except OSError:
        pass


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
    tar.addfile(info, io.BytesIO(data))
