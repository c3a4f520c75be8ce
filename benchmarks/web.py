"""The web page's footprint: idle RSS, and the recent-photos page (and the Map) with 10,000 results stored.

``python -m benchmarks.web [--results 10000] [--out benchmarks/results/web]``

A state directory gets N results and a full review pool of 2000 (synthetic rows, then the shipped gate photos as the newest, real files in
``processed/``: the page's HTML cost depends on the rows, not on the pixels). ``edge-agent web`` runs as
its own process; each page is fetched repeatedly over loopback (client-side wall time, sequential). RSS is
read from /proc: idle after start, after the pages, after the first page's 48 thumbnails were made, and
idle again. Then the daemon's start-to-READY and idle RSS, the figures the page must not change.
Writes ``web.json`` and ``web.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GATE = REPO / "edge_agent" / "default_data" / "gate"


def fill_state(state: Path, n: int) -> None:
    from edge_agent.ledger_rows import QueueEntry, ResultRow
    from edge_agent.results import ResultsDB
    from edge_agent.state import StateLayout

    layout = StateLayout(state)
    layout.create()
    day = state / "processed" / time.strftime("%Y-%m-%d")
    day.mkdir(parents=True, exist_ok=True)
    db = ResultsDB(layout.db)
    rows, now = [], time.time()
    photos = sorted(GATE.glob("*/*.jpg"))
    first_real = max(0, n - len(photos))  # the real photos are the newest: the first pages show them
    for i in range(n):
        if i >= first_real:
            src = photos[i - first_real]
            shutil.copy(src, day / src.name)
            sha, label, path = (hashlib.sha256(src.read_bytes()).hexdigest(), src.parent.name, str(state / "inbox" / src.name))
        else:
            sha, label, path = (hashlib.sha256(f"synthetic-{i}".encode()).hexdigest(), photos[i % len(photos)].parent.name, None)
        top_k = (
            [[label, 0.95], ["Apple___healthy", 0.03], ["Tomato___healthy", 0.02]]
            if i >= 2000
            else [[label, 0.5], ["Apple___healthy", 0.3 + i * 1e-4], ["Tomato___healthy", 0.1]]
        )  # the review pool's
        lat, lon = 47.3978 + (i // 40 % 50) * 4.5e-5, 8.5472 + (i % 40) * 5.3e-5  # a 200 m by 160 m orchard, 2,000 trees
        rows.append(
            ResultRow(
                sha,
                sha[:16],
                path,
                "folder",
                label,
                0.95,
                top_k,
                "v0001",
                {"total": 9.0},
                now - (n - i) * 30,
                None,
                None,
                None,
                None,
                lat,
                lon,
            )
        )  # one every 30 s: 10,000 span three and a half days, each with a GPS position
    # and a full review pool ([labels] review_pool, 2000): every page counts it for the Review badge
    queued = [
        QueueEntry(r.sha256, r.photo_id, "review", r.label, 0.5, "v0001", str(state / "queue" / "review" / "x.jpg"), 1000)
        for r in rows[:2000]
    ]
    db.commit(rows, queued)
    db.close()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(client, url: str, repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, (url, r.status_code)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
        "max_ms": round(times[-1], 1),
        "bytes": len(r.content),
        "repeats": repeats,
    }


def measure_web(state: Path, repeats: int) -> dict:
    import httpx

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "web", "--state-dir", str(state), "--port", str(port), "--log-level", "warning"], cwd=REPO
    )
    try:
        t0 = time.perf_counter()
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert proc.poll() is None, "web page exited"
                time.sleep(0.05)
        out = {"start_to_listening_s": round(time.perf_counter() - t0, 2)}
        time.sleep(2)
        out["rss_idle_after_start_mb"] = _rss_mb(proc.pid)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        label = sorted(p.name for p in GATE.iterdir())[0]
        out["pages"] = {
            "/photos (first page, 48 of all)": _timed(client, "/photos", repeats),
            "/photos?page=150 (deep page)": _timed(client, "/photos?page=150", repeats),
            f"/photos?label={label}": _timed(client, f"/photos?label={label}", repeats),
            "/photos?near=... (15 m of a tree)": _timed(client, "/photos?near=47.3990,8.5480", repeats),
            "/map (the newest 2,000 of 10,000 with a place)": _timed(client, "/map", max(5, repeats // 5)),
            "/classes (every class's season)": _timed(client, "/classes", max(5, repeats // 5)),
            f"/classes/{label}": _timed(client, f"/classes/{label}", max(5, repeats // 5)),
            "/health": _timed(client, "/health", max(5, repeats // 5)),
            "/engines": _timed(client, "/engines", max(5, repeats // 5)),
            "/review": _timed(client, "/review", max(5, repeats // 5)),
        }
        out["rss_after_pages_mb"] = _rss_mb(proc.pid)
        first = client.get("/photos").text
        shas = [part.split('"')[0] for part in first.split('src="/img/thumb/')[1:]]
        t0 = time.perf_counter()
        made = sum(client.get(f"/img/thumb/{s}").status_code == 200 for s in shas)
        out["thumbnails"] = {"asked": len(shas), "made": made, "first_time_total_s": round(time.perf_counter() - t0, 2)}
        t0 = time.perf_counter()
        for s in shas:
            client.get(f"/img/thumb/{s}")
        out["thumbnails"]["cached_total_s"] = round(time.perf_counter() - t0, 3)
        out["rss_after_thumbnails_mb"] = _rss_mb(proc.pid)
        time.sleep(5)
        out["rss_idle_after_use_mb"] = _rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(15)
    return out


def measure_daemon(work: Path) -> dict:
    from benchmarks.daemon import _rss_mb as rss
    from benchmarks.daemon import _start, _write_config

    config = _write_config(work, None)
    ready, idle = [], []
    for i in range(5):
        proc, t = _start(work / f"d{i}", config, work / "n.sock")
        ready.append(round(t, 3))
        time.sleep(2)
        idle.append(round(rss(proc.pid)))
        proc.terminate()
        proc.wait(30)
    return {"start_to_ready_s": ready, "start_to_ready_s_median": statistics.median(ready), "rss_idle_mb": idle}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.web", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "web")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        fill_state(state, args.results)
        report = {
            "machine": f"{platform.machine()}, {platform.processor() or platform.system()}, Python {platform.python_version()}",
            "results_stored": args.results,
            "web": measure_web(state, args.repeats),
            "daemon": measure_daemon(Path(tmp)),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "web.json").write_text(json.dumps(report, indent=2) + "\n")
    w = report["web"]
    lines = [
        f"# edge-agent web: footprint ({report['results_stored']} results stored)",
        "",
        f"Command: `python -m benchmarks.web --results {args.results}`. {report['machine']}.",
        "",
        "| page | p50 (ms) | p95 (ms) | max (ms) | size (bytes) |",
        "|---|---|---|---|---|",
    ]
    for name, p in w["pages"].items():
        lines.append(f"| {name} | {p['p50_ms']} | {p['p95_ms']} | {p['max_ms']} | {p['bytes']} |")
    t = w["thumbnails"]
    lines += [
        "",
        "| web process | value |",
        "|---|---|",
        f"| start to listening (s) | {w['start_to_listening_s']} |",
        f"| RSS idle after start (MB) | {w['rss_idle_after_start_mb']} |",
        f"| RSS after the pages (MB) | {w['rss_after_pages_mb']} |",
        f"| RSS after making {t['made']} thumbnails (MB) | {w['rss_after_thumbnails_mb']} |",
        f"| RSS idle after use (MB) | {w['rss_idle_after_use_mb']} |",
        f"| first page's thumbnails, made / cached (s) | {t['first_time_total_s']} / {t['cached_total_s']} |",
        "",
        "| daemon (must not change: the page is another process) | value |",
        "|---|---|",
        f"| start to READY=1 (s), median of 5 | {report['daemon']['start_to_ready_s_median']} {report['daemon']['start_to_ready_s']} |",
        f"| RSS idle (MB) | {report['daemon']['rss_idle_mb']} |",
    ]
    (args.out / "web.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
