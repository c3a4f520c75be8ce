"""Stopping a retrain part-way: SIGTERM during a retrain abandons the candidate, never a sample."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from engines.errors import EdgeAgentError

__all__ = ["Stopped", "check", "checked_inside"]


class Stopped(EdgeAgentError):
    """Training was asked to stop (SIGTERM, SIGINT); the candidate is abandoned and nothing is marked as used."""


def check(should_stop, where: str) -> None:
    """Raise :class:`Stopped` if ``should_stop()`` says so."""
    if should_stop():
        raise Stopped(f"stopped {where}")


@contextlib.contextmanager
def checked_inside(networks: Iterable, should_stop, where: str) -> Iterator[None]:
    """While in the block, :func:`check` before each layer of ``networks`` (torch modules) runs, not only between the
    calls that use them: on a CPU shared with other work one forward pass of a few photos took over 4 s here."""
    handles, seen = [], set()
    for network in networks:
        for layer in network.modules():
            if id(layer) not in seen and next(layer.children(), None) is None:
                seen.add(id(layer))
                handles.append(layer.register_forward_pre_hook(lambda *_: check(should_stop, where)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
