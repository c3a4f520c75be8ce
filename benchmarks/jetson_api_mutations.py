"""Do the Jetson-path tests catch a wrong call? Each mutation below changes one API call in the Jetson paths the
way a slip would (a wrong name, argument order, unit or a missing step), runs the tests against the fakes
(tests/test_jetson_paths.py), and restores the file. Every mutation must make a test fail.

``python -m benchmarks.jetson_api_mutations [--out benchmarks/results/jetson-api-mutations.md]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: (file, original text, mutated text, what the slip is)
MUTATIONS = [
    (
        "engines/backends/tensorrt_backend.py",
        "        self._ctx.push()\n        try:\n            return np.concatenate",
        "        try:\n            return np.concatenate",
        "no context push in infer",
    ),
    ("engines/backends/tensorrt_backend.py", "        self._stream.synchronize()\n", "", "no stream synchronize"),
    (
        "engines/backends/tensorrt_backend.py",
        "cuda.memcpy_htod_async(self._dev_in, self._host_in[:k], self._stream)",
        "cuda.memcpy_htod_async(self._host_in[:k], self._dev_in, self._stream)",
        "htod arguments swapped",
    ),
    (
        "engines/backends/tensorrt_backend.py",
        "execute_async_v3(stream_handle=self._stream.handle)",
        "execute_async_v3(stream=self._stream.handle)",
        "wrong keyword for execute_async_v3",
    ),
    (
        "engines/backends/tensorrt_backend.py",
        "execute_async_v3(stream_handle=self._stream.handle)",
        "execute_async_v2(stream_handle=self._stream.handle)",
        "execute_async_v2 (removed in 10)",
    ),
    (
        "engines/backends/tensorrt_backend.py",
        "        if not self._context.set_input_shape(self._in_name, tuple(batch.shape)):\n            raise",
        "        if False:\n            raise",
        "input shape never set",
    ),
    (
        "engines/backends/tensorrt_backend.py",
        "cuda.pagelocked_empty((n, *shape), in_dtype)",
        "cuda.pagelocked_empty((n, *shape), np.float32)",
        "host input assumed float32",
    ),
    (
        "engines/backends/tensorrt_backend.py",
        "self._context.set_tensor_address(name, int(mem))",
        "self._context.set_tensor_address(int(mem), name)",
        "set_tensor_address arguments swapped",
    ),
    (
        "engines/backends/_tensorrt_plan.py",
        "flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)",
        "flags = 0",
        "no EXPLICIT_BATCH on TensorRT 8",
    ),
    (
        "engines/backends/_tensorrt_plan.py",
        "profile.set_shape(input_name, (min_batch, *input_shape), (opt_batch, *input_shape), (max_batch, *input_shape))",
        "profile.set_shape(input_name, (max_batch, *input_shape), (opt_batch, *input_shape), (min_batch, *input_shape))",
        "profile min/max swapped",
    ),
    ("engines/backends/_tensorrt_plan.py", "if not parser.parse(model):", "if not parser.parse(str(onnx_path)):", "parser given a path"),
    (
        "engines/backends/_tensorrt_plan.py",
        "config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)",
        "config.set_memory_pool_limit(workspace_mb << 20, trt.MemoryPoolType.WORKSPACE)",
        "set_memory_pool_limit arguments swapped",
    ),
    (
        "engines/backends/onnxruntime_backend.py",
        '"trt_fp16_enable": precision == "fp16"',
        '"trt_fp16": precision == "fp16"',
        "TensorRT EP option misnamed",
    ),
    (
        "engines/backends/onnxruntime_backend.py",
        '"trt_profile_min_shapes": f"{name}:1x{dims}"',
        '"trt_profile_min_shapes": f"{name}:1,{dims}"',
        "profile shape in the wrong format",
    ),
    (
        "engines/backends/onnxruntime_backend.py",
        '"arena_extend_strategy": "kSameAsRequested"',
        '"arena_extend_strategy": "same"',
        "CUDA EP option value",
    ),
    (
        "benchmarks/power.py",
        'watts.append(float(total["power"]) / 1000.0)',
        'watts.append(float(total["power"]))',
        "jtop power taken as watts (it is mW)",
    ),
    (
        "benchmarks/power.py",
        'total = (jetson.power or {}).get("tot") or {}',
        'total = (jetson.power or {}).get("total") or {}',
        "jtop total under a wrong key",
    ),
    (
        "benchmarks/power.py",
        '"jetson_clocks": None if clocks is None else bool(clocks)',
        '"jetson_clocks": bool(clocks)',
        "absent jetson_clocks recorded as off",
    ),
    ("benchmarks/power.py", "jetson.attach(observer)", "observer(jetson)", "one jtop sample instead of a trace"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.jetson_api_mutations", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/jetson-api-mutations.md"))
    args = ap.parse_args(argv)
    rows, missed = [], 0
    for path, old, new, what in MUTATIONS:
        file = REPO / path
        original = file.read_text()
        if old not in original:
            raise SystemExit(f"{path}: the text to mutate for {what!r} is gone; update this list")
        file.write_text(original.replace(old, new, 1))
        try:
            r = subprocess.run(
                [sys.executable, "-m", "pytest", "tests/test_jetson_paths.py", "-q", "-x", "-p", "no:cacheprovider"],
                capture_output=True,
                text=True,
                cwd=REPO,
            )
        finally:
            file.write_text(original)
        failed = [ln.split(" - ")[0].removeprefix("FAILED ") for ln in r.stdout.splitlines() if ln.startswith("FAILED")]
        caught = r.returncode != 0
        missed += not caught
        tests = ", ".join(f"`{f.split('::')[-1]}`" for f in failed)
        rows.append(f"| {what} | `{path}` | {'caught by ' + tests if caught else '**missed**'} |")
        print(rows[-1], flush=True)
    text = (
        "# Jetson API calls: does a wrong call fail a test?\n\n`python -m benchmarks.jetson_api_mutations`: each row "
        "changes one call, runs tests/test_jetson_paths.py against the fakes, and restores the file.\n\n"
        "| mutation | file | result |\n|---|---|---|\n" + "\n".join(rows) + f"\n\n{len(rows) - missed} of {len(rows)} caught.\n"
    )
    Path(args.out).write_text(text)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
