"""The learning loop as a new user meets it: no configuration file, a fresh state directory, real photos.

``python -m benchmarks.out_of_box --out DIR [--photos 300] [--seed 0]``

Starts ``edge-agent run --state-dir DIR/state`` and ``edge-trainer serve --state-dir DIR/state`` (nothing else:
the defaults, the shipped model and its shipped gate and replay photos), copies ``--photos`` real PlantVillage
photos into the inbox (never the shipped gate or replay photos, nor the shipped model's validation split, which is
kept to judge the outcome), and waits for a second engine version to answer photos. It reports the time from the
first photo to the new engine, the time from the retrain being due to the daemon swapping to the new engine
(one cycle), the gate's decision, and both versions' top-1 on the 184 photos neither trained on (the shipped
model's validation split: it picked the shipped checkpoint, so if anything it favours v0001). Writes
``DIR/out_of_box.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _events(log: Path, name: str) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == name:
            out.append(rec)
    return out


def _ts(rec: dict) -> float:
    return dt.datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()


def held_out_split(data: str) -> list:
    """The shipped model's split of ``data`` (train, test, val): its val photos are ones no version of the
    out-of-box loop trained on (the shipped gate photos are its test split)."""
    from edge_agent.config import default_store_path
    from engines.store import EngineStore
    from trainer.data import scan_folder, stratified_split

    split = EngineStore(default_store_path()).open(verify=False).manifest["training"]["split"]
    parts = stratified_split(scan_folder(data).samples, {"test": split["test_fraction"], "val": split["val_fraction"]}, split["seed"])
    return parts


def held_out_top1(store, versions: list[str], held_out: list) -> dict:
    """``held_out_top1_<version>`` for each version of ``store`` on the ``held_out`` samples, with the default engine
    (what a user gets: INT8 where the version's INT8 variant qualifies)."""
    import numpy as np

    from edge_agent.classifier import Classifier
    from edge_agent.config import default_store_path, parse_config
    from edge_agent.preprocess import preprocess_file
    from engines.loader import open_engine
    from engines.store import EngineStore

    x = np.stack([preprocess_file(s.path) for s in held_out])
    names = EngineStore(default_store_path()).open(verify=False).classes
    truth = [names[s.label] for s in held_out]
    out = {}
    for version in versions:
        clf = Classifier(open_engine(store, parse_config({}).engine, version), top_k=1)
        preds = clf.predict_tensors(x)
        out[f"held_out_top1_{version}"] = round(sum(p.label == t for p, t in zip(preds, truth)) / len(truth), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.out_of_box", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/plantvillage"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--photos", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0, help="which photos are dropped (a different sample per seed)")
    ap.add_argument("--config", help="a configuration for both processes (default: none, as a new user)")
    ap.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds (the target is 15 minutes)")
    args = ap.parse_args(argv)

    from edge_agent.config import default_data_path
    from engines.store import EngineStore

    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists: give a new folder")
    state = out / "state"
    (state / "inbox").mkdir(parents=True)
    shipped = {f["sha256"] for f in json.loads((default_data_path() / "manifest.json").read_text())["files"]}
    parts = held_out_split(args.data)
    held_out = parts["val"]
    pool = [s.path for s in parts["train"] if hashlib.sha256(Path(s.path).read_bytes()).hexdigest() not in shipped]
    random.Random(args.seed).shuffle(pool)
    photos = pool[: args.photos]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("EDGE_AGENT_CONFIG", None)
    if args.config:
        env["EDGE_AGENT_CONFIG"] = str(Path(args.config).resolve())
    logs = {name: out / f"{name}.log" for name in ("daemon", "trainer")}
    procs = {
        "daemon": subprocess.Popen(
            [sys.executable, "-m", "edge_agent", "run", "--state-dir", str(state)],
            stdout=open(logs["daemon"], "w"),
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
        ),
        "trainer": subprocess.Popen(
            [sys.executable, "-m", "trainer", "--log-format", "json", "serve", "--state-dir", str(state)],
            stdout=open(logs["trainer"], "w"),
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
        ),
    }
    store = EngineStore(state / "engines")
    report: dict = {"photos": len(photos), "seed": args.seed, "machine": f"{os.cpu_count()} CPUs", "config": args.config}
    try:
        while not (state / "status.json").exists():
            time.sleep(0.2)
        t0 = time.time()
        staging = state / "inbox" / ".staging"
        staging.mkdir()
        for i, p in enumerate(photos):
            shutil.copy(p, staging / f"{i:04d}.jpg")
            os.rename(staging / f"{i:04d}.jpg", state / "inbox" / f"{i:04d}.jpg")
        while not _events(logs["daemon"], "engine_swapped"):
            if time.time() - t0 > args.timeout:
                report["error"] = f"no new engine within {args.timeout:.0f} s"
                break
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise SystemExit(f"the {name} exited ({proc.returncode}); see {logs[name]}")
            time.sleep(1.0)
        due, published, swapped = (
            _events(logs["trainer"], "retrain_due"),
            _events(logs["trainer"], "gate"),
            _events(logs["daemon"], "engine_swapped"),
        )
        report["gate"] = [{k: g.get(k) for k in ("publish", "reason", "candidate_top1", "current_top1", "root_top1")} for g in published]
        if swapped:
            report["seconds_to_new_engine"] = round(_ts(swapped[0]) - t0, 1)
            report["cycle_seconds"] = round(_ts(swapped[0]) - _ts(due[-1]), 1)
            report["new_engine"] = swapped[0]["engine_version"]
            for i, p in enumerate(held_out[:5]):  # a few more photos: answered by the new engine?
                shutil.copy(p.path, staging / f"after{i}.jpg")
                os.rename(staging / f"after{i}.jpg", state / "inbox" / f"after{i}.jpg")
            time.sleep(8.0)
            rows = subprocess.run(
                [sys.executable, "-m", "edge_agent", "results", "--state-dir", str(state), "--json"],
                capture_output=True,
                text=True,
                cwd=REPO,
                env=env,
            ).stdout.splitlines()
            results = [json.loads(r) for r in rows if r.strip()]
            report["results_by_engine"] = {
                v: sum(1 for r in results if r["engine_version"] == v) for v in sorted({r["engine_version"] for r in results})
            }
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(60)
    if "new_engine" in report:
        report.update(held_out_top1(store, ["v0001", report["new_engine"]], held_out))
        report["held_out_photos"] = len(held_out)
    (out / "out_of_box.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if "new_engine" in report else 1


if __name__ == "__main__":
    sys.exit(main())
