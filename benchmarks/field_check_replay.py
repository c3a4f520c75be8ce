"""Replays the field check's decisions of a finished ``benchmarks.field_loop`` run, to test a rule for ties.

``python -m benchmarks.field_check_replay RUN_DIR DAYS_JSONL`` (for example
``benchmarks/results/field-loop-v2000-r2/device-labels-only-fast/seed-1`` and
``benchmarks/results/field-loop-v2000-r2/device-labels-only-seed-1-days.jsonl``).

For every day a version was published over another, the held-back photos are rebuilt as they stood that day (every
``--every``-th expert label of a class, in arrival order, of the labels given so far) and both versions from the run's
store are scored on them with :func:`trainer.field_check.prefer`: right-counts and log-loss, beside the held-out field
top-1 of each (the day lines). A rule that breaks ties on the held-back photos is worth having only where it picks the
version that is better held out; this prints what each rule would have decided. Refused candidates are not in the
store, so only published ones are replayed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["replay"]


def replay(run: Path, days: list[dict], every: int = 4) -> list[dict]:
    """One row per published version: the day, serving and candidate, their right-counts and log-loss on that day's
    held-back photos, and their held-out field top-1."""
    import torch

    from edge_agent.preprocess import PreprocessSpec, preprocess_file
    from engines.store import EngineStore
    from trainer import photos
    from trainer.field_check import held_back, prefer
    from trainer.publish import load_weights
    from trainer.samples import SampleStore

    store = EngineStore(run / "state" / "engines")
    expert = sorted((s for s in SampleStore(run / "state" / "trainer").all() if s.kind == "expert"), key=lambda s: (s.received, s.id))
    rows, serving, serving_field = [], None, days[0]["field"]
    for d in days:
        published = d.get("published")
        if published and serving is not None:
            given = expert[: d["expert_labels"]]
            held = held_back(given, every)
            cur, cand = store.open(serving), store.open(published)
            spec = PreprocessSpec.from_manifest(cur.manifest["preprocess"])
            if cand.manifest["preprocess"] != cur.manifest["preprocess"]:
                raise SystemExit(f"{published} takes its photos unlike {serving} (a new lineage): this replay compares one lineage only")
            classes = list(cur.classes)
            kept = [s for s in given if s.id in held and s.label in classes]
            x = photos.stack([photos.photo(preprocess_file(s.file, spec)) for s in kept])
            y = torch.tensor([classes.index(s.label) for s in kept])
            _, f = prefer(load_weights(cand), load_weights(cur), x, y)
            rows.append(
                {
                    "day": d["day"],
                    "expert_labels": d["expert_labels"],
                    "serving": serving,
                    "candidate": published,
                    "held_back": len(y),
                    "right_serving": round(f["field_top1_without"] * len(y)),
                    "right_candidate": round(f["field_top1_with"] * len(y)),
                    "log_loss_serving": f["field_log_loss_without"],
                    "log_loss_candidate": f["field_log_loss_with"],
                    "field_serving": serving_field,
                    "field_candidate": d["field"],
                }
            )
        if published:
            serving = published
        serving_field = d["field"]
    return rows


def _verdicts(r: dict) -> str:
    better = r["field_candidate"] > r["field_serving"]
    tie = r["right_candidate"] == r["right_serving"]
    by_loss = r["log_loss_candidate"] < r["log_loss_serving"]
    held_out = "better" if better else ("same" if r["field_candidate"] == r["field_serving"] else "worse")
    return f"{'tie' if tie else 'more right'}; held out {held_out}; log-loss tie-break {'publishes' if by_loss else 'refuses'}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.field_check_replay", description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a field_loop seed directory (holds state/)")
    p.add_argument("days", type=Path, help="its day lines (the -days.jsonl beside it)")
    p.add_argument("--every", type=int, default=4, help="[trainer] field_check_every the run used")
    a = p.parse_args(argv)
    days = [json.loads(line) for line in a.days.read_text().splitlines() if line.strip()]
    print("| day | labels | serving -> candidate | right of held back | log-loss | held-out field | |")
    print("|---|---|---|---|---|---|---|")
    for r in replay(a.run, days, a.every):
        print(
            f"| {r['day']} | {r['expert_labels']} | {r['serving']} -> {r['candidate']} | {r['right_serving']} -> "
            f"{r['right_candidate']} of {r['held_back']} | {r['log_loss_serving']:.3f} -> {r['log_loss_candidate']:.3f} | "
            f"{r['field_serving']:.3f} -> {r['field_candidate']:.3f} | {_verdicts(r)} |"
        )


if __name__ == "__main__":
    main()
