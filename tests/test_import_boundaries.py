"""The daemon side never imports torch, and imports flow engines <- edge_agent <- trainer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]


def _runs_clean(code: str) -> None:
    """``code`` (which prints OK last) succeeds in a fresh interpreter: nothing imported before it."""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr


def test_daemon_side_never_imports_torch():
    code = (
        "import sys, pkgutil, importlib\n"
        "import edge_agent, engines\n"
        "for pkg in (edge_agent, engines):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "from engines.base import backends; backends()\n"
        "from edge_agent.cli import main\n"
        "rc = main(['config', 'show'])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'trainer', 'torchvision'))\n"
        "assert not bad, bad\n"
        "print('OK')\n"
    )
    _runs_clean(code)


def _imports(package: str) -> set[str]:
    found = set()
    for path in (REPO / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_imports_flow_one_way():
    assert not _imports("engines") & {"edge_agent", "trainer", "torch"}
    assert not _imports("edge_agent") & {"trainer", "torch"}


def test_the_daemon_never_loads_the_web_page():
    """The page is a separate process: the daemon's start-up and memory do not pay for it."""
    code = (
        "import sys\n"
        "import edge_agent.daemon, edge_agent.cli\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'uvicorn', 'jinja2', 'multipart', 'PIL'}"
        " | {m for m in sys.modules if m.startswith('edge_agent.web')})\n"
        "assert not bad, bad\n"
        "print('OK')\n"
    )
    _runs_clean(code)


def test_what_a_photo_does_not_wait_for_is_not_imported_before_ready():
    """READY=1 waits for the daemon module's imports: OpenCV (imported just after READY=1), ZeroMQ, the hand-off, hot
    swap, transfer and alert workers (started after it) are not among them."""
    code = (
        "import sys\n"
        "import edge_agent.daemon, edge_agent.cli\n"
        "late = ('cv2', 'zmq', 'edge_agent.handoff.sender', 'edge_agent.hotswap', 'edge_agent.transfer.fetcher', "
        "'edge_agent.alerts.worker', 'edge_agent.retention', 'http.client')\n"
        "bad = sorted(m for m in late if m in sys.modules)\n"
        "assert not bad, bad\n"
        "print('OK')\n"
    )
    _runs_clean(code)


def test_the_trainer_commands_that_only_look_never_import_torch(tmp_path):
    """``edge-trainer status``, ``fleet`` and a ``retrain`` that has nothing to retrain answer without loading torch
    (seconds on a small board): torch comes with the service and the retrain itself."""
    code = (
        "import sys, os\n"
        "from trainer.cli import main\n"
        f"os.chdir({str(tmp_path)!r})\n"
        "for argv in (['status'], ['fleet'], ['retrain']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision'))\n"
        "assert not bad, bad[:5]\n"
        "print('OK')\n"
    )
    _runs_clean(code)
