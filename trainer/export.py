"""Export a :class:`~trainer.models.LeafNet` to ONNX and check it against torch."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from engines.errors import EdgeAgentError

__all__ = ["export_onnx", "ExportMismatch", "INPUT_NAME", "OUTPUT_NAME", "OPSET"]

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
#: Opset 17: parsed by TensorRT 8.5+ (JetPack 5) and 10 (JetPack 6), and every recent ONNX Runtime.
OPSET = 17


class ExportMismatch(EdgeAgentError, RuntimeError):
    """The exported graph does not compute what the torch model computes."""


def export_onnx(model: torch.nn.Module, path: str | Path, size: int = 128, tolerance: float = 1e-4) -> float:
    """Write ``model`` as one self-contained ONNX file with a dynamic batch axis.

    Input ``input`` [N,3,size,size] float32, output ``logits`` [N,classes]. The
    file is then run with ONNX Runtime on a random batch and compared with torch;
    returns the max abs difference, raising :class:`ExportMismatch` above ``tolerance`` times the largest logit
    (at least 1).
    """
    import onnxruntime as ort

    path = Path(path)
    model = model.eval().cpu()
    dummy = torch.randn(1, 3, size, size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (dummy,),
            str(path),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    probe = torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(probe).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run([OUTPUT_NAME], {INPUT_NAME: probe.numpy()})[0]
    diff = float(np.abs(got - expected).max())
    scale = max(1.0, float(np.abs(expected).max()))  # float32 rounding grows with the logits' size
    if diff > tolerance * scale:
        raise ExportMismatch(f"ONNX output differs from torch by {diff:.2e} (> {tolerance:.0e} x {scale:.3g})")
    return diff
