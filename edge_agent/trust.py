"""Which engine versions this daemon may serve: signed by a trusted key (see :mod:`engines.signing`)."""

from __future__ import annotations

from pathlib import Path

from edge_agent._truth import precision_check
from edge_agent.config import AppConfig
from edge_agent.state import trainer_state_dir
from engines.base import BackendConfig, Engine
from engines.loader import open_engine
from engines.signing import TrustedKeys
from engines.store import EngineStore, StoreError

__all__ = ["daemon_trust", "open_trusted", "trainer_key_path"]


def trainer_key_path(cfg: AppConfig, state_dir: Path) -> Path:
    """The secret key of the trainer on ``state_dir`` (``signing.key`` in its state directory; ``signing.pub`` beside)."""
    return trainer_state_dir(cfg, state_dir) / "signing.key"


def daemon_trust(cfg: AppConfig, state_dir: Path) -> TrustedKeys | None:
    """The keys this daemon trusts, or None when ``[store] require_signature`` is off."""
    if not cfg.store.require_signature:
        return None
    return TrustedKeys.default(cfg.store.trusted_keys, local_trainer_key=trainer_key_path(cfg, state_dir).with_suffix(".pub"))


def open_trusted(
    store: EngineStore, config: BackendConfig, trust: TrustedKeys | None, log, golden_file: Path | None = None, min_agreement: float = 0.5
) -> tuple[Engine, dict[str, str]]:
    """The current version if it passes every check; else the newest one that does (the refusals, version -> reason,
    are returned and logged). Raises the current version's error when no version qualifies.

    The checks are a hot swap's (:func:`edge_agent.hotswap.verify_candidate`), so a version is not served after a
    restart that a swap refused: files and signature; a smoke inference (its network matches its class list); and
    against the version that labelled the golden photos in ``golden_file`` (where that is another version the store
    holds: the one served before; for the current version only, so an older one can still stand in), else against its
    parent: the same input and preprocessing, every class kept by name, and agreement on the golden photos. A current
    version an operator chose (a rollback: :func:`edge_agent.hotswap.operator_chosen`) is served on files, signature
    and the smoke inference alone, as at the swap."""
    from edge_agent.golden import load_golden
    from edge_agent.hotswap import operator_chosen, smoke_test, verify_candidate

    refused: dict[str, str] = {}
    current = store.current()
    try:
        golden = load_golden(golden_file) if golden_file is not None else None
    except ValueError as exc:
        log.warning("golden_file_ignored", file=str(golden_file), error=str(exc))
        golden = None
    held = set(store.versions())
    for version in [current] + [v for v in reversed(store.versions()) if v != current]:
        engine = None
        try:
            engine = open_engine(store, config, version, trust=trust, check_photos=precision_check)
            smoke_test(engine)
            if version == current and golden is not None and golden[0] != version and golden[0] in held:
                chosen = operator_chosen(store, version, golden[0])
                verify_candidate(engine, store.read_manifest(golden[0]), golden[0], golden[1], min_agreement, chosen)
            elif engine.version.manifest.get("parent") in held:  # a fallback, or nothing served before
                parent = engine.version.manifest["parent"]
                chosen = version == current and operator_chosen(store, version, parent)
                verify_candidate(engine, store.read_manifest(parent), parent, [], min_agreement, chosen)
        except Exception as exc:  # noqa: BLE001 - TamperedError, UntrustedVersion, SwapRefused, a model its runtime rejects
            if engine is not None:
                engine.close()
            refused[version] = str(exc)
            log.error("engine_refused", candidate=version, reason=str(exc))
            continue
        if version != current:
            log.warning("serving_older_version", engine_version=version, current=current, reason=refused[current])
        return engine, refused
    raise StoreError(
        f"no version in {store.root} can be served: {refused[current]} (a trainer's versions are signed "
        "with its key: trust it with [store] trusted_keys, or sign with `edge-trainer sign`)"
    )
