"""``python -m benchmarks [--data DIR] [--batch 1 8 32] [--iters N]``: engine latency on real photos."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from benchmarks.latency import CASES, measure, real_batch


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    ap.add_argument("--data", default=str(Path(__file__).parents[1].parent / "shared/data/plantvillage"))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    photos = sorted(Path(args.data).rglob("*.jpg"))[::37]
    if not photos:
        raise SystemExit(f"no photos under {args.data}")
    print(f"machine: {platform.machine()} {platform.processor() or ''} ({platform.node()}), photos from {args.data}")
    print("| engine | batch | mean ms | p50 ms | p99 ms | images/s | provider |")
    print("|---|---|---|---|---|---|---|")
    for case in CASES:
        for b in args.batch:
            r = measure(case, real_batch(photos, b), args.warmup, args.iters)
            if args.json:
                print(json.dumps(r.__dict__))
            elif r.unavailable:
                print(f"| {r.case} | {b} | absent: {r.unavailable} | | | | |")
                break
            else:
                print(f"| {r.case} | {b} | {r.mean_ms} | {r.p50_ms} | {r.p99_ms} | {r.images_per_s} | {r.provider} |")


if __name__ == "__main__":
    main()
