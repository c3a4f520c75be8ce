"""Where one on-device retrain's memory goes: its resident size sampled through each step, and what the C allocator's
settings change.

``python -m benchmarks.retrain_memory --out DIR [--seed 1] [--labels 100] [--unlabelled 400] [--mmap-threshold BYTES]
[--trim-before-training]``

The retrain of :mod:`benchmarks.retrain_cost` (same photos, same state directory, the trainer's defaults), run in this
process instead of a child so that a thread can read ``VmRSS`` every 0.25 s and each named step of
:func:`trainer.retrain.retrain` can be timed and read on entry and exit (resident size and the process's peak).
``--mmap-threshold`` fixes glibc's ``M_MMAP_THRESHOLD`` (blocks that large are mapped and unmapped on their own,
never left in the heap); ``--trim-before-training`` hands the free heap back (``malloc_trim``) before each
candidate's training. Writes ``DIR/report.json`` (every step, every sample, user and system CPU seconds) and
``DIR/summary.md``. Slower and larger than a child's retrain by the benchmark's own ~300 MB of photos and engines:
compare runs of this benchmark with each other, not with :mod:`benchmarks.retrain_cost`.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import resource
import threading
import time
from pathlib import Path

from benchmarks.retrain_cost import SHARED

__all__ = ["segments", "main"]

#: The steps of a retrain that are timed and read: module, function.
STEPS = {
    "trainer.retrain": ["load_labelled", "train_generation", "with_unlabelled", "adapt_batchnorm", "gate", "field_gate"],
    "trainer.loop.second_candidate": ["load_unlabelled", "teach", "train_generation", "prefer"],
}

#: glibc's mallopt parameter number of M_MMAP_THRESHOLD.
_M_MMAP_THRESHOLD = -3


def _rss() -> int:
    """This process's resident size now (``VmRSS``) in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))


def _now() -> list:
    """Resident size now and the process's peak so far (:func:`trainer._memory.peak_rss_mb`), MiB."""
    from trainer._memory import peak_rss_mb

    return [_rss(), round(peak_rss_mb())]


def segments(samples: list[list]) -> list[dict]:
    """Consecutive samples ``[seconds, rss_mb, step]`` of one step as one row: the step, its seconds, lowest and highest."""
    rows: list[dict] = []
    for t, rss, step in samples:
        if not rows or rows[-1]["step"] != step:
            rows.append({"step": step, "from_s": t, "to_s": t, "min_mb": rss, "max_mb": rss})
        row = rows[-1]
        row.update(to_s=t, min_mb=min(row["min_mb"], rss), max_mb=max(row["max_mb"], rss))
    return rows


def _instrument(events: list, stack: list, t0: float, trim: bool) -> None:
    """Wrap each of :data:`STEPS` so that its entry and exit are recorded (and, with ``trim``, the heap is handed back
    before a training)."""
    import importlib

    from engines.base import malloc_trim

    for module_name, names in STEPS.items():
        module = importlib.import_module(module_name)
        for name in names:
            f = getattr(module, name)

            @functools.wraps(f)
            def step(*a, _f=f, _name=name, **k):
                if trim and _name == "train_generation":
                    malloc_trim()
                stack.append(_name)
                events.append([round(time.time() - t0, 2), "enter", _name, *_now()])
                try:
                    return _f(*a, **k)
                finally:
                    events.append([round(time.time() - t0, 2), "exit", _name, *_now()])
                    stack.pop()

            setattr(module, name, step)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--labels", type=int, default=100)
    ap.add_argument("--unlabelled", type=int, default=400)
    ap.add_argument("--field", default="apple-orchard")
    ap.add_argument("--mmap-threshold", type=int, default=None, help="glibc M_MMAP_THRESHOLD in bytes (default: glibc's dynamic one).")
    ap.add_argument("--trim-before-training", action="store_true", help="malloc_trim before each candidate's training.")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.mmap_threshold is not None and not ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, args.mmap_threshold):
        raise SystemExit(f"mallopt(M_MMAP_THRESHOLD, {args.mmap_threshold}) refused: not glibc, or a value out of range")
    import trainer._child as child
    from benchmarks.retrain_cost import one_seed
    from engines.signing import load_key
    from engines.store import EngineStore
    from trainer.retrain import retrain
    from trainer.samples import SampleStore

    t0, events, samples, stack, done = time.time(), [], [], ["-"], threading.Event()
    _instrument(events, stack, t0, args.trim_before_training)

    def sample() -> None:
        while not done.is_set():
            samples.append([round(time.time() - t0, 2), _rss(), "/".join(stack[-2:])])
            time.sleep(0.25)

    def in_process(cfg, store_root, samples_root, strategy_dir, key_path, announce, progress, should_stop):
        """:func:`trainer._child.retrain_in_child`, here, sampled."""
        store = SampleStore(samples_root)
        events.append([round(time.time() - t0, 2), "start", "retrain", *_now()])
        threading.Thread(target=sample, daemon=True).start()
        try:
            return retrain(cfg, EngineStore(store_root), store, Path(strategy_dir), signing_key=load_key(key_path))
        finally:
            done.set()
            store.close()

    child.retrain_in_child = in_process
    result = one_seed(args.seed, args.labels, SHARED / "field" / args.field, SHARED / "plantvillage", unlabelled=args.unlabelled)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report = {
        "settings": vars(args),
        "result": {k: result[k] for k in ("before", "after", "published", "retrain_seconds", "memory", "unlabelled")},
        "cpu_s": {"user": round(usage.ru_utime, 1), "system": round(usage.ru_stime, 1)},
        "events": events,
        "segments": segments(samples),
        "samples": samples,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"# Where one retrain's memory goes (seed {args.seed}, {args.labels} labels, {args.unlabelled} unlabelled photos)",
        "",
        f"mmap threshold {args.mmap_threshold or 'glibc dynamic'}; trim before training: {args.trim_before_training}. "
        f"Retrain {result['retrain_seconds']} s; CPU user {report['cpu_s']['user']} s, system {report['cpu_s']['system']} s; "
        f"peak {max(e[4] for e in events)} MiB; field {result['after']['field']}, lab {result['after']['lab']}.",
        "",
        "| step | entered: RSS / peak MiB | left: RSS / peak MiB |",
        "|---|---|---|",
    ]
    entered = {}
    for t, kind, name, rss, hwm in events:
        if kind == "enter":
            entered.setdefault(name, []).append((rss, hwm))
        elif kind == "exit":
            rss0, hwm0 = entered[name].pop()
            lines.append(f"| {name} (to {t:.0f} s) | {rss0} / {hwm0} | {rss} / {hwm} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
