"""Which of a version's two CPU precisions runs here: INT8 only where it is faster than FP32 on this machine and gives
FP32's answers on this machine, measured once per version, INT8 file and ONNX Runtime release, and cached."""

from __future__ import annotations

import functools
import json
import platform
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engines.cache import cache_dir
from engines.durable import atomic_write

if TYPE_CHECKING:
    import numpy as np

    from engines.store import StoreVersion

__all__ = ["INT8_DRIFT", "NO_VNNI", "agreement", "answer_file", "decide", "read_answer", "timings", "write_answer", "x86_without_vnni"]

#: How much lower INT8's agreement with FP32 may be here than the manifest records (measured where it was built) before
#: FP32 runs instead: half a point. v4000's INT8 on an AVX2 CPU without VNNI: 0.982 of the gate photos against 1.000.
INT8_DRIFT = 0.005


#: Why INT8 does not run on an x86 CPU without VNNI, measured (docs/model.md, "INT8 on a CPU without VNNI").
NO_VNNI = (
    "this x86 CPU has no VNNI, where ONNX Runtime's 8-bit kernels saturate their sums: INT8 gave FP32's answer on "
    "0.69 (8-bit weights) to 0.84 (7-bit) of field photos on such a CPU, though on 0.98-0.99 of lab photos"
)


@functools.cache
def x86_without_vnni(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this is an x86 CPU whose flags (Linux's ``cpuinfo``) show no VNNI (AVX-512 VNNI, AVX-VNNI or AMX):
    ONNX Runtime's 8-bit kernels then add pairs of products in 16 bits and saturate. False where it cannot tell
    (another architecture, another system)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return False
    return flags is not None and not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags)


def agreement(int8, fp32, batches) -> dict:
    """The share of the photos in ``batches`` on which the ``int8`` session's top-1 equals the ``fp32`` one's (and how
    many); agreement None where there were none."""
    same = photos = 0
    for batch in batches:
        feed8, feed32 = {int8.get_inputs()[0].name: batch}, {fp32.get_inputs()[0].name: batch}
        a = int8.run([int8.get_outputs()[0].name], feed8)[0].argmax(1)
        b = fp32.run([fp32.get_outputs()[0].name], feed32)[0].argmax(1)
        same, photos = same + int((a == b).sum()), photos + len(batch)
    return {"agreement": round(same / photos, 4) if photos else None, "photos": photos}


def timings(int8, fp32, photo: np.ndarray, runs: int = 30) -> dict:
    """The median milliseconds a run of ``photo`` takes on the ``int8`` and on the ``fp32`` session, their runs taken
    in turn so that a load that comes and goes (photos being served meanwhile) falls on both alike."""
    times: dict[str, list[float]] = {"int8_ms": [], "fp32_ms": []}
    sessions = {"int8_ms": int8, "fp32_ms": fp32}
    feeds = {k: ([s.get_outputs()[0].name], {s.get_inputs()[0].name: photo}) for k, s in sessions.items()}
    for i in range(runs + 3):  # three to warm up
        for key, session in sessions.items():
            t0 = time.perf_counter()
            session.run(*feeds[key])
            if i >= 3:
                times[key].append((time.perf_counter() - t0) * 1000)
    return {"fp32_ms": round(statistics.median(times["fp32_ms"]), 3), "int8_ms": round(statistics.median(times["int8_ms"]), 3)}


def answer_file(version: StoreVersion, configured_cache: str, runtime_version: str) -> Path:
    """Where this machine's answer for ``version``'s INT8 file under ONNX Runtime ``runtime_version`` is cached."""
    sha = version.manifest["files"][version.artifact("int8").name]["sha256"][:16]
    return cache_dir(configured_cache, "ort-precision") / f"{version.name}-{sha}-ort{runtime_version}.json"


def read_answer(path: Path, with_agreement: bool) -> dict | None:
    """The cached timing (and agreement) at ``path``, or None where there is none to trust: missing, unreadable,
    garbled, or timed before the agreement was checked where ``with_agreement`` asks for it."""
    try:
        measured = json.loads(path.read_text())
        float(measured["fp32_ms"]), float(measured["int8_ms"])
        here = measured.get("agreement", None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if with_agreement and "agreement" not in measured:
        return None
    if here is not None and (isinstance(here, bool) or not isinstance(here, (int, float))):
        return None
    return measured


def write_answer(path: Path, measured: dict) -> None:
    """Cache ``measured`` at ``path``; a read-only cache is measured again at the next start."""
    try:
        atomic_write(path, json.dumps(measured).encode(), durable=False)
    except OSError:
        pass


def decide(measured: dict, version: StoreVersion, min_agreement: float, why: str) -> tuple[str, str]:
    """The precision ``measured`` picks for ``version`` (INT8 only where faster and agreeing here on at least
    ``min_agreement`` and the manifest's figure less :data:`INT8_DRIFT`), and why, after the manifest's reason ``why``."""
    fp32_ms, int8_ms = float(measured["fp32_ms"]), float(measured["int8_ms"])
    said = f"INT8 {int8_ms:.2f} ms vs FP32 {fp32_ms:.2f} ms a photo here"
    here = measured.get("agreement")
    recorded = float(version.manifest["metrics"]["int8"]["top1_agreement_with_fp32"])  # choose_precision read it
    bar = max(min_agreement, recorded - INT8_DRIFT)
    if fp32_ms < int8_ms:
        return "fp32", f"{why}, but {said}: FP32 is faster"
    if here is not None and here < bar:
        return "fp32", (
            f"{why}, but here only on {here:.3f} of {measured.get('photos')} check photos (< {bar:.3f}: "
            "this CPU's 8-bit arithmetic differs from the build machine's, as without VNNI): FP32"
        )
    if here is not None:
        said += f", agreeing with FP32 here on {here:.3f} of {measured.get('photos')} check photos"
    return "int8", f"{why}; {said}"
