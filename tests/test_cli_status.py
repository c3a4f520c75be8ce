"""``edge-agent status`` of a daemon that is not running: its last status is said to be old, and nothing in it is
shown as if it were live."""

from __future__ import annotations

import json
import os
import time

from edge_agent.results import ResultsDB
from edge_agent.state import StateLayout

LIVE = {
    "uptime_s": 9,
    "healthy": True,
    "engine": {"engine_version": "v4000", "type": "onnxruntime", "provider": "CPUExecutionProvider", "precision": "int8"},
    "handoff": {"trainer_alive": True, "trainer": {"endpoint": "ipc://x", "state": "idle", "version": "v4000", "heard": 0}},
    "in_flight": 0,
    "queue_depths": {"decode": 0},
    "spool": {"bytes": 0, "quota_bytes": 1 << 30, "full": False},
}


def test_a_stopped_daemons_status_says_when_it_last_wrote_and_shows_no_uptime_health_link_or_queues_as_live(tmp_path, capsys):
    """A daemon stopped three hours ago showed "uptime 9 s  healthy: True", "connected" to its trainer and its queues
    under "daemon: not running", read from the status file it left."""
    from edge_agent.cli import main

    layout = StateLayout(tmp_path / "state")
    layout.create()
    ResultsDB(layout.db).close()
    then = time.time() - 3 * 3600
    (layout.root / "status.json").write_text(json.dumps({"pid": 0, "updated": then, **LIVE}))
    main(["status", "--state-dir", str(layout.root)])
    out = capsys.readouterr().out
    assert f"daemon: not running  (state {layout.root}); it last wrote its status 3 h ago\n" in out, out
    assert "engine: v4000 (onnxruntime, CPUExecutionProvider, int8)  when it last ran" in out
    assert not [w for w in ("uptime", "healthy", "connected", "in flight", "label spool") if w in out], out

    (layout.root / "status.json").write_text(json.dumps({"pid": os.getpid(), "updated": time.time(), **LIVE}))
    main(["status", "--state-dir", str(layout.root)])
    out = capsys.readouterr().out
    assert "daemon: running  (state" in out and "last wrote" not in out
    assert "uptime 9 s  healthy: True" in out and "trainer (ipc://x): connected: idle, serving v4000" in out
    assert "in flight 0  queues {'decode': 0}  label spool 0/1024 MiB" in out
