"""Build the labelled photos shipped beside the default model (``edge_agent/default_data``).

A retrain needs two sets of true labels, and a new device has neither:

* ``gate/``: the photos the publish gate judges candidates on. They are the shipped model's **test split**:
  never trained on and never used to pick its checkpoint or temperature, so the model in service is judged
  on them as fairly as any candidate (on its validation split it scores higher than it deserves, because
  that split chose it, and every honest candidate would be refused).
* ``replay/``: a small class-balanced memory from the shipped model's training split, chosen by herding on
  its own features (iCaRL's exemplar selection), replayed in every retrain so it does not drift away from
  the classes the field has not shown lately.

``python -m trainer.shipped_data --data ../shared/data/plantvillage`` rebuilds both from the split recorded
in the shipped version's manifest and writes ``manifest.json`` (which photo, its sha256, its source) and a
``NOTICE`` with the photos' sources and licences. The photos are the original bytes, never re-encoded.

It also writes ``gate-logits/``: the shipped version's logits on ``gate/`` as a retrain reads those photos, so a new
device's first retrain does not run the version in service over them (:mod:`trainer.loop.gate_logits`; about 35 s
of a first retrain on 2 x86 cores, more on a Raspberry Pi). ``--logits-only`` writes just those, from the photos
already there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from edge_agent.config import AppConfig, default_data_path, default_store_path
from edge_agent.preprocess import PreprocessSpec
from engines.store import EngineStore
from trainer.data import TensorDataset, recorded_split
from trainer.labelled import labelled_sources, load_labelled
from trainer.loop.gate_logits import FOLDER, file_name, photos_digest
from trainer.models import logits_on
from trainer.publish import load_weights
from trainer.strategies.rehearsal import select

__all__ = ["build", "gate_logits"]

NOTICE = """\
Photos in this folder (gate/ and replay/) are original, unmodified PlantVillage leaf photos, taken from
the development subset described in shared/data/plantvillage/SOURCE.md. manifest.json lists every file
with its sha256 and the file it was copied from.

Sources, as SOURCE.md states them:
- T061202/Plant_village (commit 08d9dcbe0b422a104d6f2f893fe9c5397dfca6e9), Data/raw/: Pepper bell healthy,
  Potato x3, Tomato x10. No LICENSE and no README: no licence is stated.
- ai-agriculture-circuits-and-systems/plant_Village_Apple, Plant_Village_Blueberry, Plant_Village_Orange,
  Plant_Village_Raspberry, Plant_Village_Strawberry (data/origin/<Class>/color/): CC BY 4.0, as each
  repository's LICENSE and README state; they credit Kaggle abdallahalidev/plantvillage-dataset and ask
  users to check the original dataset's terms.
- ai-agriculture-circuits-and-systems/Plant_Village_Corn and Plant_Village_Pepper (data/origin/.../color/): 4 Corn
  classes and Pepper bell bacterial spot; CC BY 4.0, as each repository's LICENSE and README state.
- JLG-96/milestone-project-mildew-detection-in-cherry-leaves (2 Cherry classes), sinchana1408/grape-disease-detection
  (4 Grape classes), AnjaneyuluChinni/Plant-Disease-Detection (Peach x2, Soybean, Squash): no licence stated; the
  images are PlantVillage originals.
- The canonical spMohanty/PlantVillage-Dataset gives no licence and asks to be cited.
None of these sources states CC BY-SA or CC0. Treat the terms as unverified and attribute the original authors:

Hughes, D. P. & Salathe, M. (2015). An open access repository of images on plant health to enable the
development of mobile disease diagnostics. arXiv:1511.08060.
Mohanty, S. P., Hughes, D. P. & Salathe, M. (2016). Using deep learning for image-based plant disease
detection. Frontiers in Plant Science 7:1419. doi:10.3389/fpls.2016.01419.
"""


def build(data: str | Path, out: Path, store: Path, replay_per_class: int = 8) -> dict:
    """Write ``out/gate``, ``out/replay``, ``out/manifest.json`` and ``out/NOTICE``; return the manifest."""
    version = EngineStore(store).open()
    split_info = version.manifest["training"]["split"]
    classes = list(version.classes)
    parts = recorded_split(version, data)
    if len(parts["test"]) != split_info["test_photos"] or len(parts["train"]) != split_info["train_photos"]:
        raise ValueError(f"{data}: does not give the split recorded in {version.name}'s manifest")
    model = load_weights(version)
    train = TensorDataset(parts["train"], PreprocessSpec.from_manifest(version.manifest["preprocess"]))
    with torch.no_grad():
        feats = torch.cat([model.features(train.x[i : i + 128]) for i in range(0, len(train), 128)])
    replay = []
    for c in range(len(classes)):
        idx = torch.nonzero(train.y == c).flatten()
        replay.extend(train.samples[int(i)] for i in idx[select(feats[idx], replay_per_class, "herding")])
    shutil.rmtree(out / "gate", ignore_errors=True)
    shutil.rmtree(out / "replay", ignore_errors=True)
    files = []
    for kind, samples in (("gate", parts["test"]), ("replay", replay)):
        for s in samples:
            name = classes[s.label]
            dst = out / kind / name / Path(s.path).name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(s.path, dst)
            files.append(
                {
                    "file": str(dst.relative_to(out)),
                    "class": name,
                    "set": kind,
                    "sha256": hashlib.sha256(dst.read_bytes()).hexdigest(),
                    "source": str(Path(s.path).relative_to(Path(data))),
                }
            )
    manifest = {
        "model_version": version.name,
        "model_sha256": version.manifest["files"]["model.onnx"]["sha256"],
        "split": split_info,
        "gate": {"photos": len(parts["test"]), "what": "the shipped model's test split: never trained on, never used for selection"},
        "replay": {
            "photos": len(replay),
            "per_class": replay_per_class,
            "selection": "herding on the shipped model's features",
            "from": "the shipped model's training split",
        },
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "NOTICE").write_text(NOTICE)
    gate_logits(out, store)
    return json.loads((out / "manifest.json").read_text())


def gate_logits(out: Path, store: Path) -> dict:
    """Write the current version of ``store``'s logits on ``out/gate`` (read as a retrain reads them: the version's
    preprocessing, its classes) to ``out/gate-logits/``, replacing what was there; recorded in ``out/manifest.json``."""
    version = EngineStore(store).open()
    sources = labelled_sources(AppConfig(), list(version.classes), shipped=out)
    x = load_labelled(sources, spec=PreprocessSpec.from_manifest(version.manifest["preprocess"])).val.x
    if len(x) == 0:
        raise ValueError(f"{out / 'gate'}: no gate photo of {version.name}'s classes to compute logits on")
    z = logits_on(load_weights(version), x).numpy()
    folder = out / FOLDER
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / file_name(version, photos_digest(x))
    np.save(path, z, allow_pickle=False)
    entry = {
        "file": str(path.relative_to(out)),
        "model_version": version.name,
        "photos": len(x),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["gate_logits"] = entry
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.shipped_data", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="the folder the shipped model was trained from (not needed with --logits-only)")
    ap.add_argument("--out", default=str(default_data_path()))
    ap.add_argument("--store", default=str(default_store_path()))
    ap.add_argument("--replay-per-class", type=int, default=8)
    ap.add_argument("--logits-only", action="store_true", help="write only gate-logits/, from the gate photos already in --out")
    args = ap.parse_args(argv)
    if args.logits_only:
        e = gate_logits(Path(args.out), Path(args.store))
        print(f"{args.out}: {e['file']} ({e['model_version']} on {e['photos']} gate photos)")
        return 0
    if not args.data:
        ap.error("--data is required: the folder the shipped model was trained from (../shared/data/plantvillage)")
    m = build(args.data, Path(args.out), Path(args.store), args.replay_per_class)
    size = sum((Path(args.out) / f["file"]).stat().st_size for f in m["files"])
    print(f"{args.out}: {m['gate']['photos']} gate photos, {m['replay']['photos']} replay photos, {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
