"""The local page and /metrics at a season's end: each page's time with a ledger of N results (1,000 a day for a year
is 365,000), the first load and the next (the page cache warm).

    python -m benchmarks.season_pages --results 300000 [--loads 8]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

PAGES = (
    "/photos",
    "/photos?class=Apple___Apple_scab",
    "/review",
    "/health",
    "/plants",
    "/plants/tree3",
    "/map",
    "/classes",
    "/trust",
    "/engines",
    "/api/v1/results?limit=50",
    "/metrics",
)
CLASSES = ("Apple___Apple_scab", "Apple___healthy", "Apple___Black_rot", "Corn_(maize)___healthy", "Tomato___Late_blight")


def season(state: Path, results: int, seed: int = 1) -> None:
    """``results`` results in ``state``'s ledger, one every 100 s up to now, a third of them photos of 500 plants."""
    from edge_agent.ledger_rows import ResultRow
    from edge_agent.results import ResultsDB

    db = ResultsDB(state / "results.sqlite")
    rnd, now = random.Random(seed), time.time()
    for start in range(0, results, 5000):
        rows = []
        for i in range(start, min(results, start + 5000)):
            c = rnd.choice(CLASSES)
            rows.append(
                ResultRow(
                    f"{i:064x}", f"{i:016x}", f"/inbox/tree{i % 500}/p{i}.jpg", "folder", c, 0.9, [[c, 0.9], [CLASSES[0], 0.05]],
                    "v4000", {"total": 5.0}, created=now - (results - i) * 100,
                    verdict=rnd.choice(["confident", "unsure", "unknown"]), plant=f"tree{i % 500}" if i % 3 == 0 else None,
                )
            )  # fmt: skip
        db.commit(rows)
    db.close()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.season_pages")
    ap.add_argument("--results", type=int, default=300000, help="results in the ledger")
    ap.add_argument("--loads", type=int, default=2, help="loads of each page: the first, then the median of the others")
    args = ap.parse_args()
    from tests.web_helpers import client, make_state

    with tempfile.TemporaryDirectory(prefix="edge-season-") as tmp:
        state = make_state(Path(tmp))
        t = time.perf_counter()
        season(state, args.results)
        made = time.perf_counter() - t
        size = (state / "results.sqlite").stat().st_size
        page = client(state)
        print(f"a ledger of {args.results:,} results ({size / 1e6:.0f} MB, made in {made:.0f} s)")
        print(f"| page | first load (ms) | next (ms{f', median of {args.loads - 1}' if args.loads > 2 else ''}) | status |")
        print("|---|---|---|---|")
        for path in PAGES:
            times = []
            for _ in range(max(2, args.loads)):
                t = time.perf_counter()
                r = page.get(path)
                times.append((time.perf_counter() - t) * 1000)
            print(f"| `{path}` | {times[0]:.0f} | {statistics.median(times[1:]):.0f} | {r.status_code} |")


if __name__ == "__main__":
    main()
