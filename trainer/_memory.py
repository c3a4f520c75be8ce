"""A retrain's memory by phase: the process's peak resident size reached while each phase ran.

The kernel keeps one peak per process (``VmHWM`` on Linux, ``ru_maxrss`` elsewhere), never lowered; read at each
phase's start, the rise since the previous reading is what that phase added to the peak. A retrain runs in its own
child process (:mod:`trainer._child`), so the peak is the retrain's own. Linux and macOS report the peak; where the platform
does not, the record is empty rather than wrong.
"""

from __future__ import annotations

import sys

__all__ = ["PhaseMemory", "peak_rss_mb"]


def peak_rss_mb() -> float | None:
    """This process's peak resident size so far in MiB, or None where the platform does not report it.

    Linux: ``VmHWM`` of ``/proc/self/status``, the peak since the program started (``ru_maxrss`` survives ``exec``:
    a child started from a large process would report the parent's size as its own)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


class PhaseMemory:
    """Records, for each named phase, the peak resident size the process had reached when the phase ended."""

    def __init__(self) -> None:
        self._phase: str | None = None
        self.peaks: dict[str, float] = {}

    def enter(self, phase: str) -> None:
        """The retrain starts ``phase`` (a repeated name, an epoch's progress, continues the same phase)."""
        if phase == self._phase:
            return
        self._close()
        self._phase = phase

    def summary(self) -> dict:
        """``{"peak_mb": P, "by_phase": {phase: peak reached by its end}}``, the phase that raised the peak first."""
        self._close()
        self._phase = None
        peak = peak_rss_mb()
        return {"peak_mb": None if peak is None else round(peak), "by_phase": {k: round(v) for k, v in self.peaks.items()}}

    def _close(self) -> None:
        peak = peak_rss_mb()
        if self._phase is not None and peak is not None:
            self.peaks[self._phase] = max(peak, self.peaks.get(self._phase, 0.0))
