"""What an upgrade from an earlier release needs, in one place; each shim says what it keeps working and since when.

* :data:`REPLACED_KEYS`: configuration keys an earlier release took, answered with what replaced them.
* :func:`adopt_shipped_release`: a package upgrade puts the shipped release into a store that already has versions;
  where the farm's own retrained version serves, the release waits beside it (:data:`PENDING_RELEASE`) until the
  trainer's field check says which serves (:mod:`trainer.loop.release_adoption`).
* :func:`adopt_shipped_signatures`: a store seeded before versions were signed gets the shipped signatures.

Elsewhere, where the shim is the data's own reading of an older form: ``strategy = "ewc"`` in ``[trainer]``
(:mod:`edge_agent.trainer_config`), results stored before verdicts (:mod:`edge_agent.results`), and the trainer's
strategy state from before a new release's lineage (:mod:`trainer.lineage`).
"""

from __future__ import annotations

from pathlib import Path

from edge_agent.seeding import install_shipped
from engines.store import EngineStore

__all__ = ["PENDING_RELEASE", "REPLACED_KEYS", "adopt_shipped_release", "adopt_shipped_signatures", "pending_release"]

#: In a store's root: the name of a release installed by an upgrade that does not serve yet, because the farm's own
#: retrained version does; the trainer decides on the farm's field check and removes the file.
PENDING_RELEASE = "release-pending"

#: Keys an earlier release accepted, and what took their place (said with the unknown-key error).
REPLACED_KEYS = {
    "trainer.pseudo_only_interpolate": "replaced by trainer.pseudo_only_steps, the steps a retrain on pseudo-labels "
    "chooses from; pseudo_only_steps = [x] keeps one fixed step",
    "trainer.ewc_lambda": 'replaced by ewc_lambda in [trainer.strategy] (with type = "ewc")',
    "trainer.rehearsal_per_class": 'replaced by per_class in [trainer.strategy] (with type = "rehearsal")',
    "trainer.rehearsal_selection": 'replaced by selection in [trainer.strategy] (with type = "rehearsal")',
    "labels.max_queue_mb": "replaced by labels.max_spool_mb (the label spool's disk quota, same meaning)",
    "handoff.delivery_endpoint": "replaced by handoff.transfer_endpoint (the engine-transfer socket, same meaning)",
    "trainer.lwf_temperature": "replaced by trainer.distill_temperature for distill, and temperature in [trainer.strategy] "
    '(with type = "lwf") for LwF',
}


def adopt_shipped_release(store: EngineStore, shipped: Path) -> str | None:
    """After a package upgrade: install the shipped store's current version into ``store`` if it lacks it, and put it
    in service; returns its name, or None when there was nothing to do.

    Releases are numbered apart from a device's own versions (the 38-class release is v1000; a device's retrains
    count up from the version in service), so the name is free on any device that has retrained fewer than ~1000
    times since; where it is taken, the device keeps what it has and the release is not installed. The device's own
    versions stay in the store (``edge-agent engine rollback`` reaches them); labels keep their meaning because
    they are class names, which a later release extends. Done once: a release the store holds is never re-installed,
    so a rollback after the upgrade stays.

    Where the version in service is the farm's own (a retrain: it has a parent in the store) or a rollback pinned it,
    the release is installed but not put in service: :data:`PENDING_RELEASE` names it, and the trainer puts it (or
    its first retrain on the farm's labels) in service once the farm's field check finds it no worse. A device with
    no trainer on its state directory keeps serving its own version, and ``edge-agent status`` says what waits."""
    try:
        release = EngineStore(shipped).current()
    except Exception:  # noqa: BLE001 - a package without a shipped store: nothing to adopt
        return None
    if (store.root / release).exists():
        return None
    current = store.current()
    parent = store.parent_of(current)
    farm_taught = (parent is not None and (parent in store.versions() or parent in store.pruned())) or store.pin() is not None
    install_shipped(store, shipped, release, make_current=not farm_taught)
    if farm_taught:
        from engines.durable import atomic_write

        atomic_write(store.root / PENDING_RELEASE, f"{release}\n".encode())
    return release


def pending_release(store: EngineStore) -> str | None:
    """The release an upgrade installed that waits for the field check (:data:`PENDING_RELEASE`), or None."""
    try:
        name = (store.root / PENDING_RELEASE).read_text().strip()
    except OSError:
        return None
    return name if name in store.versions() else None


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
            atomic_write(mine / SIGNATURE, (theirs / SIGNATURE).read_bytes())
            adopted.append(version)
            if log is not None:
                log.info("shipped_signature_adopted", engine_version=version)
    return adopted
