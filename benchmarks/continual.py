"""Class-incremental experiment on the shared photos: does a strategy remember task A after learning task B?

``python -m benchmarks.continual --data DIR --out DIR [--epochs-a N] [--epochs-b N]``

Task A: the tomato and potato classes; task B: the other crops, as new classes
(the head grows). Each strategy starts from the same task-A model; its state is
seeded on task A (EWC: Fisher at the task-A solution; rehearsal: a class-balanced
memory; LwF: the task-A model as teacher), then it trains on task B only.
Reported: the accuracy matrix R[i][j] (after task i, on task j's test photos),
average accuracy after B, and forgetting of A = R[A][A] - R[B][A].
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from edge_agent.config import TrainerSection
from edge_agent.trainer_config import STRATEGY_CONFIGS
from trainer.continual import train_generation
from trainer.data import TensorDataset, scan_folder, stratified_split
from trainer.models import build_model
from trainer.strategies.base import STRATEGIES, Generation, get_strategy
from trainer.train import TrainSettings, evaluate, fit


def task_of(name: str) -> str:
    return "A" if name.startswith(("Tomato", "Potato")) else "B"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.continual")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/plantvillage"))
    ap.add_argument("--out", default="bench-out/continual")
    ap.add_argument("--epochs-a", type=int, default=30)
    ap.add_argument("--epochs-b", type=int, default=15)
    ap.add_argument("--ewc-lambda", type=float, default=5000.0)
    ap.add_argument("--per-class", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    folder = scan_folder(args.data)
    # class order: task A classes first, so A's labels keep their indices when the head grows
    order = sorted(folder.classes, key=lambda c: (task_of(c), c))
    index = {c: i for i, c in enumerate(order)}
    samples = [type(s)(s.path, index[folder.classes[s.label]]) for s in folder.samples]
    n_a = sum(task_of(c) == "A" for c in order)
    parts = stratified_split(samples, {"test": 0.2}, seed=7)
    data = {}
    for split in ("train", "test"):
        for task in ("A", "B"):
            chosen = [s for s in parts[split] if (s.label < n_a) == (task == "A")]
            ds = TensorDataset(chosen)
            data[split, task] = Generation(ds.x, ds.y)

    def acc(model, task):
        g = data["test", task]
        return evaluate(model, g.x, g.y).top1

    # Task A: supervised, from scratch (validation = a tenth of A's training photos)
    a_train = data["train", "A"]
    cut = torch.randperm(len(a_train), generator=torch.Generator().manual_seed(0))
    val_idx, tr_idx = cut[: len(cut) // 10], cut[len(cut) // 10 :]

    class _DS:  # the minimal dataset interface fit() uses
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __len__(self):
            return len(self.x)

    model_a = build_model(n_a)
    model_a, _ = fit(
        model_a,
        _DS(a_train.x[tr_idx], a_train.y[tr_idx]),
        _DS(a_train.x[val_idx], a_train.y[val_idx]),
        TrainSettings(epochs=args.epochs_a, patience=args.epochs_a),
        progress=False,
    )
    r_aa = acc(model_a, "A")
    print(f"task A model: top-1 on A = {r_aa:.4f} ({time.time() - t0:.0f} s)", flush=True)

    results = {}
    settings = TrainerSection(epochs=args.epochs_b, batch_size=32, ramp_epochs=0, seed=0, swa_epochs=0, distill=0.0)
    for name in STRATEGIES.names():
        t1 = time.time()
        options = {"ewc_lambda": args.ewc_lambda, "per_class": args.per_class, "selection": "herding", "temperature": 2.0}
        config = STRATEGY_CONFIGS[name](**{k: v for k, v in options.items() if k in STRATEGY_CONFIGS[name].model_fields})
        strategy = get_strategy(name)(out / "state" / name, config)
        strategy.after(copy.deepcopy(model_a), data["train", "A"])  # seed its state on task A
        model_b, _ = train_generation(model_a, data["train", "B"], strategy, settings, 1e-3, num_classes=len(order))
        r_ba, r_bb = acc(model_b, "A"), acc(model_b, "B")
        results[name] = {
            "R": {"after_A": {"A": round(r_aa, 4), "B": None}, "after_B": {"A": round(r_ba, 4), "B": round(r_bb, 4)}},
            "average_accuracy": round((r_ba + r_bb) / 2, 4),
            "forgetting_A": round(r_aa - r_ba, 4),
            "seconds": round(time.time() - t1, 1),
        }
        print(
            f"{name:10s} after B: A {r_ba:.4f}  B {r_bb:.4f}  avg {(r_ba + r_bb) / 2:.4f}  forgetting {r_aa - r_ba:.4f}  ({time.time() - t1:.0f} s)",
            flush=True,
        )

    report = {
        "tasks": {"A": order[:n_a], "B": order[n_a:]},
        "photos": {f"{k[0]}_{k[1]}": len(v) for k, v in data.items()},
        "settings": {
            "epochs_a": args.epochs_a,
            "epochs_b": args.epochs_b,
            "ewc_lambda": args.ewc_lambda,
            "rehearsal_per_class": args.per_class,
        },
        "results": results,
        "wall_s": round(time.time() - t0, 1),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["| strategy | A after A | A after B | B after B | average | forgetting of A |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r_aa:.4f} | {r['R']['after_B']['A']:.4f} | {r['R']['after_B']['B']:.4f} | {r['average_accuracy']:.4f} | {r['forgetting_A']:.4f} |"
        )
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
