"""benchmarks.verdict_features: the shared covariance's two estimates, the features it reads and its interval."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.verdict_features import distances, feature_session, wilson


def _clusters(seed: int = 0, d: int = 6, n: int = 200):
    rng = np.random.default_rng(seed)
    scale = np.array([3.0, 3.0] + [0.2] * (d - 2))  # two wide directions, the rest narrow
    x = np.concatenate([rng.normal(0, 1, (n, d)) * scale + c * 5 for c in range(2)])
    return x, np.repeat([0, 1], n)


def test_the_low_rank_precision_is_the_inverse_of_top_directions_plus_one_variance_for_the_rest():
    from trainer.verdict_fit import class_means_and_precision

    x, y = _clusters()
    means, precision = class_means_and_precision(x, y, 2, rank=2)
    resid = x - means[y]
    lam, u = np.linalg.eigh(resid.T @ resid / (len(x) - 1))
    top = u[:, -2:]
    cov = (top * lam[-2:]) @ top.T + lam[:-2].mean() * (np.eye(6) - top @ top.T)
    assert np.allclose(precision, np.linalg.inv(cov), atol=1e-8)
    assert np.allclose(means, [x[y == 0].mean(0), x[y == 1].mean(0)])


def test_a_rank_outside_the_features_width_is_refused():
    from trainer.verdict_fit import class_means_and_precision

    x, y = _clusters()
    for rank in (0, 6):
        with pytest.raises(ValueError, match="rank must lie between 1 and 5"):
            class_means_and_precision(x, y, 2, rank=rank)


def test_a_photo_off_the_narrow_directions_is_far_only_for_a_covariance_that_keeps_them_narrow():
    from trainer.verdict_fit import class_means_and_precision

    x, y = _clusters()
    off = np.zeros((1, 6))
    off[0, -1] = 3.0  # 3 units along a narrow direction (sd 0.2): 15 sd away
    wide = np.zeros((1, 6))
    wide[0, 0] = 3.0  # 3 units along the widest (sd 3): 1 sd
    for estimate in ({"shrinkage": 0.2}, {"rank": 2}):
        means, precision = class_means_and_precision(x, y, 2, **estimate)
        assert distances(means, precision, off)[0] > 5 * distances(means, precision, wide)[0]
    means, _ = class_means_and_precision(x, y, 2)
    assert distances(means, np.eye(6), off)[0] == pytest.approx(
        distances(means, np.eye(6), wide)[0], rel=0.3
    )  # same length, mean estimates aside


def test_the_interval_of_a_share_is_wilsons():
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    lo, hi = wilson(621, 672)
    assert lo == pytest.approx(0.9022, abs=1e-3) and hi == pytest.approx(0.9418, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)


def test_the_features_are_the_final_linear_layers_input_and_give_back_its_logits(tiny_store):
    from engines.store import EngineStore

    version = EngineStore(tiny_store).open()
    session, name = feature_session(tiny_store / version.name / "model.onnx", threads=1)
    x = np.random.default_rng(1).normal(0, 1, (2, *version.manifest["input"]["shape"][1:])).astype(np.float32)
    logits, features = session.run([session.get_outputs()[0].name, name], {session.get_inputs()[0].name: x})
    assert features.shape[0] == 2 and features.reshape(2, -1).shape[1] > logits.shape[1]
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(tiny_store / version.name / "model.onnx"))
    gemm = [n for n in model.graph.node if n.op_type == "Gemm"][-1]
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w, b = weights[gemm.input[1]], weights[gemm.input[2]]
    transposed = any(a.name == "transB" and a.i == 1 for a in gemm.attribute)
    assert np.allclose(features.reshape(2, -1) @ (w.T if transposed else w) + b, logits, atol=1e-4)


def test_a_model_without_a_linear_layer_is_refused_with_the_file_named(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(SystemExit, match="model.onnx: no final linear layer"):
        feature_session(path)
