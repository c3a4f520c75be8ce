"""What a photo reduced for the trainer (``[handoff] photo_side``) costs the model's answer, and what it saves.

``python -m benchmarks.handoff_photo --out benchmarks/results/handoff-photo`` turns each field photo (orchard and
corn, 1,382) into a stand-in for a phone photo, because the data holds none larger than 512 px: upscaled to 4032 x 3024
(12 MP, a phone's 4:3) with cubic interpolation, sensor-like noise added (Gaussian, ``--noise`` levels) and saved as
JPEG quality 92. Each stand-in and its reduced copy (:func:`edge_agent.handoff.reduce.reduced`, as the hand-off
sends it) go through :class:`Classifier` as the daemon runs the engine; it reports bytes, the time to reduce, how
often the two answers and verdicts agree, how far the top class's probability moves, and top-1 on each. What it
cannot say: how a real 12 MP photo's fine detail (which an upscaled 256 px photo lacks) fares; the reduction keeps
four times the input side, so detail below that scale is averaged away by preprocessing either way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import cv2
import numpy as np

from benchmarks.field import SHARED, field_sets
from edge_agent._truth import precision_check
from edge_agent.classifier import Classifier
from edge_agent.config import default_store_path, parse_config
from edge_agent.handoff.reduce import reduced
from engines.loader import open_engine
from engines.store import EngineStore

__all__ = ["main", "stand_in"]


def stand_in(path: Path, rng: np.random.Generator, noise: float, size: tuple[int, int] = (4032, 3024)) -> bytes:
    """A phone-sized JPEG made of the photo at ``path`` (see the module)."""
    big = cv2.resize(cv2.imread(str(path)), size, interpolation=cv2.INTER_CUBIC).astype(np.float32)
    big += rng.normal(0, noise, big.shape).astype(np.float32)
    ok, out = cv2.imencode(".jpg", np.clip(big, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 92])
    return out.tobytes()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.handoff_photo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for handoff_photo.json and .md")
    ap.add_argument("--store", default=str(default_store_path()), help="engine store (default: the shipped one)")
    ap.add_argument("--version", default=None)
    ap.add_argument("--field", default=str(SHARED / "field"))
    ap.add_argument("--side", type=int, default=1024, help="[handoff] photo_side")
    ap.add_argument("--noise", type=float, default=4.0, help="sensor noise added to a stand-in (sd, pixel levels)")
    ap.add_argument("--every", type=int, default=1, help="take every n-th field photo")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    version = EngineStore(args.store).open(args.version)
    photos = field_sets(version, SHARED / "plantvillage", Path(args.field))["field"][:: args.every]
    engine = open_engine(args.store, parse_config({}).engine, version.name, check_photos=precision_check)
    engine.wait_checked()
    clf = Classifier.configured(engine, parse_config({}))
    described = engine.describe()
    rng = np.random.default_rng(20261204)
    rows = []
    for path, truth in photos:
        data = stand_in(path, rng, args.noise)
        t0 = time.perf_counter()
        copy, _ext = reduced(data, args.side)
        took = time.perf_counter() - t0
        a, b = clf.predict_bytes(data), clf.predict_bytes(copy)
        other = clf.predict_bytes(stand_in(path, rng, args.noise))  # another shot: the noise drawn again
        rows.append(
            {
                "photo": path.name,
                "truth": truth,
                "bytes": len(data),
                "copy_bytes": len(copy),
                "reduce_ms": round(took * 1000, 1),
                "label": a.label,
                "copy_label": b.label,
                "verdict": a.verdict,
                "copy_verdict": b.verdict,
                "confidence": round(a.confidence, 4),
                "copy_confidence": round(b.confidence, 4),
                "other_label": other.label,
                "other_verdict": other.verdict,
                "other_confidence": round(other.confidence, 4),
            }
        )
    engine.close()
    n = len(rows)
    summary = {
        "version": version.name,
        "engine": described,
        "side": args.side,
        "noise": args.noise,
        "photos": n,
        "mean_bytes": round(float(np.mean([r["bytes"] for r in rows]))),
        "mean_copy_bytes": round(float(np.mean([r["copy_bytes"] for r in rows]))),
        "reduce_ms_median": round(float(np.median([r["reduce_ms"] for r in rows])), 1),
        "same_answer": round(sum(r["label"] == r["copy_label"] for r in rows) / n, 4),
        "same_verdict": round(sum(r["verdict"] == r["copy_verdict"] for r in rows) / n, 4),
        "confidence_moved_mean": round(float(np.mean([abs(r["confidence"] - r["copy_confidence"]) for r in rows])), 4),
        "confidence_moved_max": round(float(max(abs(r["confidence"] - r["copy_confidence"]) for r in rows)), 4),
        "other_same_answer": round(sum(r["label"] == r["other_label"] for r in rows) / n, 4),
        "other_same_verdict": round(sum(r["verdict"] == r["other_verdict"] for r in rows) / n, 4),
        "other_confidence_moved_mean": round(float(np.mean([abs(r["confidence"] - r["other_confidence"]) for r in rows])), 4),
        "top1": round(sum(r["label"] == r["truth"] for r in rows) / n, 4),
        "copy_top1": round(sum(r["copy_label"] == r["truth"] for r in rows) / n, 4),
    }
    (out / "handoff_photo.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    s = summary
    md = [
        "# A photo reduced for the trainer: what it saves and what it moves",
        "",
        f"`python -m benchmarks.handoff_photo {' '.join(argv if argv is not None else sys.argv[1:])}` ({s['photos']} field photos as 12 MP stand-ins, noise sd "
        f"{s['noise']}; {s['version']}, {s['engine'].get('precision', '?')}; `photo_side` = {s['side']})",
        "",
        "| figure | as taken | reduced |",
        "|---|---|---|",
        f"| bytes a photo (mean) | {s['mean_bytes'] / 1e6:.2f} MB | {s['mean_copy_bytes'] / 1e6:.3f} MB |",
        f"| top-1 on the field | {s['top1']:.4f} | {s['copy_top1']:.4f} |",
        "",
        "| against the answer as taken | the reduced copy | another shot (the noise drawn again) |",
        "|---|---|---|",
        f"| the same answer | {s['same_answer']:.2%} | {s['other_same_answer']:.2%} |",
        f"| the same verdict | {s['same_verdict']:.2%} | {s['other_same_verdict']:.2%} |",
        f"| confidence moved (mean) | {s['confidence_moved_mean']:.4f} | {s['other_confidence_moved_mean']:.4f} |",
        "",
        f"- the reduced copy's confidence moved {s['confidence_moved_max']:.4f} at most",
        f"- reducing a photo took {s['reduce_ms_median']} ms (median) on this machine",
        "",
    ]
    (out / "handoff_photo.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
