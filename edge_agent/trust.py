"""Which engine versions this daemon may serve: signed by a trusted key (see :mod:`engines.signing`)."""

from __future__ import annotations

from pathlib import Path

from edge_agent.config import AppConfig
from edge_agent.state import trainer_state_dir
from engines.base import BackendConfig, Engine
from engines.loader import open_engine
from engines.signing import TrustedKeys
from engines.store import EngineStore, StoreError

__all__ = ["daemon_trust", "open_trusted", "adopt_shipped_signatures", "trainer_key_path"]


def trainer_key_path(cfg: AppConfig, state_dir: Path) -> Path:
    """The secret key of the trainer on ``state_dir`` (``signing.key`` in its state directory; ``signing.pub`` beside)."""
    return trainer_state_dir(cfg, state_dir) / "signing.key"


def daemon_trust(cfg: AppConfig, state_dir: Path) -> TrustedKeys | None:
    """The keys this daemon trusts, or None when ``[store] require_signature`` is off."""
    if not cfg.store.require_signature:
        return None
    return TrustedKeys.default(cfg.store.trusted_keys, local_trainer_key=trainer_key_path(cfg, state_dir).with_suffix(".pub"))


def open_trusted(store: EngineStore, config: BackendConfig, trust: TrustedKeys | None, log) -> tuple[Engine, dict[str, str]]:
    """The current version if it verifies and is trusted; else the newest one that is (the refusals, version ->
    reason, are returned and logged). Raises the current version's error when no version qualifies."""
    refused: dict[str, str] = {}
    current = store.current()
    for version in [current] + [v for v in reversed(store.versions()) if v != current]:
        try:
            engine = open_engine(store, config, version, trust=trust)
        except StoreError as exc:  # TamperedError, UntrustedVersion
            refused[version] = str(exc)
            log.error("engine_refused", candidate=version, reason=str(exc))
            continue
        if version != current:
            log.warning("serving_older_version", engine_version=version, current=current, reason=refused[current])
        return engine, refused
    raise StoreError(f"no version in {store.root} can be served: {refused[current]} (a trainer's versions are signed "
                     "with its key: trust it with [store] trusted_keys, or sign with `edge-trainer sign`)")


def adopt_shipped_signatures(store: EngineStore, shipped: Path, log=None) -> list[str]:
    """Give an unsigned version the shipped store's signature where its manifest is byte for byte the shipped one
    (a state directory seeded before versions were signed). Safe by construction: the signature is still checked
    against this manifest, and the files against the manifest, before anything is served."""
    from engines.durable import atomic_write
    from engines.signing import SIGNATURE
    from engines.store import MANIFEST

    adopted = []
    for version in store.versions():
        mine, theirs = store.root / version, shipped / version
        if (mine / SIGNATURE).exists() or not (theirs / SIGNATURE).is_file() or not (theirs / MANIFEST).is_file():
            continue
        if (mine / MANIFEST).read_bytes() == (theirs / MANIFEST).read_bytes():
            atomic_write(mine / SIGNATURE, (theirs / SIGNATURE).read_bytes(), durable=False)
            adopted.append(version)
            if log is not None:
                log.info("shipped_signature_adopted", engine_version=version)
    return adopted
