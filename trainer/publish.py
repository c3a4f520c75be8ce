"""Turn a trained model into a store version: ONNX, INT8 variant, weights and manifest."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from edge_agent.log import get_logger
from edge_agent.preprocess import DEFAULT_SPEC, PreprocessSpec
from engines.store import EngineStore, StoreVersion
from trainer.export import INPUT_NAME, OPSET, OUTPUT_NAME, export_onnx
from trainer.models import Classifier
from trainer.stop import check

__all__ = ["publish_model", "load_weights", "ONNX_FILE", "INT8_FILE", "WEIGHTS_FILE", "SPLIT_FILE"]

SPLIT_FILE = "split.json"
ONNX_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"
WEIGHTS_FILE = "weights.pt"


def publish_model(
    model: Classifier,
    classes: list[str],
    store_dir: str | os.PathLike,
    *,
    spec: PreprocessSpec | None = None,
    metrics: dict | None = None,
    training: dict | None = None,
    calibration: np.ndarray | None = None,
    held_out: tuple[np.ndarray, np.ndarray] | None = None,
    parent: str | None = None,
    make_current: bool = True,
    should_stop=lambda: False,
    signing_key=None,
    verdict: dict | None = None,
    split: dict | None = None,
    version: str | None = None,
    new_lineage: bool = False,
    distance: torch.nn.Module | None = None,
) -> StoreVersion:
    """Export ``model`` and publish it atomically to the store at ``store_dir``.

    With ``calibration`` photos an INT8 variant is built too, and its top-1
    agreement with FP32 on ``held_out`` photos goes into the manifest (either may be a retrain's half-precision photos,
    :mod:`trainer.photos`: each batch is cast to float32 as it is used, never the whole set). ``should_stop`` is asked between the
    steps; once the store's own publish has begun it runs to the end (it is atomic and takes milliseconds).
    ``signing_key`` (:class:`engines.signing.SigningKey`) signs the version, as daemons require. ``verdict`` is the
    manifest's verdict section (:mod:`trainer.verdict_fit`), and ``distance`` its module where the section is on the
    features (exported into the model as its second output); with an INT8 variant, how often INT8's verdict agrees
    with FP32's on ``held_out`` is recorded beside the top-1 agreement. ``split`` (split name -> photo paths relative
    to the training folder) is written as ``split.json``: which photos the model was and was not trained on.
    ``parent`` defaults to the store's current version; ``new_lineage`` publishes with none (a release, which
    descends from no version a device serves: :mod:`edge_agent.hotswap`'s new-lineage rule). ``spec`` defaults to
    the parent's preprocessing where the parent is of the same architecture (a retrain keeps its parent's input), else
    the architecture's own (:func:`trainer.models.data_config`).
    """
    import json

    from trainer.int8 import outputs_of_onnx, quantize_int8, top1_agreement

    log = get_logger("trainer")
    if len(classes) != model.num_classes:
        raise ValueError(f"{len(classes)} class names for a model with {model.num_classes} outputs")
    metrics = dict(metrics or {})
    if (verdict or {}).get("on") == "features" and distance is None:
        raise ValueError("a verdict on the features needs its distance module, which the export puts into the model")
    if spec is None:
        spec = _inherited_spec(model, store_dir, None if new_lineage else parent)
    with tempfile.TemporaryDirectory(prefix="edge-publish-") as tmp:
        work = Path(tmp)
        files = {ONNX_FILE: work / ONNX_FILE, WEIGHTS_FILE: work / WEIGHTS_FILE}
        artifacts = {"onnx": ONNX_FILE, "torch": WEIGHTS_FILE}
        metrics["onnx_max_abs_diff"] = export_onnx(model, files[ONNX_FILE], spec.size, distance=distance)
        torch.save({"state_dict": model.state_dict(), "num_classes": model.num_classes, "arch": model.arch}, files[WEIGHTS_FILE])
        check(should_stop, "before the INT8 build")
        if calibration is not None and len(calibration):
            quantize_int8(files[ONNX_FILE], work / INT8_FILE, calibration)
            files[INT8_FILE] = work / INT8_FILE
            artifacts["int8"] = INT8_FILE
            if held_out is not None:
                x = held_out[0]
                (z32, d32), (z8, d8) = (_logits_distances(outputs_of_onnx(files[name], x)) for name in (ONNX_FILE, INT8_FILE))
                rep = top1_agreement(z32, z8, x, held_out[1])  # each model run once on the check photos
                metrics["int8"] = {
                    "top1_agreement_with_fp32": round(rep.agreement, 4),
                    "photos": rep.photos,
                    "fp32_top1": round(rep.fp32_top1, 4),
                    "int8_top1": round(rep.int8_top1, 4),
                    "calibration_photos": int(len(calibration)),
                }
                if verdict is not None:
                    from trainer.verdict_fit import verdicts_of

                    a = verdicts_of(verdict, list(classes), z32, x, spec, distances=d32)
                    b = verdicts_of(verdict, list(classes), z8, x, spec, distances=d8)
                    metrics["int8"]["verdict_agreement_with_fp32"] = round(float(np.mean([u == v for u, v in zip(a, b)])), 4)
                log.info("int8_built", **metrics["int8"])
        if split is not None:
            files[SPLIT_FILE] = work / SPLIT_FILE
            files[SPLIT_FILE].write_text(json.dumps(split, indent=0, sort_keys=True) + "\n")
            artifacts["split"] = SPLIT_FILE
        manifest = {
            "classes": list(classes),
            "input": {"name": INPUT_NAME, "shape": [None, 3, spec.size, spec.size], "dtype": "float32"},
            "output": {"name": OUTPUT_NAME, "shape": [None, len(classes)], "dtype": "float32"},
            "preprocess": spec.to_manifest(),
            "artifacts": artifacts,
            "model": {"arch": model.arch, "opset": OPSET},
            "training": training or {},
            "metrics": metrics,
            **({"verdict": verdict} if verdict is not None else {}),
        }
        if parent is not None or new_lineage:
            manifest["parent"] = None if new_lineage else parent
        check(should_stop, "before publishing")
        sign = None
        if signing_key is not None:
            from engines.signing import sign_manifest

            sign = lambda data: sign_manifest(data, signing_key)  # noqa: E731
        version = EngineStore(store_dir).publish(files, manifest, make_current=make_current, sign=sign, version=version)
    log.info("published", engine_version=version.name, store=str(store_dir))
    return version


def _logits_distances(outputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    return outputs[0], outputs[1] if len(outputs) > 1 else None


def _inherited_spec(model: Classifier, store_dir: str | os.PathLike, parent: str | None) -> PreprocessSpec:
    """The preprocessing of ``parent`` (default: the store's current version) if it is ``model``'s architecture, else
    the architecture's own."""
    from trainer.models import ARCHS, data_config

    if parent is not None or (Path(store_dir) / "current").exists():
        store = EngineStore(store_dir)
        m = store.read_manifest(parent or store.current())
        if m.get("model", {}).get("arch") == model.arch and "preprocess" in m:
            return PreprocessSpec.from_manifest(m["preprocess"])
    return data_config(model.arch) if model.arch in ARCHS else DEFAULT_SPEC


def load_weights(version: StoreVersion) -> Classifier:
    """Rebuild the torch model of a store version from its verified weights."""
    from trainer.models import build_model

    blob = torch.load(version.artifact("torch"), map_location="cpu", weights_only=True)
    model = build_model(int(blob["num_classes"]), str(blob.get("arch", "Classifier")))
    model.load_state_dict(blob["state_dict"])
    return model.eval()
