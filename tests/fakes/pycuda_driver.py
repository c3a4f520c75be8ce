"""Fake ``pycuda.driver`` (pycuda 2022.2+, https://documen.tician.de/pycuda/driver.html).

Reproduces what a real driver enforces and a hand-waved mock would not:
- ``init()`` must come first; ``Device(n)`` checks ``n`` against ``Device.count()``.
- Context stacks are per thread: ``mem_alloc``, ``pagelocked_empty``, ``Stream()``, the
  copies and a TensorRT launch raise ``LogicError(... invalid device context)`` in a
  thread whose stack is empty, as CUDA does for a context made current elsewhere.
- ``Context.pop()`` is a static method; ``detach()`` releases a retained primary context.
- ``memcpy_htod_async(dest, src, stream)`` / ``memcpy_dtoh_async(dest, src, stream)``:
  device pointer vs host array in the documented order (a swap is a ``TypeError``, as
  Boost.Python's ArgumentError is); work queued on a stream runs only at
  ``Stream.synchronize()``, so a missing synchronise leaves the host buffer stale.
"""

from __future__ import annotations

import importlib.util
import itertools
import threading
from pathlib import Path

import numpy as np


class Error(Exception):
    """pycuda.driver.Error."""


class LogicError(Error):
    """pycuda.driver.LogicError."""


_initialised = False
_local = threading.local()
_addresses = itertools.count(0x7F0000000000, 0x100000)
_memory: dict[int, bytearray] = {}
_streams: dict[int, "Stream"] = {}
DEVICES = ["Orin (nvgpu)"]
events: list[str] = []  # what happened, for tests to read


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def current_context() -> "Context | None":
    """The context current in the calling thread (``Context.get_current()``)."""
    stack = _stack()
    return stack[-1] if stack else None


def require_context(call: str) -> None:
    if current_context() is None:
        raise LogicError(f"{call} failed: invalid device context")


def init(flags: int = 0) -> None:
    global _initialised
    _initialised = True


class Device:
    def __init__(self, number: int) -> None:
        if not _initialised:
            raise LogicError("cuDeviceGet failed: initialization error")
        if not 0 <= number < len(DEVICES):
            raise LogicError("cuDeviceGet failed: invalid device ordinal")
        self.number = number
        self._primary: Context | None = None

    @staticmethod
    def count() -> int:
        if not _initialised:
            raise LogicError("cuDeviceGetCount failed: initialization error")
        return len(DEVICES)

    def name(self) -> str:
        return DEVICES[self.number]

    def retain_primary_context(self) -> "Context":
        events.append("retain_primary_context")
        return Context(self)


class Context:
    def __init__(self, device: Device) -> None:
        self.device = device
        self.detached = False

    def push(self) -> None:
        if self.detached:
            raise LogicError("cuCtxPushCurrent failed: invalid device context")
        _stack().append(self)

    @staticmethod
    def pop() -> None:
        if not _stack():
            raise LogicError("cuCtxPopCurrent failed: invalid device context")
        _stack().pop()

    @staticmethod
    def get_current() -> "Context | None":
        return current_context()

    def detach(self) -> None:
        if self.detached:
            raise LogicError("cuDevicePrimaryCtxRelease failed: invalid device context")
        self.detached = True
        events.append("detach")


class DeviceAllocation:
    def __init__(self, nbytes: int) -> None:
        self.address = next(_addresses)
        _memory[self.address] = bytearray(nbytes)

    def __int__(self) -> int:
        return self.address

    __index__ = __int__

    def free(self) -> None:
        if self.address not in _memory:
            raise LogicError("cuMemFree failed: invalid argument")
        del _memory[self.address]
        events.append("free")


def memory_at(address: int) -> bytearray:
    """The bytes of the allocation starting at ``address`` (an unknown or freed address is an illegal access)."""
    try:
        return _memory[int(address)]
    except KeyError:
        raise LogicError("an illegal memory access was encountered") from None


def mem_alloc(nbytes: int) -> DeviceAllocation:
    require_context("cuMemAlloc")
    if not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
        raise TypeError(f"mem_alloc(bytes): expected a positive int, got {nbytes!r}")
    return DeviceAllocation(int(nbytes))


def pagelocked_empty(shape, dtype, order: str = "C", mem_flags: int = 0) -> np.ndarray:
    require_context("cuMemHostAlloc")
    return np.empty(shape, dtype, order)


class Stream:
    def __init__(self, flags: int = 0) -> None:
        require_context("cuStreamCreate")
        self.handle = next(_addresses)
        self._queue: list = []
        _streams[self.handle] = self

    def enqueue(self, op) -> None:
        self._queue.append(op)

    def synchronize(self) -> None:
        require_context("cuStreamSynchronize")
        queue, self._queue = self._queue, []
        for op in queue:
            op()

    def is_done(self) -> bool:
        return not self._queue


def stream_for(handle: int) -> Stream:
    if not isinstance(handle, int):
        raise TypeError(f"stream handle must be an int, got {type(handle).__name__}")
    try:
        return _streams[handle]
    except KeyError:
        raise LogicError("invalid resource handle") from None


def _device_ptr(value, what: str) -> int:
    if isinstance(value, np.ndarray) or not isinstance(value, (DeviceAllocation, int)):
        raise TypeError(f"Python argument types did not match C++ signature: {what} must be a device pointer, got {type(value).__name__}")
    return int(value)


def _host(value, what: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"Python argument types did not match C++ signature: {what} must be a host buffer, got {type(value).__name__}")
    if not value.flags.c_contiguous:
        raise TypeError(f"{what}: host buffer is not contiguous")
    return value


def _submit(stream: Stream | None, op) -> None:
    if stream is None:
        op()
    else:
        if not isinstance(stream, Stream):
            raise TypeError("stream must be a pycuda.driver.Stream")
        stream.enqueue(op)


def memcpy_htod_async(dest, src, stream: Stream | None = None) -> None:
    require_context("cuMemcpyHtoDAsync")
    address, host = _device_ptr(dest, "dest"), _host(src, "src")

    def op() -> None:
        mem = memory_at(address)
        if host.nbytes > len(mem):
            raise LogicError("cuMemcpyHtoDAsync failed: invalid argument")
        mem[: host.nbytes] = host.tobytes()

    _submit(stream, op)


def memcpy_dtoh_async(dest, src, stream: Stream | None = None) -> None:
    require_context("cuMemcpyDtoHAsync")
    host, address = _host(dest, "dest"), _device_ptr(src, "src")
    if not host.flags.writeable:
        raise TypeError("dest: host buffer is read-only")

    def op() -> None:
        mem = memory_at(address)
        if host.nbytes > len(mem):
            raise LogicError("cuMemcpyDtoHAsync failed: invalid argument")
        host.reshape(-1).view(np.uint8)[:] = np.frombuffer(bytes(mem[: host.nbytes]), np.uint8)

    _submit(stream, op)


def memcpy_htod(dest, src) -> None:
    memcpy_htod_async(dest, src, None)


def memcpy_dtoh(dest, src) -> None:
    memcpy_dtoh_async(dest, src, None)


def make_module():
    """A fresh copy of this module (its own devices, memory and streams) for one test."""
    spec = importlib.util.spec_from_file_location("pycuda.driver", Path(__file__))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
