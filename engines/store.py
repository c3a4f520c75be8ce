"""The versioned engine store.

Layout::

    <root>/
      v0001/  model.onnx  model.int8.onnx  manifest.json
      v0002/  ...
      current            # text file holding the name of the version in service
      pruned.json        # old versions deleted (engines.prune), each with its parent
      .lock              # serialises publishers

A version directory is immutable once it exists. Publishing writes everything to
``.tmp-*`` first, fsyncs it, renames it into place, then replaces ``current``
atomically, so a reader sees either the old version or the complete new one,
never a half-written one. Every file's sha256 is in the manifest and is checked
when a version is opened; a file that does not match is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from engines.durable import NO_ROOM, atomic_write, fsync_dir, fsync_file
from engines.errors import EdgeAgentError

__all__ = ["EngineStore", "StoreVersion", "StoreError", "TamperedError", "OfferRefused", "MANIFEST", "sha256_file"]

MANIFEST = "manifest.json"
SIGNATURE_FILE = "manifest.sig"  # see engines.signing
CURRENT = "current"
PIN = "pinned"  # a local rollback's pin: {"version", "from", "at"} (JSON)
PRUNED = "pruned.json"  # the versions engines.prune deleted: {version: parent}
MANIFEST_FORMAT = 1
_VERSION_RE = re.compile(r"^v(\d{4,})$")
#: No file of a version may be larger (a model here is a few MB; TensorRT plans are built on the device, not stored).
MAX_FILE_BYTES = 512 << 20


class StoreError(EdgeAgentError, RuntimeError):
    """The store or a version in it is missing, malformed or inconsistent."""


class TamperedError(StoreError):
    """A file of a version does not match the sha256 in its manifest."""


class OfferRefused(StoreError):
    """An offered version the store's policy turns away (older than the one in service, or a rollback's pin)."""


def _read_manifest(vdir: Path, version: str) -> dict:
    """The manifest of the version in ``vdir``, checked for the fields every reader needs and for naming ``version``."""
    path = vdir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise StoreError(f"{vdir.parent}: no version {version!r}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path}: unreadable manifest ({exc})") from None
    for key in ("version", "files", "classes", "artifacts", "input", "preprocess"):
        if key not in manifest:
            raise StoreError(f"{path}: manifest lacks {key!r}")
    if manifest["version"] != version:
        raise StoreError(f"{path}: manifest says version {manifest['version']!r}, directory is {version!r}")
    return manifest


def _check_files(vdir: Path, name: str, manifest: dict) -> None:
    """Every file the manifest lists is in ``vdir`` with its sha256 (:class:`TamperedError` otherwise); the files are
    hashed two at a time (hashing releases the GIL: a version's 30 MB take half the time on two cores)."""
    files = list(manifest["files"].items())
    for fname, _ in files:
        fpath = vdir / fname
        if fpath.is_symlink():
            raise TamperedError(f"{name}/{fname}: a link (a version's files are its own); refusing to load it")
        if not fpath.is_file():
            raise TamperedError(f"{name}/{fname}: missing")
        if fpath.stat().st_size > MAX_FILE_BYTES:
            raise TamperedError(f"{name}/{fname}: larger than {MAX_FILE_BYTES >> 20} MiB; refusing to load it")
    digests: dict[str, str | OSError] = {}

    def hash_some(names: list[str]) -> None:
        for fname in names:
            try:
                digests[fname] = sha256_file(vdir / fname)
            except OSError as exc:
                digests[fname] = exc

    by_size = sorted((f for f, _ in files), key=lambda f: -(vdir / f).stat().st_size)
    other = threading.Thread(target=hash_some, args=(by_size[1::2],), name="verify-files", daemon=True)
    other.start()
    hash_some(by_size[0::2])
    other.join()
    for fname, meta in files:
        digest = digests[fname]
        if isinstance(digest, OSError):
            raise TamperedError(f"{name}/{fname}: unreadable ({digest})")
        _check_digest(f"{name}/{fname}", digest, meta["sha256"])


def _check_digest(what: str, digest: str, expected: str) -> None:
    """:class:`TamperedError` naming ``what`` unless its sha256 ``digest`` is the manifest's ``expected``."""
    if digest != expected:
        raise TamperedError(
            f"{what}: sha256 {digest[:12]}... does not match manifest {expected[:12]}... (file modified or corrupt); refusing to load it"
        )


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f)[0]


def sha256_stream(f, out=None) -> tuple[str, int]:
    """The sha256 and length of what the open file ``f`` holds from where it is, read in 1 MiB chunks (each also
    written to ``out``, where given)."""
    h, size = hashlib.sha256(), 0
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
        size += len(chunk)
        if out is not None:
            out.write(chunk)
    return h.hexdigest(), size


def _step(name: str) -> None:
    """Named point between publishing steps (a seam for crash tests; does nothing)."""


@dataclass(frozen=True)
class StoreVersion:
    """One verified, immutable version: its directory and manifest."""

    name: str
    path: Path
    manifest: dict
    signed_by: str | None = None  # the trusted key that signed it, where the signature was checked

    def file(self, name: str) -> Path:
        """Path of a file listed in the manifest."""
        if name not in self.manifest["files"]:
            raise StoreError(f"{self.name}: no file {name!r} in manifest")
        return self.path / name

    def verify_files(self) -> None:
        """Check every file the manifest lists against its sha256 (:class:`TamperedError` otherwise)."""
        _check_files(self.path, self.name, self.manifest)

    def read_verified(self, name: str) -> bytes:
        """The bytes of a file the manifest lists, read once and checked against its sha256 and size cap: what the
        caller loads is exactly what was checked (:class:`TamperedError` otherwise)."""
        path, meta = self.file(name), self.manifest["files"][name]
        try:
            with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as f:
                # read what the file holds (plus one byte to see growth), not a buffer of the cap's size
                data = f.read(min(os.fstat(f.fileno()).st_size, MAX_FILE_BYTES) + 1)
        except OSError as exc:
            raise TamperedError(f"{self.name}/{name}: unreadable ({exc})") from None
        if len(data) > MAX_FILE_BYTES:
            raise TamperedError(f"{self.name}/{name}: larger than {MAX_FILE_BYTES >> 20} MiB; refusing to load it")
        _check_digest(f"{self.name}/{name}", hashlib.sha256(data).hexdigest(), meta["sha256"])
        return data

    def artifact(self, kind: str) -> Path:
        """Path of an artifact by kind (``onnx``, ``int8``, ...), as the manifest names it."""
        name = self.manifest.get("artifacts", {}).get(kind)
        if name is None:
            have = ", ".join(sorted(self.manifest.get("artifacts", {}))) or "none"
            raise StoreError(f"{self.name} has no {kind!r} artifact (has: {have})")
        return self.file(name)

    @property
    def classes(self) -> list[str]:
        return list(self.manifest["classes"])


class EngineStore:
    """A directory of engine versions with an atomically switched ``current`` pointer."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    # ---- reading -------------------------------------------------------
    def versions(self) -> list[str]:
        """Complete versions, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            m = _VERSION_RE.match(p.name)
            if m and (p / MANIFEST).is_file():
                found.append((int(m.group(1)), p.name))
        return [name for _, name in sorted(found)]

    def current(self) -> str:
        """Name of the version in service."""
        try:
            name = (self.root / CURRENT).read_text().strip()
        except FileNotFoundError:
            raise StoreError(f"{self.root}: no current version (is this an engine store?)") from None
        if not _VERSION_RE.match(name) or not (self.root / name / MANIFEST).is_file():
            raise StoreError(f"{self.root}: current points at {name!r}, which is not a complete version")
        return name

    def read_manifest(self, version: str) -> dict:
        """The manifest of ``version``; a name that is not a version's (``v`` and four digits or more) is refused
        before any path is made of it."""
        if not _VERSION_RE.match(version):
            raise StoreError(f"{self.root}: no version {version!r} (a version is named v and four digits or more: v4001)")
        if not (self.root / version / MANIFEST).is_file() and version in self.pruned():
            raise StoreError(
                f"{self.root}: {version} was deleted as an old retrain ([retention] engine_versions keeps the newest); "
                f"held: {', '.join(self.versions())}"
            )
        return _read_manifest(self.root / version, version)

    def open(self, version: str | None = None, verify: bool = True, trust=None) -> StoreVersion:
        """Open ``version`` (default: current), checking every file's sha256, and with ``trust`` (an
        :class:`engines.signing.TrustedKeys`) that a trusted key signed it."""
        name = version or self.current()
        manifest = self.read_manifest(name)
        vdir = self.root / name
        signer = trust.check(vdir) if trust is not None else None
        opened = StoreVersion(name, vdir, manifest, signer)
        if verify:
            opened.verify_files()
        return opened

    # ---- writing -------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock (publishers, installs, switches and :mod:`engines.prune` take turns)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _next_version(self) -> str:
        nums = [int(_VERSION_RE.match(p.name).group(1)) for p in self.root.iterdir() if _VERSION_RE.match(p.name)]
        nums += [int(name[1:]) for name in self.pruned()]  # a deleted version's name is never handed out again
        return f"v{max(nums, default=0) + 1:04d}"

    def clean_partial(self) -> None:
        """Remove what a publish or a prune stopped half-way left (``.tmp-*``; ``.pruned-*`` once its parent is
        recorded: :meth:`settle_pruned`); under :meth:`locked`."""
        for p in self.root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        self.settle_pruned()

    def settle_pruned(self) -> bool:
        """Record the parents of the versions set aside for deletion (``.pruned-*``, each still holding its manifest)
        in ``pruned.json``, then remove them; under :meth:`locked`. On a disk too full to take the record, their other
        files go first (the room a prune is for) and the record is written again; where even that fails they stay, each
        its manifest alone, for the next pass (False)."""
        aside = sorted(p for p in self.root.iterdir() if p.name.startswith(".pruned-") and p.is_dir())
        if not aside:
            return True
        record = (json.dumps(self.pruned(), indent=0, sort_keys=True) + "\n").encode()
        try:
            atomic_write(self.root / PRUNED, record)
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
            for folder in aside:
                for f in folder.iterdir():
                    if f.name != MANIFEST:
                        f.unlink(missing_ok=True)
            try:
                atomic_write(self.root / PRUNED, record)
            except OSError as again:
                if again.errno not in NO_ROOM:
                    raise
                return False
        for folder in aside:
            shutil.rmtree(folder, ignore_errors=True)
        return True

    def pruned(self) -> dict[str, str]:
        """The versions :mod:`engines.prune` deleted, each with its parent (a lineage is followed across them): those
        recorded in ``pruned.json`` and those set aside but not recorded yet (their manifest says)."""
        try:
            record = json.loads((self.root / PRUNED).read_text())
        except (OSError, ValueError):
            record = {}
        found = (
            {k: v for k, v in record.items() if _VERSION_RE.match(str(k)) and _VERSION_RE.match(str(v))} if isinstance(record, dict) else {}
        )
        with contextlib.suppress(OSError):
            for folder in self.root.glob(".pruned-v*"):
                try:
                    parent = json.loads((folder / MANIFEST).read_text()).get("parent")
                except (OSError, ValueError, AttributeError):
                    continue
                name = folder.name.removeprefix(".pruned-")
                if _VERSION_RE.match(name) and isinstance(parent, str) and _VERSION_RE.match(parent):
                    found.setdefault(name, parent)
        return found

    def parent_of(self, version: str) -> str | None:
        """The version ``version`` was retrained from: its manifest's ``parent``, or for a deleted version the one
        recorded; None for a release (the first of its lineage) or a version the store never held."""
        if (self.root / version / MANIFEST).is_file():
            return self.read_manifest(version).get("parent") or None
        return self.pruned().get(version)

    def publish(
        self, files: Mapping[str, str | os.PathLike], manifest: Mapping, make_current: bool = True, sign=None, version: str | None = None
    ) -> StoreVersion:
        """Publish ``files`` (store name -> source path) as a new version (named ``version``, which must be newer
        than every version in the store, else the next number).

        ``manifest`` supplies the descriptive fields (classes, input, preprocess,
        artifacts, metrics, ...); ``version``, ``files`` and ``created`` are
        filled in here, and ``parent`` (the current version) unless given.
        ``sign`` (manifest bytes -> ``manifest.sig`` bytes) signs it before it appears.
        """
        for fname in files:
            if "/" in fname or fname in (MANIFEST, "") or fname.startswith("."):
                raise StoreError(f"bad file name for a store version: {fname!r}")
        for kind, fname in dict(manifest.get("artifacts", {})).items():
            if fname not in files:
                raise StoreError(f"artifact {kind!r} names {fname!r}, which is not among the files")
        with self.locked():
            self.clean_partial()
            nxt = self._next_version()
            if version is None:
                version = nxt
            elif not _VERSION_RE.match(version) or int(version[1:]) < int(nxt[1:]):
                raise StoreError(f"cannot publish as {version!r}: the store's next version is {nxt}")
            try:
                parent = self.current()
            except StoreError:
                parent = None
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=self.root))
            try:
                self._fill(tmp, files, manifest, version, parent, sign)
                os.rename(tmp, self.root / version)
            except BaseException:  # a full disk, a source gone: what was copied goes now, not at the next publish
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            fsync_dir(self.root)
            _step("renamed")
            if make_current:
                self._write_current(version)
            _step("current")
        return self.open(version)

    @staticmethod
    def _fill(tmp: Path, files: Mapping[str, str | os.PathLike], manifest: Mapping, version: str, parent: str | None, sign) -> None:
        """Write a version's files, manifest and signature into ``tmp``, each made durable (:meth:`publish`)."""
        os.chmod(tmp, 0o755)  # readable by a daemon running as another user
        _step("tmpdir")
        entries = {}
        for fname, src in files.items():
            dst = tmp / fname
            shutil.copyfile(src, dst)
            fsync_file(dst)
            entries[fname] = {"sha256": sha256_file(dst), "bytes": dst.stat().st_size}
            _step("file")
        full = {
            "format": MANIFEST_FORMAT,
            "version": version,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "parent": parent,
            **{k: v for k, v in manifest.items() if k not in ("version", "files", "format", "created", "parent")},
            "files": entries,
        }
        if "parent" in manifest:
            full["parent"] = manifest["parent"]
        mpath = tmp / MANIFEST
        mpath.write_text(json.dumps(full, indent=2, sort_keys=False) + "\n")
        fsync_file(mpath)
        if sign is not None:
            spath = tmp / SIGNATURE_FILE
            spath.write_bytes(sign(mpath.read_bytes()))
            fsync_file(spath)
        fsync_dir(tmp)
        _step("manifest")

    # ---- versions that arrive from elsewhere (engine transfer) ---------------
    def incoming(self, version: str) -> Path:
        """Where a version being received is assembled (kept across restarts, so a transfer resumes)."""
        if not _VERSION_RE.match(version):
            raise StoreError(f"bad version name {version!r}")
        return self.root / ".incoming" / version

    def install(self, version: str, make_current: bool = True, offered: bool = False) -> StoreVersion:
        """Move ``incoming(version)`` into the store under its own name, atomically, once every file matches its
        manifest, and put it in service. A version the store already holds is only put in service. An ``offered``
        one is put in service only if :meth:`offer_refusal` still allows it under the store's lock (a rollback
        in another process cannot slip between the check and the switch); else :class:`OfferRefused`."""
        with self.locked():
            if offered and make_current:
                self._refuse_offer(version)
            src, dst = self.incoming(version), self.root / version
            if dst.exists():
                manifest = self.read_manifest(version)
            else:
                manifest = _read_manifest(src, version)
                _check_files(src, version, manifest)
                for f in src.iterdir():
                    if f.name not in manifest["files"] and f.name not in (MANIFEST, SIGNATURE_FILE):
                        f.unlink()  # leftovers of an interrupted transfer
                    else:
                        fsync_file(f)
                fsync_dir(src)
                os.chmod(src, 0o755)
                os.rename(src, dst)
                fsync_dir(self.root)
            if make_current:
                self._write_current(version)
        return StoreVersion(version, dst, manifest)

    def _write_current(self, version: str) -> None:
        """Put ``version`` in service; one newer than a rollback's pin was made from lifts the pin (it has done its job)."""
        atomic_write(self.root / CURRENT, f"{version}\n".encode())
        if (self.root / PIN).exists() and self.pin() is None:  # :meth:`pin` says when a pin is lifted
            self.unpin()

    def set_current(self, version: str, trust=None, offered: bool = False) -> StoreVersion:
        """Put ``version`` in service after verifying it (and with ``trust``, that a trusted key signed it); an
        ``offered`` one only if :meth:`offer_refusal` allows it under the store's lock, else :class:`OfferRefused`."""
        opened = self.open(version, trust=trust)
        with self.locked():
            if offered:
                self._refuse_offer(version)
            self._write_current(version)
        return opened

    def _refuse_offer(self, version: str) -> None:
        why = self.offer_refusal(version)
        if why is not None:
            raise OfferRefused(why)

    def rollback(self, to: str | None = None, trust=None) -> StoreVersion:
        """Switch back to ``to``, or else to the current version's parent (or the previous one held); with ``trust``, only
        to a version a trusted key signed (the daemon would refuse any other). The device is then pinned there
        (:meth:`pin`): offers of the version rolled back from, or any older one, are refused until a newer one
        arrives or :meth:`unpin` lifts it."""
        cur = self.current()
        if to is None:
            to = self.read_manifest(cur).get("parent")
            if not to or not (self.root / to / MANIFEST).is_file():  # a release, or its parent deleted (engines.prune)
                older = [v for v in self.versions() if int(v[1:]) < int(cur[1:])]
                if not older:
                    raise StoreError(f"{cur} has no parent and no older version to roll back to")
                to = older[-1]
        opened = self.open(to, trust=trust)
        with self.locked():  # the switch and its pin together: an offer checked between them would undo the rollback
            now = self.current()  # another process may have put a newer one in service since ``cur`` was read
            if to != cur or to != now:
                newest = max((cur, now, (self.pin() or {}).get("from", cur)), key=lambda v: int(v[1:]))
                atomic_write(
                    self.root / PIN,
                    json.dumps({"version": to, "from": newest, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}).encode(),
                )
            self._write_current(to)
        return opened

    def pin(self) -> dict | None:
        """The pin a rollback left (``version``: pinned to, ``from``: the newest version rolled back from), or None;
        a pin whose ``from`` is older than the version in service has been lifted, even before its file is gone
        (a reader between the two writes of :meth:`_write_current`, or a crash there)."""
        try:
            pin = json.loads((self.root / PIN).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"version": "?", "from": "v9999999", "at": "?", "problem": f"{self.root / PIN} is unreadable: delete it to unpin"}
        if not isinstance(pin, dict) or not _VERSION_RE.match(str(pin.get("from", ""))):
            return {"version": "?", "from": "v9999999", "at": "?", "problem": f"{self.root / PIN} is malformed: delete it to unpin"}
        try:
            lifted = int(self.current()[1:]) > int(pin["from"][1:])
        except StoreError:
            lifted = False
        return None if lifted else pin

    def unpin(self) -> None:
        """Lift a rollback's pin: offers of newer versions are taken again."""
        (self.root / PIN).unlink(missing_ok=True)
        fsync_dir(self.root)

    def offer_refusal(self, version: str) -> str | None:
        """Why an offered ``version`` must not be put in service here, or None: offers never move a device to an older
        version, nor, while a rollback pins it, to the version it was rolled back from or any older one. A version
        newer than the pin's lifts it (:meth:`install`)."""
        if not _VERSION_RE.match(version):
            return f"bad version name {version!r}"
        try:
            cur = self.current()
        except StoreError:
            cur = None
        if cur is not None and int(version[1:]) < int(cur[1:]):
            return f"older than {cur} in service: offers never move a device back (edge-agent engine rollback does)"
        pin = self.pin()
        if pin is not None and int(version[1:]) <= int(pin["from"][1:]):
            return (
                pin.get("problem")
                or f"pinned to {pin['version']} by a rollback from {pin['from']}: only a newer version moves it "
                "(edge-agent engine unpin lifts the pin)"
            )
        return None
