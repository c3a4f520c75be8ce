"""Export a :class:`~trainer.models.Classifier` to ONNX (with the verdict's distance output, where it has one) and
check it against torch."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from edge_agent.verdict import DISTANCE_OUTPUT
from engines.errors import EdgeAgentError

__all__ = ["export_onnx", "ExportMismatch", "INPUT_NAME", "OUTPUT_NAME", "OPSET", "DISTANCE_SCOPE"]

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
#: Opset 17: parsed by TensorRT 8.5+ (JetPack 5) and 10 (JetPack 6), and every recent ONNX Runtime.
OPSET = 17


#: The graph's node names of the distance computation start with this (the INT8 build leaves them in float).
DISTANCE_SCOPE = "/distance/"


class ExportMismatch(EdgeAgentError, RuntimeError):
    """The exported graph does not compute what the torch model computes."""


class _WithDistance(torch.nn.Module):
    """The classifier and, from the same pooled features, the verdict's distances: (logits, distances)."""

    def __init__(self, model: torch.nn.Module, distance: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.distance = model, distance

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.model.features(x)
        return self.model.head(f), self.distance(f)


def export_onnx(
    model: torch.nn.Module, path: str | Path, size: int = 128, tolerance: float = 1e-4, distance: torch.nn.Module | None = None
) -> float:
    """Write ``model`` as one self-contained ONNX file with a dynamic batch axis.

    Input ``input`` [N,3,size,size] float32, output ``logits`` [N,classes]; with ``distance`` (the verdict's
    :class:`~trainer.verdict_fit.FeatureDistance`), a second output ``distance`` [N,classes] computed from the same
    pooled features. The file is then run with ONNX Runtime on a random batch and compared with torch; returns the
    max abs difference of the logits, raising :class:`ExportMismatch` where an output differs by more than
    ``tolerance`` times its largest value (at least 1).
    """
    import onnxruntime as ort

    path = Path(path)
    model = model.eval().cpu()
    net = model if distance is None else _WithDistance(model, distance.eval().cpu()).eval()
    names = [OUTPUT_NAME] if distance is None else [OUTPUT_NAME, DISTANCE_OUTPUT]
    dummy = torch.randn(1, 3, size, size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (dummy,),
            str(path),
            input_names=[INPUT_NAME],
            output_names=names,
            dynamic_axes={INPUT_NAME: {0: "batch"}, **{name: {0: "batch"} for name in names}},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    probe = torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = net(probe)
    expected = [expected.numpy()] if distance is None else [t.numpy() for t in expected]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    diffs = []
    for name, want, got in zip(names, expected, session.run(names, {INPUT_NAME: probe.numpy()})):
        diff = float(np.abs(got - want).max())
        scale = max(1.0, float(np.abs(want).max()))  # float32 rounding grows with the values' size
        if diff > tolerance * scale:
            raise ExportMismatch(f"ONNX output {name!r} differs from torch by {diff:.2e} (> {tolerance:.0e} x {scale:.3g})")
        diffs.append(diff)
    return diffs[0]
