"""How long photos take, as cumulative histograms a Prometheus scrape can read (milliseconds, since the start)."""

from __future__ import annotations

import bisect
import threading

__all__ = ["BUCKETS_MS", "LatencyHistograms"]

#: Upper bounds (ms); a Jetson's inference is ~5 ms, a Pi's ~100 ms, a photo's whole way a few hundred.
BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)


class LatencyHistograms:
    """Per stage (``total``: arrival to result; ``infer``; ``preprocess``), how many photos fell in each bucket."""

    STAGES = ("total", "infer", "preprocess")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {s: [0] * (len(BUCKETS_MS) + 1) for s in self.STAGES}
        self._sums = dict.fromkeys(self.STAGES, 0.0)

    def observe(self, timings_ms: dict) -> None:
        """Count one photo's stage timings (stages it lacks are skipped)."""
        with self._lock:
            for stage in self.STAGES:
                v = timings_ms.get(stage)
                if isinstance(v, (int, float)) and v >= 0:
                    self._counts[stage][bisect.bisect_left(BUCKETS_MS, v)] += 1
                    self._sums[stage] += float(v)

    def as_dict(self) -> dict:
        """``{stage: {"buckets": [...], "counts": [per bucket, last: above all], "sum": ms, "count": n}}``."""
        with self._lock:
            return {
                s: {"buckets": list(BUCKETS_MS), "counts": list(c), "sum": round(self._sums[s], 3), "count": sum(c)}
                for s, c in self._counts.items()
            }
