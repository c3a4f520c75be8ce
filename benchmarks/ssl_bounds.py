"""How much could the field stream teach at best? Fine-tunes of one simulation's baseline, offline.

``python -m benchmarks.ssl_bounds --sim DIR --out DIR [--arms ...] [--epochs 20]``

``--sim`` is a ``python -m benchmarks.simulate`` output folder: its supervised baseline (store version v0001) and
its settings (seed, fractions), which give back the very same splits. Each *arm* fine-tunes that baseline
with the retrain's own loop (:func:`trainer.continual.train_generation`, plain fine-tuning, same epochs,
learning rate and seed) on the labelled pool plus part of the stream, then reports validation and test top-1:

* ``labelled``: the labelled pool alone (what more training alone is worth);
* ``pseudo``: plus the stream photos the baseline is confident about (softmax >= tau), with its
  pseudo-labels and the confidence-weighted, ramped pseudo-label loss (what self-training can use; without the
  service's class balancing, recheck and gate, which the simulation itself measures);
* ``confident-true``: plus the same photos with their true labels (self-training with perfect precision);
* ``all-true``: plus every stream photo with its true label (the ceiling: a fully labelled stream);
* ``consistency``: FixMatch-style (Sohn et al., 2020) over the whole stream, no labels: each step the model
  labels weakly augmented stream photos, and where it is at or above tau it learns that label on a strongly
  augmented copy (larger rotation and jitter, cutout), next to the labelled cross-entropy. Research only:
  the daemon hands over confident photos alone, so the product cannot train this way today.

The gap between ``confident-true`` and ``all-true`` is what the photos the model is unsure of hold, which
confident pseudo-labels can never reach. Writes ``bounds.json`` and ``bounds.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = ("labelled", "pseudo", "confident-true", "all-true", "consistency")


def run(sim: Path, arms: list[str], epochs: int, lr: float, threads: int, data: str | None = None) -> dict:
    import torch
    import torch.nn.functional as F

    from benchmarks.simulate import SimSettings, split_photos
    from edge_agent.config import TrainerSection
    from engines.store import EngineStore
    from trainer.continual import train_generation
    from trainer.data import TensorDataset
    from trainer.publish import load_weights
    from trainer.strategies.base import Generation, get_strategy
    from trainer.train import evaluate

    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    report = json.loads((sim / "report.json").read_text())
    settings = {k: v for k, v in report["settings"].items() if k in SimSettings.__dataclass_fields__}
    s = SimSettings(**settings)
    torch.set_num_threads(threads)
    split = split_photos(data or report["data"], s)
    if split.sizes() != report["split"]:
        raise SystemExit(f"{sim}: the photos at {data or report['data']} no longer give that simulation's splits")
    baseline = load_weights(EngineStore(sim / "store").open("v0001")).eval()
    sets = {name: TensorDataset(getattr(split, name)) for name in ("labelled", "val", "test", "stream")}
    stream = sets["stream"]
    with torch.no_grad():
        probs = torch.cat([F.softmax(baseline(stream.x[i : i + 128]), 1) for i in range(0, len(stream), 128)])
    conf, pred = probs.max(1)
    sure = conf >= s.tau
    labelled = Generation(sets["labelled"].x, sets["labelled"].y)
    extra = {
        "labelled": None,
        "pseudo": Generation(stream.x[sure], pred[sure], conf[sure], torch.ones(int(sure.sum()), dtype=torch.bool)),
        "confident-true": Generation(stream.x[sure], stream.y[sure]),
        "all-true": Generation(stream.x, stream.y),
        "consistency": None,  # the stream's photos without labels; see consistency_finetune
    }

    def scores(model) -> dict:
        return {name: round(evaluate(model, sets[name].x, sets[name].y).top1, 4) for name in ("val", "test")}

    rows = [{"arm": "baseline", "photos": len(labelled), **scores(baseline), "seconds": 0.0}]
    print(f"baseline: {rows[0]}", file=sys.stderr, flush=True)
    for arm in arms:
        t0 = time.perf_counter()
        data_ = labelled + extra[arm] if extra[arm] is not None else labelled
        if arm == "consistency":
            candidate = consistency_finetune(baseline, labelled, stream.x, s.tau, epochs, lr, s.seed)
        else:
            with tempfile.TemporaryDirectory() as td:
                candidate, _ = train_generation(
                    baseline,
                    data_,
                    get_strategy("finetune")(Path(td)),
                    TrainerSection(epochs=epochs, seed=s.seed, ramp_epochs=10, swa_epochs=0, distill=0.0),
                    lr,
                )
        photos = len(labelled) + len(stream) if arm == "consistency" else len(data_)
        rows.append({"arm": arm, "photos": photos, **scores(candidate), "seconds": round(time.perf_counter() - t0, 1)})
        print(f"{arm}: {rows[-1]}", file=sys.stderr, flush=True)
    right = pred == stream.y
    return {
        "sim": str(sim.resolve()),
        "tau": s.tau,
        "epochs": epochs,
        "lr": lr,
        "split": split.sizes(),
        "stream": {
            "photos": len(stream),
            "confident": int(sure.sum()),
            "confident_right": round(float(right[sure].float().mean()), 4) if sure.any() else None,
            "unsure_right": round(float(right[~sure].float().mean()), 4) if (~sure).any() else None,
        },
        "rows": rows,
    }


def strong_augment():
    """The labelled photos' augmentation, stronger (rotation 30 degrees, jitter 0.4, noise 0.04), then cutout:
    one square of 25-50 % of the side set to the mean colour."""
    from trainer.augment import Augment

    return Augment(max_degrees=30, brightness=0.4, contrast=0.4, noise_std=0.04, cutout=(0.25, 0.5))


def consistency_loss(strong_logits, weak_probs, tau: float):
    """Mean over the batch of the strong views' cross-entropy against the weak views' top class, counted only
    where the weak view is at or above ``tau`` (the others add zero but still count in the mean, as in FixMatch)."""
    import torch.nn.functional as F

    conf, target = weak_probs.max(1)
    return (F.cross_entropy(strong_logits, target, reduction="none") * (conf >= tau).float()).mean()


def consistency_finetune(baseline, labelled, unlabelled, tau: float, epochs: int, lr: float, seed: int, mu: int = 2, batch: int = 32):
    """Fine-tune ``baseline`` FixMatch-style: labelled cross-entropy plus, on ``mu`` unlabelled photos per
    labelled one, cross-entropy of the strong view against the weak view's prediction where that is >= tau."""
    import copy
    import math

    import torch
    import torch.nn.functional as F

    from trainer.augment import Augment
    from trainer.batchnorm import recompute_batchnorm
    from trainer.train import lr_schedule

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model, weak, strong = copy.deepcopy(baseline), Augment(), strong_augment()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps = math.ceil(len(unlabelled) / (batch * mu))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule(epochs * steps))
    for _ in range(epochs):
        model.train()
        uorder, lorder = torch.randperm(len(unlabelled), generator=gen), torch.randperm(len(labelled), generator=gen)
        for step in range(steps):
            ui = uorder[step * batch * mu : (step + 1) * batch * mu]
            li = lorder.roll(-step * batch)[:batch]
            with torch.no_grad():
                weak_probs = F.softmax(model(weak(unlabelled[ui], gen)), 1)
            logits = model(torch.cat([weak(labelled.x[li], gen), strong(unlabelled[ui], gen)]))
            loss = F.cross_entropy(logits[: len(li)], labelled.y[li]) + consistency_loss(logits[len(li) :], weak_probs, tau)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return recompute_batchnorm(model, torch.cat([labelled.x, unlabelled]), batch)


def markdown(result: dict) -> str:
    st = result["stream"]
    base = result["rows"][0]
    lines = [
        f"Fine-tunes of the baseline in `{result['sim']}` ({result['epochs']} epochs, lr {result['lr']}, plain fine-tuning). "
        f"Stream: {st['photos']} photos, {st['confident']} at softmax >= {result['tau']} ({st['confident_right']} of them right; "
        f"the baseline gets {st['unsure_right']} of the others right).",
        "",
        "| arm | photos trained on | validation top-1 | test top-1 | test vs baseline (points) | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['arm']} | {r['photos']} | {r['val']:.4f} | {r['test']:.4f} | {(r['test'] - base['test']) * 100:+.1f} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ssl_bounds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", required=True, help="a `python -m benchmarks.simulate` output folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), help=f"any of {', '.join(ARMS)}")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", help="the photos, if they moved since the simulation ran")
    args = ap.parse_args(argv)
    result = run(Path(args.sim), args.arms, args.epochs, args.lr, args.threads, args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bounds.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (out / "bounds.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
