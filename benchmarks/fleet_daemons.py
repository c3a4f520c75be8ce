"""Engine delivery to a fleet on loopback: one trainer, N daemons, tcp:// with CURVE, signed versions.

``python -m benchmarks.fleet_daemons --daemons 1 10 --out benchmarks/results/fleet``

For each N: a real ``edge-trainer serve`` and N real ``edge-agent run`` processes (their own state directories,
the shipped model, the trainer's key trusted), tcp:// on 127.0.0.1 with CURVE. Once every daemon is in the
trainer's fleet list, the trainer's CPU and memory are sampled for 10 s with all of them connected; then a
retrain is requested (one epoch on the shipped replay photos, gate open: the point is the delivery, not the
model) and the times are taken from the trainer's ``published`` log line to each daemon's ``engine_received``
(the whole version, about 4 MB, verified and installed) and ``engine_swapped`` (serving it). Target: all swapped
within 10 s of the publish. Writes ``fleet.json`` and ``fleet.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from edge_agent.config_toml import sections_toml

REPO = Path(__file__).resolve().parents[1]
QUICK_TRAINER = {
    "epochs": 1,
    "int8": False,
    "calibrate": False,
    "gate_tolerance": 1.0,
    "nice": 0,
    "recheck_pseudo": False,
    "pseudo_only_steps": [1.0],  # one step: no search over the gate photos
    "strategy": {"type": "rehearsal", "per_class": 2},  # a small replay: the delivery is measured, not the learning
}
"""[trainer] keys for a retrain in seconds whose candidate always passes: what is measured is the delivery, not learning."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _events(log: Path, name: str) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if f'"event": "{name}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _ts(rec: dict) -> float:
    return dt.datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()


def _proc_sample(pid: int) -> tuple[float, int]:
    """(CPU seconds so far, RSS bytes) of ``pid`` from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS"))
    return cpu, rss


def _idle_sample(pid: int, seconds: int = 10) -> tuple[float, int]:
    """(CPU %, peak RSS bytes) of ``pid`` over ``seconds``, sampled each second."""
    c0, _ = _proc_sample(pid)
    rss = []
    for _ in range(seconds):
        time.sleep(1.0)
        rss.append(_proc_sample(pid)[1])
    c1, _ = _proc_sample(pid)
    return 100 * (c1 - c0) / seconds, max(rss)


def _fleet_of(status: Path) -> list:
    """The fleet list in a trainer's status file ([] while it cannot be read)."""
    try:
        return json.loads(status.read_text()).get("fleet", [])
    except (OSError, ValueError):
        return []


def _wait(cond, timeout: float, what: str, procs: list) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"a process exited ({p.returncode}) while waiting for {what}")
        if cond():
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def run_fleet(n: int, out: Path) -> dict:
    import zmq.auth

    if out.exists():
        shutil.rmtree(out)
    keys = out / "curve"
    for name in ("trainer", "daemon", "authorized"):
        (keys / name).mkdir(parents=True)
    tpub, tsec = zmq.auth.create_certificates(keys / "trainer", "trainer")
    dpub, dsec = zmq.auth.create_certificates(keys / "daemon", "daemon")
    shutil.copy(dpub, keys / "authorized" / "daemon.key")
    ports = [_port() for _ in range(3)]
    endpoints = {
        "endpoint": f"tcp://127.0.0.1:{ports[0]}",
        "announce_endpoint": f"tcp://127.0.0.1:{ports[1]}",
        "transfer_endpoint": f"tcp://127.0.0.1:{ports[2]}",
        "heartbeat_s": 1.0,
    }
    tstate = out / "trainer"
    key = (
        subprocess.run(
            [sys.executable, "-m", "trainer", "keys", "--out", str(out / "keys"), "--state-dir", str(tstate)],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=True,
        )
        .stdout.split("file:")[1]
        .split()[0]
    )
    tcfg = out / "trainer.toml"
    tcfg.write_text(
        sections_toml(
            {
                "log": {"format": "json"},
                "handoff": {**endpoints, "curve_secret_key": str(tsec), "curve_authorized_dir": str(keys / "authorized")},
                "trainer": {**QUICK_TRAINER, "retrain_threshold": 10**6},
            }
        )
    )
    procs, logs = [], []
    tlog = out / "trainer.log"
    trainer = subprocess.Popen(
        [sys.executable, "-m", "trainer", "--log-format", "json", "serve", "--config", str(tcfg), "--state-dir", str(tstate)],
        stdout=open(tlog, "w"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    procs.append(trainer)
    try:
        for i in range(n):
            dstate = out / f"device-{i:02d}"
            cfg = out / f"device-{i:02d}.toml"
            cfg.write_text(
                sections_toml(
                    {
                        "log": {"format": "json"},
                        "hotswap": {"poll_s": 1.0},
                        "handoff": {**endpoints, "curve_secret_key": str(dsec), "curve_server_key": str(tpub), "name": f"device-{i:02d}"},
                        "store": {"trusted_keys": [key]},
                    }
                )
            )
            log = out / f"device-{i:02d}.log"
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "edge_agent", "run", "--config", str(cfg), "--state-dir", str(dstate)],
                    stdout=open(log, "w"),
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                )
            )
            logs.append(log)
        status = tstate / "trainer" / "status.json"

        def fleet() -> list:
            return _fleet_of(status)

        _wait(lambda: len(fleet()) == n, 120, f"{n} daemons in the fleet list", procs)
        cpu, rss = _idle_sample(trainer.pid)
        idle = {"cpu_percent": round(cpu, 1), "rss_mb": round(rss / 2**20, 1)}
        (tstate / "trainer" / "retrain.request").touch()
        _wait(lambda: _events(tlog, "published"), 600, "the retrain's publish", procs)
        published = _ts(_events(tlog, "published")[0])
        cpu_a, _ = _proc_sample(trainer.pid)
        t_a = time.time()
        _wait(lambda: all(_events(log, "engine_swapped") for log in logs), 120, "every daemon swapped", procs)
        cpu_b, rss_b = _proc_sample(trainer.pid)
        received = [_ts(_events(log, "engine_received")[0]) - published for log in logs]
        swapped = [_ts(_events(log, "engine_swapped")[0]) - published for log in logs]
        version = _events(tlog, "published")[0]["engine_version"]
        size = sum(m["bytes"] for m in json.loads((tstate / "engines" / version / "manifest.json").read_text())["files"].values())
        return {
            "daemons": n,
            "engine_bytes": size,
            "idle_with_all_connected": idle,
            "received_s": {"median": round(sorted(received)[len(received) // 2], 2), "max": round(max(received), 2)},
            "swapped_s": {"median": round(sorted(swapped)[len(swapped) // 2], 2), "max": round(max(swapped), 2)},
            "trainer_during_delivery": {
                "cpu_seconds": round(cpu_b - cpu_a, 2),
                "window_s": round(time.time() - t_a, 1),
                "rss_mb": round(rss_b / 2**20, 1),
            },
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fleet_daemons", description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemons", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/fleet"))
    ap.add_argument("--work", default="/tmp/edge-fleet-bench")
    args = ap.parse_args(argv)
    rows = []
    for n in args.daemons:
        rows.append(run_fleet(n, Path(args.work) / f"n{n}"))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "daemons.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        f"# Engine delivery to a fleet on loopback ({os.cpu_count()} CPUs, tcp:// + CURVE, one machine)",
        "",
        "`python -m benchmarks.fleet_daemons --daemons " + " ".join(map(str, args.daemons)) + "`: times from the trainer's "
        "`published` to each daemon's `engine_received` (verified, installed) and `engine_swapped` (serving).",
        "",
        "| daemons | engine | received (median / max) | swapped (median / max) | trainer idle, all connected | trainer during delivery |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["trainer_during_delivery"]
        lines.append(
            f"| {r['daemons']} | {r['engine_bytes'] / 2**20:.1f} MiB | {r['received_s']['median']} / {r['received_s']['max']} s | "
            f"{r['swapped_s']['median']} / {r['swapped_s']['max']} s | {r['idle_with_all_connected']['cpu_percent']} % CPU, "
            f"{r['idle_with_all_connected']['rss_mb']} MB RSS | {d['cpu_seconds']} CPU s in {d['window_s']} s, {d['rss_mb']} MB RSS |"
        )
    (out / "daemons.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
