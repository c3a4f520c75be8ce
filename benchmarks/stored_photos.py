"""What reducing a trainer's stored phone photos frees and costs: the pass a trainer runs once between retrains over
photos it stored larger than ``[handoff] photo_side`` (:mod:`trainer.loop.stored_photos`).

``python -m benchmarks.stored_photos --out DIR [--photos 60] [--side 1024]``

Field photos are turned into 12 MP stand-ins as :mod:`benchmarks.handoff_photo` makes them (the data holds no photo
larger than 512 px), stored as a trainer from before 2026-12-04 stored what it received (expert labels, as sent), and
the pass is stepped as the trainer's loop steps it until it is done. Reports the bytes before and after, the time a
photo took and the loop's steps. Writes ``DIR/stored_photos.json`` and ``DIR/stored_photos.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.field import SHARED
from benchmarks.handoff_photo import stand_in
from edge_agent.log import get_logger
from trainer.loop.stored_photos import StoredPhotos
from trainer.loop.unlabelled_pool import UnlabelledPool
from trainer.samples import SampleStore

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.stored_photos", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for stored_photos.json and .md")
    ap.add_argument("--field", default=str(SHARED / "field"))
    ap.add_argument("--photos", type=int, default=60, help="stand-ins stored (every field photo's n-th, spread over the field)")
    ap.add_argument("--side", type=int, default=1024, help="[handoff] photo_side")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    field = sorted(p for p in Path(args.field).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    chosen = field[:: max(1, len(field) // args.photos)][: args.photos]
    root = Path(tempfile.mkdtemp(prefix="stored-photos-"))
    try:
        store, pool = SampleStore(root), UnlabelledPool(root, 100, 1 << 30)
        rng = np.random.default_rng(20261204)
        for path in chosen:
            data = stand_in(path, rng, 4.0)
            header = {"id": hashlib.sha256(data).hexdigest(), "kind": "expert", "label": path.parent.name, "confidence": 1.0}
            store.add({**header, "engine_version": "v4000", "ext": ".jpg"}, data)
        before = sum(p.stat().st_size for p in (root / "samples").iterdir())
        shrink = StoredPhotos(store, pool, args.side, get_logger("benchmark"))
        steps, t0 = 0, time.perf_counter()
        while not shrink.done:
            shrink.step()
            steps += 1
        took = time.perf_counter() - t0
        after = sum(p.stat().st_size for p in (root / "samples").iterdir())
        store.close()
        pool.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "photos": len(chosen),
        "side": args.side,
        "reduced": shrink.reduced,
        "mb_before": round(before / 1e6, 2),
        "mb_after": round(after / 1e6, 2),
        "seconds": round(took, 2),
        "ms_per_photo": round(took / max(1, len(chosen)) * 1000, 1),
        "loop_steps": steps,
    }
    (out / "stored_photos.json").write_text(json.dumps(result, indent=2) + "\n")
    md = (
        f"# A trainer's stored phone photos reduced to {args.side} px\n\n`python -m benchmarks.stored_photos --out {args.out} "
        f"--photos {args.photos} --side {args.side}`\n\n| photos | reduced | before | after | time | a photo | loop steps |\n"
        f"|---|---|---|---|---|---|---|\n| {len(chosen)} | {shrink.reduced} | {result['mb_before']} MB | {result['mb_after']} MB "
        f"| {result['seconds']} s | {result['ms_per_photo']} ms | {steps} |\n"
    )
    (out / "stored_photos.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
