"""Fakes of the Jetson-only libraries, reproducing their documented API surface exactly.

Each fake implements only what edge-agent calls, with the documented names, argument
order, dtypes and return shapes, and fails the way the real library does on a misuse:
``tensorrt`` (10.x by default, 8.6 on request), ``pycuda.driver`` (per-thread context
stacks, deferred stream work), ONNX Runtime's GPU provider options, and ``jtop``
(jetson-stats 4.2+ / 7.x: power in milliwatts). See docs/jetson-api.md for the table of
calls and the sources each fake follows. :func:`install` puts them in ``sys.modules``.
"""

from __future__ import annotations

import sys
import types

__all__ = ["install"]


def install(monkeypatch, tensorrt_version: str = "10.3.0", io_dtype: str = "float32") -> types.SimpleNamespace:
    """Make ``import tensorrt`` and ``import pycuda.driver`` give the fakes for this test."""
    from tests.fakes import pycuda_driver, tensorrt

    cuda = pycuda_driver.make_module()
    trt = tensorrt.make_module(tensorrt_version, io_dtype, cuda)
    pkg = types.ModuleType("pycuda")
    pkg.driver = cuda
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", cuda)
    return types.SimpleNamespace(trt=trt, cuda=cuda)
