"""ONNX Runtime INT8: static QDQ quantisation calibrated on real photos.

Needs the ``onnx`` package (the ``train`` extra); the daemon only loads the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.photos import as_array

__all__ = ["quantize_int8", "top1_agreement", "logits_of_onnx", "outputs_of_onnx", "Int8Report"]


@dataclass(frozen=True)
class Int8Report:
    agreement: float  # share of photos where INT8 top-1 == FP32 top-1
    photos: int
    fp32_top1: float | None = None  # against true labels, when given
    int8_top1: float | None = None


class _Reader:
    """CalibrationDataReader over batches of preprocessed photos."""

    def __init__(self, input_name: str, batches: Iterable[np.ndarray]) -> None:
        self._it: Iterator[np.ndarray] = iter(batches)
        self._name = input_name

    def get_next(self):
        batch = next(self._it, None)
        return None if batch is None else {self._name: np.ascontiguousarray(as_array(batch))}


def quantize_int8(onnx_in: str | Path, onnx_out: str | Path, calibration: np.ndarray, batch: int = 1) -> None:
    """Quantise ``onnx_in`` to ``onnx_out`` (QDQ, per-channel INT8 weights, calibrated on
    ``calibration`` [N,3,H,W] float32 photos preprocessed exactly as for inference), ``batch`` photos at a time.

    MinMax ranges do not depend on the batch (the same file at 1, 2, 4 and 16), but the calibration session's memory
    does: EfficientNet-Lite0 at 192 px peaks 1.1 GB above its start at 16 photos a batch, 0.2 GB at 4; at 256 px
    0.67 GB at 4, 0.39 GB at 2, 0.27 GB at 1, each in 5 s for 256 photos (a retrain's publishing peak). The verdict's
    distance computation (nodes under :data:`trainer.export.DISTANCE_SCOPE`) stays in float: its squared sums over
    1,280 features would not survive 8 bits.

    Weights use all 8 bits. 7-bit weights (``reduce_range``, built from 2026-11-29 to 2026-12-02) are ONNX Runtime's
    remedy for x86 CPUs without VNNI, whose 8-bit kernels saturate their 16-bit sums; there they lifted v4000's
    agreement with FP32 from 0.982 to 0.994 of the 672 gate photos but only from 0.69 to 0.84 of 300 field photos, so
    such a CPU now runs FP32 (:func:`engines.backends._ort_precision.x86_without_vnni`). On a CPU with VNNI they cost
    the field: retrained versions of the loop gave FP32's answer on 0.91-0.96 of 300 held-out orchard photos with 7-bit
    weights, 0.977-1.000 with 8-bit (top-1 0.6033-0.7567 against 0.6133-0.7733; FP32 0.6067-0.7700)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if len(calibration) == 0:
        raise ValueError("INT8 calibration needs at least one photo")
    onnx_in, onnx_out = Path(onnx_in), Path(onnx_out)
    input_name = ort.InferenceSession(str(onnx_in), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    prepped = onnx_out.with_suffix(".pre.onnx")
    try:
        quant_pre_process(str(onnx_in), str(prepped), skip_symbolic_shape=True)
        from trainer.export import DISTANCE_SCOPE

        distance_nodes = [n.name for n in onnx.load(str(prepped)).graph.node if n.name.startswith(DISTANCE_SCOPE)]
        quantize_static(
            str(prepped),
            str(onnx_out),
            _Reader(input_name, (calibration[i : i + batch] for i in range(0, len(calibration), batch))),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=distance_nodes,
            reduce_range=False,  # 8-bit weights (above)
        )
    finally:
        prepped.unlink(missing_ok=True)


def outputs_of_onnx(path: Path, x: np.ndarray, batch: int = 1) -> list[np.ndarray]:
    """Every output of an ONNX model for ``x`` (ONNX Runtime, CPU), ``batch`` photos a run: EfficientNet-Lite0's session
    at 192 px peaks 0.17 GB above its start at 16 photos a run and 0.04 GB at 4, in a retrain that opens four of them;
    at 256 px 0.15 GB at 4 and 0.09 GB at 1 over 672 photos, in the same 2 s."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    parts = [sess.run(None, {name: as_array(x[i : i + batch])}) for i in range(0, len(x), batch)]
    return [np.concatenate(column) for column in zip(*parts)]


def logits_of_onnx(path: Path, x: np.ndarray, batch: int = 1) -> np.ndarray:
    """An ONNX model's first output (its logits) for ``x``; see :func:`outputs_of_onnx`."""
    return outputs_of_onnx(path, x, batch)[0]


def top1_agreement(
    fp32: str | Path | np.ndarray, int8: str | Path | np.ndarray, photos: np.ndarray, labels: np.ndarray | None = None
) -> Int8Report:
    """Compare FP32 and INT8 top-1 on held-out ``photos`` (and accuracy, given ``labels``); ``fp32`` and ``int8`` are
    the models' files, or their logits for ``photos`` already computed."""
    a = (fp32 if isinstance(fp32, np.ndarray) else logits_of_onnx(Path(fp32), photos)).argmax(1)
    b = (int8 if isinstance(int8, np.ndarray) else logits_of_onnx(Path(int8), photos)).argmax(1)
    report = Int8Report(agreement=float((a == b).mean()), photos=len(photos))
    if labels is not None:
        report = Int8Report(report.agreement, report.photos, float((a == labels).mean()), float((b == labels).mean()))
    return report
