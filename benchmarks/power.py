"""Power meters: jtop on a Jetson, Intel RAPL, NVIDIA NVML; otherwise "unavailable" with the reason.

A meter measures the mean watts over a steady window of work and the joules per inference.
Never an invented figure: a meter that cannot be read says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["measure_power"]

RAPL = Path("/sys/class/powercap/intel-rapl:0/energy_uj")


def _jtop(work: Callable[[], int], seconds: float, interval: float = 0.5) -> dict:
    """Board total power from jetson-stats' jtop service (4.2+ and 7.x): ``jetson.power['tot']['power']`` is in mW.

    jtop refreshes its stats every ``interval`` seconds in its own thread; an observer registered with
    ``attach`` takes each new sample (reading ``jetson.power`` in the work loop would count one sample many
    times). The nvpmodel mode and whether jetson_clocks is on are recorded: both change the figures.
    """
    from jtop import jtop  # jetson-stats; talks to the jtop service over /run/jtop.sock

    watts: list[float] = []

    def observer(jetson) -> None:
        total = (jetson.power or {}).get("tot") or {}
        if "power" in total:
            watts.append(float(total["power"]) / 1000.0)  # mW -> W

    with jtop(interval=interval) as jetson:
        if not jetson.ok():
            raise RuntimeError("jtop service not answering")
        total = (jetson.power or {}).get("tot")
        if not total:
            raise RuntimeError("jtop found no power sensor on this board")
        nvpmodel, clocks = jetson.nvpmodel, jetson.jetson_clocks
        jetson.attach(observer)
        try:
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                n += work()
            elapsed = time.perf_counter() - t0
        finally:
            jetson.detach(observer)
    if not watts:
        raise RuntimeError(f"jtop delivered no sample in {elapsed:.1f} s (interval {interval} s): lengthen the window")
    if n <= 0:
        raise RuntimeError("no inference ran in the window")
    mean_w = sum(watts) / len(watts)
    return {
        "meter": f"jtop {total.get('name', 'total')} (board total)",
        "mean_w": round(mean_w, 3),
        "joules_per_inference": round(mean_w * elapsed / n, 6),
        "samples": len(watts),
        "inferences": n,
        "nvpmodel": None if nvpmodel is None else str(nvpmodel),
        "jetson_clocks": None if clocks is None else bool(clocks),
        "window_s": round(elapsed, 1),
    }


def _rapl(work: Callable[[], int], seconds: float) -> dict:
    e0, t0, n = int(RAPL.read_text()), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        n += work()
    e1, elapsed = int(RAPL.read_text()), time.perf_counter() - t0
    joules = (e1 - e0) / 1e6
    if joules <= 0:
        raise RuntimeError("RAPL counter did not advance (wrapped or virtualised)")
    return {
        "meter": "Intel RAPL package-0",
        "mean_w": round(joules / elapsed, 2),
        "joules_per_inference": round(joules / n, 5),
        "window_s": round(elapsed, 1),
    }


def _nvml(work: Callable[[], int], seconds: float) -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        samples, n, t0 = [], 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            n += work()
            samples.append(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # mW -> W
        elapsed = time.perf_counter() - t0
        watts = sum(samples) / len(samples)
        return {
            "meter": "NVML GPU 0 (GPU board only)",
            "mean_w": round(watts, 2),
            "joules_per_inference": round(watts * elapsed / n, 5),
            "window_s": round(elapsed, 1),
        }
    finally:
        pynvml.nvmlShutdown()


def measure_power(work: Callable[[], int], seconds: float = 10.0, gpu: bool = False) -> dict:
    """Run ``work`` (returns inferences done) for ``seconds`` under the first meter that can be read."""
    reasons = []
    meters = [("jtop", _jtop), ("RAPL", _rapl)] + ([("NVML", _nvml)] if gpu else [])
    for name, meter in meters:
        try:
            return meter(work, seconds)
        except ImportError as exc:
            reasons.append(f"{name}: {exc.name or exc} not installed")
        except PermissionError:
            reasons.append(f"{name}: no permission to read the counter (root only on this kernel)")
        except FileNotFoundError:
            reasons.append(f"{name}: {RAPL} absent (not an Intel CPU, or a VM)")
        except Exception as exc:
            reasons.append(f"{name}: {exc}")
    if not gpu:
        reasons.append("NVML: not tried for a CPU engine (it reads GPU board power only)")
    return {"meter": None, "unavailable": "; ".join(reasons)}
