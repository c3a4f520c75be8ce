"""End-to-end daemon benchmark, beside engine-only and engine+decode throughput in the same run.

``python -m benchmarks.daemon [--photos N] [--data DIR]``

* engine only: batches of ``max_batch`` preprocessed photos through the engine;
* engine + decode: read + preprocess (the daemon's decode-worker count in threads) + infer;
* end to end: the real daemon process; N photos renamed into its inbox at once;
  sustained rate = photos / (last result - first result), plus drop-to-result latency;
* start-to-READY (sd_notify READY=1 on a socket we read) over several starts, and steady RSS;
* a version's first start on a machine (an empty cache): start to READY=1, and to the end of the background check
  that times INT8 against FP32 and compares their answers (its ``engine_precision_checked`` log line).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from edge_agent.config import default_store_path
from edge_agent.preprocess import PreprocessSpec, preprocess_bytes, preprocess_file
from edge_agent.results import query_readonly
from engines.loader import open_engine
from engines.store import EngineStore

REPO = Path(__file__).resolve().parents[1]


def _spec() -> PreprocessSpec:
    """The served version's preprocessing (its manifest's), as the daemon applies it."""
    return PreprocessSpec.from_manifest(EngineStore(default_store_path()).open().manifest["preprocess"])


def engine_only(photos: list[Path], batch: int, engine_cfg) -> float:
    spec = _spec()
    x = np.stack([preprocess_file(p, spec) for p in photos])
    with open_engine(default_store_path(), engine_cfg) as engine:
        engine.infer(x[:batch])
        t0 = time.perf_counter()
        for i in range(0, len(x), batch):
            engine.infer(x[i : i + batch])
        return len(x) / (time.perf_counter() - t0)


def engine_decode(photos: list[Path], batch: int, workers: int, engine_cfg, overlapped: bool = False) -> float:
    """Read + preprocess in ``workers`` threads, infer in batches. In lock-step (default) a batch is decoded,
    then inferred; ``overlapped`` lets the workers decode ahead while the engine runs, as the daemon does."""
    spec = _spec()
    with open_engine(default_store_path(), engine_cfg) as engine, ThreadPoolExecutor(workers) as pool:
        engine.infer(np.stack([preprocess_file(photos[0], spec)]))
        t0 = time.perf_counter()
        if overlapped:
            decoded = pool.map(lambda p: preprocess_bytes(p.read_bytes(), spec), photos)
            for i in range(0, len(photos), batch):
                engine.infer(np.stack([next(decoded) for _ in photos[i : i + batch]]))
        else:
            for i in range(0, len(photos), batch):
                xs = list(pool.map(lambda p: preprocess_bytes(p.read_bytes(), spec), photos[i : i + batch]))
                engine.infer(np.stack(xs))
        return len(photos) / (time.perf_counter() - t0)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds so far per kernel thread name (digits dropped: decode-0 and decode-1 are "decode"); threads
    without a name of their own (the main thread, ONNX Runtime's pool) are "main+onnxruntime"."""
    hz = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        name = name.rstrip("0123456789").rstrip("-") or name
        if name.startswith("python"):
            name = "main+onnxruntime"
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / hz
    return out


def compile_bytecode(repo: Path = REPO) -> None:
    """The package's bytecode, as `pip install` leaves it and a checkout's first start writes it (unless
    PYTHONDONTWRITEBYTECODE is set, as on the development machine): without it every start compiles ~40 modules."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "edge_agent", "engines"], cwd=repo, check=True, stdout=subprocess.DEVNULL)


def _start(
    state: Path, config: Path, notify: Path, repo: Path = REPO, env: dict | None = None, log: Path | None = None
) -> tuple[subprocess.Popen, float]:
    """The daemon of the checkout ``repo`` started on ``state``, and the seconds from exec to its READY=1
    (``env`` added to its environment; its log written to ``log`` where given, else dropped)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.settimeout(30)
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - the child holds it; closed below
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "run", "--config", str(config), "--state-dir", str(state)],
        env={**os.environ, **(env or {}), "NOTIFY_SOCKET": str(notify)},
        stdout=out,
        stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
        cwd=repo,
    )
    if log:
        out.close()
    try:
        while b"READY=1" not in sock.recv(4096):
            pass
    finally:
        sock.close()
        notify.unlink()
    return proc, time.perf_counter() - t0


def _write_config(work: Path, extra: dict | None, tail: str = "") -> Path:
    """``[section] key = value`` from ``extra``'s ``"section.key"``, then ``tail`` (TOML, e.g. ``[[webhooks]]``)."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "bench.toml"
    sections = {"inbox": {"settle_s": "0.5"}, "log": {"format": '"json"'}}  # the default level (info): a log line per photo
    for key, value in (extra or {}).items():
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = value
    config.write_text("".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items()) for s, kv in sections.items()) + tail)
    return config


def start_to_ready(work: Path, starts: int = 5, extra: dict | None = None, restart: bool = False) -> list[float]:
    """Seconds from exec to READY=1 for ``starts`` fresh state directories (the first start seeds the shipped store
    into each), or with ``restart`` for ``starts`` restarts on one state directory seeded beforehand."""
    config = _write_config(work, extra)
    ready = []
    if restart:
        proc, _ = _start(work / "again", config, work / "n.sock")
        proc.terminate()
        proc.wait(30)
    for i in range(starts):
        proc, t = _start(work / ("again" if restart else f"s{i}"), config, work / "n.sock")
        ready.append(t)
        proc.terminate()
        proc.wait(30)
    return ready


def first_start(work: Path, starts: int = 3, extra: dict | None = None, limit_s: float = 600) -> list[tuple[float, float | None]]:
    """A version's first start on a machine, ``starts`` times (each a fresh state directory and an empty cache):
    seconds from exec to READY=1 and to the daemon's ``engine_precision_checked`` (None where it never logs one:
    an engine with no INT8 check, or none within ``limit_s``)."""
    config = _write_config(work, extra)
    out = []
    for i in range(starts):
        log = work / f"first{i}.log"
        t0 = time.perf_counter()
        proc, ready = _start(work / f"first{i}", config, work / "n.sock", env={"XDG_CACHE_HOME": str(work / f"cache{i}")}, log=log)
        checked = None
        while time.perf_counter() - t0 < limit_s and proc.poll() is None:
            if b'"engine_precision_checked"' in log.read_bytes():
                checked = time.perf_counter() - t0
                break
            time.sleep(0.1)
        proc.terminate()
        proc.wait(30)
        out.append((ready, checked))
    return out


def end_to_end(photos: list[Path], work: Path, extra: dict | None = None, tail: str = "") -> dict:
    """One daemon run: ``photos`` renamed into its inbox at once; throughput, latency and RSS."""
    config = _write_config(work, extra, tail)
    state = work / "run"
    proc, _ = _start(state, config, work / "n.sock")
    ready = time.monotonic()
    staging = work / "staging"  # outside the watched inbox (same filesystem): copying it costs the daemon nothing
    staging.mkdir(parents=True)
    for i, p in enumerate(photos):
        shutil.copy(p, staging / f"{i:05d}.jpg")
    time.sleep(max(0.0, ready + 2.5 - time.monotonic()))  # idle: past [pipeline] idle_trim_s (1 s) after start-up
    rss_idle = _rss_mb(proc.pid)
    cpu_before = _thread_cpu_s(proc.pid)
    dropped = time.time()
    for f in sorted(staging.iterdir()):
        os.rename(f, state / "inbox" / f.name)
    db = state / "results.sqlite"
    peak = rss_idle
    while True:
        time.sleep(0.2)
        peak = max(peak, _rss_mb(proc.pid))
        if (query_readonly(db, "SELECT COUNT(*) FROM results") or [(0,)])[0][0] >= len(photos):
            created = sorted(r[0] for r in query_readonly(db, "SELECT created FROM results"))
            cpu_after = _thread_cpu_s(proc.pid)
            break
    time.sleep(2.0)
    rss_steady = _rss_mb(proc.pid)
    proc.terminate()
    proc.wait(30)
    lat = [(c - dropped) * 1000 for c in created]
    return {
        "end_to_end_photos_per_s": len(photos) / (created[-1] - created[0]),
        "drop_to_result_ms_p50": statistics.median(lat),
        "drop_to_result_ms_p99": lat[int(len(lat) * 0.99) - 1],
        "rss_mb_idle": rss_idle,
        "rss_mb_steady": rss_steady,
        "rss_mb_peak": peak,
        "cpu_ms_per_photo": {k: (v - cpu_before.get(k, 0.0)) * 1000 / len(photos) for k, v in cpu_after.items()},
    }


def season_restarts(work: Path, rows: int, starts: int = 3, extra: dict | None = None) -> tuple[list[float], list[float]]:
    """Seconds from exec to READY=1 of ``starts`` restarts on a state directory whose ledger holds ``rows`` results (a
    season: 1,000 a day), closed whole by the daemon before each, and of ``starts`` more where it changed since (its
    record of the last close removed, as a power cut or a copy leaves it): the start then reads it whole for damage."""
    from edge_agent._ledger_file import CLOSED
    from edge_agent.ledger_rows import ResultRow
    from edge_agent.results import ResultsDB

    config = _write_config(work, extra)
    state = work / "season"
    proc, _ = _start(state, config, work / "n.sock")
    proc.terminate()
    proc.wait(30)
    db = ResultsDB(state / "results.sqlite")
    top = [["Apple___Apple_scab", 0.9], ["Apple___healthy", 0.05], ["Apple___Black_rot", 0.05]]
    for start in range(0, rows, 5000):
        db.commit(
            [
                ResultRow(
                    f"{i:064x}", f"{i:016x}", f"/inbox/p{i}.jpg", "folder", top[0][0], 0.9, top, "v4000", {"total": 5.0}, verdict="unsure"
                )
                for i in range(start, min(rows, start + 5000))
            ]
        )
    db.close()
    (state / "processed" / "2026-01-01").mkdir(parents=True, exist_ok=True)
    (state / "processed" / "2026-01-01" / "x.jpg").write_bytes(b"a photo processed: the ledger is expected to hold results")
    clean, changed = [], []
    for out in [clean] * starts + [changed] * starts:
        if out is changed:
            Path(f"{state}/results.sqlite{CLOSED}").unlink(missing_ok=True)
        proc, t = _start(state, config, work / "n.sock")
        out.append(t)
        proc.terminate()
        proc.wait(30)
    return clean, changed


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.daemon")
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/plantvillage"))
    ap.add_argument("--photos", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5, help="end-to-end runs; the table gives medians and every run")
    ap.add_argument("--first-starts", type=int, default=3, help="a version's first starts on an empty cache (0: none)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="daemon config override (TOML value)")
    ap.add_argument("--season-ledger", type=int, default=0, metavar="N", help="also restarts with a ledger of N results (0: none)")
    args = ap.parse_args()
    from benchmarks._sets import config_sets
    from edge_agent.config import parse_config

    cfg = parse_config(config_sets(args.set))  # first: a malformed --set is refused with what to write
    extra = dict(item.split("=", 1) for item in args.set)  # as written, for the daemon's configuration file
    photos = sorted(Path(args.data).rglob("*.jpg"))[: args.photos]
    batch, workers = cfg.pipeline.max_batch, cfg.pipeline.decode_workers
    rows = []
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="edge-bench-") as tmp:
        ready = start_to_ready(Path(tmp), extra=extra)
        first = first_start(Path(tmp) / "first", args.first_starts, extra=extra) if args.first_starts else []
        season = season_restarts(Path(tmp) / "season", args.season_ledger, extra=extra) if args.season_ledger else None
        for i in range(args.runs):  # each run measures its own engine-only and engine+decode beside the daemon
            eng = engine_only(photos, batch, cfg.engine)
            dec = engine_decode(photos, batch, workers, cfg.engine)
            over = engine_decode(photos, batch, workers, cfg.engine, overlapped=True)
            work = Path(tmp) / f"run{i}"
            work.mkdir()
            e2e = end_to_end(photos, work, extra=extra)
            rows.append(
                {
                    "engine": eng,
                    "decode": dec,
                    "overlapped": over,
                    **e2e,
                    "ratio": e2e["end_to_end_photos_per_s"] / dec,
                    "ratio_overlapped": e2e["end_to_end_photos_per_s"] / over,
                }
            )
            print(f"run {i + 1}/{args.runs}: ratio {rows[-1]['ratio']:.2f}", file=sys.stderr)

    def med(key: str, digits: int | None = None) -> str:
        digits = digits if digits is not None else 2 if key.startswith("ratio") else 0
        values = [r[key] for r in rows]
        return f"{statistics.median(values):.{digits}f} [" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"

    with open_engine(EngineStore(default_store_path()), cfg.engine) as engine:
        running = f"{engine.type} {engine.provider} {engine.precision.upper()}"
        why = engine.describe().get("precision_reason", "")
    print(
        f"machine: {os.cpu_count()} CPUs; {len(photos)} real photos; batch {batch}, {workers} decode workers; "
        f"{running}{f' ({why})' if why else ''}; overrides {extra or 'none'}; median of {args.runs} runs [each run]"
    )
    print("| measure | value |")
    print("|---|---|")
    print(f"| engine only (photos/s) | {med('engine')} |")
    print(f"| engine + decode, lock-step: decode a batch, then infer it (photos/s) | {med('decode')} |")
    print(f"| engine + decode, overlapped: workers decode ahead while the engine runs (photos/s) | {med('overlapped')} |")
    print(f"| end to end, daemon sustained (photos/s) | {med('end_to_end_photos_per_s')} |")
    print(f"| **end to end / (engine + decode, lock-step)** | {med('ratio')} |")
    print(f"| end to end / (engine + decode, overlapped) | {med('ratio_overlapped')} |")
    print(f"| drop-to-result p50 (ms, {len(photos)} dropped at once) | {med('drop_to_result_ms_p50')} |")
    print(f"| drop-to-result p99 (ms) | {med('drop_to_result_ms_p99')} |")
    print(
        f"| start to READY=1 (s), median of {len(ready)} fresh state directories, bytecode compiled | "
        f"{statistics.median(ready):.3f} {[round(r, 3) for r in ready]} |"
    )
    if first:
        print(
            f"| a version's first start, empty cache: start to READY=1 (s), median of {len(first)} | "
            f"{statistics.median(r for r, _ in first):.3f} {[round(r, 3) for r, _ in first]} |"
        )
        checked = [c for _, c in first if c is not None]
        print(
            "| - and to the end of the INT8 check (FP32 serving meanwhile) (s) | "
            + (f"{statistics.median(checked):.1f} {[round(c, 1) for c in checked]} |" if checked else "no check logged |")
        )
    if season:
        for said, values in zip(("closed whole by the daemon", "changed since, read whole for damage"), season):
            print(
                f"| a restart with a ledger of {args.season_ledger:,} results, {said}: start to READY=1 (s), median of "
                f"{len(values)} | {statistics.median(values):.3f} {[round(v, 3) for v in values]} |"
            )
    print(f"| RSS idle (MB) | {med('rss_mb_idle')} |")
    print(f"| RSS steady, 2 s after the burst (MB) | {med('rss_mb_steady')} |")
    print(f"| RSS peak during the burst (MB) | {med('rss_mb_peak')} |")
    names = sorted(
        {k for r in rows for k in r["cpu_ms_per_photo"]}, key=lambda k: -statistics.median(r["cpu_ms_per_photo"].get(k, 0) for r in rows)
    )
    for r in rows:
        r["cpu_total"] = sum(r["cpu_ms_per_photo"].values())
        for k in names:
            r[f"cpu {k}"] = r["cpu_ms_per_photo"].get(k, 0.0)
    print(f"| daemon CPU per photo, all threads (ms) | {med('cpu_total', 2)} |")
    for k in names:
        print(f"| - of which {k} (ms) | {med(f'cpu {k}', 2)} |")


if __name__ == "__main__":
    main()
