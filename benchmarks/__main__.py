"""``python -m benchmarks --out DIR [--quick]``: every engine on this machine, side by side, in one run.

Per engine (ONNX Runtime CPU FP32 and INT8, CUDA, TensorRT-EP FP16, native TensorRT FP16, and a PyTorch
eager reference of the same weights): latency mean/p50/p99 and throughput at batch 1, 8 and 32 on real
photos (warm-ups, then timed iterations); on CPU the FLOP floor (model FLOPs over a measured GEMM rate)
and each engine's ratio to it; power where a meter can be read. Then the daemon's start-to-READY and
steady RSS, and install sizes. Absent engines are listed with the reason. Writes ``results.json``,
``results.md`` and ``latency.png`` into DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.latency import CASES, EngineCase, LatencyResult, measure, real_batch

REPO = Path(__file__).resolve().parents[1]
TORCH = EngineCase("PyTorch eager FP32 (reference)", {})


def _torch_case(photos_batch, warmup: int, iters: int, store: Path) -> LatencyResult:
    """The same weights in PyTorch eager mode (needs the 'train' extra)."""
    try:
        import torch

        from engines.store import EngineStore
        from trainer.publish import load_weights
    except ImportError as exc:
        return LatencyResult(TORCH.name, len(photos_batch), unavailable=f"{exc.name} not installed (the 'train' extra)")
    model = load_weights(EngineStore(store).open()).eval()
    x = torch.from_numpy(photos_batch)
    times = []
    with torch.inference_mode():
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            model(x)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    mean = statistics.fmean(times)
    return LatencyResult(
        TORCH.name,
        len(x),
        round(mean, 3),
        round(times[len(times) // 2], 3),
        round(times[min(len(times) - 1, int(len(times) * 0.99))], 3),
        round(len(x) * 1000 / mean, 1),
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)",
    )


def _dist_size(name: str) -> int | None:
    from importlib import metadata

    try:
        files = metadata.distribution(name).files or []
    except metadata.PackageNotFoundError:
        return None
    return sum(f.locate().stat().st_size for f in files if f.locate().is_file())


def install_sizes(version: Path) -> dict:
    out = {"model": {f.name: f.stat().st_size for f in sorted(version.iterdir())}}
    daemon = ["onnxruntime", "onnxruntime-gpu", "opencv-python-headless", "opencv-python", "numpy", "pyzmq", "watchdog"]
    daemon += ["structlog", "pydantic", "pydantic-core"]
    packages = [*daemon, "torch", "onnx", "tensorrt", "pycuda"]
    out["packages"] = {p: s for p in packages if (s := _dist_size(p)) is not None}
    out["daemon_runtime_total"] = sum(out["packages"].get(p, 0) for p in daemon)
    return out


def _power_for(case: EngineCase, batch, store: Path, seconds: float) -> dict:
    from benchmarks.power import measure_power
    from edge_agent.config import parse_config
    from engines.loader import open_engine

    with open_engine(store, parse_config({"engine": case.engine}).engine) as engine:

        def work() -> int:
            engine.infer(batch)
            return len(batch)

        return measure_power(work, seconds, gpu=case.engine.get("provider") in ("cuda", "tensorrt") or case.engine["type"] == "tensorrt")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [r for r in rows if r["batch"] == 1 and not r["unavailable"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    names = [r["case"].replace(" (reference)", "") for r in present]
    a.barh(names, [r["mean_ms"] for r in present], color="steelblue")
    a.set(xlabel="batch-1 latency, mean ms", title="Latency (lower is better)")
    batches = sorted({x["batch"] for x in rows if not x["unavailable"]})
    height = 0.8 / max(len(batches), 1)
    for k, batch in enumerate(batches):  # grouped bars, one per batch size
        vals = [
            next((x["images_per_s"] for x in rows if x["case"] == r["case"] and x["batch"] == batch and not x["unavailable"]), 0)
            for r in present
        ]
        b.barh([i - 0.4 + height * (k + 0.5) for i in range(len(present))], vals, height=height, label=f"batch {batch}")
    b.set_yticks(range(len(present)), names)
    b.set(xlabel="images/s", title="Throughput")
    b.legend(loc="lower right", fontsize=8)
    absent = sorted({r["case"] for r in rows if r["unavailable"]})
    if absent:
        fig.text(0.01, 0.01, "absent here (reasons in results.md): " + ", ".join(absent), fontsize=7, color="dimgrey")
    fig.tight_layout(rect=(0, 0.05 if absent else 0, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _markdown(r: dict) -> str:
    lines = [
        f"# edge-agent benchmark ({r['machine']['summary']})",
        "",
        f"{r['settings']['warmup']} warm-ups then {r['settings']['iters']} timed runs per row; real preprocessed photos.",
        "",
        "| engine | batch | mean ms | p50 ms | p99 ms | images/s | x FLOP floor | provider |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["latency"]:
        if row["unavailable"]:
            lines.append(f"| {row['case']} | - | absent: {row['unavailable']} | | | | | |")
            continue
        floor = f"{row['floor_ratio']:.1f}" if row.get("floor_ratio") else "-"
        lines.append(
            f"| {row['case']} | {row['batch']} | {row['mean_ms']} | {row['p50_ms']} | {row['p99_ms']} | {row['images_per_s']} | {floor} | {row['provider']} |"
        )
    f = r["flop_floor"]
    lines += [
        "",
        f"FLOP floor: {f['model_gflops_per_photo']:.3f} GFLOP per photo; GEMM {f['gemm_gflops']:.0f} GFLOP/s "
        f"(numpy float32 {f['gemm_n']}x{f['gemm_n']}) -> {f['floor_ms_per_photo']:.3f} ms per photo; 'x FLOP floor' = mean time per "
        "photo / that floor (below 1 means the engine does less arithmetic than a dense convolution, e.g. Winograd or INT8).",
        "",
        "| power | engine | meter | mean W | J / inference | notes |",
        "|---|---|---|---|---|---|",
    ]
    for p in r["power"]:
        if p.get("meter"):
            notes = ", ".join(f"{k} {p[k]}" for k in ("nvpmodel", "jetson_clocks", "window_s") if k in p)
            lines.append(f"| | {p['case']} | {p['meter']} | {p['mean_w']} | {p['joules_per_inference']} | {notes} |")
        else:
            lines.append(f"| | {p['case']} | unavailable | | | {p['unavailable']} |")
    d = r["daemon"]
    lines += [
        "",
        "| daemon | value |",
        "|---|---|",
        f"| start to READY=1 on a fresh state directory (seeds the shipped store), median of {len(d['start_to_ready_s'])} | {d['start_to_ready_s_median']:.3f} s |",
        f"| restart to READY=1 (state directory seeded), median of {len(d.get('restart_to_ready_s', []))} | {d.get('restart_to_ready_s_median', float('nan')):.3f} s |",
        f"| RSS idle / 2 s after {d['photos']} photos / peak | {d['rss_mb_idle']:.0f} / {d['rss_mb_steady']:.0f} / {d['rss_mb_peak']:.0f} MB |",
        f"| end to end, sustained ({d['photos']} photos dropped at once) | {d['end_to_end_photos_per_s']:.0f} photos/s |",
    ]
    s = r["install_sizes"]
    lines += ["", "| install size | MB |", "|---|---|"]
    lines += [f"| model: {k} | {v / 1e6:.2f} |" for k, v in s["model"].items()]
    lines += [f"| package: {k} | {v / 1e6:.1f} |" for k, v in s["packages"].items()]
    lines.append(
        f"| daemon runtime (ONNX Runtime, OpenCV, numpy, pyzmq, watchdog, structlog, pydantic) | {s['daemon_runtime_total'] / 1e6:.1f} |"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for results.json, results.md and latency.png")
    ap.add_argument("--quick", action="store_true", help="fewer iterations and photos (a smoke run, not for publishing)")
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/plantvillage"))
    ap.add_argument("--store", default=None, help="engine store (default: the shipped model)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--power-seconds", type=float, default=10.0, help="steady window per engine for power")
    args = ap.parse_args(argv)
    if args.quick:
        args.warmup, args.iters, args.power_seconds = 2, 10, 2.0
    from tqdm import tqdm

    from benchmarks.daemon import end_to_end, start_to_ready
    from benchmarks.floor import gemm_gflops, model_flops
    from edge_agent.config import default_store_path

    store = Path(args.store) if args.store else default_store_path()
    photos = sorted(Path(args.data).rglob("*.jpg"))
    if not photos:
        print(f"python -m benchmarks: no photos under {args.data}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [*CASES, TORCH]
    steps = len(cases) * len(args.batch) + 4
    bar = tqdm(total=steps, desc="benchmark", unit="step", dynamic_ncols=True)
    t0 = time.perf_counter()
    batches = {b: real_batch(photos[::37], b, store) for b in args.batch}
    rows, present = [], []
    for case in cases:
        for b in args.batch:
            bar.set_postfix_str(f"{case.name}, batch {b}")
            r = (
                _torch_case(batches[b], args.warmup, args.iters, store)
                if case is TORCH
                else measure(case, batches[b], args.warmup, args.iters, store)
            )
            rows.append(r.__dict__)
            bar.update(1)
            if r.unavailable:
                bar.update(len(args.batch) - args.batch.index(b) - 1)
                break
        else:
            present.append(case)
    bar.set_postfix_str("FLOP floor")
    from engines.store import EngineStore

    version = EngineStore(store).open().path  # the version the daemon would serve
    flops, gemm_n = model_flops(version / "model.onnx"), 1024
    gemm = gemm_gflops(gemm_n, 1.0 if args.quick else 3.0)
    floor_ms = flops / (gemm * 1e9) * 1000
    for row in rows:
        if not row["unavailable"] and ("CPU" in row["case"] or "PyTorch" in row["case"]):
            row["floor_ratio"] = round(row["mean_ms"] / row["batch"] / floor_ms, 2)
    bar.update(1)
    bar.set_postfix_str("power")
    power = []
    for case in present:
        if case is TORCH:
            continue
        power.append({"case": case.name, **_power_for(case, batches[args.batch[0]], store, args.power_seconds)})
    bar.update(1)
    bar.set_postfix_str("daemon start-up and memory")
    with tempfile.TemporaryDirectory(prefix="edge-bench-") as tmp:
        ready = start_to_ready(Path(tmp), starts=3 if args.quick else 5)
        again = start_to_ready(Path(tmp) / "restart", starts=3 if args.quick else 5, restart=True)
        n = 200 if args.quick else 1000
        (Path(tmp) / "e2e").mkdir()
        e2e = end_to_end(photos[:n], Path(tmp) / "e2e")
    bar.update(1)
    bar.set_postfix_str("install sizes")
    sizes = install_sizes(version)
    bar.update(1)
    bar.close()
    import onnxruntime

    results = {
        "machine": {
            "summary": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.processor() or platform.system()}, "
            f"Python {platform.python_version()}, ONNX Runtime {onnxruntime.__version__}",
            "node": platform.node(),
        },
        "settings": {"warmup": args.warmup, "iters": args.iters, "batches": args.batch, "quick": args.quick, "store": str(store)},
        "latency": rows,
        "flop_floor": {"model_gflops_per_photo": flops / 1e9, "gemm_gflops": gemm, "gemm_n": gemm_n, "floor_ms_per_photo": floor_ms},
        "power": power,
        "daemon": {
            "start_to_ready_s": ready,
            "start_to_ready_s_median": statistics.median(ready),
            "restart_to_ready_s": again,
            "restart_to_ready_s_median": statistics.median(again),
            "photos": n,
            **e2e,
        },
        "install_sizes": sizes,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(_markdown(results))
    _plot(rows, out / "latency.png")
    print(_markdown(results))
    print(f"wrote {out / 'results.json'}, results.md, latency.png in {results['wall_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
