"""What `pip install -e ".[extra]"` asks for on the machines users have: nothing that PyPI cannot install there."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

from edge_agent.config import tomllib

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

#: Packages with no Linux aarch64 wheel (nor an sdist that builds there) on PyPI, checked on 2026-11-23 with
#: ``pip download NAME --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 --python-version 3.10
#: --only-binary=:all: --no-deps``. On a Jetson they come from JetPack (tensorrt) or NVIDIA's Jetson index
#: (onnxruntime-gpu); see README "On a Jetson".
NO_AARCH64_ON_PYPI = {"tensorrt", "tensorrt-cu12", "tensorrt-cu11", "onnxruntime-gpu", "nvidia-tensorrt"}

JETPACK_6 = {
    "platform_machine": "aarch64",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "python_version": "3.10",
    "python_full_version": "3.10.12",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
RASPBERRY_PI_OS = JETPACK_6 | {"python_version": "3.11", "python_full_version": "3.11.2"}


def wanted(group: list[str], env: dict) -> list[str]:
    """The requirements of ``group`` that pip would install in ``env``."""
    out = []
    for line in group:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            out.append(req.name.lower())
    return out


@pytest.mark.parametrize("env", [JETPACK_6, RASPBERRY_PI_OS], ids=["jetpack6", "raspberry-pi-os"])
@pytest.mark.parametrize("group", ["dependencies", *PYPROJECT["project"]["optional-dependencies"]])
def test_nothing_x86_only_is_required_on_aarch64(group, env):
    reqs = PYPROJECT["project"]["dependencies"] if group == "dependencies" else PYPROJECT["project"]["optional-dependencies"][group]
    assert not set(wanted(reqs, env)) & NO_AARCH64_ON_PYPI


def test_jetson_extra_has_what_a_jetson_builds_or_needs():
    jetson = wanted(PYPROJECT["project"]["optional-dependencies"]["jetson"], JETPACK_6)
    assert {"pycuda", "jetson-stats"} <= set(jetson)


def test_python_of_jetpack_6_is_supported():
    from packaging.specifiers import SpecifierSet

    assert "3.10" in SpecifierSet(PYPROJECT["project"]["requires-python"])


def test_the_check_itself_catches_an_x86_only_requirement():
    assert set(wanted(["onnxruntime-gpu>=1.18", "pycuda"], JETPACK_6)) & NO_AARCH64_ON_PYPI
    assert not set(wanted(["onnxruntime-gpu>=1.18; platform_machine == 'x86_64'"], JETPACK_6)) & NO_AARCH64_ON_PYPI
