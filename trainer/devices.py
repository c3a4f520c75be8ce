"""The farm's CURVE certificates: the trainer's, made once, and one per device, each added or revoked on its own.

A keys folder holds ``trainer/`` (the trainer's pair), ``authorized/`` (the public key of every device the trainer
accepts: the trainer reads it again on each handshake, so adding or revoking a device needs no restart),
``devices/<name>/`` (what to copy to that device: its pair and the trainer's public key) and ``revoked/`` (the
public keys of revoked devices, for the record). Secret files are 0600 and their folders 0700.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from edge_agent.names import device_name_problem
from engines.durable import sync_filesystem
from engines.errors import EdgeAgentError

__all__ = ["KeysError", "DeviceKeys", "make_trainer_keys", "add_device", "revoke_device", "list_devices", "trainer_keys"]


class KeysError(EdgeAgentError, ValueError):
    """A keys folder that cannot be used as asked (certificates that would be overwritten, a device unknown)."""


@dataclass(frozen=True)
class DeviceKeys:
    """One device's certificate files, as made in the keys folder."""

    name: str
    folder: Path  # devices/<name>/: copy it to the device
    secret: Path
    server_public: Path


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A CURVE pair ``<name>.key`` / ``<name>.key_secret`` in ``folder`` (the secret 0600)."""
    import zmq.auth

    public, secret = zmq.auth.create_certificates(folder, name)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    return Path(public), Path(secret)


def trainer_keys(out: Path) -> tuple[Path, Path]:
    """(public, secret) of the trainer's certificate in ``out``."""
    return out / "trainer" / "trainer.key", out / "trainer" / "trainer.key_secret"


def make_trainer_keys(out: Path, force: bool = False) -> tuple[Path, Path, bool]:
    """The trainer's certificate in ``out/trainer`` and an empty ``authorized/``: made once; (public, secret, made
    now). With ``force`` a new pair replaces the old one: every device must then get the new ``trainer.key``."""
    public, secret = trainer_keys(out)
    if secret.is_file() and not force:
        return public, secret, False
    _private_dir(out)
    _private_dir(out / "trainer")
    _private_dir(out / "authorized")
    public, secret = _certificate(out / "trainer", "trainer")
    for dev in list_devices(out):  # the devices' copies of the trainer's public key follow
        if (out / "devices" / dev).is_dir():
            shutil.copy(public, out / "devices" / dev / "trainer.key")
    _on_disk(out)
    return public, secret, True


def _on_disk(out: Path) -> None:
    """Everything just written or moved in the keys folder, on the disk before the command says it is done: a power cut
    after a revocation put the device's key back in ``authorized/`` (the rename was not yet on the card)."""
    sync_filesystem(out)


def _check_name(name: str) -> None:
    if (problem := device_name_problem(name)) is not None:
        raise KeysError(problem)


def add_device(out: Path, name: str, force: bool = False, signing_pub: Path | None = None) -> DeviceKeys:
    """Make ``name``'s certificate in ``out/devices/<name>/`` (with the trainer's public key beside it, and the
    trainer's engine-signing public key ``signing_pub`` as ``signing.pub``, for ``[store] trusted_keys``) and
    authorize it."""
    _check_name(name)
    public_trainer, secret_trainer = trainer_keys(out)
    if not secret_trainer.is_file():
        raise KeysError(f"{out}: no trainer certificate (trainer/trainer.key_secret); make it first: edge-trainer keys --out {out}")
    folder = out / "devices" / name
    if (folder / f"{name}.key_secret").is_file() and not force:
        raise KeysError(f"{folder}: device {name!r} has a certificate already; --force makes a new one (the old one stops working)")
    _private_dir(out / "devices")
    _private_dir(folder)
    public, secret = _certificate(folder, name)
    shutil.copy(public_trainer, folder / "trainer.key")
    if signing_pub is not None and signing_pub.is_file():
        shutil.copy(signing_pub, folder / "signing.pub")
    _private_dir(out / "authorized")
    tmp = out / "authorized" / f".{name}.key.tmp"
    shutil.copy(public, tmp)
    os.replace(tmp, out / "authorized" / f"{name}.key")  # the trainer sees a whole key or none
    (out / "revoked" / f"{name}.key").unlink(missing_ok=True)
    _on_disk(out)
    return DeviceKeys(name, folder, secret, folder / "trainer.key")


def revoke_device(out: Path, name: str) -> Path:
    """Stop accepting ``name``: its public key leaves ``authorized/`` (kept in ``revoked/``); returns where it went.
    A running trainer sees the folder change at the device's next message: it refuses that message and every later one,
    and drops the device's connections (:class:`edge_agent.handoff.transport.Authenticator`)."""
    _check_name(name)
    key = out / "authorized" / f"{name}.key"
    if not key.is_file():
        known = ", ".join(list_devices(out)) or "none"
        raise KeysError(f"{key}: no authorized device {name!r} in {out} (authorized: {known})")
    _private_dir(out / "revoked")
    os.replace(key, out / "revoked" / f"{name}.key")
    secret = out / "devices" / name / f"{name}.key_secret"
    secret.unlink(missing_ok=True)  # a revoked certificate is never handed out again
    _on_disk(out)
    return out / "revoked" / f"{name}.key"


def list_devices(out: Path) -> list[str]:
    """The devices the trainer accepts (their keys in ``authorized/``), sorted."""
    folder = out / "authorized"
    return sorted(p.name[: -len(".key")] for p in folder.glob("*.key")) if folder.is_dir() else []
