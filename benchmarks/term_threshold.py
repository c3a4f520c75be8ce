"""Replays the unlabelled term's confidence rules on a kept field loop run: how often each rule's pseudo-labels are
right on the next day's photos.

For each retrain of a kept ``benchmarks.field_loop`` run (device arm, fast mode, state directory kept), the engine
that served the day before stands in for the teacher; the field check set is the expert's held-back labels as they
stood at that retrain; the photos it labels are that day's stream photos the expert did not label (never trained on
by that engine). Each rule picks which of them become pseudo-labels; the benchmark knows their true class. Inference
only: a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import sys
from pathlib import Path

import numpy as np

from edge_agent.classifier import softmax

__all__ = ["main", "replay", "rules", "summary"]


def _expected(conf: np.ndarray, precision: float) -> np.ndarray:
    """The pool photos to take: the most confident ones whose mean (calibrated) confidence is at least ``precision``."""
    order = np.argsort(-conf, kind="stable")
    means = np.cumsum(conf[order]) / np.arange(1, len(conf) + 1)
    ok = np.flatnonzero(means >= precision)
    keep = np.zeros(len(conf), bool)
    if len(ok):
        keep[order[: ok[-1] + 1]] = True
    return keep


def rules(check_logits, check_y, pool_logits, mirror_logits, precision=0.95, floor=0.99) -> tuple[dict[str, np.ndarray], float]:
    """Each rule's choice of pool photos (boolean masks), and the temperature fitted on the check set;
    ``mirror_logits``: the pool photos mirrored left to right."""
    import torch

    from trainer.calibrate import fit_temperature
    from trainer.loop.unlabelled_term import fit_threshold

    pc, pp, pm = softmax(check_logits), softmax(pool_logits), softmax(mirror_logits)
    conf = pp.max(1)
    tau = fit_threshold(pc.max(1), pc.argmax(1) == check_y, precision, max(2, len(check_y) // 8))
    sure = max(2.0 if tau is None else tau, floor)  # no fitted threshold: nothing taken, as in the trainer
    t = max(1.0, fit_temperature(torch.from_numpy(check_logits), torch.from_numpy(check_y)))  # never sharpened
    calibrated = softmax(pool_logits / t).max(1)
    out = {
        "fitted on the check set (before)": conf >= (2.0 if tau is None else tau),
        f"fitted, never below {floor}": conf >= sure,
        f"fitted, never below {floor}, mirror agrees (shipped)": (conf >= sure) & (pm.argmax(1) == pp.argmax(1)) & (pm.max(1) >= sure),
        "temperature on the check set, pool mean >= p": _expected(calibrated, precision),
        "temperature on the check set, each >= p": calibrated >= precision,
        "raw, pool mean >= p": _expected(conf, precision),
    }
    for fixed in (0.97, 0.99, 0.995):
        out[f"raw >= {fixed}"] = conf >= fixed
    return out, t


def replay(run: Path) -> tuple[list[dict], list[dict]]:
    """Per retrain of the kept run under ``run``: each rule's (taken, right); and the logits it was decided on."""
    import torch

    from benchmarks.field_loop import split_field
    from edge_agent.preprocess import PreprocessSpec, preprocess_file
    from engines.store import EngineStore
    from trainer.field_check import held_back
    from trainer.photos import photo, stack
    from trainer.publish import load_weights
    from trainer.samples import Sample
    from trainer.verdict_fit import logits_of

    torch.set_num_threads(2)
    rows = []
    dump = []
    for rep in sorted(run.glob("device-fast/seed-*/report.json")):
        r = json.loads(rep.read_text())
        s, state = r["settings"], rep.parent / "state"
        classes = r["classes"]
        _, stream = split_field(Path(s["data"]) / s["field"], classes, s["seed"], s["test_fraction"])
        db = sqlite3.connect(f"file:{state / 'trainer' / 'samples.sqlite'}?mode=ro", uri=True)
        samples = [
            Sample(*row[:5], str(state / "trainer" / "samples" / Path(row[5]).name), *row[6:])
            for row in db.execute(
                "SELECT id, kind, label, confidence, engine_version, file, received, generation FROM samples ORDER BY received"
            )
        ]
        expert = [x for x in samples if x.kind == "expert"]
        store = EngineStore(state / "engines")
        days = r["days"]
        for i in range(1, len(days)):
            teacher_name = days[i - 1]["engine"]
            n = days[i]["expert_labels"]
            so_far = expert[:n]
            check_ids = held_back(so_far, 4)
            if len(check_ids) < 12:
                continue
            version = store.open(teacher_name)
            spec = PreprocessSpec.from_manifest(version.manifest["preprocess"])
            model = load_weights(version)
            check = [x for x in so_far if x.id in check_ids]
            cx = stack([photo(preprocess_file(x.file, spec)) for x in check])
            cy = np.array([classes.index(x.label) for x in check])
            labelled = {x.id for x in so_far}
            ds = s["day_size"]
            day = stream[i * ds : (i + 1) * ds]
            pool = [(p, y) for p, y in day if hashlib.sha256(Path(p).read_bytes()).hexdigest() not in labelled]
            px = stack([photo(preprocess_file(p, spec)) for p, _ in pool])
            py = np.array([y for _, y in pool])
            cl, pl = logits_of(model, cx), logits_of(model, px)
            fl = logits_of(model, torch.flip(px, dims=[3]))  # every photo mirrored left to right
            chosen, t = rules(cl, cy, pl, fl)
            row = {"seed": s["seed"], "day": i + 1, "teacher": teacher_name, "check": len(cy), "pool": len(py), "T": round(t, 3)}
            logits = {"check_logits": cl, "pool_logits": pl, "mirror_logits": fl}
            dump.append(row | {k: np.round(v, 4).tolist() for k, v in logits.items()} | {"check_y": cy.tolist(), "pool_y": py.tolist()})
            answer = pl.argmax(1)
            for name, keep in chosen.items():
                row[name] = [int(keep.sum()), int((answer[keep] == py[keep]).sum())]
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows, dump


def summary(rows: list[dict]) -> str:
    names = [k for k in rows[0] if isinstance(rows[0][k], list)]
    lines = ["| rule | taken | right | precision | retrains under 95 % | worst retrain |", "|---|---|---|---|---|---|"]
    for name in names:
        taken = sum(r[name][0] for r in rows)
        right = sum(r[name][1] for r in rows)
        per = [r[name][1] / r[name][0] for r in rows if r[name][0]]
        under = sum(p < 0.95 for p in per)
        lines.append(
            f"| {name} | {taken} | {right} | {right / taken:.3f} | {under} of {len(per)} | {min(per):.3f} |"
            if taken
            else f"| {name} | 0 | | | | |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.term_threshold", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="A field_loop --out folder whose device arm's state was kept.")
    ap.add_argument("--out", type=Path, required=True, help="Where rows.json and summary.md go.")
    a = ap.parse_args(argv)
    rows, dump = replay(a.run)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "logits.json").write_text(json.dumps(dump))  # every figure above can be recomputed from these
    (a.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    (a.out / "summary.md").write_text(summary(rows) + "\n")
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
