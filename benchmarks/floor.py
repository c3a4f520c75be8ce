"""The CPU FLOP floor: the model's FLOPs from its ONNX graph against a measured GEMM rate."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

__all__ = ["model_flops", "gemm_gflops"]


def model_flops(onnx_path: Path) -> int:
    """FLOPs (2 x multiply-adds) of one photo through the Conv, Gemm and MatMul nodes."""
    import onnx
    from onnx import shape_inference

    model = onnx.load(str(onnx_path))
    inp = model.graph.input[0].type.tensor_type.shape.dim[0]
    inp.ClearField("dim_param")
    inp.dim_value = 1  # batch 1, so every shape is concrete
    model = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in (*model.graph.value_info, *model.graph.output)}
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    macs = 0
    for node in model.graph.node:
        if node.op_type == "Conv":
            cout, cin_per_group, *k = inits[node.input[1]]
            _, _, *spatial = shapes[node.output[0]]
            macs += cout * cin_per_group * int(np.prod(k)) * int(np.prod(spatial))
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
