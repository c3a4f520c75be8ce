"""The provider options onnxruntime-gpu parses, as its sources list them.

TensorRT EP: onnxruntime/core/providers/tensorrt/tensorrt_execution_provider_info.cc
(``provider_option_names``); CUDA EP: onnxruntime/core/providers/cuda/cuda_execution_provider_info.cc.
ONNX Runtime's ProviderOptionsParser rejects a name it does not know ("Unknown provider option"),
the Python binding turns every value into a string, and a profile shape is
``name:DxDxD[,name:DxDxD]`` with all three of min/opt/max given together.
"""

from __future__ import annotations

import re

__all__ = ["TENSORRT_OPTIONS", "CUDA_OPTIONS", "check_providers"]

TENSORRT_OPTIONS = {
    "device_id",
    "has_user_compute_stream",
    "user_compute_stream",
    "trt_max_partition_iterations",
    "trt_min_subgraph_size",
    "trt_max_workspace_size",
    "trt_fp16_enable",
    "trt_int8_enable",
    "trt_int8_calibration_table_name",
    "trt_int8_use_native_calibration_table",
    "trt_dla_enable",
    "trt_dla_core",
    "trt_dump_subgraphs",
    "trt_engine_cache_enable",
    "trt_engine_cache_path",
    "trt_weight_stripped_engine_enable",
    "trt_onnx_model_folder_path",
    "trt_engine_cache_prefix",
    "trt_engine_decryption_enable",
    "trt_engine_decryption_lib_path",
    "trt_force_sequential_engine_build",
    "trt_context_memory_sharing_enable",
    "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable",
    "trt_timing_cache_path",
    "trt_force_timing_cache",
    "trt_detailed_build_log",
    "trt_build_heuristics_enable",
    "trt_sparsity_enable",
    "trt_builder_optimization_level",
    "trt_auxiliary_streams",
    "trt_tactic_sources",
    "trt_extra_plugin_lib_paths",
    "trt_profile_min_shapes",
    "trt_profile_max_shapes",
    "trt_profile_opt_shapes",
    "trt_cuda_graph_enable",
    "trt_ep_context_embed_mode",
    "trt_ep_context_file_path",
    "trt_dump_ep_context_model",
    "trt_engine_hw_compatible",
    "trt_op_types_to_exclude",
}
CUDA_OPTIONS = {
    "device_id",
    "has_user_compute_stream",
    "user_compute_stream",
    "gpu_mem_limit",
    "arena_extend_strategy",
    "cudnn_conv_algo_search",
    "do_copy_in_default_stream",
    "gpu_external_alloc",
    "gpu_external_free",
    "gpu_external_empty_cache",
    "cudnn_conv_use_max_workspace",
    "enable_cuda_graph",
    "cudnn_conv1d_pad_to_nc1d",
    "tunable_op_enable",
    "tunable_op_tuning_enable",
    "tunable_op_max_tuning_duration_ms",
    "enable_skip_layer_norm_strict_mode",
    "prefer_nhwc",
    "use_ep_level_unified_stream",
    "use_tf32",
    "sdpa_kernel",
    "fuse_conv_bias",
}
_BOOL = {"True", "False", "true", "false", "1", "0"}
_PROFILE = re.compile(r"^[^:,]+:\d+(x\d+)*(,[^:,]+:\d+(x\d+)*)*$")


def _tensorrt(options: dict[str, str]) -> None:
    for key, value in options.items():
        if key.endswith("_enable") and value not in _BOOL:
            raise ValueError(f"{key}: {value!r} is not a boolean")
        if key in ("device_id", "trt_max_workspace_size") and not value.isdigit():
            raise ValueError(f"{key}: {value!r} is not a number")
    shapes = [k for k in ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes") if k in options]
    if shapes and len(shapes) != 3:
        raise ValueError("trt_profile_min_shapes, trt_profile_opt_shapes and trt_profile_max_shapes: give all three")
    for key in shapes:
        if not _PROFILE.match(options[key]):
            raise ValueError(f"{key}: {options[key]!r} is not name:DxDxD")


def _cuda(options: dict[str, str]) -> None:
    if options.get("arena_extend_strategy", "kNextPowerOfTwo") not in ("kNextPowerOfTwo", "kSameAsRequested"):
        raise ValueError(f"arena_extend_strategy: {options['arena_extend_strategy']!r} is not kNextPowerOfTwo or kSameAsRequested")


def check_providers(providers: list) -> None:
    """Raise ValueError for what ``InferenceSession(providers=...)`` of onnxruntime-gpu would refuse."""
    for entry in providers:
        name, options = (entry, {}) if isinstance(entry, str) else entry
        known = {"TensorrtExecutionProvider": TENSORRT_OPTIONS, "CUDAExecutionProvider": CUDA_OPTIONS, "CPUExecutionProvider": set()}.get(
            name
        )
        if known is None:
            raise ValueError(f"Unknown Provider Type: {name}")
        text = {str(k): str(v) for k, v in options.items()}  # what the Python binding hands over
        for key in text:
            if key not in known:
                raise ValueError(f"Unknown provider option: {key}")
        (_tensorrt if name == "TensorrtExecutionProvider" else _cuda)(text)
