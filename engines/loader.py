"""Open the configured engine on a (verified) store version."""

from __future__ import annotations

import os
import threading

from engines.base import BackendConfig, CheckPhotos, Engine, get_backend
from engines.store import EngineStore

__all__ = ["open_engine"]


def open_engine(
    store: EngineStore | str | os.PathLike,
    config: BackendConfig,
    version: str | None = None,
    trust=None,
    check_photos: CheckPhotos | None = None,
) -> Engine:
    """Verify ``version`` (default: current) of ``store`` (its files, and with ``trust`` its signature) and load it
    with the backend ``config.type`` names; ``check_photos``: what a backend checks a faster precision on here."""
    if not isinstance(store, EngineStore):
        store = EngineStore(store)
    opened = store.open(version, trust=trust, verify=False)  # the manifest, and its signature
    backend = get_backend(config.type)
    failed: list[BaseException] = []

    def verify() -> None:
        try:
            opened.verify_files()
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            failed.append(exc)

    hashing = threading.Thread(target=verify, name="verify-engine", daemon=True)
    hashing.start()  # hashing releases the GIL: the files are checked while the backend's library imports
    try:
        backend.load_runtime()
    finally:
        hashing.join()
        if failed:
            raise failed[0]
    return backend(opened, config, check_photos)
