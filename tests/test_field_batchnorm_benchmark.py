"""benchmarks.field_batchnorm: an engine's BatchNorm statistics moved a fraction of the way towards a field stream's,
everything else kept, and the engine put back as it was between measurements."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

CLASSES = ["Tomato___healthy", "Pepper,_bell___healthy", "Orange___Haunglongbing_(Citrus_greening)"]


def _field_folder(root, hues: tuple[int, ...], per_class: int) -> None:
    from .conftest import encode, leaf_image

    for c, (cls, hue) in enumerate(zip(CLASSES, hues)):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            (root / cls / f"{i}.jpg").write_bytes(encode(leaf_image(100 * c + i, (150, 170), hue=hue)))


def test_half_way_moves_each_batchnorm_statistic_half_way_and_leaves_every_weight_as_it_was(tiny_store):
    from benchmarks.field_batchnorm import adapted_statistics
    from benchmarks.wise_ft import mix
    from engines.store import EngineStore
    from trainer.publish import load_weights

    model = load_weights(EngineStore(tiny_store).open())
    as_is = {k: v.clone() for k, v in model.state_dict().items()}
    adapted = adapted_statistics(model, torch.rand(12, 3, 128, 128) * 4 - 2)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in as_is.items())  # the engine itself is not touched
    half = mix(as_is, adapted, 0.5)
    means = [k for k in as_is if k.endswith("running_mean")]
    assert means and all(not torch.allclose(as_is[k], adapted[k]) for k in means)
    for k, v in as_is.items():
        if k.endswith(("running_mean", "running_var")):
            assert torch.allclose(half[k], (v + adapted[k]) / 2)
        else:
            assert torch.equal(half[k], adapted[k]) and torch.equal(v, adapted[k])


def test_every_ratio_is_measured_from_the_engine_as_it_was_whatever_came_before(tiny_store, tmp_path, monkeypatch):
    import benchmarks.field_batchnorm as fb
    from engines.store import EngineStore
    from trainer.publish import load_weights

    def first_statistics(model, x, y):  # stands in for top1: what the measured model's first BatchNorm layer holds
        bn = next(m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
        return float(bn.running_mean.sum() + bn.running_var.sum())

    monkeypatch.setattr(fb, "top1", first_statistics)
    data = tmp_path / "data"
    _field_folder(data / "field" / "apple-orchard", (20, 60, 100), 8)
    _field_folder(data / "field" / "corn-field", (140, 10, 170), 4)
    out = tmp_path / "out"
    argv = ["--out", str(out), "--store", str(tiny_store), "--data", str(data), "--seeds", "1", "--photos", "4", "50"]
    assert fb.main([*argv, "--alphas", "1", "0", "--threads", "1"]) == 0
    rows = json.loads((out / "field_batchnorm.json").read_text())["rows"]
    expected = [(f, n, a) for f, ns in (("apple-orchard", (4, 18)), ("corn-field", (4, 9))) for n in ns for a in (1.0, 0.0)]
    assert [(r["field"], r["photos"], r["alpha"]) for r in rows] == expected  # a short stream: what it had (24 - 6, 12 - 3)
    assert all("lab" not in r for r in rows)  # the store records no split: the lab figure is left out, never guessed
    as_is = round(first_statistics(load_weights(EngineStore(tiny_store).open()), None, None), 4)
    assert [r["top1"] for r in rows if r["alpha"] == 0.0] == [as_is] * 4
    assert len({r["top1"] for r in rows if r["alpha"] == 1.0} | {as_is}) == 5  # each stream's own statistics
    table = (out / "field_batchnorm.md").read_text()
    assert "| apple-orchard (6 held out) | 18 | 1.0 |" in table and "| corn-field (3 held out) | 4 | 0.0 |" in table
