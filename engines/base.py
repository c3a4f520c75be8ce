"""The one small interface every engine backend implements, and the backend registry.

A backend is one module in :mod:`engines.backends` defining a :class:`BackendConfig`
subclass with a unique ``type`` literal and an :class:`Engine` subclass decorated
with :func:`register`. Adding a backend touches no other file: the registry
(:mod:`engines.plugins`, shared with the training strategies) finds it and the
configuration's ``[engine]`` union accepts its ``type``.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ClassVar

from engines.errors import EdgeAgentError
from engines.plugins import Registry
from engines.settings import Section
from engines.store import StoreVersion

if TYPE_CHECKING:  # numpy is imported where a batch is handled, so reading the config stays light
    import numpy as np

__all__ = [
    "CheckPhotos",
    "BackendConfig",
    "Engine",
    "EngineError",
    "BackendUnavailable",
    "BACKENDS",
    "register",
    "backends",
    "get_backend",
    "check_batch",
    "check_distance_io",
    "check_io",
    "distance_output",
    "expected_input",
    "malloc_trim",
]


def malloc_trim() -> None:
    """Return free heap memory to the OS (glibc only; elsewhere nothing happens)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class EngineError(EdgeAgentError, RuntimeError):
    """An engine could not be built, loaded or run as configured."""


class BackendUnavailable(EngineError):
    """The backend's runtime or hardware is not present on this machine."""


class BackendConfig(Section):
    """Base of every backend's configuration; unknown keys are errors."""

    type: str


#: Given a store version, batches of photos (float32 [N,C,H,W], decoded with the version's own preprocessing) on which
#: a backend may check, on this machine, that a faster precision gives the reference precision's answers.
CheckPhotos = Callable[[StoreVersion], Iterable["np.ndarray"]]


class Engine(ABC):
    """A loaded model that maps a float32 [N,3,H,W] batch to float32 [N,classes] logits (and, for a version whose
    verdict is on the features, to its squared distances to each class as well: :meth:`infer_with_distance`)."""

    #: The ``type`` value that selects this backend in the configuration.
    type: ClassVar[str]
    #: The backend's configuration model.
    Config: ClassVar[type[BackendConfig]]

    def __init__(self, version: StoreVersion, config: BackendConfig, check_photos: CheckPhotos | None = None) -> None:
        self.version = version
        self.config = config
        self.check_photos = check_photos

    @classmethod
    def load_runtime(cls) -> None:
        """Import the library the backend runs on (:func:`engines.loader.open_engine` does it while the files hash)."""
        return None  # a backend whose library is already imported

    @property
    def engine_version(self) -> str:
        return self.version.name

    @property
    def classes(self) -> list[str]:
        return self.version.classes

    @property
    @abstractmethod
    def provider(self) -> str:
        """The execution provider really running the model (e.g. ``CPUExecutionProvider``)."""

    @property
    @abstractmethod
    def precision(self) -> str:
        """``fp32``, ``fp16`` or ``int8``: the arithmetic really used."""

    @abstractmethod
    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Logits for ``batch`` (float32, [N,3,H,W])."""

    def infer_with_distance(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Logits and the model's distance output [N,classes] where its manifest's verdict names one (else None)."""
        return self.infer(batch), None

    def wait_checked(self, timeout: float | None = None) -> bool:
        """Block until the precision served is the final one (a backend may check a faster one in the background
        first); False where ``timeout`` seconds passed before."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook: a backend with nothing to release keeps it
        """Release runtime resources (sessions, device buffers)."""

    def trim(self) -> None:
        """Give cached memory back to the OS; the daemon calls this when it goes idle."""
        malloc_trim()

    def describe(self) -> dict:
        return {
            "type": self.type,
            "engine_version": self.engine_version,
            "provider": self.provider,
            "precision": self.precision,
            "signed_by": self.version.signed_by,
        }

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: Every backend, by the ``type`` that selects it in ``[engine]``.
BACKENDS: Registry[type[Engine]] = Registry("engine type", "engines.backends", error=EngineError)
register = BACKENDS.register
backends = BACKENDS.all
get_backend = BACKENDS.get


def expected_input(version: StoreVersion) -> tuple[int, int]:
    """(channels, size) the version's manifest declares."""
    shape = version.manifest["input"]["shape"]
    return int(shape[1]), int(shape[2])


def distance_output(version: StoreVersion) -> str | None:
    """The model output holding the verdict's distances, where the manifest's verdict is on the features."""
    verdict = version.manifest.get("verdict")
    if isinstance(verdict, dict) and verdict.get("on") == "features":
        name = verdict.get("output")
        if not isinstance(name, str) or not name:
            raise EngineError(f"{version.name}: manifest 'verdict' is on the features but names no 'output' (republish it)")
        return name
    return None


def check_batch(batch: np.ndarray, version: StoreVersion) -> np.ndarray:
    """Validate a batch against the manifest's input spec; returns it as contiguous float32."""
    import numpy as np

    channels, size = expected_input(version)
    if batch.ndim != 4 or batch.shape[1:] != (channels, size, size) or batch.shape[0] < 1:
        raise EngineError(f"batch shape {tuple(batch.shape)} does not match input [N,{channels},{size},{size}]")
    return np.ascontiguousarray(batch, dtype=np.float32)


def check_io(version: StoreVersion, input_name: str, input_shape, output_shape) -> None:
    """Refuse a model whose input or output does not match its manifest."""
    spec = version.manifest["input"]
    channels, size = expected_input(version)
    if input_name != spec["name"] or list(input_shape[1:]) != [channels, size, size]:
        raise EngineError(f"{version.name}: model input {input_name}{input_shape} does not match manifest {spec}")
    if output_shape[-1] != len(version.classes):
        raise EngineError(f"{version.name}: model has {output_shape[-1]} outputs but the manifest lists {len(version.classes)} classes")


def check_distance_io(version: StoreVersion, outputs: dict[str, tuple]) -> str | None:
    """The distance output's name where the manifest's verdict needs one, checked against the model's ``outputs``
    (name -> shape); :class:`EngineError` where the model lacks it or it is not one number a class."""
    name = distance_output(version)
    if name is None:
        return None
    if name not in outputs:
        raise EngineError(
            f"{version.name}: the manifest's verdict reads the model output {name!r}, which the model lacks "
            f"(outputs: {', '.join(outputs)}); republish the version with edge-trainer"
        )
    if outputs[name][-1] != len(version.classes):
        raise EngineError(f"{version.name}: output {name!r} has {outputs[name][-1]} columns for {len(version.classes)} classes")
    return name
