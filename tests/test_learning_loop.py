"""The learning loop end to end: daemon and trainer processes, real photos, retrain, publish, hot swap."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import cv2
import numpy as np
import pytest

from engines.store import EngineStore

from .daemon_helpers import (
    FIRST_RELEASE,
    REPO,
    SHIPPED,
    SHIPPED_NEXT,
    DaemonProc,
    TrainerProc,
    db_rows,
    first_release_store,
    make_labelled,
    split_photos,
    stand_in_store,
    wait_until,
)

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer

pytest.importorskip("torch", reason="the trainer needs the 'train' extra")


def loop_config(tmp_path: Path, labelled_dir: Path, **trainer) -> dict:
    return {
        "handoff": {"heartbeat_s": 0.3, "ack_timeout_s": 1.0},
        "hotswap": {"poll_s": 0.5},
        "trainer": {
            "labelled_data": str(labelled_dir),
            "retrain_threshold": 20,
            "epochs": 1,
            "int8": False,
            "gate_tolerance": 0.05,
            "nice": 0,
            **trainer,
        },
    }


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory, signing_key) -> Path:
    """The shipped model's stand-in for the tests of the trainer's process (daemon_helpers.stand_in_store)."""
    return stand_in_store(tmp_path_factory.mktemp("stand-in"), signing_key)


def test_pseudo_labels_retrain_publish_swap_nothing_dropped(plantvillage, tmp_path):
    labelled, field = split_photos(plantvillage, labelled_per_class=3)  # the shipped model's own retrain, on a small folder
    cfg = loop_config(tmp_path, make_labelled(tmp_path, labelled))
    state = tmp_path / "state"
    d = DaemonProc(state, cfg).start()
    t = TrainerProc(state, cfg).start()
    try:
        d.wait_ready()
        batch1 = field[::12][:32]  # 20 sure answers start a retrain ([trainer] retrain_threshold)
        for i, p in enumerate(batch1):
            shutil.copy(p, d.inbox / f"a{i:03d}.jpg")
        wait_until(lambda: t.logged("retrain_published"), 240, "a retrain that publishes")
        store = EngineStore(state / "engines")
        assert store.current() == SHIPPED_NEXT and store.open().manifest["parent"] == SHIPPED
        calibration = store.open().manifest["metrics"]["calibration"]  # [trainer] calibrate, on by default
        held = len(labelled)  # one validation photo of each class's three ([trainer] val_fraction 0.2, at least one)
        assert calibration["photos"] == held and calibration["temperature"] > 0
        # fitted, or (when the candidate is never wrong on these photos) refused for that reason, not sharpened to T = 0.1
        assert calibration["skipped"] is None or f"mistakes on {held} held-out photos" in calibration["skipped"]
        wait_until(lambda: '"engine_swapped"' in d.log_path.read_text(), 60, "hot swap in the daemon")
        batch2 = field[5::12][:20]
        for i, p in enumerate(batch2):
            shutil.copy(p, d.inbox / f"b{i:03d}.jpg")
        total = len(batch1) + len(batch2)
        wait_until(lambda: db_rows(state, "SELECT COUNT(*) FROM results")[0][0] >= total, 120, "all results")
        rows = db_rows(state, "SELECT path, engine_version FROM results")
        assert len(rows) == total  # no photo dropped
        after = [v for path, v in rows if Path(path).name.startswith("b")]
        assert set(after) == {SHIPPED_NEXT}  # results after the swap carry the new version
        delivered = db_rows(state / "trainer", "SELECT COUNT(*) FROM samples", "samples.sqlite")[0][0]
        assert delivered >= 20
        assert d.terminate() == 0 and t.terminate() == 0
    finally:
        for proc in (d, t):
            if proc.proc and proc.proc.poll() is None:
                proc.proc.kill()


@pytest.mark.parametrize("moment", ["retrain_started", "gate"])
def test_trainer_sigkill_during_training_and_publishing(plantvillage, stand_in, tmp_path, moment):
    """Samples are already stored; kill the trainer mid-retrain (or right after the gate, while publishing)."""
    from trainer.samples import SampleStore

    labelled, field = split_photos(plantvillage, labelled_per_class=3)  # what is tested is the process, not learning
    # INT8 where the kill falls while publishing (more files to leave half-written); a kill mid-training needs none
    cfg = loop_config(tmp_path, make_labelled(tmp_path, labelled), int8=moment == "gate")
    engines = shutil.copytree(stand_in, tmp_path / "engines")  # the process, not the model: the shipped one's stand-in
    cfg["store"] = {"path": str(engines)}
    state = tmp_path / "state"
    _store_expert_samples(state, field[::40][:25])
    t = TrainerProc(state, cfg).start()
    wait_until(lambda: t.logged(moment), 240, moment)
    t.kill()
    store = EngineStore(engines)
    cur = store.open()  # verifies every file: complete, never half-written
    assert cur.name in (SHIPPED, SHIPPED_NEXT)
    t = TrainerProc(state, cfg).start()  # resumes from its stored samples, or finds them published
    try:
        wait_until(
            lambda: store.current() != SHIPPED and (t.logged("retrain_published") or t.logged("pending_samples_settled")),
            240,
            "published, before or after the restart",
        )
        time.sleep(2)
        assert store.versions()[-1] == SHIPPED_NEXT  # one version from one set of samples, however the kill fell
        assert store.open().manifest["training"]["samples"]["expert"] == 25
        left = SampleStore(state / "trainer")
        assert left.counts()["new"] == 0 and {s.generation for s in left.all()} == {SHIPPED_NEXT}
    finally:
        t.terminate()


@pytest.mark.one_core  # trains nothing (a daemon's burst, then the queue drained): beside the other tests
def test_trainer_down_while_2000_photos_arrive(plantvillage, tmp_path):
    photos = sorted(plantvillage.rglob("*.jpg"))
    state = tmp_path / "state"
    cfg = {
        "handoff": {"heartbeat_s": 0.3, "ack_timeout_s": 1.0, "window": 64},
        "trainer": {"retrain_threshold": 100000, "nice": 0},
        # the road 2,000 pseudo-labels travel, not the model: the first release answers as surely, at a third of the cost
        "store": {"path": str(first_release_store(tmp_path / "engines"))},
    }
    d = DaemonProc(state, cfg).start()
    d.wait_ready()
    staging = d.inbox / ".staging"
    staging.mkdir()
    for i in range(2000):
        src = photos[i % len(photos)]
        if i < len(photos):
            shutil.copy(src, staging / f"{i:04d}.jpg")
        else:  # a mirrored copy: new bytes, still a real leaf
            img = cv2.imread(str(src))
            cv2.imwrite(str(staging / f"{i:04d}.jpg"), np.ascontiguousarray(img[:, ::-1]))
    for f in sorted(staging.iterdir()):
        os.rename(f, d.inbox / f.name)
    wait_until(lambda: db_rows(state, "SELECT COUNT(*) FROM results")[0][0] >= 2000, 300, "2000 results")
    queued = {r[0] for r in db_rows(state, "SELECT sha256 FROM label_queue WHERE kind = 'pseudo'")}
    assert len(queued) > 100  # held on disk while the trainer is down
    time.sleep(1.0)
    assert len(db_rows(state, "SELECT sha256 FROM label_queue WHERE kind = 'pseudo'")) == len(queued)
    t = TrainerProc(state, cfg).start()
    try:
        wait_until(lambda: not db_rows(state, "SELECT COUNT(*) FROM label_queue WHERE kind = 'pseudo'")[0][0], 300, "queue drained")
        stored = [r[0] for r in db_rows(state / "trainer", "SELECT id FROM samples", "samples.sqlite")]
        assert len(stored) == len(set(stored)) == len(queued) and set(stored) == queued  # no loss, no duplicate
        assert not list((state / "queue" / "pseudo").iterdir())
    finally:
        t.terminate()
        d.terminate()


def _store_expert_samples(state: Path, photos: list[Path]) -> None:
    import hashlib

    from trainer.samples import SampleStore

    samples = SampleStore(state / "trainer")
    for p in photos:
        data = p.read_bytes()
        samples.add(
            {
                "id": hashlib.sha256(data).hexdigest(),
                "kind": "expert",
                "label": p.parent.name,
                "confidence": 1.0,
                "engine_version": "v0001",
                "ext": ".jpg",
            },
            data,
        )
    samples.close()


def test_sigterm_during_a_retrain_exits_within_5_s_and_keeps_every_sample(plantvillage, tmp_path):
    """A trained release retraining: SIGTERM mid-training: exit 0 within 5 s, candidate abandoned (nothing
    published), every sample kept and still new, and the next start retrains on them. The first release (v1000), not
    the shipped v4000: the stop is checked before each layer of a forward pass whatever the network
    (tests/test_continual.py), and on v4000 this test took 24 s alone and 54-83 s in full runs here; three labelled photos a class
    (the shipped replay photos would take 40 s here to finish the first epoch the test waits for)."""
    state = tmp_path / "state"
    labelled, field = split_photos(plantvillage, labelled_per_class=3)
    _store_expert_samples(state, field[::40][:25])
    cfg = {
        "trainer": {
            "labelled_data": str(make_labelled(tmp_path, labelled)),
            "retrain_threshold": 20,
            "epochs": 200,
            "int8": False,
            "nice": 0,
        },
        "store": {"path": str(first_release_store(tmp_path / "engines"))},
    }
    t = TrainerProc(state, cfg).start()
    wait_until(lambda: t.logged("generation_epoch"), 240, "training under way")
    status = state / "trainer" / "status.json"

    def retraining() -> dict:
        return json.loads(status.read_text()).get("retraining") or {}

    wait_until(lambda: retraining().get("epoch", 0) >= 1, 20, "status says which epoch")  # fresh while it trains
    st = json.loads(status.read_text())
    assert st["state"] == "training" and st["retraining"]["phase"] == "training" and st["retraining"]["epochs"] == 200
    assert time.time() - st["updated"] < 10  # never "not running" while it works
    t0, sent = time.monotonic(), datetime.now(timezone.utc)
    t.proc.send_signal(signal.SIGTERM)
    rc = t.proc.wait(30)
    took = time.monotonic() - t0
    t._log.close()
    assert rc == 0 and took < 5.0, (rc, took, _seconds_after(t.log_path, sent))  # where the time went, if it fails
    assert t.logged("retrain_abandoned") and not t.logged("retrain_child_killed")  # it stopped itself, within a step's part
    assert EngineStore(tmp_path / "engines").versions() == [FIRST_RELEASE]  # nothing published
    rows = db_rows(state / "trainer", "SELECT generation FROM samples", "samples.sqlite")
    assert len(rows) == 25 and all(g is None for (g,) in rows)  # kept, and still new for the next start


def _seconds_after(log: Path, since: datetime) -> list[tuple[str, float]]:
    """The trainer's log events from ``since`` on, each with its seconds after it."""
    out = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):
            rec = json.loads(line)
            at = (datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")) - since).total_seconds()
            if at >= 0:
                out.append((rec["event"], round(at, 2)))
    return out


@pytest.mark.one_core  # trains nothing: beside the other tests (tests/conftest.py)
def test_no_validation_photos_no_retrain_and_it_says_so(plantvillage, tmp_path):
    import json

    state = tmp_path / "state"
    _, field = split_photos(plantvillage)
    _store_expert_samples(state, field[::40][:25])
    t = TrainerProc(state, {"trainer": {"retrain_threshold": 20, "nice": 0, "shipped_data": False}}).start()
    try:
        wait_until(lambda: t.logged("no_validation_photos"), 60, "the warning at start-up")
        status = state / "trainer" / "status.json"
        wait_until(lambda: status.exists() and json.loads(status.read_text()).get("blocked"), 30, "blocked in the status")
        time.sleep(2.0)
        assert not t.logged("retrain_started")
        out = subprocess.run(
            [sys.executable, "-m", "trainer", "status", "--state-dir", str(state)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "EDGE_AGENT_CONFIG": str(t.config_path)},
        )
        assert "NOT RETRAINING: no validation photos" in out.stdout
    finally:
        assert t.terminate() == 0


@pytest.mark.one_core  # trains nothing: beside the other tests (tests/conftest.py)
def test_a_failed_retrain_waits_for_new_samples(tmp_path, monkeypatch):
    from edge_agent.config import parse_config
    from trainer import service

    svc = service.TrainerService(parse_config({"trainer": {"retrain_threshold": 1, "field_check_every": 0}}), tmp_path)
    svc.samples.add({"id": "a" * 64, "kind": "expert", "label": "x", "confidence": 1.0, "engine_version": "v0001", "ext": ".jpg"}, b"x")

    def boom(*a, **k):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(service, "retrain_in_child", boom)
    assert svc._due()
    svc._retrain_once()
    assert svc.last.reason.startswith("failed") and not svc._due()  # not again on the same samples
    svc.samples.add({"id": "b" * 64, "kind": "expert", "label": "x", "confidence": 1.0, "engine_version": "v0001", "ext": ".jpg"}, b"y")
    assert svc._due()
    svc.samples.close()


def test_a_retrain_killed_by_the_kernel_says_it_was_most_likely_memory_and_what_lowers_it(tmp_path):
    """The OOM killer's SIGKILL gave "the retrain's process died (exit code -9): out of memory?": now it is named, with
    where the kernel says so and the setting that takes less."""
    import multiprocessing
    import threading

    from edge_agent.config import AppConfig
    from trainer import _child

    def kill_it() -> None:
        for _ in range(3000):
            kids = [p for p in multiprocessing.active_children() if p.name == "edge-trainer-retrain"]
            if kids:
                os.kill(kids[0].pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_it)
    killer.start()
    with pytest.raises(_child.RetrainFailed) as died:
        _child.retrain_in_child(
            AppConfig(), tmp_path / "engines", tmp_path, tmp_path / "strategy", tmp_path / "key", print, lambda *a, **k: None, lambda: False
        )
    killer.join()
    said = str(died.value)
    assert said.startswith("the retrain's process was killed (SIGKILL), most likely by the kernel for want of memory"), said
    assert "[trainer] micro_batch" in said and "dmesg" in said


def _rss(pid: int) -> int:
    return next(int(line.split()[1]) << 10 for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS"))


def test_a_retrain_runs_in_a_child_and_the_trainer_idles_within_50_mb_of_its_memory_before_it(plantvillage, stand_in, tmp_path):
    """The retrain's memory (the model, photos, optimiser) goes with its process: the service idles afterwards
    within 50 MB of what it held before (SIGTERM during the child's retrain: the test above)."""
    labelled, field = split_photos(plantvillage, labelled_per_class=3)  # what is tested is the process, not learning
    cfg = loop_config(tmp_path, make_labelled(tmp_path, labelled), int8=False)
    cfg["store"] = {"path": str(shutil.copytree(stand_in, tmp_path / "engines"))}  # the shipped model's stand-in
    state = tmp_path / "state"
    _store_expert_samples(state, field[::40][:25])
    t = TrainerProc(state, cfg).start()
    try:
        wait_until(lambda: t.logged("retrain_child_started"), 60, "the retrain's process")
        before = _rss(t.proc.pid)  # the service alone: its retrain runs elsewhere
        wait_until(lambda: t.logged("retrain_published"), 240, "published")
        time.sleep(3)
        after = _rss(t.proc.pid)
        print(f"trainer RSS: {before >> 20} MiB during the child's retrain, {after >> 20} MiB after it")
        assert after - before < 50 << 20, f"idle at {after >> 20} MB after the retrain, {before >> 20} MB before"
    finally:
        assert t.terminate() == 0
