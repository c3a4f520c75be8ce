"""A season's daily backups onto a stick: what each day writes and takes, with the photos and engines shared between
the backups there and with every backup whole in one file, and what a restore takes.

``python -m benchmarks.backup --out DIR [--photos 500] [--photo-mb 4] [--new 15] [--days 3] [--results 20000]
[--stick DIR] [--sealed]``

A state directory as a season leaves it: the shipped engines, ``--results`` result rows, ``--photos`` expert-labelled
photos of ``--photo-mb`` MB each in the trainer's samples (random bytes: a JPEG does not compress either). Then, day
after day, ``--new`` labelled photos arrive and the schedule's own :func:`edge_agent.backup_folder.take` writes a
backup into ``--stick`` (a folder on another disk; /dev/shm by default), once with ``[backup] shared_files`` (the
default) and once without it. Measured: seconds and bytes written per day, bytes on the stick after each day, and the
seconds to restore the last backup. Writes ``backup.json`` and ``backup.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from edge_agent.backup_folder import take
from edge_agent.config import AppConfig, override
from edge_agent.ledger_rows import ResultRow
from edge_agent.restore import restore
from edge_agent.results import ResultsDB
from edge_agent.state import StateLayout, resolve_store

__all__ = ["season"]


def _state(root: Path, photos: int, photo_mb: float, results: int) -> Path:
    layout = StateLayout(root / "state")
    layout.create()
    resolve_store(AppConfig(), layout.root)
    db = ResultsDB(layout.db)
    for start in range(0, results, 1000):
        rows = []
        for i in range(start, min(results, start + 1000)):
            sha = hashlib.sha256(str(i).encode()).hexdigest()
            top_k = [["Apple___Apple_scab", 0.8], ["Apple___healthy", 0.15], ["Apple___Black_rot", 0.05]]
            rows.append(ResultRow(sha, f"p{i}.jpg", f"/inbox/p{i}.jpg", "folder", top_k[0][0], 0.8, top_k, "v4000", {"total": 5.0}))
        db.commit(rows, [])
    db.close()
    _photos(layout.root, 0, photos, photo_mb)
    return layout.root


def _photos(state: Path, first: int, n: int, photo_mb: float) -> None:
    folder = state / "trainer" / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    size = int(photo_mb * 1e6)
    for i in range(first, first + n):
        (folder / f"label-{i:05d}.jpg").write_bytes(os.urandom(size))


def _on(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def season(out: Path, photos: int, photo_mb: float, new: int, days: int, results: int, stick: Path, sealed: bool) -> dict:
    """Run the benchmark (see the module) and return its figures."""
    work = Path(tempfile.mkdtemp(prefix="backup-bench-", dir=out))
    report: dict = {"photos": photos, "photo_mb": photo_mb, "new_per_day": new, "days": days, "results": results, "sealed": sealed}
    try:
        state = _state(work, photos, photo_mb, results)
        report["state_bytes"] = _on(state)
        secret = work / "passphrase"
        secret.write_text("a farm passphrase\n")
        n = photos
        for shared in (True, False):
            folder = Path(tempfile.mkdtemp(prefix="stick-", dir=stick))
            settings = {"backup.dir": str(folder), "backup.shared_files": shared}
            if sealed:
                settings["backup.passphrase_file"] = str(secret)
            cfg = override(AppConfig(), settings)
            rows, t0 = [], time.time()
            for day in range(days):
                if day:
                    _photos(state, n, new, photo_mb)
                    n += new
                started = time.perf_counter()
                done = take(cfg, state, device="bench", now=t0 + day * 86400)
                rows.append(
                    {
                        "day": day + 1,
                        "s": round(time.perf_counter() - started, 1),
                        "written_mb": round(done["written"] / 1e6, 1),
                        "restores_mb": round(done["bytes"] / 1e6, 1),
                        "stick_mb": round(_on(folder) / 1e6, 1),
                    }
                )
                print(("shared" if shared else "whole"), rows[-1], flush=True)
            started = time.perf_counter()
            restore(Path(done["path"]), work / f"restored-{shared}", passphrase=b"a farm passphrase" if sealed else None)
            report["shared" if shared else "whole"] = {"days": rows, "restore_s": round(time.perf_counter() - started, 1)}
            shutil.rmtree(work / f"restored-{shared}", ignore_errors=True)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _markdown(r: dict) -> str:
    lines = [
        "# A season's daily backups onto a stick",
        "",
        f"State: {r['state_bytes'] / 1e6:.0f} MB ({r['photos']} labelled photos of {r['photo_mb']} MB, {r['results']} results, "
        f"the shipped engines); {r['new_per_day']} new photos a day; {'sealed' if r['sealed'] else 'not sealed'}.",
        "",
        "| backups | day | seconds | written MB | restores MB | on the stick MB |",
        "|---|---|---|---|---|---|",
    ]
    for kind in ("shared", "whole"):
        for d in r[kind]["days"]:
            lines.append(f"| {kind} | {d['day']} | {d['s']} | {d['written_mb']} | {d['restores_mb']} | {d['stick_mb']} |")
    lines += ["", f"Restore of the last: shared {r['shared']['restore_s']} s, whole {r['whole']['restore_s']} s.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--photos", type=int, default=500)
    ap.add_argument("--photo-mb", type=float, default=4.0)
    ap.add_argument("--new", type=int, default=15)
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--results", type=int, default=20000)
    ap.add_argument("--stick", type=Path, default=Path("/dev/shm"))
    ap.add_argument("--sealed", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    r = season(args.out, args.photos, args.photo_mb, args.new, args.days, args.results, args.stick, args.sealed)
    r["command"] = (
        "python -m benchmarks.backup "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "sealed"))
        + (" --sealed" if args.sealed else "")
    )
    (args.out / "backup.json").write_text(json.dumps(r, indent=2))
    (args.out / "backup.md").write_text(_markdown(r))
    print(_markdown(r))


if __name__ == "__main__":
    main()
