"""Hands the memory a large page freed back to the system, so the web process stays small on a 4 GB board.

Python frees a page's objects when it is sent, but glibc's allocator keeps the freed memory for reuse and the
process's resident size stays at its peak; ``malloc_trim`` returns what is free. Called after the Map page and after
a thumbnail is made (``python -m benchmarks.web``: after every page, the Map's 2,000 photos among them, and 48
thumbnails, 61.2 MB without it, 58.8 MB with it; a call costs about 3 ms where there is memory to return, microseconds
where there is none). Elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["trim_heap"]

_libc = None


def trim_heap() -> bool:
    """Return freed heap memory to the system where the C library can (glibc); whether it could."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim  # noqa: B018 (glibc only)
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)
    return True
