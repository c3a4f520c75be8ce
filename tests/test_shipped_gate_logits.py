"""The shipped version's logits on the shipped gate photos (``edge_agent/default_data/gate-logits``) are what a new
device's first retrain would compute, under the name it looks for: written by ``python -m trainer.shipped_data``."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the trainer needs the 'train' extra")


class _Refuses(torch.nn.Module):
    def __init__(self, num_classes: int = 38) -> None:
        super().__init__()
        self.num_classes = num_classes

    def forward(self, x):
        raise AssertionError("the shipped logits were not read")


def test_the_shipped_logits_belong_to_the_shipped_version_and_a_first_retrain_reads_them_instead_of_running_it(tmp_path):
    from edge_agent.config import default_data_path, default_store_path, parse_config
    from edge_agent.preprocess import PreprocessSpec
    from engines.store import EngineStore
    from trainer.labelled import labelled_sources, load_labelled
    from trainer.loop.gate_logits import GateLogits, file_name, photos_digest, shipped_folder
    from trainer.models import logits_on
    from trainer.publish import load_weights

    version = EngineStore(default_store_path()).open()
    entry = json.loads((default_data_path() / "manifest.json").read_text())["gate_logits"]
    path = default_data_path() / entry["file"]
    assert entry["model_version"] == version.name and hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
    assert [p.name for p in shipped_folder().glob("*.npy")] == [path.name]
    # the gate photos as a retrain with no configuration reads them for the version in service
    sources = labelled_sources(parse_config({}), list(version.classes))
    x = load_labelled(sources, spec=PreprocessSpec.from_manifest(version.manifest["preprocess"])).val.x
    assert path.name == file_name(version, photos_digest(x)), "stale: run python -m trainer.shipped_data --logits-only"
    got = GateLogits(tmp_path, photos_digest(x)).of(version, _Refuses(), x)
    assert got.shape == (entry["photos"], len(version.classes)) == (len(x), 38)
    torch.testing.assert_close(got[::84], logits_on(load_weights(version), x[::84]), atol=1e-3, rtol=1e-3)
    assert np.array_equal(np.load(tmp_path / "gate-logits" / path.name), got.numpy())  # kept for the next retrain


NAMES = ["Tomato___healthy", "Pepper,_bell___healthy", "Orange___Haunglongbing_(Citrus_greening)"]


def test_the_release_step_writes_the_logits_under_the_name_a_retrain_reads_and_records_them(tmp_path, capsys):
    from edge_agent.config import parse_config
    from edge_agent.preprocess import PreprocessSpec
    from engines.store import EngineStore
    from trainer.labelled import labelled_sources, load_labelled
    from trainer.loop.gate_logits import GateLogits, photos_digest
    from trainer.models import build_model
    from trainer.publish import publish_model
    from trainer.shipped_data import gate_logits, main

    from .conftest import make_class_folders

    torch.manual_seed(0)
    version = publish_model(build_model(3).eval(), NAMES, tmp_path / "store", version="v0001")
    out = make_class_folders(tmp_path / "data" / "gate", NAMES[:2], 3).parent
    (out / "manifest.json").write_text(json.dumps({"model_version": "v0001", "files": []}))
    (out / "gate-logits").mkdir()
    (out / "gate-logits" / "v0000-old.npy").write_bytes(b"a version shipped before")
    entry = gate_logits(out, tmp_path / "store")
    assert entry["model_version"] == "v0001" and entry["photos"] == 6
    assert json.loads((out / "manifest.json").read_text())["gate_logits"] == entry
    assert [p.name for p in (out / "gate-logits").iterdir()] == [entry["file"].split("/")[1]]  # the old one gone
    sources = labelled_sources(parse_config({}), NAMES, shipped=out)
    x = load_labelled(sources, spec=PreprocessSpec.from_manifest(version.manifest["preprocess"])).val.x
    got = GateLogits(tmp_path / "trainer", photos_digest(x), shipped=out / "gate-logits").of(
        EngineStore(tmp_path / "store").open(), _Refuses(3), x
    )
    assert got.shape == (6, 3)
    assert main(["--logits-only", "--out", str(out), "--store", str(tmp_path / "store")]) == 0
    assert "v0001 on 6 gate photos" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), "--store", str(tmp_path / "store")])
    assert exc.value.code == 2 and "--data is required" in capsys.readouterr().err
    other = make_class_folders(tmp_path / "other" / "gate", ["Corn___healthy"], 2).parent
    (other / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match="other/gate: no gate photo of v0001's classes"):
        gate_logits(other, tmp_path / "store")
