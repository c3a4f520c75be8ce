"""Which retrain settings keep the out-of-box loop from losing accuracy? Replays the samples of out-of-box runs.

``python -m benchmarks.retrain_variants --runs DIR [DIR ...] --variant NAME="TOML lines" [...] --out DIR``

For each run of ``benchmarks.out_of_box`` (the pseudo-labels its daemon handed over) and each variant: a copy of the
run's trainer state with only the shipped v0001 in its store, one ``edge-trainer retrain`` with the variant's
``[trainer]`` settings and the gate opened (``gate_tolerance = 1``, so every candidate is measured, not only the ones
a gate lets through), then the gate's own top-1 for both versions and both versions' top-1 on the 184 photos neither
trained on (the shipped model's validation split). Writes ``DIR/variants.jsonl`` and ``DIR/variants.md``
(mean +- sd over the runs of the held-out change, in points).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _fresh_state(run: Path, work: Path) -> Path:
    """The run's received samples and the shipped v0001 only, as if no retrain had happened yet."""
    src, state = run / "state", work / "state"
    if work.exists():
        shutil.rmtree(work)
    (state / "engines").mkdir(parents=True)
    shutil.copytree(src / "engines" / "v0001", state / "engines" / "v0001")
    (state / "engines" / "current").write_text("v0001\n")
    (state / "trainer").mkdir()
    shutil.copytree(src / "trainer" / "samples", state / "trainer" / "samples")
    shutil.copy(src / "trainer" / "samples.sqlite", state / "trainer" / "samples.sqlite")
    with sqlite3.connect(state / "trainer" / "samples.sqlite") as db:
        db.execute("UPDATE samples SET generation = NULL")
        db.execute("DELETE FROM state")
    return state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.retrain_variants", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", required=True, help="out-of-box run folders")
    ap.add_argument("--variant", action="append", required=True, help='NAME="key = value; key = value" ([trainer] keys)')
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/plantvillage"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from benchmarks.out_of_box import held_out_split, held_out_top1
    from engines.store import EngineStore

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    held_out = held_out_split(args.data)["val"]
    rows = []
    for spec in args.variant:
        name, _, body = spec.partition("=")
        for run in map(Path, args.runs):
            work = out / f"{name}-{run.name}"
            state = _fresh_state(run, work)
            cfg = work / "config.toml"
            cfg.write_text("[trainer]\ngate_tolerance = 1.0\n" + "\n".join(x.strip() for x in body.split(";") if x.strip()) + "\n")
            log = work / "retrain.log"
            with open(log, "w") as fh:
                subprocess.run(
                    [sys.executable, "-m", "trainer", "--log-format", "json", "retrain", "--state-dir", str(state), "--config", str(cfg)],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                    check=False,
                )
            gate = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{") and '"event": "gate"' in ln]
            store = EngineStore(state / "engines")
            row = {"variant": name, "settings": body.strip(), "run": run.name}
            if gate:
                row.update({k: gate[-1].get(k) for k in ("candidate_top1", "current_top1")})
            if (state / "engines" / "v0002").is_dir():
                row.update(held_out_top1(store, ["v0001", "v0002"], held_out))
                row["change_points"] = round(100 * (row["held_out_top1_v0002"] - row["held_out_top1_v0001"]), 2)
            else:
                row["error"] = f"no candidate; see {log}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(out / "variants.jsonl", "a") as fh:
                fh.write(json.dumps(row) + "\n")
            shutil.rmtree(state / "trainer" / "samples", ignore_errors=True)  # keep the folder small
    lines = [
        "| variant | settings | runs | held-out change, points (mean +- sd) | per run | gate change, points (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name and "change_points" in r]
        if not mine:
            continue
        ch = [r["change_points"] for r in mine]
        gate = [100 * (r["candidate_top1"] - r["current_top1"]) for r in mine if r.get("candidate_top1") is not None]
        sd = statistics.stdev(ch) if len(ch) > 1 else 0.0
        lines.append(
            f"| {name} | `{mine[0]['settings'] or 'defaults'}` | {len(mine)} | {statistics.mean(ch):+.2f} +- {sd:.2f} | "
            f"{', '.join(f'{c:+.1f}' for c in ch)} | {statistics.mean(gate):+.2f} |"
            if gate
            else ""
        )
    (out / "variants.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
