"""One registry for every kind of plugin: engine backends (:mod:`engines.backends`) and training strategies
(:mod:`trainer.strategies`) alike.

A plugin is a class with a ``type`` name, in a public module of its package, added with ``@REGISTRY.register``.
Adding one touches no other file: the registry imports the package's modules the first time it is asked, and the
configuration, the command lines and the docs take their lists of names from it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, TypeVar

from engines.errors import EdgeAgentError

__all__ = ["Registry", "UnknownPlugin", "import_plugins"]

P = TypeVar("P", bound=type)


class UnknownPlugin(EdgeAgentError, ValueError):
    """No plugin of that kind has that ``type``; the message lists the ones there are."""


def import_plugins(package: str, skip: tuple[str, ...] = ()) -> None:
    """Import every public submodule of ``package`` (each registers its plugin on import)."""
    module = importlib.import_module(package)
    for info in pkgutil.iter_modules(module.__path__):
        if not info.name.startswith("_") and info.name not in skip:
            importlib.import_module(f"{package}.{info.name}")


class Registry(Generic[P]):
    """Plugins of one kind by their ``type``, found by importing the public modules of ``package``."""

    def __init__(self, kind: str, package: str, skip: tuple[str, ...] = (), error: type[Exception] = UnknownPlugin) -> None:
        self.kind = kind  # as an error message names it: "engine type", "strategy"
        self.package = package
        self.skip = skip
        self.error = error
        self._found: dict[str, P] = {}
        self._discovered = False

    def register(self, cls: P) -> P:
        """Class decorator: add ``cls`` under ``cls.type``."""
        if self._found.get(cls.type, cls) is not cls:
            raise self.error(f"two plugins claim {self.kind} {cls.type!r}")
        self._found[cls.type] = cls
        return cls

    def all(self) -> dict[str, P]:
        """Every plugin by ``type`` (importing the plugin modules, not the runtimes they load when used)."""
        if not self._discovered:
            import_plugins(self.package, self.skip)
            self._discovered = True
        return dict(self._found)

    def names(self) -> list[str]:
        return sorted(self.all())

    def get(self, type_: str) -> P:
        found = self.all()
        if type_ not in found:
            raise self.error(f"unknown {self.kind} {type_!r} (known: {', '.join(sorted(found))})")
        return found[type_]
