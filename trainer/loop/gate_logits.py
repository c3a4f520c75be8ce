"""A store version's logits on the gate photos, kept beside the trainer's samples, so each retrain's gate runs only
its candidate.

A published version never changes (its weights file is signed and checked), and the gate photos rarely do (the
shipped ones, or a fixed share of ``labelled_data``): yet every retrain ran the version in service, and the lineage's
first version, over all of them again (the 672 shipped gate photos: about 30 s a version on a 2-core CPU). The
logits are keyed by the version, its weights file's sha256 and a digest of the photos' stored values, so other photos,
other weights or another version are a miss and are computed. A retrain writes its published candidate's (calibrated)
logits, which it has already; a file that cannot be read is computed again, and the folder keeps only the files the
last retrain used.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import torch

from edge_agent.log import get_logger
from engines.durable import atomic_write
from engines.store import StoreVersion
from trainer.models import logits_on
from trainer.photos import INFERENCE_BATCH
from trainer.publish import WEIGHTS_FILE

__all__ = ["GateLogits", "photos_digest"]

#: The folder under the trainer's state directory.
FOLDER = "gate-logits"


def photos_digest(x: torch.Tensor) -> str:
    """A digest of the stored values of the photos ``x`` (their order, precision and shape included)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{x.dtype}:{tuple(x.shape)}".encode())
    for i in range(0, len(x), INFERENCE_BATCH * 8):
        h.update(x[i : i + INFERENCE_BATCH * 8].contiguous().numpy().tobytes())
    return h.hexdigest()


class GateLogits:
    """Logits of store versions on one set of gate photos (``digest``: :func:`photos_digest`), in ``state_dir``."""

    def __init__(self, state_dir: str | Path, digest: str) -> None:
        self.folder = Path(state_dir) / FOLDER
        self.digest = digest
        self.used: set[Path] = set()

    def _path(self, version: StoreVersion) -> Path:
        sha = version.manifest["files"][WEIGHTS_FILE]["sha256"][:16]
        return self.folder / f"{version.name}-{sha}-{self.digest}.npy"

    def of(self, version: StoreVersion, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``version``'s logits on ``x`` (float32 [N, classes]): read where kept, else ``model`` (its weights) is run
        and they are kept."""
        path = self._path(version)
        self.used.add(path)
        try:
            z = np.load(path, allow_pickle=False)
            if z.shape == (len(x), model.num_classes) and z.dtype == np.float32:
                return torch.from_numpy(z)
            get_logger("trainer").warning("gate_logits_unusable", file=str(path), shape=list(z.shape), dtype=str(z.dtype))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, EOFError) as exc:  # a torn or foreign file: computed again and replaced
            get_logger("trainer").warning("gate_logits_unusable", file=str(path), error=str(exc))
        z = logits_on(model, x)
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
