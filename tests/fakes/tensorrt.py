"""Fake ``tensorrt`` Python API: 10.x by default, 8.5/8.6 on request (https://docs.nvidia.com/deeplearning/tensorrt/
latest/_static/python-api/ and the 8.x -> 10.x migration reference).

What it reproduces, because a real Jetson would expose it:
- ``Builder.create_network(flags)``: in 8.x the ONNX parser refuses a network created without
  ``1 << NetworkDefinitionCreationFlag.EXPLICIT_BATCH``; in 10.x every network is explicit-batch.
- ``OnnxParser.parse(model: bytes)`` (a path is a TypeError), ``num_errors``, ``get_error(i)``.
- ``IBuilderConfig.set_memory_pool_limit(MemoryPoolType, int)``, ``set_flag(BuilderFlag)``,
  ``add_optimization_profile`` (-1 for an invalid profile); a dynamic batch with no valid
  profile builds nothing (``build_serialized_network(network, config)`` returns None).
- ``Runtime.deserialize_cuda_engine(bytes)`` returns None, with the real log message, for a plan
  from another TensorRT version or a damaged plan.
- The named I/O tensor API (8.5+): ``num_io_tensors``, ``get_tensor_name(i)``, ``get_tensor_mode(name)``,
  ``get_tensor_dtype(name)``, ``set_tensor_address(name, int)``, ``set_input_shape(name, shape)`` (False
  outside the profile), ``execute_async_v3(stream_handle)`` (False without addresses or shape, or with no
  CUDA context current in the calling thread). The binding-index API exists in 8.x only.
- I/O tensors in the plan's dtype: FLOAT, or HALF when the fake is made with ``io_dtype="float16"``.
The engine computes with ONNX Runtime on CPU, rounding through float16 for an FP16 plan.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import math
from pathlib import Path

import numpy as np

__version__ = "10.3.0"
IO_DTYPE = "float32"
cuda = None  # the fake pycuda.driver this TensorRT runs with
_MAGIC = b"FAKETRT\x00"


def _major() -> int:
    return int(__version__.split(".")[0])


def _minor() -> tuple[int, int]:
    return tuple(int(p) for p in __version__.split(".")[:2])


class Logger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = Severity

    def __init__(self, min_severity: "Logger.Severity" = Severity.WARNING) -> None:
        if not isinstance(min_severity, Logger.Severity):
            raise TypeError("Logger(min_severity: tensorrt.Logger.Severity)")
        self.min_severity = min_severity
        self.messages: list[tuple[Logger.Severity, str]] = []

    def log(self, severity: "Logger.Severity", msg: str) -> None:
        self.messages.append((severity, msg))


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4


_NP = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8, DataType.INT32: np.int32, DataType.BOOL: np.bool_}


def nptype(trt_type: DataType) -> type:
    return _NP[trt_type]


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class NetworkDefinitionCreationFlag(enum.IntEnum):
    EXPLICIT_BATCH = 0
    STRONGLY_TYPED = 1


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0
    DLA_MANAGED_SRAM = 1
    DLA_LOCAL_DRAM = 2
    DLA_GLOBAL_DRAM = 3


class BuilderFlag(enum.IntEnum):
    FP16 = 0
    INT8 = 1
    DEBUG = 2
    GPU_FALLBACK = 3


def _check(value, kind, what: str) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"incompatible function arguments: {what} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")


class ITensor:
    def __init__(self, name: str, shape: tuple, dtype: DataType) -> None:
        self.name, self.shape, self.dtype = name, shape, dtype


class INetworkDefinition:
    def __init__(self, explicit_batch: bool) -> None:
        self.explicit_batch = explicit_batch
        self.inputs: list[ITensor] = []
        self.outputs: list[ITensor] = []
        self.onnx: bytes = b""

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def get_input(self, index: int) -> ITensor:
        return self.inputs[index]

    def get_output(self, index: int) -> ITensor:
        return self.outputs[index]


class ParserError:
    def __init__(self, desc: str) -> None:
        self._desc = desc

    def desc(self) -> str:
        return self._desc

    def __str__(self) -> str:
        return self._desc


class OnnxParser:
    def __init__(self, network: INetworkDefinition, logger: Logger) -> None:
        _check(network, INetworkDefinition, "network")
        _check(logger, Logger, "logger")
        self.network, self._errors = network, []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> ParserError:
        return self._errors[index]

    def parse(self, model, path: str | None = None) -> bool:
        if not isinstance(model, (bytes, bytearray, memoryview)):
            raise TypeError("parse(model: buffer, path: str = None): model must be the serialised ONNX bytes")
        if not self.network.explicit_batch:
            self._errors.append(
                ParserError(
                    "ModelImporter.cpp: The ONNX parser only supports networks with an "
                    "explicit batch dimension (create it with EXPLICIT_BATCH)"
                )
            )
            return False
        import onnxruntime as ort

        try:
            sess = ort.InferenceSession(bytes(model), providers=["CPUExecutionProvider"])
        except Exception as exc:
            self._errors.append(ParserError(f"ModelImporter.cpp: Failed to parse ONNX model: {exc}"))
            return False
        shape = lambda s: tuple(d if isinstance(d, int) else -1 for d in s)  # noqa: E731
        self.network.inputs = [ITensor(i.name, shape(i.shape), DataType.FLOAT) for i in sess.get_inputs()]
        self.network.outputs = [ITensor(o.name, shape(o.shape), DataType.FLOAT) for o in sess.get_outputs()]
        self.network.onnx = bytes(model)
        return True


class IOptimizationProfile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[tuple, tuple, tuple]] = {}
        self.valid = True

    def set_shape(self, input: str, min, opt, max) -> None:  # noqa: A002 - the documented parameter names
        _check(input, str, "input")
        dims = [tuple(int(d) for d in s) for s in (min, opt, max)]
        if len({len(d) for d in dims}) != 1 or not all(a <= b <= c for a, b, c in zip(*dims)):
            self.valid = False  # TensorRT logs an API usage error and the profile is unusable
            return
        self.shapes[input] = tuple(dims)

    def get_shape(self, input: str) -> list[tuple]:  # noqa: A002
        return list(self.shapes[input])


class IBuilderConfig:
    def __init__(self) -> None:
        self.flags: set[BuilderFlag] = set()
        self.pools: dict[MemoryPoolType, int] = {}
        self.profiles: list[IOptimizationProfile] = []

    def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None:
        _check(pool, MemoryPoolType, "pool")
        _check(pool_size, int, "pool_size")
        self.pools[pool] = pool_size

    def get_memory_pool_limit(self, pool: MemoryPoolType) -> int:
        return self.pools.get(pool, 0)

    def set_flag(self, flag: BuilderFlag) -> None:
        _check(flag, BuilderFlag, "flag")
        self.flags.add(flag)

    def get_flag(self, flag: BuilderFlag) -> bool:
        return flag in self.flags

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        _check(profile, IOptimizationProfile, "profile")
        if not profile.valid or not profile.shapes:
            return -1
        self.profiles.append(profile)
        return len(self.profiles) - 1

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.profiles)


class IHostMemory(bytes):
    """Supports the buffer protocol, as the real one does (``bytes(plan)``)."""

    @property
    def nbytes(self) -> int:
        return len(self)


class Builder:
    def __init__(self, logger: Logger) -> None:
        _check(logger, Logger, "logger")
        self.logger = logger

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        _check(flags, int, "flags")
        return INetworkDefinition(_major() >= 10 or bool(flags & (1 << int(NetworkDefinitionCreationFlag.EXPLICIT_BATCH))))

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    @property
    def platform_has_fast_fp16(self) -> bool:
        if _minor() >= (10, 5):
            import warnings

            warnings.warn("platform_has_fast_fp16 is deprecated since TensorRT 10.5", DeprecationWarning, stacklevel=2)
        return True

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        _check(network, INetworkDefinition, "network")
        _check(config, IBuilderConfig, "config")
        if not network.inputs:
            self.logger.log(Logger.ERROR, "Network must have at least one output")
            return None
        profile = {}
        for t in network.inputs:
            if -1 in t.shape:
                found = [p.shapes[t.name] for p in config.profiles if t.name in p.shapes]
                if not found:
                    self.logger.log(
                        Logger.ERROR, f"Network has dynamic or shape inputs, but no optimization profile has been defined for {t.name}"
                    )
                    return None
                profile[t.name] = found[0]
        dtype = "float16" if IO_DTYPE == "float16" else "float32"
        header = {
            "version": __version__,
            "fp16": BuilderFlag.FP16 in config.flags,
            "io_dtype": dtype,
            "inputs": [[t.name, t.shape] for t in network.inputs],
            "outputs": [[t.name, t.shape] for t in network.outputs],
            "profile": profile,
        }
        blob = json.dumps(header).encode()
        return IHostMemory(_MAGIC + len(blob).to_bytes(4, "little") + blob + network.onnx)


class Runtime:
    def __init__(self, logger: Logger) -> None:
        _check(logger, Logger, "logger")
        self.logger = logger

    def deserialize_cuda_engine(self, serialized_engine) -> "ICudaEngine | None":
        if not isinstance(serialized_engine, (bytes, bytearray, memoryview)):
            raise TypeError("deserialize_cuda_engine(serialized_engine: buffer)")
        data = bytes(serialized_engine)
        if not data.startswith(_MAGIC):
            self.logger.log(
                Logger.ERROR,
                "1: [stdArchiveReader.cpp::StdArchiveReader::32] Error Code 1: Serialization "
                "(Serialization assertion magicTagRead == kMAGIC_TAG failed.Magic tag does not match)",
            )
            return None
        n = int.from_bytes(data[8:12], "little")
        header = json.loads(data[12 : 12 + n])
        if header["version"] != __version__:
            self.logger.log(
                Logger.ERROR,
                "1: [stdArchiveReader.cpp::StdArchiveReader::40] Error Code 1: Serialization "
                "(Serialization assertion stdVersionRead == serializationVersion failed. "
                f"The engine plan file is not compatible with this version of TensorRT, "
                f"expecting library version {__version__} got {header['version']})",
            )
            return None
        return ICudaEngine(header, data[12 + n :], self.logger)


class ICudaEngine:
    def __init__(self, header: dict, onnx: bytes, logger: Logger) -> None:
        import onnxruntime as ort

        self._header, self._logger = header, logger
        self._dtype = DataType.HALF if header["io_dtype"] == "float16" else DataType.FLOAT
        self._io = [(n, TensorIOMode.INPUT, tuple(s)) for n, s in header["inputs"]] + [
            (n, TensorIOMode.OUTPUT, tuple(s)) for n, s in header["outputs"]
        ]
        self.session = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
        if _major() < 10:  # the binding-index API, deprecated in 8.5 and gone in 10
            self.num_bindings = len(self._io)
            self.get_binding_name = lambda i: self._io[i][0]

    @property
    def num_io_tensors(self) -> int:
        return len(self._io)

    def get_tensor_name(self, index: int) -> str:
        _check(index, int, "index")
        return self._io[index][0]

    def _find(self, name: str):
        _check(name, str, "name")
        for entry in self._io:
            if entry[0] == name:
                return entry
        raise ValueError(f"no tensor named {name!r}")

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        try:
            return self._find(name)[1]
        except ValueError:
            return TensorIOMode.NONE

    def get_tensor_dtype(self, name: str) -> DataType:
        self._find(name)
        return self._dtype

    def get_tensor_shape(self, name: str) -> tuple:
        return self._find(name)[2]

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple]:
        return [tuple(s) for s in self._header["profile"][name]]

    def create_execution_context(self) -> "IExecutionContext":
        return IExecutionContext(self)


class IExecutionContext:
    def __init__(self, engine: ICudaEngine) -> None:
        self.engine = engine
        self._addresses: dict[str, int] = {}
        self._shapes: dict[str, tuple] = {}
        self.launches = 0

    def set_tensor_address(self, name: str, memory: int) -> bool:
        _check(name, str, "name")
        _check(memory, int, "memory")
        if self.engine.get_tensor_mode(name) is TensorIOMode.NONE:
            self.engine._logger.log(Logger.ERROR, f"3: setTensorAddress given invalid tensor name: {name}")
            return False
        self._addresses[name] = memory
        return True

    def set_input_shape(self, name: str, shape) -> bool:
        _check(name, str, "name")
        dims = tuple(int(d) for d in shape)
        lo, _, hi = self.engine.get_tensor_profile_shape(name, 0)
        if len(dims) != len(lo) or not all(a <= d <= b for a, d, b in zip(lo, dims, hi)):
            self.engine._logger.log(
                Logger.ERROR,
                f"3: [executionContext.cpp::setInputShape] Error Code 3: API Usage "
                f"Error (Given invalid tensor shape {dims} for {name}: outside the profile {lo}..{hi})",
            )
            return False
        self._shapes[name] = dims
        return True

    def get_tensor_shape(self, name: str) -> tuple:
        return self._shapes.get(name, self.engine.get_tensor_shape(name))

    def execute_async_v3(self, stream_handle: int) -> bool:
        log = self.engine._logger
        if cuda.current_context() is None:
            log.log(Logger.ERROR, "1: [runner.cpp::execute] Error Code 1: Cuda Runtime (invalid resource handle)")
            return False
        missing = [n for n, _, _ in self.engine._io if n not in self._addresses]
        if missing:
            log.log(
                Logger.ERROR,
                f"3: [executionContext.cpp::enqueueV3] Error Code 3: API Usage Error (address of tensor {missing[0]} was not set)",
            )
            return False
        in_name = self.engine._io[0][0]
        out_names = [n for n, mode, _ in self.engine._io if mode is TensorIOMode.OUTPUT]
        if in_name not in self._shapes:
            log.log(
                Logger.ERROR,
                f"3: [executionContext.cpp::enqueueV3] Error Code 3: API Usage Error (input shape of {in_name} was not specified)",
            )
            return False
        stream = cuda.stream_for(stream_handle)
        shape, dtype = self._shapes[in_name], nptype(self.engine._dtype)
        fp16 = self.engine._header["fp16"]

        def run() -> None:
            src = cuda.memory_at(self._addresses[in_name])
            count = math.prod(shape) * np.dtype(dtype).itemsize
            x = np.frombuffer(bytes(src[:count]), dtype).reshape(shape).astype(np.float32)
            if fp16:
                x = x.astype(np.float16).astype(np.float32)
            for out_name, y in zip(out_names, self.engine.session.run(out_names, {in_name: x})):
                if fp16:
                    y = y.astype(np.float16)
                out = np.ascontiguousarray(y.astype(dtype)).tobytes()
                dst = cuda.memory_at(self._addresses[out_name])
                if len(out) > len(dst):
                    raise cuda.LogicError("an illegal memory access was encountered")
                dst[: len(out)] = out

        stream.enqueue(run)
        self.launches += 1
        return True


def make_module(version: str, io_dtype: str, cuda_module):
    """A fresh fake ``tensorrt`` of ``version`` whose plans have ``io_dtype`` I/O tensors."""
    spec = importlib.util.spec_from_file_location("tensorrt", Path(__file__))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.__version__, module.IO_DTYPE, module.cuda = version, io_dtype, cuda_module
    if int(version.split(".")[0]) >= 11:  # strongly typed networks only: FP16/INT8 flags and the FP16 query removed
        module.BuilderFlag = enum.IntEnum("BuilderFlag", {"DEBUG": 2, "GPU_FALLBACK": 3})
        del module.Builder.platform_has_fast_fp16
    return module
