"""Start-to-READY of two checkouts, interleaved start by start, so a VM whose speed drifts gives a fair difference.

``python -m benchmarks.ready_ab BASE NEW [--starts 15]``: BASE and NEW are checkouts (``git worktree add /tmp/base
COMMIT``); each start is a fresh state directory with the shipped store, timed from exec to READY=1 as
:mod:`benchmarks.daemon` does, the package's bytecode compiled first in both. Prints each side's median and the paired
difference (mean +- its standard error).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from benchmarks.daemon import _start, _write_config, compile_bytecode

__all__ = ["main"]


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.ready_ab", description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--starts", type=int, default=15)
    a = ap.parse_args(argv)
    base, new = Path(a.base).resolve(), Path(a.new).resolve()
    for repo in (base, new):
        compile_bytecode(repo)
    res = {base: [], new: []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config = _write_config(tmp, None)
        for i in range(a.starts):
            for j, repo in enumerate((base, new) if i % 2 == 0 else (new, base)):
                proc, seconds = _start(tmp / f"s{i}-{j}", config, tmp / "n.sock", repo)
                res[repo].append(seconds)
                proc.terminate()
                proc.wait(30)
    for name, repo in (("base", base), ("new", new)):
        r = res[repo]
        print(f"{name} ({repo}): median {statistics.median(r):.3f} s, mean {statistics.mean(r):.3f}, {sorted(round(x, 3) for x in r)}")
    d = [x - y for x, y in zip(res[base], res[new])]
    print(
        f"paired base - new: median {statistics.median(d):.3f} s, mean {statistics.mean(d):.3f} +- {statistics.stdev(d) / len(d) ** 0.5:.3f}"
    )


if __name__ == "__main__":
    main()
