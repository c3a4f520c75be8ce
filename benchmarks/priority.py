"""Inference first: the daemon's inference latency while a retrain runs, against idle.

``python -m benchmarks.priority [--data DIR] [--seconds N]``

Inference: the shipped engine on real preprocessed photos, batch 1, one request every
20 ms (a camera/hot-folder pace), for ``--seconds`` idle, then again while
``edge-trainer retrain`` (niced, thread-capped as configured) trains on real photos.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from edge_agent.config import AppConfig, default_store_path
from edge_agent.preprocess import preprocess_file
from engines.loader import open_engine

REPO = Path(__file__).resolve().parents[1]


def latencies(engine, xs: np.ndarray, seconds: float, until=None) -> list[float]:
    out, end, i = [], time.monotonic() + seconds, 0
    while time.monotonic() < end and (until is None or until()):
        t0 = time.perf_counter()
        engine.infer(xs[i % len(xs)][None])
        out.append((time.perf_counter() - t0) * 1000)
        i += 1
        time.sleep(0.02)
    return out


def summary(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.priority")
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/plantvillage"))
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    data = Path(args.data)
    photos = sorted(data.rglob("*.jpg"))
    xs = np.stack([preprocess_file(p) for p in photos[::50]])
    with tempfile.TemporaryDirectory(prefix="edge-prio-") as tmp:
        tmp = Path(tmp)
        labelled = tmp / "labelled"
        for cls in sorted(d for d in data.iterdir() if d.is_dir()):
            (labelled / cls.name).mkdir(parents=True)
            for p in sorted(cls.glob("*.jpg"))[:20]:
                shutil.copy(p, labelled / cls.name / p.name)
        state = tmp / "state"
        sys.path.insert(0, str(REPO))
        from trainer.samples import SampleStore

        samples = SampleStore(state / "trainer")
        for p in photos[1::9][:150]:
            raw = p.read_bytes()
            samples.add(
                {
                    "id": hashlib.sha256(raw).hexdigest(),
                    "kind": "pseudo",
                    "label": p.parent.name,
                    "confidence": 0.95,
                    "engine_version": "v0001",
                    "ext": ".jpg",
                },
                raw,
            )
        samples.close()
        cfg = tmp / "c.toml"
        cfg.write_text(f'[trainer]\nlabelled_data = "{labelled}"\nepochs = 50\nint8 = false\n[log]\nlevel = "warning"\n')
        with open_engine(default_store_path(), AppConfig().engine) as engine:
            for _ in range(20):
                engine.infer(xs[:1])
            idle = latencies(engine, xs, args.seconds)
            proc = subprocess.Popen(
                [sys.executable, "-m", "trainer", "retrain", "--config", str(cfg), "--state-dir", str(state)],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(8.0)  # past data loading: into the training epochs
            busy = latencies(engine, xs, args.seconds, until=lambda: proc.poll() is None)
            proc.kill()
            proc.wait()
    i, b = summary(idle), summary(busy)
    cfgd = AppConfig().trainer
    print(f"trainer: nice +{cfgd.nice}, {cfgd.threads} threads; inference: ONNX Runtime CPU FP32, batch 1 every 20 ms")
    print("| inference | requests | p50 ms | p99 ms |")
    print("|---|---|---|---|")
    print(f"| idle | {i['n']} | {i['p50_ms']} | {i['p99_ms']} |")
    print(f"| during a retrain | {b['n']} | {b['p50_ms']} | {b['p99_ms']} |")
    print(f"| p99 ratio | | | {b['p99_ms'] / i['p99_ms']:.2f}x |")


if __name__ == "__main__":
    main()
