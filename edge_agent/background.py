"""Work that can wait yields to the photos: its thread, or the whole trainer, at the lowest CPU and disk priority.

A reading of the whole ledger, a backup and its read-back can each take minutes on an SD card; at the daemon's own
priority they would take the card from the photos being classified and stored. :func:`yield_to_photos` lowers the
calling thread to niceness 19 and the idle IO class (``ioprio_set``, Linux only, as ``ionice -c 3``; a
:class:`~edge_agent.worker.Worker` with ``background`` set runs so); :func:`idle_io` lowers the IO of a thread and of
every thread it starts after (the trainer, at its start, with its ``nice``). The idle class is never starved for good:
mq-deadline (the Pi's and most SD cards' scheduler) serves a waiting request after ``prio_aging_expire`` (10 s), BFQ
after 200 ms, so a backup that holds a read snapshot of the ledger still ends while photos keep coming. Where the kernel has no such
call (not Linux, an architecture not listed here, a container that forbids it) the thread keeps its IO priority
and :func:`yield_to_photos` says so; nothing fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
import threading
from collections.abc import Iterator

__all__ = ["IOPRIO_CLASS_IDLE", "idle_io", "io_priority", "yielding_to_photos", "yield_to_photos"]

#: The idle IO class: served when the disk has nothing else to do (or a request has waited past the aging time).
IOPRIO_CLASS_IDLE = 3
_CLASS_SHIFT = 13
_WHO_PROCESS = 1  # with a thread's id: that thread (a process's IO priority is per thread on Linux)
#: ``ioprio_set`` / ``ioprio_get`` by machine (x86-64 laptops, the Pi and the Jetson, 32-bit Raspberry Pi OS).
_SYSCALLS = {"x86_64": (251, 252), "aarch64": (30, 31), "arm64": (30, 31), "armv7l": (314, 315), "armv6l": (314, 315), "riscv64": (30, 31)}


def _syscalls() -> tuple[int, int] | None:
    if not sys.platform.startswith("linux"):
        return None
    return _SYSCALLS.get(platform.machine())


def _call(number: int, *args: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(number, *args)
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def io_priority(tid: int | None = None) -> tuple[int, int] | None:
    """A thread's IO priority as (class, level) (this thread by default); None where it cannot be read here."""
    numbers = _syscalls()
    if numbers is None:
        return None
    try:
        value = _call(numbers[1], _WHO_PROCESS, tid or threading.get_native_id())
    except OSError:
        return None
    return value >> _CLASS_SHIFT, value & ((1 << _CLASS_SHIFT) - 1)


def idle_io() -> str | None:
    """Put the calling thread (and the threads it starts after) in the idle IO class; None where done, else why not."""
    numbers = _syscalls()
    if numbers is None:
        return f"IO priority kept (no ioprio_set on {sys.platform} {platform.machine()})"
    try:
        _call(numbers[0], _WHO_PROCESS, threading.get_native_id(), IOPRIO_CLASS_IDLE << _CLASS_SHIFT)
    except OSError as exc:
        return f"IO priority kept ({exc})"
    return None


def yield_to_photos() -> str | None:
    """Lower the calling thread to niceness 19 and the idle IO class; None where both were done, else what was not."""
    left = []
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError) as exc:
        left.append(f"CPU priority kept ({exc})")
    if (io := idle_io()) is not None:
        left.append(io)
    return "; ".join(left) or None


@contextlib.contextmanager
def yielding_to_photos() -> Iterator[str | None]:
    """The calling thread at the lowest priority for the block (:func:`yield_to_photos`, what it says given), its own
    again after it where the system lets it raise it back (a command run by hand ends with the block anyway)."""
    tid, numbers = threading.get_native_id(), _syscalls()
    nice, io = os.getpriority(os.PRIO_PROCESS, tid), io_priority(tid)
    try:
        yield yield_to_photos()
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        if io is not None:
            with contextlib.suppress(OSError):
                _call(numbers[0], _WHO_PROCESS, tid, io[0] << _CLASS_SHIFT | io[1])
