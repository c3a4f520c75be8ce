"""One exception root: every error edge-agent raises on purpose is an EdgeAgentError, and the CLIs print it in one line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from edge_agent.imageheader import ImageRejected, ImageTooLarge, ImageTruncated, check_image
from engines.errors import EdgeAgentError

REPO = Path(__file__).parents[1]
#: Exceptions that are control flow inside one module, never seen by a caller.
PRIVATE = {"_TooLarge", "_Collected"}


def _exception_classes() -> list[tuple[str, str, list[str]]]:
    found = []
    for package in ("edge_agent", "engines", "trainer"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b) for b in node.bases]
                    if any(b.endswith(("Error", "Exception")) or b in ("ValueError", "RuntimeError") for b in bases):
                        found.append((str(path.relative_to(REPO)), node.name, bases))
    return found


def test_every_public_exception_class_derives_from_the_root():
    import importlib

    classes = [(f, name) for f, name, _ in _exception_classes() if name not in PRIVATE]
    assert len(classes) >= 20
    for f, name in classes:
        module = importlib.import_module(f.removesuffix(".py").replace("/", ".").removesuffix(".__init__"))
        assert issubclass(getattr(module, name), EdgeAgentError), f"{f}: {name} does not derive from EdgeAgentError"


def test_a_truncated_photo_and_an_oversized_one_are_told_apart_by_type(tmp_path):
    import cv2
    import numpy as np

    ok, jpeg = cv2.imencode(".jpg", np.zeros((64, 64, 3), np.uint8))
    whole = jpeg.tobytes()
    with pytest.raises(ImageTruncated):
        check_image(whole[: len(whole) // 2], 1 << 20, 1 << 20)
    with pytest.raises(ImageTooLarge):
        check_image(whole, 1 << 20, 32 * 32)
    with pytest.raises(ImageTooLarge):
        check_image(whole, 100, 1 << 20)
    with pytest.raises(ImageRejected) as rejected:
        check_image(b"not an image at all", 1 << 20, 1 << 20)
    assert not isinstance(rejected.value, (ImageTruncated, ImageTooLarge))


def test_no_product_code_branches_on_an_exceptions_message():
    offenders = []
    for package in ("edge_agent", "engines", "trainer"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            for needle in ("in str(exc)", "str(exc).startswith", "in str(e)", "str(e).startswith"):
                if needle in text:
                    offenders.append(f"{path.relative_to(REPO)}: {needle}")
    assert not offenders


@pytest.mark.parametrize("cli", ["edge_agent.cli", "trainer.cli"])
def test_both_command_lines_print_any_edge_agent_error_in_one_line(cli, monkeypatch, capsys):
    import importlib

    from engines.backends._tensorrt_plan import PlanBuildError

    module = importlib.import_module(cli)
    parser = module.build_parser()

    def fail(_args):
        raise PlanBuildError("plan.engine: TensorRT could not build the plan (out of memory); free GPU memory and retry")

    real = parser.parse_args
    monkeypatch.setattr(module, "build_parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: _with_func(real(argv), fail))
    assert module.main(["status"] if cli == "edge_agent.cli" else ["status"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not build the plan" in err and "Traceback" not in err


def _with_func(args, func):
    args.func = func
    return args
