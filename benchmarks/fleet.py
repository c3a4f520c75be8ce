"""One trainer, many devices: how long a new engine takes to reach 10, 100 and 1,000 of them, and what it costs the
trainer.

``python -m benchmarks.fleet --devices 10 100 1000 --out benchmarks/results/fleet``

For each N: a real ``edge-trainer serve`` (tcp:// on 127.0.0.1, CURVE, ``[rollout] staged = false``: all at once,
the worst case for the trainer) and N simulated devices (:mod:`benchmarks._simdevice`: each its own CURVE
certificate made by ``trainer.devices.add_device``, the real protocol and checks, nothing kept on disk) in two
processes. Once the trainer lists all N, its CPU and memory are sampled for 10 s idle; then a new version (the
shipped model with a nudged bias, signed by the trainer's key) is published into its store, and the time from
the publish to each device's last verified byte is taken, with the trainer's CPU seconds, peak memory and bytes
sent. Target: 1,000 devices served one engine within 60 s. Writes ``fleet.json`` and ``fleet.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.fleet_daemons import _fleet_of, _idle_sample, _port, _proc_sample
from edge_agent.config_toml import sections_toml

REPO = Path(__file__).resolve().parents[1]
SIM_PROCS = 2


def publish_nudged(store_root: Path, key_path: Path) -> str:
    """A new version of the store's current model (its bias nudged), signed with the key at ``key_path``, as a
    retrain would publish it: what delivery is measured (and tested) with, when learning is not the point."""
    import torch

    from engines.signing import load_key
    from engines.store import EngineStore
    from trainer.publish import load_weights, publish_model

    store = EngineStore(store_root)
    cur = store.open()
    model = load_weights(cur)
    with torch.no_grad():
        model.head.bias.add_(0.01)
    return publish_model(model, cur.classes, store.root, training={"kind": "benchmark"}, signing_key=load_key(key_path)).name


def _lines(paths: list[Path]) -> list[dict]:
    rows = []
    for p in paths:
        if p.exists():
            rows += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return rows


def run(n: int, out: Path, heartbeat_s: float = 2.0, limit_s: float = 600.0) -> dict:
    from trainer.devices import add_device, make_trainer_keys

    work = out / f"work-{n}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    keys, tstate = work / "keys", work / "trainer"
    subprocess.run(
        [sys.executable, "-m", "trainer", "keys", "--out", str(keys), "--state-dir", str(tstate)], cwd=REPO, check=True, capture_output=True
    )
    _, tsecret, _ = make_trainer_keys(keys)
    t0 = time.perf_counter()
    devices = [add_device(keys, f"sim-{i:04d}") for i in range(n)]
    certs_s = time.perf_counter() - t0
    ports = [_port() for _ in range(3)]
    tcfg = work / "trainer.toml"
    tcfg.write_text(
        sections_toml(
            {
                "handoff": {
                    "endpoint": f"tcp://127.0.0.1:{ports[0]}",
                    "announce_endpoint": f"tcp://127.0.0.1:{ports[1]}",
                    "transfer_endpoint": f"tcp://127.0.0.1:{ports[2]}",
                    "heartbeat_s": heartbeat_s,
                    "curve_secret_key": str(tsecret),
                    "curve_authorized_dir": str(keys / "authorized"),
                },
                "rollout": {"staged": False},
                "trainer": {"retrain_threshold": 10**9, "nice": 0},
                "log": {"format": "json"},
            }
        )
    )
    log = open(work / "trainer.log", "w")
    trainer = subprocess.Popen(
        [sys.executable, "-m", "trainer", "--log-format", "json", "serve", "--config", str(tcfg), "--state-dir", str(tstate)],
        cwd=REPO,
        stdout=log,
        stderr=log,
    )
    status = tstate / "trainer" / "status.json"
    sims, outs, specs = [], [], []
    try:
        end = time.monotonic() + 60
        while not status.exists() and time.monotonic() < end:
            time.sleep(0.2)
        from engines.store import EngineStore

        shipped = EngineStore(tstate / "engines").current()
        trusted = (tstate / "trainer" / "signing.pub").read_text().strip()
        for k in range(SIM_PROCS):
            part = devices[k::SIM_PROCS]
            spec = work / f"sim-{k}.json"
            spec.write_text(
                json.dumps(
                    {
                        "endpoint": f"tcp://127.0.0.1:{ports[2]}",
                        "server_key": str(keys / "trainer" / "trainer.key"),
                        "trusted": trusted,
                        "heartbeat_s": heartbeat_s,
                        "version": shipped,
                        "devices": [{"name": d.name, "secret": str(d.secret)} for d in part],
                    }
                )
            )
            specs.append(spec)
            outs.append(work / f"sim-{k}.jsonl")
            sims.append(
                subprocess.Popen(
                    [sys.executable, "-m", "benchmarks._simdevice", "--spec", str(spec), "--out", str(outs[-1])],
                    cwd=REPO,
                    stdout=open(work / f"sim-{k}.log", "w"),
                    stderr=subprocess.STDOUT,
                )
            )

        def fleet() -> list:
            return _fleet_of(status)

        t_connect = time.monotonic()
        while len(fleet()) < n:
            if time.monotonic() - t_connect > limit_s:
                raise SystemExit(f"only {len(fleet())} of {n} devices connected in {limit_s:.0f} s")
            if any(p.poll() is not None for p in [trainer, *sims]):
                raise SystemExit("a process exited while the devices connected")
            time.sleep(0.5)
        connected_s = time.monotonic() - t_connect
        idle_cpu, rss_idle = _idle_sample(trainer.pid)

        peak = [0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], _proc_sample(trainer.pid)[1])
                sampling.wait(0.25)

        threading.Thread(target=sample, daemon=True).start()
        cpu_before, _ = _proc_sample(trainer.pid)
        version = publish_nudged(tstate / "engines", tstate / "trainer" / "signing.key")
        t_pub = time.time()
        while len([r for r in _lines(outs) if r["version"] == version]) < n:
            if time.time() - t_pub > limit_s:
                break
            if any(p.poll() is not None for p in [trainer, *sims]):
                raise SystemExit("a process exited during the delivery")
            time.sleep(0.2)
        cpu_after, _ = _proc_sample(trainer.pid)
        sampling.set()
        done = [r for r in _lines(outs) if r["version"] == version]
        times = sorted(r["done"] - t_pub for r in done)
        served = len([r for r in done if r["ok"]])
        time.sleep(2.5 * heartbeat_s)  # the trainer's status file catches up (written every 2 s)
        st = json.loads(status.read_text())
        wall = max(times) if times else float("nan")
        row = {
            "devices": n,
            "served": served,
            "engine_mib": round(done[0]["bytes"] / 2**20, 2) if done else None,
            "certificates_s": round(certs_s, 2),
            "all_connected_s": round(connected_s, 1),
            "publish_to_all_serving_s": round(wall, 2),
            "median_s": round(statistics.median(times), 2) if times else None,
            "p95_s": round(times[int(0.95 * (len(times) - 1))], 2) if times else None,
            "trainer_idle_cpu_pct": round(idle_cpu, 1),
            "trainer_idle_rss_mb": round(rss_idle / 1e6, 1),
            "trainer_cpu_s_during": round(cpu_after - cpu_before, 1),
            "trainer_peak_rss_mb": round(peak[0] / 1e6, 1),
            "bytes_sent": st.get("transfer", {}).get("bytes"),
            "bytes_received": sum(r["bytes"] for r in done if r["ok"]),
            "gib_sent": round(st.get("transfer", {}).get("bytes", 0) / 2**30, 2),
            "target_met": n < 1000 or (served == n and wall <= 60),
        }
        return row
    finally:
        for spec in specs:
            spec.with_suffix(".stop").touch()
        for p in sims:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        trainer.terminate()
        try:
            trainer.wait(30)
        except subprocess.TimeoutExpired:
            trainer.kill()
        shutil.rmtree(work / "keys", ignore_errors=True)  # secrets: not kept in results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/fleet"))
    ap.add_argument("--heartbeat", type=float, default=2.0, help="[handoff] heartbeat_s of the trainer and the devices")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.devices:
        rows.append(run(n, args.out, args.heartbeat))
        print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(args.out / f"work-{n}", ignore_errors=True)
    (args.out / "fleet.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        f"# One trainer, N devices: a new engine to every device ({os.cpu_count()} CPUs, loopback, tcp:// + CURVE)",
        "",
        f"`python -m benchmarks.fleet --devices {' '.join(map(str, args.devices))}`: a real `edge-trainer serve` and N simulated "
        "devices (the real protocol and checks, two processes); every device at once (`[rollout] staged = false`).",
        "",
        "| devices | engine | publish -> all serving | median / p95 | trainer idle, all connected | trainer during delivery | sent |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['devices']} | {r['engine_mib']} MiB | {r['publish_to_all_serving_s']} s ({r['served']} served) | "
            f"{r['median_s']} / {r['p95_s']} s | {r['trainer_idle_cpu_pct']} % CPU, {r['trainer_idle_rss_mb']} MB | "
            f"{r['trainer_cpu_s_during']} CPU s, peak {r['trainer_peak_rss_mb']} MB | {r['gib_sent']} GiB |"
        )
    (args.out / "fleet.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
