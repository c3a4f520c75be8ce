"""What exact BatchNorm statistics are worth to the shipped model.

``python -m benchmarks.batchnorm [--data DIR]``

The shipped v0001's BatchNorm statistics were averaged over batches of 32 of its training photos taken in class
order (one or two classes per batch: most of the between-class spread missing from the variances). This prints its
top-1 and log-loss (FP32, torch) on the 184 validation and 184 test photos of its split (neither trained on) as
shipped and with the exact statistics over its 1,380 training photos (:mod:`trainer.batchnorm`, what every retrain
and ``edge-trainer calibrate --batchnorm`` now use), and with the exact statistics over the shipped replay photos
alone (what a retrain has). Writes ``benchmarks/results/batchnorm.md``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.batchnorm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/plantvillage"))
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/batchnorm.md"))
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    import torch.nn.functional as F

    from benchmarks.out_of_box import held_out_split
    from edge_agent.config import default_data_path, default_store_path
    from edge_agent.preprocess import preprocess_file
    from engines.store import EngineStore
    from trainer.batchnorm import recompute_batchnorm
    from trainer.publish import load_weights

    def tensors(samples):
        return torch.from_numpy(np.stack([preprocess_file(s.path) for s in samples])), torch.tensor([s.label for s in samples])

    parts = held_out_split(args.data)
    sets = {"validation (184)": tensors(parts["val"]), "test = shipped gate (184)": tensors(parts["test"])}
    train_x, _ = tensors(parts["train"])
    replay_x = torch.from_numpy(np.stack([preprocess_file(p) for p in sorted((default_data_path() / "replay").rglob("*.jpg"))]))
    shipped = load_weights(EngineStore(default_store_path()).open("v0001", verify=False))
    models = {
        "as shipped (per-batch averages, class order)": shipped,
        f"exact over its {len(train_x)} training photos": recompute_batchnorm(copy.deepcopy(shipped), train_x),
        f"exact over the {len(replay_x)} shipped replay photos": recompute_batchnorm(copy.deepcopy(shipped), replay_x),
    }
    lines = ["| v0001's BatchNorm statistics | " + " | ".join(f"{k}: top-1, log-loss" for k in sets) + " |", "|---|---|---|"]
    with torch.no_grad():
        for name, model in models.items():
            cells = []
            for x, y in sets.values():
                logits = model.eval()(x)
                wrong = int((logits.argmax(1) != y).sum())
                cells.append(f"{1 - wrong / len(y):.4f} ({wrong} wrong), {F.cross_entropy(logits, y).item():.4f}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = (
        "# Exact BatchNorm statistics and the shipped model\n\n`python -m benchmarks.batchnorm` (FP32, torch).\n\n"
        + "\n".join(lines)
        + "\n"
    )
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
