"""The web tests' shared state directory and clients (test_web, test_api)."""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from pathlib import Path

from starlette.testclient import TestClient

from edge_agent.config import AppConfig
from edge_agent.ledger_rows import QueueEntry, ResultRow
from edge_agent.results import ResultsDB
from edge_agent.state import StateLayout, resolve_store
from edge_agent.web.app import WebContext, create_app

from .daemon_helpers import SHIPPED

REPO = Path(__file__).resolve().parents[1]
GATE = REPO / "edge_agent" / "default_data" / "gate"
LOCAL = ("127.0.0.1", 50000)
REMOTE = ("192.168.1.23", 50000)


def _photos(n: int) -> list[Path]:
    return sorted(GATE.glob("*/*.jpg"))[:n]


def make_state(tmp_path: Path) -> Path:
    """A state directory as the daemon leaves it: 6 results, 2 in the review pool (files in the queue), the shipped store."""
    root = tmp_path / "state"
    layout = StateLayout(root)
    layout.create()
    cfg = AppConfig()
    store = resolve_store(cfg, root)
    classes = store.open(verify=False).classes
    db = ResultsDB(layout.db)
    rows, queued = [], []
    for i, src in enumerate(_photos(6)):
        data = src.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        inbox_path = root / "inbox" / src.name
        if i < 2:  # unsure: a copy waits in the review pool
            dst = layout.queue / "review" / f"{sha[:16]}.jpg"
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
            top_k = [[classes[0], 0.4 + 0.1 * i], [classes[1], 0.3], [classes[2], 0.1]]
            queued.append(QueueEntry(sha, f"p{i}", "review", classes[0], top_k[0][1], "v0001", str(dst), len(data)))
        else:  # processed: moved to processed/<day>/ by the daemon
            day = root / "processed" / time.strftime("%Y-%m-%d")
            day.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, day / src.name)
            top_k = [[src.parent.name, 0.97], [classes[1], 0.02], [classes[2], 0.01]]
        rows.append(ResultRow(sha, f"p{i}", str(inbox_path), "folder", top_k[0][0], top_k[0][1], top_k, "v0001", {"total": 5.0}))
    db.commit(rows, queued)
    db.close()
    return root


def app_for(state: Path, bind: str = "127.0.0.1", cfg: AppConfig | None = None, **preprocess) -> TestClient:
    cfg = cfg or AppConfig()
    if preprocess:
        cfg = cfg.model_copy(update={"preprocess": cfg.preprocess.model_copy(update=preprocess)})
    return create_app(WebContext(cfg, StateLayout(state), state / "inbox", bind))


def client(state: Path, who=LOCAL, **kw) -> TestClient:
    return TestClient(app_for(state, **kw), base_url="http://localhost", client=who, follow_redirects=False)


def csrf_of(c: TestClient) -> str:
    """The CSRF token the page renders for this client's session (never in a cookie a script could read)."""
    return re.search(r'name="csrf" value="([^"]+)"', c.get("/upload").text).group(1)


def sha_of(state: Path, photo_id: str) -> str:
    con = ResultsDB(state / "results.sqlite", readonly=True)
    try:
        return (
            con.find_queued(photo_id).sha256
            if con.find_queued(photo_id)
            else next(r["sha256"] for r in con.results() if r["photo_id"] == photo_id)
        )
    finally:
        con.close()


def _second_version(state: Path) -> None:
    store = resolve_store(AppConfig(), state)
    v1 = store.open(SHIPPED)
    manifest = {k: v for k, v in v1.manifest.items() if k not in ("version", "files", "created", "parent")}
    store.publish({name: v1.path / name for name in v1.manifest["files"]}, manifest)
