"""A season of retrains does not fill the disk: old retrained engine versions are deleted, never a release, the one
in service, a rollback's pin, what a daemon serves or checks against, nor the newest few; a lineage is still followed
to its first version across the gap, and a rollback, an upgrade and the version numbers still work."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from edge_agent.config import RetentionSection
from edge_agent.engine_keep import prune_engines
from edge_agent.results import ResultsDB
from edge_agent.retention import Retention
from edge_agent.state import StateLayout
from engines.prune import prune_versions, store_bytes
from engines.store import EngineStore

from .test_store import _manifest


def _season(tmp_path: Path, retrains: int = 12) -> EngineStore:
    """A store of one release (v1000) and ``retrains`` versions retrained one from the other, the newest in service."""
    store = EngineStore(tmp_path / "engines")
    for i in range(retrains + 1):
        src = tmp_path / f"model-{i}.onnx"
        src.write_bytes(f"weights of version {i}".encode() * 1000)
        int8 = tmp_path / f"model-{i}.int8.onnx"
        int8.write_bytes(f"8-bit weights of version {i}".encode() * 250)
        manifest = _manifest() | ({"parent": None} if i == 0 else {})
        store.publish({"model.onnx": src, "model.int8.onnx": int8}, manifest, version=f"v{1000 + i}")
    return store


def test_old_retrains_go_and_the_release_the_one_in_service_a_pin_what_is_named_and_the_newest_stay(tmp_path):
    store = _season(tmp_path)
    store.rollback("v1003")  # pinned there by a rollback...
    store.set_current("v1012")  # ...and a newer version put in service by hand later: the pin's version still stays
    (store.root / "pinned").write_text(json.dumps({"version": "v1003", "from": "v1012", "at": "now"}))
    before = store_bytes(store)
    deleted = prune_versions(store, keep=3, protect=["v1005"])
    assert [d.version for d in deleted] == ["v1001", "v1002", "v1004", "v1006", "v1007", "v1008", "v1009"]
    assert store.versions() == ["v1000", "v1003", "v1005", "v1010", "v1011", "v1012"]
    assert store.current() == "v1012" and store.open("v1012").name == "v1012"
    assert store_bytes(store)[1] == before[1] - sum(d.bytes for d in deleted) and all(d.bytes > 0 for d in deleted)
    assert all(d.onnx_sha256 for d in deleted)
    assert store.pruned()["v1009"] == "v1008" and store.parent_of("v1004") == "v1003"
    assert prune_versions(store, keep=3, protect=["v1005"]) == []  # nothing more to do


def test_a_lineage_is_followed_across_deleted_versions_to_its_first_version(tmp_path):
    from trainer.lineage import lineage_root

    store = _season(tmp_path)
    prune_versions(store, keep=2)
    assert store.versions() == ["v1000", "v1011", "v1012"]
    assert lineage_root(store, "v1012") == "v1000"  # the gate's first version, not v1011


def test_keep_zero_deletes_nothing_and_a_store_with_no_version_in_service_is_left_alone(tmp_path):
    store = _season(tmp_path, retrains=4)
    assert prune_versions(store, keep=0) == [] and len(store.versions()) == 5
    (store.root / "current").unlink()
    assert prune_versions(store, keep=1) == [] and len(store.versions()) == 5


def test_a_deleted_name_is_never_handed_out_again_and_a_prune_stopped_half_way_is_finished(tmp_path):
    store = _season(tmp_path, retrains=3)
    prune_versions(store, keep=1)
    (store.root / "v1003").rename(store.root / ".pruned-v1003")  # as if killed between the rename and the removal
    (store.root / "pruned.json").write_text(json.dumps(store.pruned() | {"v1003": "v1002"}))
    store.set_current("v1000")
    assert store.versions() == ["v1000"]
    src = tmp_path / "next.onnx"
    src.write_bytes(b"next")
    assert store.publish({"model.onnx": src}, _manifest()).name == "v1004"  # not v1001 nor v1003 again
    assert not (store.root / ".pruned-v1003").exists()


def test_a_rollback_goes_to_the_newest_version_held_when_the_parent_was_deleted(tmp_path):
    store = _season(tmp_path, retrains=4)
    prune_versions(store, keep=1)
    assert store.versions() == ["v1000", "v1004"]
    assert store.rollback().name == "v1000" and store.current() == "v1000"


def test_an_upgrade_still_knows_a_retrain_whose_parent_was_deleted_is_the_farms_own(tmp_path):
    from edge_agent.upgrade import adopt_shipped_release

    store = _season(tmp_path, retrains=3)
    prune_versions(store, keep=1)
    shipped = EngineStore(tmp_path / "shipped")
    src = tmp_path / "release.onnx"
    src.write_bytes(b"a new release")
    shipped.publish({"model.onnx": src}, _manifest() | {"parent": None}, version="v2000")
    assert adopt_shipped_release(store, shipped.root) == "v2000"
    assert store.current() == "v1003"  # the farm's own version stays in service; the release waits for the field check


def test_a_trainer_on_the_daemons_state_directory_keeps_what_the_daemon_serves_and_checks_against(tmp_path):
    store = _season(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / "status.json").write_text(json.dumps({"engine": {"engine_version": "v1002"}}))  # a swap it refused since
    np.savez(state / "golden.npz", x=np.zeros((1, 3, 2, 2), np.float16), y=np.zeros(1, np.int64), version=np.array("v1004"))
    deleted = prune_engines(store, 2, state, [store.current()])
    assert "v1002" in store.versions() and "v1004" in store.versions() and "v1003" not in store.versions()
    assert len(deleted) == 8


def test_the_daemons_retention_deletes_old_retrains_and_their_plans_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = _season(tmp_path)
    plans = tmp_path / "cache" / "edge-agent" / "trt-plans"
    plans.mkdir(parents=True)
    sha = {v: store.read_manifest(v)["files"]["model.onnx"]["sha256"] for v in store.versions()}
    for v in ("v1001", "v1012"):
        (plans / f"{sha[v][:12]}-fp16-abc.plan").write_bytes(b"plan")
        ort_trt = tmp_path / "cache" / "edge-agent" / "ort-trt" / sha[v][:12]  # ONNX Runtime's TensorRT engines of v
        ort_trt.mkdir(parents=True)
        (ort_trt / "TensorrtExecutionProvider_TRTKernel_graph_main_graph_1_0_0_fp16_sm87.engine").write_bytes(b"engine")
    timing = tmp_path / "cache" / "edge-agent" / "ort-trt" / "TensorrtExecutionProvider_cache_sm87.timing"
    timing.write_bytes(b"kernel timings: any model's")
    answers = tmp_path / "cache" / "edge-agent" / "ort-precision"
    answers.mkdir()
    (answers / "v1001-0123456789abcdef-ort1.23.json").write_text("{}")  # another store's v1001 (another INT8 file)
    int8 = store.read_manifest("v1001")["files"]["model.int8.onnx"]["sha256"][:16]
    (answers / f"v1001-{int8}-ort1.23.json").write_text("{}")  # this machine's INT8-or-FP32 answer for v1001
    layout = StateLayout(tmp_path / "state")
    layout.create()
    labels = layout.root / "trainer" / "samples"  # a trainer sharing the state directory: its labels' photos
    labels.mkdir(parents=True)
    for i in range(3):
        (labels / f"{i:064x}.jpg").write_bytes(bytes(1 << 20))
    db = ResultsDB(layout.db)
    r = Retention(RetentionSection(), layout.root, db, store=store, serving=lambda: "v1012")
    r.run_once(age=True)
    assert len(store.versions()) == 6  # the release and the 5 newest retrains
    assert [p.name[:12] for p in plans.glob("*.plan")] == [sha["v1012"][:12]]  # the deleted version's plan went with it
    assert sorted(p.name for p in timing.parent.iterdir()) == sorted([sha["v1012"][:12], timing.name])  # and its engines
    assert [p.name for p in answers.iterdir()] == ["v1001-0123456789abcdef-ort1.23.json"]  # another store's v1001 stays
    st = r.status()
    assert st["engines"] == 6 and st["pruned_engines"] == 7 and st["engine_versions"] == 5
    assert (st["trainer_photos"], st["trainer_bytes"]) == (3, 3 << 20) and len(list(labels.iterdir())) == 3  # measured, kept
    (layout.root / "status.json").write_text(json.dumps({"retention": st, "updated": time.time(), "pid": 0}))
    from edge_agent.config import AppConfig
    from edge_agent.web.app import WebContext, create_app

    from .web_helpers import LOCAL

    app = create_app(WebContext(AppConfig(), layout, layout.root / "inbox", "127.0.0.1"))
    page = TestClient(app, base_url="http://localhost", client=LOCAL).get("/health").text
    assert "engines: 6 versions" in page and "the 5 newest retrains kept; 7 older deleted since start" in page
    assert "trainer's labels: 3 photos (3 MiB), the expert's kept always" in page
    metrics = TestClient(app, base_url="http://localhost", client=LOCAL).get("/metrics").text
    assert f"edge_agent_trainer_label_bytes {3 << 20}" in metrics
    off = Retention(RetentionSection(engine_versions=0), layout.root, db, store=store, serving=lambda: "v1012")
    assert off.old_engines().engines == 0
    db.close()


def test_the_trainer_deletes_old_retrains_after_it_publishes_and_keeps_what_the_daemon_serves(tmp_path, monkeypatch):
    from edge_agent.config import parse_config
    from trainer import service
    from trainer.retrain import RetrainResult

    cfg = parse_config({"trainer": {"retrain_threshold": 1, "field_check_every": 0}, "retention": {"engine_versions": 2}})
    svc = service.TrainerService(cfg, tmp_path)
    store = svc.store
    first = store.current()

    def publish(i: int) -> str:
        src = tmp_path / f"retrain-{i}.onnx"
        src.write_bytes(f"retrain {i}".encode())
        return store.publish({"model.onnx": src}, _manifest(store.read_manifest(first)["classes"])).name

    made = [publish(i) for i in range(4)]
    (tmp_path / "status.json").write_text(json.dumps({"engine": {"engine_version": made[0]}}))  # the daemon serves it still
    svc.samples.add({"id": "a" * 64, "kind": "expert", "label": "x", "confidence": 1.0, "engine_version": first, "ext": ".jpg"}, b"x")
    monkeypatch.setattr(service, "retrain_in_child", lambda *a, **k: RetrainResult(publish(9), "published", {}, 1, 1.0))
    svc._retrain_once()
    assert svc.status()["engines"] | {"bytes": 0} == {"versions": len(store.versions()), "bytes": 0, "keep": 2, "deleted": 2}
    held = store.versions()
    assert first in held and made[0] in held and made[-1] in held and made[1] not in held and made[2] not in held
    svc.samples.close()


def test_a_trainer_keeps_the_newest_pseudo_labels_of_each_class_and_every_expert_label(tmp_path):
    from trainer.samples import SampleStore

    samples = SampleStore(tmp_path / "trainer")

    def add(i: int, label: str, kind: str = "pseudo") -> str:
        sample_id = f"{i:064x}"
        samples.add(
            {"id": sample_id, "kind": kind, "label": label, "confidence": 0.99, "engine_version": "v4000", "ext": ".jpg"}, b"p" * 100
        )
        time.sleep(0.001)  # arrival order
        return sample_id

    scab = [add(i, "Apple___Apple_scab") for i in range(30)]
    rot = [add(100 + i, "Apple___Black_rot") for i in range(5)]
    experts = [add(200 + i, "Apple___Apple_scab", "expert") for i in range(12)]
    samples.mark_pending([s for s in samples.all() if s.id == scab[0]], "publishing")  # a publish under way: left for it to settle
    assert samples.drop_old_pseudo(0) == (0, 0)  # 0: every one kept
    assert samples.drop_old_pseudo(10) == (19, 1900)
    held = {s.id: s for s in samples.all()}
    assert set(scab[-10:]) <= set(held) and not set(scab[1:-10]) & set(held) and scab[0] in held
    assert set(rot) <= set(held) and set(experts) <= set(held)  # fewer than 10 of its own; the expert's never go
    assert len(list((tmp_path / "trainer" / "samples").iterdir())) == len(held)  # their photos went with them
    assert samples.get_state("pseudo_deleted") == "19" and samples.drop_old_pseudo(10) == (0, 0)
    samples.close()


def test_edge_trainer_status_says_how_many_pseudo_labels_and_engine_versions_went(tmp_path, capsys):
    from trainer.cli import main

    (tmp_path / "trainer").mkdir()
    status = {
        "pid": 1,
        "updated": 0,
        "state": "idle",
        "samples": {"pseudo": 400, "expert": 30},
        "pseudo_deleted": 37,
        "pseudo_withdrawn": 12,
        "pseudo_per_class": 100,
        "engines": {"versions": 6, "bytes": 200 << 20, "keep": 5, "deleted": 12},
        "store": "/srv/coop/engines",
    }
    (tmp_path / "trainer" / "status.json").write_text(json.dumps(status))
    main(["status", "--state-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "400 pseudo-labels (the 100 newest of each class; 37 older deleted) and 30 expert labels" in out
    assert "; 12 pseudo-labels withdrawn by the devices (kept as unlabelled photos)" in out
    assert "engines: 6 versions (200 MiB), the 5 newest retrains kept; 12 older deleted in all (store /srv/coop/engines)" in out


def _full_disk_for_the_record(monkeypatch, times: int) -> list[str]:
    """The store's ``pruned.json`` cannot be written the first ``times`` tries (ENOSPC, a full disk); the tries made."""
    from engines import durable, prune
    from engines import store as store_module

    tries, write = [], durable.atomic_write

    def atomic_write(path, data):
        if Path(path).name == "pruned.json":
            tries.append(Path(path).name)
            if len(tries) <= times:
                raise OSError(28, "No space left on device")
        return write(path, data)

    for module in (store_module, prune):  # wherever the store's files are written from
        if hasattr(module, "atomic_write"):
            monkeypatch.setattr(module, "atomic_write", atomic_write)
    return tries


def test_on_a_full_disk_old_versions_free_their_room_first_and_are_recorded_then(tmp_path, monkeypatch):
    """A disk too full for the few bytes of ``pruned.json`` kept every old version (33 MB each) and stayed full: the
    versions set aside give up their models first, then the record is written and they go."""
    store = _season(tmp_path, retrains=5)
    tries = _full_disk_for_the_record(monkeypatch, times=1)
    deleted = prune_versions(store, keep=1)
    assert [d.version for d in deleted] == ["v1001", "v1002", "v1003", "v1004"] and len(tries) == 2
    assert store.versions() == ["v1000", "v1005"] and not list(store.root.glob(".pruned-*"))
    assert store.pruned() == {"v1001": "v1000", "v1002": "v1001", "v1003": "v1002", "v1004": "v1003"}
    assert json.loads((store.root / "pruned.json").read_text()) == store.pruned()


def test_a_disk_that_stays_full_loses_the_old_models_keeps_their_lineage_and_records_it_once_it_can(tmp_path, monkeypatch):
    """Where even the freed room cannot take the record (another writer fills it), each version set aside keeps only its
    manifest: its parent still answers, its name is not handed out again, and the next pass with room records and
    removes it. The photos pass goes on meanwhile (logged, no exception)."""
    from trainer.lineage import lineage_root

    store = _season(tmp_path, retrains=8)
    layout = StateLayout(tmp_path / "state")
    layout.create()
    db = ResultsDB(layout.db)
    _full_disk_for_the_record(monkeypatch, times=2)
    before = store_bytes(store)[1]
    r = Retention(RetentionSection(), layout.root, db, store=store, serving=lambda: "v1008")
    r.run_once(age=True)
    kept = RetentionSection().engine_versions
    assert kept == 5 and r.last_pass is not None and r.status()["pruned_engines"] == 3
    assert len(store.versions()) == 1 + kept and store_bytes(store)[1] < before
    aside = sorted(p.name for p in store.root.glob(".pruned-*"))
    assert aside == [".pruned-v1001", ".pruned-v1002", ".pruned-v1003"]
    assert all([f.name for f in (store.root / a).iterdir()] == ["manifest.json"] for a in aside)  # the models are gone
    assert not (store.root / "pruned.json").exists() and store.parent_of("v1002") == "v1001"
    assert lineage_root(store, "v1008") == "v1000"
    src = tmp_path / "next.onnx"
    src.write_bytes(b"next")
    assert store.publish({"model.onnx": src}, _manifest(), make_current=False).name == "v1009"  # room now: recorded
    assert not list(store.root.glob(".pruned-*")) and json.loads((store.root / "pruned.json").read_text())["v1003"] == "v1002"
    db.close()


def test_a_store_that_cannot_be_written_otherwise_raises_and_loses_no_version(tmp_path, monkeypatch):
    """Another error writing the record (a read-only store) is not taken for a full disk: nothing is deleted, the
    versions set aside stay whole and are recorded and removed by the next pass that can write."""
    from engines import prune
    from engines import store as store_module

    store = _season(tmp_path, retrains=3)

    def read_only(*a, **k):
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as m:
        for module in (store_module, prune):
            if hasattr(module, "atomic_write"):
                m.setattr(module, "atomic_write", read_only)
        with pytest.raises(PermissionError):
            prune_versions(store, keep=1)
    assert sorted(p.name for p in store.root.glob(".pruned-*")) == [".pruned-v1001", ".pruned-v1002"]
    assert (store.root / ".pruned-v1001" / "model.onnx").is_file()  # whole: only a full disk frees the models first
    assert store.pruned() == {"v1001": "v1000", "v1002": "v1001"}
    assert prune_versions(store, keep=1) == [] and not list(store.root.glob(".pruned-*"))
    assert json.loads((store.root / "pruned.json").read_text()) == {"v1001": "v1000", "v1002": "v1001"}


def test_edge_agent_status_says_how_many_versions_are_held_and_kept_and_what_the_trainers_labels_take(tmp_path, capsys):
    from edge_agent.cli import main

    layout = StateLayout(tmp_path / "state")
    layout.create()
    ResultsDB(layout.db).close()
    kept = {"photos": 0, "photo_bytes": 0, "photo_days": 30, "floor_bytes": 1 << 30, "free_bytes": 1 << 34, "pruned_photos": 0}
    for n, says in ((1, "the newest retrain kept; 3 older deleted"), (5, "the 5 newest retrains kept; 3 older"), (0, "every version kept")):
        retention = kept | {"pruned_results": 0, "engines": 6, "engine_bytes": 200 << 20, "engine_versions": n, "pruned_engines": 3}
        (layout.root / "status.json").write_text(json.dumps({"pid": 0, "updated": time.time(), "retention": retention}))
        main(["status", "--state-dir", str(layout.root)])
        out = capsys.readouterr().out
        assert "engines: 6 versions (200 MiB), " + says in out, out
        assert ("trainer's labels" in out) is False
    retention |= {"trainer_photos": 1812, "trainer_bytes": 7 << 30}  # a trainer here, a season of the expert's photos
    (layout.root / "status.json").write_text(json.dumps({"pid": 0, "updated": time.time(), "retention": retention}))
    main(["status", "--state-dir", str(layout.root)])
    assert "trainer's labels: 1812 photos (7168 MiB), the expert's kept always" in capsys.readouterr().out


def test_edge_agent_status_says_the_space_free_now_not_what_the_daemons_last_status_said(tmp_path, capsys, monkeypatch):
    """A full disk keeps the daemon from writing its status: "GiB free now" is read from the disk when asked (it
    showed the 16 GiB of a status written before the disk filled, beside "DISK FULL")."""
    from collections import namedtuple

    from edge_agent import _cli_status
    from edge_agent.cli import main

    layout = StateLayout(tmp_path / "state")
    layout.create()
    ResultsDB(layout.db).close()
    kept = {"photos": 0, "photo_bytes": 0, "photo_days": 30, "floor_bytes": 1 << 30, "free_bytes": 1 << 34, "pruned_photos": 0}
    (layout.root / "status.json").write_text(json.dumps({"pid": 0, "updated": time.time(), "retention": kept | {"pruned_results": 0}}))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(_cli_status.shutil, "disk_usage", lambda _p: usage(1 << 35, (1 << 35) - (3 << 20), 3 << 20))
    main(["status", "--state-dir", str(layout.root)])
    assert "(0.0 GiB free now)" in capsys.readouterr().out


def test_a_deleted_version_asked_for_by_name_is_said_to_be_deleted_and_the_engine_list_names_them(tmp_path, capsys):
    from edge_agent.cli import main
    from engines.store import StoreError

    store = _season(tmp_path, retrains=4)
    prune_versions(store, keep=2)
    with pytest.raises(StoreError, match="v1001 was deleted as an old retrain .* held: v1000, v1003, v1004"):
        store.rollback("v1001")
    assert store.current() == "v1004"
    with pytest.raises(StoreError, match="no version 'v1009'"):  # never held: as before
        store.open("v1009")
    main(["engine", "list", "--store", str(store.root)])
    assert "deleted as old retrains ([retention] engine_versions = 5): v1001, v1002" in capsys.readouterr().out


def test_a_version_whose_manifest_cannot_be_read_is_left_for_a_person_to_look_at(tmp_path):
    store = _season(tmp_path, retrains=6)
    (store.root / "v1002" / "manifest.json").write_text("{ torn")
    deleted = prune_versions(store, keep=2)
    assert [d.version for d in deleted] == ["v1001", "v1003", "v1004"]
    assert "v1002" in store.versions()  # not judged: neither deleted nor counted among the newest
