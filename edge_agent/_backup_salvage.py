"""What still reads of a state directory on a card that fails some reads, taken off it for ``edge-agent backup
--salvage``: each file copied off the card as it is read, a file or folder that cannot be read left out and named, a
database copied whole where it reads and else block by block (a block that cannot be read as zeros: the start after a
restore keeps every row that can still be read), an engine version kept only whole, and ``current`` made to name the
newest version kept where the one it named was not.

A salvaged backup restores like any other; its manifest's ``salvaged`` says what it lacks, which ``restore`` prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import sqlite3
from pathlib import Path

__all__ = ["Salvaged", "describe", "snapshot"]

#: The unit a database is read in where it does not read whole: a block that fails is written as zeros.
_BLOCK = 4096
#: The engine stores a backup holds, by the prefix of their members' names.
_STORES = ("engines/", "outside/store/")
_VERSION = re.compile(r"^(v\d{4,})(/|$)")
#: What :func:`_copy_off` says of a file deleted since it was listed (a photo retention took): left out, unsaid.
_GONE = ""


@dataclasses.dataclass
class Salvaged:
    """What a salvage left out or changed: the manifest's ``salvaged``."""

    #: A file or folder (its name ending in ``/``) that could not be read, and what the OS said.
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)
    #: A database that did not read whole, and how many of its 4 KiB blocks were read as zeros (0: SQLite found it
    #: damaged though every block read).
    damaged: dict[str, int] = dataclasses.field(default_factory=dict)
    #: An engine version left out because one of its files did not read, and that file.
    versions_left_out: dict[str, str] = dataclasses.field(default_factory=dict)
    #: A store's ``current`` the backup holds another of than the card (its version, or its file, did not read) -> the
    #: version it names now, the newest kept whole (None: no version was whole, and it is left out).
    current: dict[str, str | None] = dataclasses.field(default_factory=dict)

    def as_manifest(self) -> dict:
        return dataclasses.asdict(self)


def _said(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _copy_off(src: Path, dst: Path) -> str | None:
    """Copy ``src`` (on the failing card) to ``dst`` (off it); what the OS said where ``src`` could not be read (no
    copy left; :data:`_GONE` where it was deleted since it was listed), None where it was copied. An error writing
    ``dst`` is raised: that is the backup's own disk."""
    with open(dst, "wb") as out:
        try:
            reader = open(src, "rb")
        except FileNotFoundError:
            trouble = _GONE
        except OSError as exc:
            trouble = _said(exc)
        else:
            with reader:
                trouble = _copy_into(reader, out)
    if trouble is not None:
        dst.unlink(missing_ok=True)
    return trouble


def _copy_into(reader, out) -> str | None:
    while True:
        try:
            chunk = reader.read(1 << 20)
        except OSError as exc:
            return _said(exc)
        if not chunk:
            return None
        out.write(chunk)


def _copy_blocks(src: Path, dst: Path) -> int | str:
    """Copy ``src`` to ``dst`` block by block, a block that cannot be read as zeros: the blocks so replaced, or what
    the OS said where ``src`` cannot be opened (nothing copied). An error writing ``dst`` is raised."""
    with open(dst, "wb") as out:
        try:
            fd = os.open(src, os.O_RDONLY)
            size = os.fstat(fd).st_size
        except OSError as exc:
            out.close()
            dst.unlink(missing_ok=True)
            return _said(exc)
        lost = 0
        try:
            for offset in range(0, size, _BLOCK):
                want = min(_BLOCK, size - offset)
                try:
                    data = os.pread(fd, want, offset)
                except OSError:
                    data, lost = b"", lost + 1
                out.write(data.ljust(want, b"\0"))
        finally:
            os.close(fd)
    return lost


def _database(state_dir: Path, name: str, src: Path, dst: Path, found: Salvaged) -> Path | None:
    """The database ``name``'s copy at ``dst``: whole through SQLite where it reads so, else its blocks (and its log's)
    as they read; None where nothing of it could be read."""
    from edge_agent.backup import DatabaseDamaged, _checked_copy
    from edge_agent.storage_errors import storage_problem
    from engines.durable import check_whole

    try:
        return _checked_copy(state_dir, name, src, dst)
    except DatabaseDamaged:
        found.damaged[name] = 0  # (copied as SQLite reads it: the rows on a damaged page are recovered at the start)
        return dst
    except (sqlite3.Error, OSError) as exc:
        if storage_problem(exc) in ("full", "locked"):  # the backup's disk full, or a service writing it past the wait
            raise
    for suffix in ("", "-wal", "-journal", "-shm"):
        Path(f"{dst}{suffix}").unlink(missing_ok=True)
    lost = _copy_blocks(src, dst)
    if isinstance(lost, str):
        found.unreadable[name] = lost
        return None
    wal = Path(f"{src}-wal")
    if wal.exists():
        in_log = _copy_blocks(wal, Path(f"{dst}-wal"))
        lost += in_log if isinstance(in_log, int) else 1  # (a log that cannot be read: the file as it was before its last writes)
    try:
        with contextlib.closing(sqlite3.connect(dst)) as copy:  # its log folded in (where it reads): one file to keep
            copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            check_whole(copy)
    except sqlite3.Error:
        found.damaged[name] = lost
    else:
        if lost:
            found.damaged[name] = lost
    for suffix in ("-wal", "-shm"):
        Path(f"{dst}{suffix}").unlink(missing_ok=True)
    return dst


def _keep_whole_versions(files: dict[str, Path], folder: Path, found: Salvaged) -> dict[str, Path]:
    """``files`` without the engine versions one of whose files (or folders) did not read, each store's ``current``
    made to name the newest version kept where it named one left out or did not read itself."""
    broken: dict[str, str] = {}
    for name in found.unreadable:
        for prefix in _STORES:
            m = _VERSION.match(name[len(prefix) :]) if name.startswith(prefix) else None
            if m:
                broken.setdefault(prefix + m.group(1), name)
    kept = {n: p for n, p in files.items() if not any(n.startswith(v + "/") for v in broken)}
    found.versions_left_out = {v: why for v, why in sorted(broken.items())}
    for prefix in _STORES:
        pointer = f"{prefix}current"
        if pointer in kept:
            if f"{prefix}{kept[pointer].read_text().strip()}" not in broken:
                continue
        elif pointer not in found.unreadable:
            continue  # (no such store)
        whole = sorted(
            {m.group(1) for n in kept if n.startswith(prefix) and (m := _VERSION.match(n[len(prefix) :])) and n.endswith("/manifest.json")},
            key=lambda v: int(v[1:]),
        )
        if whole:
            made = folder / f"current-{len(found.current)}"
            made.write_text(whole[-1] + "\n")
            kept[pointer] = made
            found.current[pointer] = whole[-1]
        else:  # the store left out whole: the restored device starts as a new one, serving the shipped release
            kept = {n: p for n, p in kept.items() if not n.startswith(prefix)}
            found.current[pointer] = None
    return kept


def snapshot(
    state_dir: Path, members: dict[str, Path], folder: Path, databases: tuple[str, ...], unlisted: dict[str, str]
) -> tuple[dict[str, Path], Salvaged]:
    """Every member of ``members`` that reads, copied into ``folder`` (off the failing card), databases through
    :func:`_database`; the copies (name -> path) and what was left out or changed (``unlisted``: what could not
    even be listed)."""
    found = Salvaged(unreadable=dict(unlisted))
    copies: dict[str, Path] = {}
    numbers = itertools.count()
    (folder / "files").mkdir(parents=True, exist_ok=True)
    for name, src in members.items():
        if name in databases:
            copy = _database(state_dir, name, src, folder / name.replace("/", "-"), found)
        else:
            copy = folder / "files" / str(next(numbers))
            trouble = _copy_off(src, copy)
            if trouble is not None:
                if trouble != _GONE:
                    found.unreadable[name] = trouble
                copy = None
        if copy is not None:
            copies[name] = copy
    return _keep_whole_versions(copies, folder, found), found


#: What puts each database right after a restore, where a salvage found it damaged.
_REPAIR = {
    "results.sqlite": "the daemon's first start on the restored state directory keeps every result that can still be read",
    "alerts.sqlite": "the daemon's first start sets it aside and begins a new alert outbox (alerts not yet delivered are lost)",
    "trainer/samples.sqlite": "run `edge-trainer salvage` on the restored state directory: it keeps every label that can still be read",
    "trainer/unlabelled.sqlite": "the trainer's first start sets it aside and begins a new pool of unlabelled photos",
}
#: What follows from a key file the salvage could not read, and what to do before the services start on the new card.
_LOST_KEY = {
    "trainer/signing.key": "the trainer makes a new signing key at its first start and writes its signing.pub over the "
    "old one: before starting it, copy trainer/signing.pub aside (e.g. /etc/edge-agent/trainer-before.pub) and add that "
    "file to [store] trusted_keys, or the versions the farm's trainer signed before are no longer served"
}
#: The files a salvage names at most, one a line; the rest are counted.
_NAMED = 20


def describe(salvaged: dict) -> list[str]:
    """Lines saying what a salvaged backup (its manifest's ``salvaged``) lacks and what to do, for ``backup`` and
    ``restore`` to print; a manifest written by another version may hold anything, so only what is well-formed is said."""
    lines = []
    unreadable = salvaged.get("unreadable") if isinstance(salvaged.get("unreadable"), dict) else {}
    damaged = salvaged.get("damaged") if isinstance(salvaged.get("damaged"), dict) else {}
    versions = salvaged.get("versions_left_out") if isinstance(salvaged.get("versions_left_out"), dict) else {}
    current = salvaged.get("current") if isinstance(salvaged.get("current"), dict) else {}
    if unreadable:
        lines.append(f"{len(unreadable)} files or folders could not be read on the card and are not in it:")
        for name, said in list(sorted(unreadable.items()))[:_NAMED]:
            lines.append(f"  {name}: {said}")
        if len(unreadable) > _NAMED:
            lines.append(f"  ... and {len(unreadable) - _NAMED} more (the backup's backup.json lists them all)")
    lines += [f"{name}: {_LOST_KEY[name]}" for name in sorted(unreadable) if name in _LOST_KEY]
    for name, blocks in sorted(damaged.items()):
        how = f"{blocks} of its 4 KiB blocks could not be read (zeros in their place)" if blocks else "damaged, copied as it reads"
        lines.append(f"{name}: {how}: {_REPAIR.get(name, 'its service sets it aside at its next start')}")
    for version, why in sorted(versions.items()):
        lines.append(f"{version}: left out whole ({why} could not be read)")
    for pointer, now in sorted(current.items()):
        lines.append(
            f"{pointer}: now {now}, the newest engine kept whole"
            if now
            else f"{pointer}: left out (no engine version was whole): the restored device serves the shipped release"
        )
    return lines or ["every file read: nothing is missing"]
