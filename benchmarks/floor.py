"""The CPU FLOP floor: the model's FLOPs from its ONNX graph against a measured GEMM rate."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

__all__ = ["model_flops", "gemm_gflops"]


def model_flops(onnx_path: Path) -> int:
    """FLOPs (2 x multiply-adds) of one photo through the Conv, Gemm and MatMul nodes. Each Conv's output shape is
    read from one run of the graph (ONNX shape inference cannot follow the dynamic "same" padding of an
    EfficientNet-Lite export)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(onnx_path))
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    del model.graph.output[:]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n.output[0]) for n in convs)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    x = np.zeros([1] + [d.dim_value for d in dims[1:]], np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = dict(zip((n.output[0] for n in convs), sess.run(None, {model.graph.input[0].name: x})))
    macs = 0
    for node in model.graph.node:
        if node.op_type == "Conv":
            cout, cin_per_group, *k = inits[node.input[1]]
            macs += cout * cin_per_group * int(np.prod(k)) * int(np.prod(outs[node.output[0]].shape[2:]))
        elif node.op_type in ("Gemm", "MatMul") and node.input[1] in inits:
            macs += int(np.prod(inits[node.input[1]]))
    return 2 * macs


def gemm_gflops(n: int = 1024, seconds: float = 2.0) -> float:
    """Sustained float32 GEMM rate of this CPU through numpy's BLAS (all cores)."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9
