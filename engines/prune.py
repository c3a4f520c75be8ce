"""Old engine versions leave the disk: a season of retrains (about 33 MB each for EfficientNet-Lite0: FP32 and INT8
ONNX and the weights the next retrain starts from) would otherwise fill a Raspberry Pi's card.

A version is deleted only where nothing needs it. Never: a release (a version without a parent: the shipped models
and the first version of any new lineage, which the gate compares candidates with and an upgrade or rollback may
return to), the version in service, a rollback's pin, the versions the caller names (the one a daemon serves, the
one its golden photos were labelled by), nor the ``keep`` newest of the rest. A deleted version's directory is
renamed aside (a rename takes no room), its parent recorded in the store's ``pruned.json``, then it is removed, so a
lineage is still followed to its first version across the gap and the name is never handed out again; a crash leaves
the version whole or a leftover whose manifest still names its parent, which the next pass records and removes. On a
disk too full to take the record, the leftovers' models go first (:meth:`~engines.store.EngineStore.settle_pruned`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from engines.durable import fsync_dir
from engines.store import EngineStore, StoreError

__all__ = ["Deleted", "forget_caches", "prune_versions", "store_bytes"]


class Deleted(NamedTuple):
    """A version deleted: its name, the bytes it took, and the sha256 of its FP32 and INT8 models (the keys of what a
    machine built for it: TensorRT plans, the INT8-or-FP32 answer)."""

    version: str
    bytes: int
    onnx_sha256: str
    int8_sha256: str = ""


def prune_versions(store: EngineStore, keep: int, protect: Iterable[str] = ()) -> list[Deleted]:
    """Delete the versions of ``store`` nothing needs (see the module), keeping the ``keep`` newest retrained ones
    (0: delete none); the versions deleted, oldest first."""
    if keep <= 0 or not store.root.is_dir():
        return []
    with store.locked():
        store.clean_partial()
        try:
            current = store.current()
        except StoreError:  # no version in service: nothing can be judged unneeded
            return []
        spared = {current, *protect, (store.pin() or {}).get("version")}
        retrained: list[tuple[str, dict]] = []
        for version in store.versions():
            try:
                manifest = store.read_manifest(version)
            except StoreError:  # a manifest that cannot be read is left for a person to look at (open() refuses it)
                continue
            if manifest.get("parent"):
                retrained.append((version, manifest))
        doomed = [(v, m) for v, m in retrained[: max(0, len(retrained) - keep)] if v not in spared]
        if not doomed:
            return []
        deleted = []
        for version, manifest in doomed:
            files = manifest.get("files") or {}
            size = _bytes(store.root / version)
            os.rename(store.root / version, store.root / f".pruned-{version}")  # takes no room: a full disk too
            sha = {name: str((meta or {}).get("sha256", "")) for name, meta in files.items() if isinstance(meta, dict)}
            deleted.append(Deleted(version, size, sha.get("model.onnx", ""), sha.get("model.int8.onnx", "")))
        fsync_dir(store.root)
        store.settle_pruned()
        return deleted


def store_bytes(store: EngineStore) -> tuple[int, int]:
    """(versions held, their bytes on disk)."""
    versions = store.versions()
    return len(versions), sum(_bytes(store.root / version) for version in versions)


def _bytes(folder: Path) -> int:
    """The bytes of the files in ``folder`` (a version's: no subfolders)."""
    size = 0
    for f in folder.iterdir():
        try:
            size += f.stat().st_size
        except OSError:
            continue
    return size


def forget_caches(deleted: Iterable[Deleted], configured_cache: str = "") -> int:
    """Remove what this machine built for the ``deleted`` versions (TensorRT plans, ONNX Runtime's TensorRT engines, the
    INT8-or-FP32 answers) from the engines' cache (:func:`engines.cache.cache_dir`); the files removed."""
    from engines.cache import cache_dir

    removed = 0
    for gone in deleted:
        patterns = [("ort-precision", f"{gone.version}-{gone.int8_sha256[:16]}-*.json")] if gone.int8_sha256 else []
        if gone.onnx_sha256:  # its TensorRT plans, and the folder of ONNX Runtime's TensorRT engines
            patterns += [("trt-plans", f"{gone.onnx_sha256[:12]}-*"), ("ort-trt", gone.onnx_sha256[:12])]
        for sub, pattern in patterns:
            for f in cache_dir(configured_cache, sub).glob(pattern):
                try:
                    if f.is_dir():
                        removed += sum(1 for g in f.rglob("*") if g.is_file())
                        shutil.rmtree(f, ignore_errors=True)
                    else:
                        f.unlink()
                        removed += 1
                except OSError:
                    continue
    return removed
