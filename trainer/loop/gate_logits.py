"""A store version's logits on the gate photos, kept beside the trainer's samples, so each retrain's gate runs only
its candidate.

A published version never changes (its weights file is signed and checked), and the gate photos rarely do (the
shipped ones, or a fixed share of ``labelled_data``): yet every retrain ran the version in service, and the lineage's
first version, over all of them again (the 672 shipped gate photos: about 30 s a version on a 2-core CPU). The
logits are keyed by the version, its weights file's sha256 and a digest of the photos' stored values, so other photos,
other weights or another version are a miss and are computed. A retrain writes its published candidate's (calibrated)
logits, which it has already; a file that cannot be read is computed again, and the folder keeps only the files the
last retrain used. The shipped version's logits on the shipped gate photos come with the package
(``edge_agent/default_data/gate-logits/``, written by ``python -m trainer.shipped_data``), so a new device's first
retrain does not run the version in service either; read only where the name (version, weights, photos as decoded
here) matches, and checked like a kept file. Logits computed on another CPU may differ from this one's in the last
bits; the gate's top-1 and log-loss do not see that.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import torch

from edge_agent.config import default_data_path
from edge_agent.log import get_logger
from engines.durable import atomic_write
from engines.store import StoreVersion
from trainer.models import logits_on
from trainer.photos import INFERENCE_BATCH
from trainer.publish import WEIGHTS_FILE

__all__ = ["GateLogits", "file_name", "photos_digest", "shipped_folder"]

#: The folder under the trainer's state directory, and beside the shipped photos (``edge_agent/default_data``).
FOLDER = "gate-logits"


def shipped_folder() -> Path:
    """Where the package keeps the shipped version's logits on the shipped gate photos."""
    return default_data_path() / FOLDER


def photos_digest(x: torch.Tensor) -> str:
    """A digest of the stored values of the photos ``x`` (their order, precision and shape included)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{x.dtype}:{tuple(x.shape)}".encode())
    for i in range(0, len(x), INFERENCE_BATCH * 8):
        h.update(x[i : i + INFERENCE_BATCH * 8].contiguous().numpy().tobytes())
    return h.hexdigest()


def file_name(version: StoreVersion, digest: str) -> str:
    """The file holding ``version``'s logits on the photos whose :func:`photos_digest` is ``digest``."""
    return f"{version.name}-{version.manifest['files'][WEIGHTS_FILE]['sha256'][:16]}-{digest}.npy"


def _read(path: Path, shape: tuple[int, int]) -> torch.Tensor | None:
    """The logits in ``path`` where it holds float32 of ``shape``; None where it is absent, torn or other (said)."""
    try:
        z = np.load(path, allow_pickle=False)
        if z.shape == shape and z.dtype == np.float32:
            return torch.from_numpy(z)
        get_logger("trainer").warning("gate_logits_unusable", file=str(path), shape=list(z.shape), dtype=str(z.dtype))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError) as exc:  # a torn or foreign file: computed again and replaced
        get_logger("trainer").warning("gate_logits_unusable", file=str(path), error=str(exc))
    return None


class GateLogits:
    """Logits of store versions on one set of gate photos (``digest``: :func:`photos_digest`), in ``state_dir``;
    ``shipped``: a read-only folder looked in before a version is run (:func:`shipped_folder` by default)."""

    def __init__(self, state_dir: str | Path, digest: str, shipped: Path | None = None) -> None:
        self.folder = Path(state_dir) / FOLDER
        self.digest = digest
        self.shipped = shipped_folder() if shipped is None else shipped
        self.used: set[Path] = set()

    def _path(self, version: StoreVersion) -> Path:
        return self.folder / file_name(version, self.digest)

    def of(self, version: StoreVersion, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``version``'s logits on ``x`` (float32 [N, classes]): read where kept or shipped, else ``model`` (its
        weights) is run; kept either way."""
        path = self._path(version)
        self.used.add(path)
        shape = (len(x), model.num_classes)
        z = _read(path, shape)
        if z is not None:
            return z
        z = _read(self.shipped / path.name, shape)
        if z is None:
            z = logits_on(model, x)
        else:
            get_logger("trainer").info("gate_logits_shipped", engine_version=version.name, photos=len(x))
        self.keep(version, z)
        return z

    def keep(self, version: StoreVersion, logits: torch.Tensor) -> None:
        """Keep ``version``'s logits on the gate photos (a full disk only costs the next retrain the pass)."""
        path = self._path(version)
        self.used.add(path)
        buf = io.BytesIO()
        np.save(buf, logits.detach().float().numpy(), allow_pickle=False)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write(path, buf.getvalue(), durable=False)
        except OSError as exc:
            get_logger("trainer").warning("gate_logits_not_kept", file=str(path), error=str(exc))

    def prune(self) -> None:
        """Remove the kept logits this retrain did not use (other versions, other gate photos)."""
        for path in self.folder.glob("*.npy") if self.folder.is_dir() else ():
            if path not in self.used:
                path.unlink(missing_ok=True)
