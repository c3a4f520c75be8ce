"""Start-to-READY of two checkouts, interleaved start by start, so a VM whose speed drifts gives a fair difference.

``python -m benchmarks.ready_ab BASE NEW [--starts 15]``: BASE and NEW are checkouts (``git worktree add /tmp/base
COMMIT``); each start is a fresh state directory with the shipped store, timed from exec to READY=1 as
:mod:`benchmarks.daemon` does, the package's bytecode compiled first in both. Prints each side's median and the paired
difference (mean +- its standard error).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["start"]


def start(repo: str, state: Path, notify: Path, config: Path) -> float:
    """Seconds from exec to READY=1 of ``repo``'s daemon on ``state``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.settimeout(30)
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "run", "--config", str(config), "--state-dir", str(state)],
        env={**os.environ, "NOTIFY_SOCKET": str(notify)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=repo,
    )
    try:
        while b"READY=1" not in sock.recv(4096):
            pass
    finally:
        sock.close()
        notify.unlink()
    t = time.perf_counter() - t0
    p.terminate()
    p.wait(30)
    return t


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.ready_ab", description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--starts", type=int, default=15)
    a = ap.parse_args(argv)
    base, new = str(Path(a.base).resolve()), str(Path(a.new).resolve())
    for repo in (base, new):
        subprocess.run([sys.executable, "-m", "compileall", "-q", "edge_agent", "engines"], cwd=repo, check=True, stdout=subprocess.DEVNULL)
    res = {base: [], new: []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config = tmp / "c.toml"
        config.write_text('[inbox]\nsettle_s = 0.5\n[log]\nformat = "json"\n')
        for i in range(a.starts):
            for j, repo in enumerate((base, new) if i % 2 == 0 else (new, base)):
                res[repo].append(start(repo, tmp / f"s{i}-{j}", tmp / "n.sock", config))
    for name, repo in (("base", base), ("new", new)):
        r = res[repo]
        print(f"{name} ({repo}): median {statistics.median(r):.3f} s, mean {statistics.mean(r):.3f}, {sorted(round(x, 3) for x in r)}")
    d = [x - y for x, y in zip(res[base], res[new])]
    print(
        f"paired base - new: median {statistics.median(d):.3f} s, mean {statistics.mean(d):.3f} +- {statistics.stdev(d) / len(d) ** 0.5:.3f}"
    )


if __name__ == "__main__":
    main()
