"""A background thread with start / stop / alive, shared by the sources, the hand-off and the hot-swap watcher."""

from __future__ import annotations

import threading

__all__ = ["Worker"]


class Worker:
    """Subclasses implement :meth:`_run`, returning once ``self._stop`` is set."""

    thread_name = "worker"
    join_timeout_s = 5.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

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
