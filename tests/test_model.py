"""The CNN and its ONNX export."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the 'train' extra (torch) is not installed")

from trainer.export import ExportMismatch, export_onnx  # noqa: E402
from trainer.models import LeafNet, build_model, count_parameters  # noqa: E402


def test_parameter_count_for_38_classes():
    assert count_parameters(build_model(38)) == 464_934  # "about 465k"


def test_architecture_blocks():
    m = build_model(23)
    convs = [mod for mod in m.backbone.modules() if isinstance(mod, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 64, 128, 256]
    assert all(c.kernel_size == (3, 3) and c.padding == (1, 1) for c in convs)
    assert m(torch.randn(2, 3, 128, 128)).shape == (2, 23)
    assert m.features(torch.randn(2, 3, 128, 128)).shape == (2, 256)


def test_onnx_export_matches_torch(tmp_path):
    import onnxruntime as ort

    torch.manual_seed(1)
    model = build_model(38).eval()
    diff = export_onnx(model, tmp_path / "m.onnx")
    assert diff < 1e-4
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    inp, out = sess.get_inputs()[0], sess.get_outputs()[0]
    assert inp.name == "input" and out.name == "logits"
    assert inp.shape[1:] == [3, 128, 128] and isinstance(inp.shape[0], str)  # dynamic batch axis
    for n in (1, 7):
        x = torch.randn(n, 3, 128, 128)
        with torch.no_grad():
            expected = model(x).numpy()
        got = sess.run(None, {"input": x.numpy()})[0]
        assert got.shape == (n, 38)
        assert np.abs(got - expected).max() < 1e-4


def test_export_mismatch_is_detected(tmp_path, monkeypatch):
    model = build_model(3).eval()
    real_forward = LeafNet.forward
    calls = {"n": 0}

    def forward(self, x):  # traced once for export, then differs when called for the check
        calls["n"] += 1
        out = real_forward(self, x)
        return out if calls["n"] == 1 else out + 1.0

    monkeypatch.setattr(LeafNet, "forward", forward)
    with pytest.raises(ExportMismatch):
        export_onnx(model, tmp_path / "m.onnx")


def test_grow_head_keeps_learnt_rows():
    m = build_model(3)
    w = m.head.weight.detach().clone()
    m.grow_head(5)
    assert m.num_classes == 5
    assert torch.equal(m.head.weight[:3], w)
    with pytest.raises(ValueError):
        m.grow_head(2)
