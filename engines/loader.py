"""Open the configured engine on a (verified) store version."""

from __future__ import annotations

import os

from engines.base import BackendConfig, Engine, get_backend
from engines.store import EngineStore, StoreVersion

__all__ = ["open_engine"]


def open_engine(store: EngineStore | str | os.PathLike, config: BackendConfig, version: str | None = None, trust=None) -> Engine:
    """Verify ``version`` (default: current) of ``store`` (its files, and with ``trust`` its signature) and load it
    with the backend ``config.type`` names."""
    if not isinstance(store, EngineStore):
        store = EngineStore(store)
    opened: StoreVersion = store.open(version, trust=trust)
    return get_backend(config.type)(opened, config)
