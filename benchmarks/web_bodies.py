"""Many large uploads at once: the web process's memory and temporary files stay bounded.

``python -m benchmarks.web_bodies --out DIR [--uploads 12] [--mib 40]``

``edge-agent web`` runs as its own process on a fresh state directory (its own ``TMPDIR``); ``--uploads`` POSTs of
``--mib`` MiB each to ``/api/v1/classify`` start at once, as raw bodies and then as multipart forms (which spool to
temporary files), with a ``label`` token. Sampled every 20 ms: the process's RSS and the bytes of the temporary
files it holds open in its ``TMPDIR``. ``--repo`` runs another checkout's web page (the code before a change).
Reported: the peaks, the answers' statuses, the wall time. Writes ``web_bodies.json`` and ``web_bodies.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from benchmarks.web import REPO, _free_port, _rss_mb

__all__ = ["measure"]


def _tmp_bytes(pid: int, root: Path) -> int:
    """Bytes in the temporary files ``pid`` holds open under ``root`` (unlinked ones, O_TMPFILE, included)."""
    total = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(root)):
                total += os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:
            pass
    return total


def _round(proc, tmpdir: Path, url: str, token: str, body: bytes, shape: str, uploads: int) -> dict:
    """``uploads`` POSTs of ``body`` at once, as ``shape``; the peaks sampled while they run."""
    import httpx

    peak = {"rss": 0.0, "tmp": 0}
    stop = threading.Event()
    statuses: list = []

    def sample() -> None:
        while not stop.is_set():
            peak["rss"] = max(peak["rss"], _rss_mb(proc.pid))
            peak["tmp"] = max(peak["tmp"], _tmp_bytes(proc.pid, tmpdir))
            time.sleep(0.02)

    def one() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        try:
            if shape == "raw body":
                r = httpx.post(url, content=body, headers=headers, timeout=180)
            else:
                r = httpx.post(url, files={"photo": ("big.jpg", body, "image/jpeg")}, headers=headers, timeout=180)
            statuses.append(r.status_code)
        except httpx.HTTPError as exc:
            statuses.append(type(exc).__name__)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(uploads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    time.sleep(0.5)
    stop.set()
    sampler.join()
    return {
        "statuses": dict(Counter(map(str, statuses))),
        "wall_s": round(wall, 1),
        "rss_peak_mb": peak["rss"],
        "tmp_peak_mb": round(peak["tmp"] / (1 << 20), 1),
        "rss_after_mb": _rss_mb(proc.pid),
    }


def measure(uploads: int, mib: int, repo: Path = REPO) -> dict:
    import httpx

    from edge_agent.web.auth import Tokens

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        state, tmpdir = tmp / "state", tmp / "web-tmp"
        tmpdir.mkdir()
        token = Tokens(state / "web").new("label")
        port = _free_port()
        env = {**os.environ, "TMPDIR": str(tmpdir)}
        cmd = [sys.executable, "-m", "edge_agent", "web", "--state-dir", str(state), "--port", str(port), "--log-level", "warning"]
        proc = subprocess.Popen(cmd, cwd=repo, env={**env, "PYTHONPATH": str(repo)})
        out: dict = {"uploads": uploads, "mib": mib}
        try:
            url = f"http://127.0.0.1:{port}/api/v1/classify?wait=0"
            deadline = time.time() + 60
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=2)
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None and time.time() < deadline, "the web page did not start"
                    time.sleep(0.1)
            time.sleep(1)
            out["rss_idle_mb"] = _rss_mb(proc.pid)
            body = b"\xff\xd8\xff\xe0" + os.urandom(1 << 20) * mib  # a JPEG's first bytes, then noise
            body = body[: mib << 20]
            for shape in ("raw body", "multipart"):
                out[shape] = _round(proc, tmpdir, url, token, body, shape, uploads)
                print(json.dumps({shape: out[shape]}), flush=True)
        finally:
            proc.terminate()
            proc.wait(15)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--uploads", type=int, default=12)
    ap.add_argument("--mib", type=int, default=40)
    ap.add_argument("--repo", type=Path, default=REPO, help="The checkout whose web page runs (default: this one).")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    out = measure(args.uploads, args.mib, args.repo)
    (args.out / "web_bodies.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        f"# {args.uploads} uploads of {args.mib} MiB at once to /api/v1/classify",
        "",
        f"`python -m benchmarks.web_bodies --out {args.out}`; the web process idle: {out['rss_idle_mb']} MB RSS.",
        "",
        "| shape | answers | wall (s) | RSS peak (MB) | temporary files peak (MB) | RSS after (MB) |",
        "|---|---|---|---|---|---|",
    ]
    for shape in ("raw body", "multipart"):
        r = out[shape]
        lines.append(f"| {shape} | {r['statuses']} | {r['wall_s']} | {r['rss_peak_mb']} | {r['tmp_peak_mb']} | {r['rss_after_mb']} |")
    (args.out / "web_bodies.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
