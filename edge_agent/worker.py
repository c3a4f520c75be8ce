"""Background threads: :func:`spawn` (named for the OS too) and :class:`Worker` with start / stop / alive,
shared by the pipeline stages, the sources, the hand-off and the hot-swap watcher."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Worker", "name_threads", "spawn"]


def name_threads(threads: list[threading.Thread], name: str) -> None:
    """Name threads of this process in the kernel too (``top -H``, ``ps -L``); Linux only, a no-op elsewhere.
    Works for threads a library started (watchdog's) as well as for the calling thread."""
    for t in threads:
        try:
            with open(f"/proc/self/task/{t.native_id}/comm", "w") as f:
                f.write(name[:15])
        except (OSError, TypeError):
            pass


def spawn(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread running ``target``, named ``name`` in Python and in the kernel (before this returns)."""
    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()  # returns once the thread runs, so its native id is known
    name_threads([t], name)
    return t


class Worker:
    """Subclasses implement :meth:`_run`, returning once ``self._stop`` is set."""

    thread_name = "worker"
    join_timeout_s = 5.0
    #: Work that can wait (a backup, a read of a whole database): the thread runs at the lowest CPU and IO priority
    #: (:func:`edge_agent.background.yield_to_photos`), the photos first.
    background = False

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = spawn(self._yielding if self.background else self._run, self.thread_name)

    def _yielding(self) -> None:
        from edge_agent.background import yield_to_photos
        from edge_agent.log import get_logger

        if (kept := yield_to_photos()) is not None:
            get_logger("worker").info("priority_kept", thread=self.thread_name, kept=kept)
        self._run()

    def _run(self) -> None:
        raise NotImplementedError

    def _on_stop(self) -> None:
        """Wake the thread up if it may be waiting on something other than ``self._stop``."""

    def stop(self) -> None:
        self._stop.set()
        self._on_stop()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout_s)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
