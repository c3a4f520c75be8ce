"""A month of photos on a small disk: the state directory stays within the floor, and nothing the loop needs is lost.

``python -m benchmarks.retention --out DIR [--days 35] [--per-day 400] [--photo-kb 300] [--disk-mb 512]``

A real filesystem of ``--disk-mb`` (a tmpfs this benchmark mounts, when run as root; otherwise the machine's own disk
with a simulated size) holds a state directory. Day after day (a simulated clock), ``--per-day`` photos of
``--photo-kb`` each arrive as the daemon leaves them (``processed/<day>/`` and a result row), one in 20 also into the
review pool (``queue/review``), one in 50 raises an alert whose delivery is still pending; the real
:class:`~edge_agent.retention.Retention` runs its passes (the floor every simulated hour, the age rule every day).
Measured: the least free space after any pass against the floor, what was pruned, and whether every review-pool
photo and every undelivered alert's photo is still there. Writes ``retention.json`` and ``retention.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections import namedtuple
from datetime import datetime
from pathlib import Path

from edge_agent.alerts.outbox import Outbox
from edge_agent.clock import ClockWatch
from edge_agent.config import RetentionSection
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.results import ResultsDB
from edge_agent.retention import Retention, floor_bytes
from edge_agent.state import StateLayout

__all__ = ["simulate"]

Usage = namedtuple("Usage", "total used free")


def _mount(size_mb: int) -> Path | None:
    """A tmpfs of ``size_mb`` (root only), or None."""
    if os.geteuid() != 0:
        return None
    point = Path(tempfile.mkdtemp(prefix="retention-disk-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(point)], capture_output=True)
    return point if done.returncode == 0 else None


def simulate(root: Path, days: int, per_day: int, photo_kb: int, disk_mb: int, real_disk: bool) -> dict:
    layout = StateLayout(root / "state")
    layout.create()
    db = ResultsDB(layout.db)
    box = Outbox(layout.root / "alerts.sqlite", 16 << 20)
    total = disk_mb << 20

    def usage(path):
        if real_disk:
            return shutil.disk_usage(path)
        used = sum(f.stat().st_size for f in layout.root.rglob("*") if f.is_file())
        return Usage(total, used, total - used)

    clock = {"now": datetime(2026, 1, 1, 6, 0).timestamp()}
    section = RetentionSection()
    watch = ClockWatch(layout.root / "clock.json", wall=lambda: clock["now"], mono=lambda: clock["now"])  # simulated: no jumps
    r = Retention(section, layout.root, db, now=lambda: clock["now"], usage=usage, clock=watch)
    review, alerted, least_free, n = [], [], None, 0
    floor = floor_bytes(section, usage(layout.root).total)
    for day in range(days):
        for hour in range(12):  # photos arrive 06:00-18:00
            clock["now"] += 3600
            folder = layout.root / "processed" / datetime.fromtimestamp(clock["now"]).strftime("%Y-%m-%d")
            folder.mkdir(parents=True, exist_ok=True)
            rows, queued = [], []
            for _ in range(per_day // 12):
                n += 1
                data = hashlib.sha256(str(n).encode()).digest() * (photo_kb * 1024 // 32)
                sha = hashlib.sha256(data).hexdigest()
                name = f"IMG_{n:06d}.jpg"
                try:
                    (folder / name).write_bytes(data)
                except OSError:  # the disk is full: the daemon would quarantine nothing and wait; count it
                    return {"failed": f"disk full on day {day}: retention did not keep up"}
                rows.append(
                    ResultRow(
                        sha, f"p{n:06d}", f"/inbox/{name}", "inbox", "Apple___Apple_scab", 0.97, [], "v1", {}, clock["now"], "confident"
                    )
                )
                if n % 20 == 0:
                    copy = layout.queue / "review" / f"{sha}.jpg"
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    copy.write_bytes(data[:20_000])  # the review pool's own copy (its size does not matter here)
                    queued.append(QueueEntry(sha, f"p{n:06d}", "review", "Apple___Apple_scab", 0.6, "v1", str(copy), 20_000))
                    review.append(copy)
                if n % 50 == 0:
                    box.put([("webhook:0", "alert", "u", json.dumps({"photo_id": f"p{n:06d}"}).encode(), 1, False)])
                    alerted.append(folder / name)
            db.commit(rows, queued)
            r.run_once(age=hour == 0)
            free = usage(layout.root).free
            least_free = free if least_free is None else min(least_free, free)
        clock["now"] += 12 * 3600
    lost_review = [p for p in review if not p.exists()]
    lost_alerted = [p for p in alerted if not p.exists()]
    st = r.status()
    db.close()
    box.close()
    return {
        "days": days,
        "photos_arrived": n,
        "gb_arrived": round(n * photo_kb / 1e6, 2),
        "disk_mb": disk_mb,
        "real_filesystem": real_disk,
        "floor_mb": round(floor / 2**20, 1),
        "least_free_mb_after_a_pass": round(least_free / 2**20, 1),
        "within_floor": least_free >= floor,
        "photos_kept": st["photos"],
        "oldest_photo_day": st["oldest_photo_day"],
        "pruned_photos": st["pruned_photos"],
        "pruned_results": st["pruned_results"],
        "review_pool_photos": len(review),
        "review_pool_lost": len(lost_review),
        "undelivered_alert_photos": len(alerted),
        "undelivered_alert_photos_lost": len(lost_alerted),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--days", type=int, default=35)
    ap.add_argument("--per-day", type=int, default=400)
    ap.add_argument("--photo-kb", type=int, default=300)
    ap.add_argument("--disk-mb", type=int, default=512)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    point = _mount(args.disk_mb)
    try:
        with tempfile.TemporaryDirectory(dir=point) as tmp:
            out = simulate(Path(tmp), args.days, args.per_day, args.photo_kb, args.disk_mb, point is not None)
    finally:
        if point is not None:
            subprocess.run(["umount", str(point)], check=False)
            point.rmdir()
    print(json.dumps(out, indent=2))
    (args.out / "retention.json").write_text(json.dumps(out, indent=2) + "\n")
    if "failed" in out:
        (args.out / "retention.md").write_text(f"# Retention: FAILED\n\n{out['failed']}\n")
        return 1
    where = f"a {args.disk_mb} MB tmpfs" if out["real_filesystem"] else f"a simulated {args.disk_mb} MB disk (not root: no tmpfs)"
    md = [
        f"# A month of photos on a small disk ({where})",
        "",
        f"`python -m benchmarks.retention --out {args.out}`: {out['days']} days, {out['photos_arrived']} photos "
        f"({out['gb_arrived']} GB) of {args.photo_kb} kB, default `[retention]` (30 days, floor "
        f"min(2 GB, 10 %) = {out['floor_mb']} MB).",
        "",
        "| least free after a pass | within the floor | photos kept (oldest day) | pruned photos / results | "
        "review-pool photos lost | undelivered alerts' photos lost |",
        "|---|---|---|---|---|---|",
        f"| {out['least_free_mb_after_a_pass']} MB | {'yes' if out['within_floor'] else 'NO'} | {out['photos_kept']} "
        f"({out['oldest_photo_day']}) | {out['pruned_photos']} / {out['pruned_results']} | {out['review_pool_lost']} of "
        f"{out['review_pool_photos']} | {out['undelivered_alert_photos_lost']} of {out['undelivered_alert_photos']} |",
    ]
    (args.out / "retention.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if out["within_floor"] and not out["review_pool_lost"] and not out["undelivered_alert_photos_lost"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
