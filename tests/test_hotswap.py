"""Hot swap: a new store version is verified off the hot path and swapped between batches."""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest
import structlog

from edge_agent.config import parse_config
from edge_agent.daemon import Daemon
from edge_agent.systemd import Notifier
from engines.store import EngineStore

from .conftest import encode, leaf_image, trusted_store
from .daemon_helpers import db_rows, wait_until

torch = pytest.importorskip("torch", reason="building candidate engines needs the trainer")


def republish(store: EngineStore, key, scale_head: float | None = None, classes: list[str] | None = None, make_current: bool = True) -> str:
    """Publish a copy of the current model (optionally with its head changed) as a new version."""
    from trainer.publish import load_weights, publish_model

    cur = store.open()
    model = load_weights(cur)
    if scale_head is not None:
        with torch.no_grad():
            model.head.weight.mul_(scale_head)
            model.head.bias.mul_(scale_head)
    return publish_model(
        model, classes or cur.classes, store.root, training={"kind": "test"}, make_current=make_current, signing_key=key
    ).name


@pytest.fixture
def running(tmp_path, tiny_store, signing_key):
    """A daemon (in-process) on a writable copy of the tiny store, polling it every 0.2 s."""
    root = tmp_path / "store"
    shutil.copytree(tiny_store, root)
    cfg = parse_config(
        {
            "store": trusted_store(root, signing_key),
            "inbox": {"settle_s": 0.1, "rescan_interval_s": 0.5},
            "hotswap": {"poll_s": 0.2, "min_agreement": 0.5},
            "handoff": {"enabled": False},
            "labels": {"pseudo_threshold": 0.01},  # every photo is "confident": golden photos fill up
        }
    )
    daemon = Daemon(cfg, tmp_path / "state", notifier=Notifier({}))
    t = threading.Thread(target=daemon.run)
    t.start()
    wait_until(lambda: daemon.watcher is not None and daemon.folder is not None, 20, "daemon up")
    daemon.test_thread = t  # for the tests that restart it
    yield daemon, EngineStore(root)
    daemon.request_stop()
    t.join(30)


def drop(daemon, n, start):
    for i in range(start, start + n):
        (daemon.inbox / f"p{i:04d}.jpg").write_bytes(encode(leaf_image(i)))


def test_swap_while_photos_keep_arriving_drops_nothing(running, signing_key):
    daemon, store = running
    drop(daemon, 20, 0)
    wait_until(lambda: daemon.pipeline.counters["processed"] >= 20, 30, "first photos")
    stop = threading.Event()

    def feed():
        i = 100
        while not stop.is_set():
            drop(daemon, 2, i)
            i += 2
            time.sleep(0.05)
        return i

    feeder = threading.Thread(target=feed)
    feeder.start()
    v2 = republish(store, signing_key)  # same weights: agrees on every golden photo
    wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == v2, 20, "swap")
    time.sleep(0.5)
    stop.set()
    feeder.join()
    wait_until(lambda: not list(daemon.inbox.glob("*.jpg")) and daemon.pipeline.in_flight == 0, 30, "all processed")
    rows = db_rows(daemon.state.root, "SELECT engine_version, created FROM results ORDER BY created")
    dropped = len(list((daemon.state.root / "processed").rglob("*.jpg")))
    assert len(rows) == dropped  # every photo has a result: none dropped during the swap
    versions = [v for v, _ in rows]
    assert versions[0] == "v0001" and versions[-1] == v2
    first_new = versions.index(v2)
    assert set(versions[first_new:]) == {v2}  # after the swap, every result carries the new version
    assert daemon.watcher.swaps == 1


def test_tampered_version_is_refused_and_old_keeps_running(running, signing_key):
    daemon, store = running
    drop(daemon, 6, 0)
    wait_until(lambda: daemon.pipeline.counters["processed"] >= 6, 30, "photos")
    v2 = republish(store, signing_key, make_current=False)
    onnx = store.root / v2 / "model.onnx"
    data = bytearray(onnx.read_bytes())
    data[-50] ^= 0xFF
    onnx.write_bytes(bytes(data))
    (store.root / "current").write_text(v2 + "\n")  # e.g. a tool that bypassed the store's checks
    wait_until(lambda: v2 in daemon.watcher.refused, 10, "refusal")
    assert "does not match manifest" in daemon.watcher.refused[v2]
    drop(daemon, 3, 50)
    wait_until(lambda: daemon.pipeline.counters["processed"] >= 9, 30, "still serving")
    assert {v for (v,) in db_rows(daemon.state.root, "SELECT engine_version FROM results")} == {"v0001"}


def test_disagreeing_engine_is_refused(running, signing_key):
    daemon, store = running
    drop(daemon, 12, 0)
    wait_until(lambda: len(daemon.pipeline.golden.photos()) >= 8, 30, "golden photos")
    v2 = republish(store, signing_key, scale_head=-1.0)  # flips the ranking: disagrees everywhere
    wait_until(lambda: v2 in daemon.watcher.refused, 10, "refusal")
    assert "golden photos" in daemon.watcher.refused[v2]
    assert daemon.pipeline.classifier.engine.engine_version == "v0001"


def test_class_list_must_extend_the_running_one(running, signing_key):
    daemon, store = running
    v2 = republish(store, signing_key, classes=["A", "B", "C"])
    wait_until(lambda: v2 in daemon.watcher.refused, 10, "refusal")
    assert "class list" in daemon.watcher.refused[v2]


def test_rollback_is_followed(running, signing_key):
    daemon, store = running
    drop(daemon, 6, 0)
    wait_until(lambda: daemon.pipeline.counters["processed"] >= 6, 30, "photos")
    v2 = republish(store, signing_key)
    wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == v2, 20, "swap")
    store.rollback()
    wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == "v0001", 20, "rolled back")
    wait_until(lambda: daemon.watcher.swaps == 2, 10, "the swap back counted")
    assert structlog.get_context(daemon.log)["engine_version"] == "v0001"  # its log lines name the engine it serves


def test_the_daemons_log_lines_name_the_engine_it_serves_after_a_swap(running, signing_key):
    """A line logged after a hot swap ("stopping", health, warnings) names the new version, not the one it started on."""
    daemon, store = running
    assert structlog.get_context(daemon.log)["engine_version"] == "v0001"
    v2 = republish(store, signing_key)
    wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == v2, 20, "swap")
    assert structlog.get_context(daemon.log)["engine_version"] == v2


def test_seeded_store_when_no_path_is_configured(tmp_path):
    from edge_agent.config import default_store_path
    from edge_agent.state import resolve_store

    store = resolve_store(parse_config({}), tmp_path / "state")
    assert store.root == tmp_path / "state" / "engines"
    assert store.versions() == EngineStore(default_store_path()).versions()
    assert store.open().manifest == EngineStore(default_store_path()).open().manifest
    assert resolve_store(parse_config({}), tmp_path / "state").root == store.root  # seeded once


def test_a_release_that_reorders_and_extends_the_classes_is_checked_by_class_name():
    """23 -> 38 classes: the new list holds every old class by name, in another order; golden labels are mapped by name."""
    import types

    from edge_agent.hotswap import SwapRefused, verify_candidate

    manifest = {"input": {"shape": [None, 3, 4, 4]}, "preprocess": {"size": 4}}

    def engine(classes, answer):
        def infer(x):
            out = np.zeros((len(x), len(classes)), np.float32)
            out[:, classes.index(answer)] = 1
            return out

        return types.SimpleNamespace(version=types.SimpleNamespace(manifest=manifest), classes=classes, engine_version="v", infer=infer)

    old = {**manifest, "classes": ["b", "c"]}
    golden = [(np.zeros((3, 4, 4), np.float32), 1)] * 4  # index 1 of the old list: "c"
    assert verify_candidate(engine(["a", "b", "c"], "c"), old, "v", golden, 0.9)["agreement"] == 1.0
    with pytest.raises(SwapRefused, match="agrees with v on 0%"):
        verify_candidate(engine(["a", "b", "c"], "b"), old, "v", golden, 0.9)
    with pytest.raises(SwapRefused, match="it lacks c"):
        verify_candidate(engine(["a", "b"], "b"), old, "v", golden, 0.9)


def _restarted(tmp_path, root, signing_key, daemon):
    """Stop ``daemon`` (its golden photos are saved) and start another on the same state directory and store."""
    daemon.request_stop()
    daemon.test_thread.join(30)
    cfg = parse_config(
        {"store": trusted_store(root, signing_key), "handoff": {"enabled": False}, "hotswap": {"poll_s": 0.2, "min_agreement": 0.5}}
    )
    again = Daemon(cfg, tmp_path / "state", notifier=Notifier({}))
    t = threading.Thread(target=again.run)
    t.start()
    wait_until(lambda: again.watcher is not None, 20, "restarted daemon up")
    return again, t


def test_a_version_a_swap_refused_is_refused_after_a_restart_too(running, signing_key, tmp_path):
    """Its class list reversed (signed by a trusted key): the parent's names by output catch it at the swap, and at
    the next start, where the version the golden photos came from serves instead."""
    daemon, store = running
    drop(daemon, 12, 0)
    wait_until(lambda: len(daemon.pipeline.golden.photos()) >= 8, 30, "golden photos")
    v2 = republish(store, signing_key, classes=list(reversed(store.open().classes)))
    wait_until(lambda: v2 in daemon.watcher.refused, 10, "refused at the swap")
    again, t = _restarted(tmp_path, store.root, signing_key, daemon)
    try:
        assert again.classifier.engine.engine_version == "v0001" and store.current() == v2
        assert "renamed or swapped" in again._refused_at_start[v2]
    finally:
        again.request_stop()
        t.join(30)


def test_a_signed_version_whose_network_does_not_match_its_manifest_does_not_stop_the_daemon(running, signing_key, tmp_path):
    import json

    from engines.signing import sign_version

    daemon, store = running
    v2 = republish(store, signing_key, make_current=False)
    manifest = json.loads((store.root / v2 / "manifest.json").read_text())
    manifest["classes"] = manifest["classes"] + ["Not_in_the_network"]
    (store.root / v2 / "manifest.json").write_text(json.dumps(manifest))
    sign_version(store.root / v2, signing_key)  # a trusted key signed it: only loading the network can tell
    (store.root / "current").write_text(v2 + "\n")
    again, t = _restarted(tmp_path, store.root, signing_key, daemon)
    try:
        assert again.classifier.engine.engine_version == "v0001"
        assert "outputs but the manifest lists" in again._refused_at_start[v2]
    finally:
        again.request_stop()
        t.join(30)


def test_a_version_of_another_input_is_a_new_lineage_unless_it_claims_the_running_engine_as_its_parent():
    """The golden photos are tensors of the old input: a new release on another input (no parent here) is verified
    without them; a 'retrain' of the running engine that changed its input is refused."""
    import types

    from edge_agent.hotswap import SwapRefused, verify_candidate

    old = {"input": {"shape": [None, 3, 4, 4]}, "preprocess": {"size": 4}, "classes": ["b", "c"]}

    def engine(classes, parent=None, size=8):
        manifest = {"input": {"shape": [None, 3, size, size]}, "preprocess": {"size": size}, "classes": classes}
        if parent:
            manifest["parent"] = parent
        infer = lambda x: np.zeros((len(x), len(classes)), np.float32)
        return types.SimpleNamespace(version=types.SimpleNamespace(manifest=manifest), classes=classes, engine_version="n", infer=infer)

    golden = [(np.zeros((3, 4, 4), np.float32), 1)] * 4
    measured = verify_candidate(engine(["a", "b", "c"]), old, "v1000", golden, 0.9)
    assert measured["golden"] == 0 and "new: its input differs from v1000" in measured["lineage"]
    with pytest.raises(SwapRefused, match="differs from its parent v1000"):
        verify_candidate(engine(["a", "b", "c"], parent="v1000"), old, "v1000", golden, 0.9)
    with pytest.raises(SwapRefused, match="it lacks c"):  # a new lineage still keeps every class by name
        verify_candidate(engine(["a", "b"]), old, "v1000", golden, 0.9)


def _lite_release(store: EngineStore, key, classes: list[str], parent: str | None = None) -> str:
    """A small EfficientNet-Lite0 version (64 px, Lite's normalisation) published to ``store``."""
    from trainer.models import build_model, data_config
    from trainer.publish import publish_model

    torch.manual_seed(0)
    model = build_model(len(classes), "efficientnet-lite0").eval()
    return publish_model(
        model,
        classes,
        store.root,
        spec=data_config("efficientnet-lite0", 64),
        training={"kind": "test"},
        signing_key=key,
        parent=parent,
        new_lineage=parent is None,
    ).name


def test_a_new_release_on_another_input_is_swapped_in_and_served_after_a_restart(running, signing_key, tmp_path):
    """v0001 (LeafNet, 128 px) labelled the golden photos; a release of another architecture and input replaces it at
    the hot swap, its photos preprocessed as its manifest says, and it still serves after a restart."""
    daemon, store = running
    drop(daemon, 10, 0)
    wait_until(lambda: len(daemon.pipeline.golden.photos()) >= 8, 30, "golden photos")
    new = _lite_release(store, signing_key, list(store.open().classes))
    wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == new, 20, "swapped to the new lineage")
    assert daemon.pipeline.classifier.spec.size == 64 and daemon.pipeline.classifier.spec.mean == (127 / 255,) * 3
    wait_until(lambda: "lineage" in daemon.watcher.swap_measured, 5, "the swap recorded")  # set just after the swap
    assert "new" in daemon.watcher.swap_measured["lineage"]
    drop(daemon, 3, 100)
    served = f"SELECT COUNT(*) FROM results WHERE engine_version = '{new}'"
    wait_until(lambda: db_rows(tmp_path / "state", served)[0][0] >= 3, 30, "served")
    again, t = _restarted(tmp_path, store.root, signing_key, daemon)
    try:
        assert again.classifier.engine.engine_version == new and not again._refused_at_start
    finally:
        again.request_stop()
        t.join(30)


def test_a_retrain_that_changed_its_parents_input_is_refused_at_the_swap(running, signing_key):
    daemon, store = running
    bad = _lite_release(store, signing_key, list(store.open().classes), parent="v0001")
    wait_until(lambda: bad in daemon.watcher.refused, 20, "refused")
    assert "differs from its parent v0001" in daemon.watcher.refused[bad]
    assert daemon.pipeline.classifier.engine.engine_version == "v0001"


# ---- an operator's rollback always happens ---------------------------------------------------------------------
def _suspect_serving(daemon, store, key) -> str:
    """A signed version that disagrees with v0001 on every photo, served (no golden photo to check it against yet),
    which then labels the golden photos: the red team's swapped-classes version, reduced to its effect."""
    bad = republish(store, key, scale_head=-1.0)
    wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == bad, 20, "the suspect version serves")
    drop(daemon, 12, 0)
    wait_until(lambda: len(daemon.pipeline.golden.photos()) >= 8, 30, "golden photos labelled by the suspect")
    return bad


def _config_file(tmp_path, root, key) -> str:
    from edge_agent.config_toml import sections_toml

    path = tmp_path / "edge-agent.toml"
    path.write_text(sections_toml({"store": trusted_store(root, key), "handoff": {"enabled": False}, "hotswap": {"poll_s": 0.2}}))
    return str(path)


def test_a_rollback_by_the_cli_is_served_although_the_version_left_behind_labelled_the_golden_photos(
    running, signing_key, tmp_path, capsys
):
    from edge_agent.cli import main

    daemon, store = running
    bad = _suspect_serving(daemon, store, signing_key)
    rc = main(
        [
            "engine",
            "rollback",
            "--to",
            "v0001",
            "--config",
            _config_file(tmp_path, store.root, signing_key),
            "--state-dir",
            str(tmp_path / "state"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "the daemon serves v0001" in out, out
    assert daemon.pipeline.classifier.engine.engine_version == "v0001" and "v0001" not in daemon.watcher.refused
    assert "rollback" in daemon.watcher.swap_measured and bad in daemon.watcher.swap_measured["rollback"]
    again, t = _restarted(tmp_path, store.root, signing_key, daemon)  # the golden file was the suspect's: no reference
    try:
        assert again.classifier.engine.engine_version == "v0001" and not again._refused_at_start
    finally:
        again.request_stop()
        t.join(30)


@pytest.mark.parametrize("way", ["api", "page"])
def test_a_rollback_by_the_api_or_the_page_reports_serving_only_once_the_daemon_serves_it(running, signing_key, tmp_path, way):
    from starlette.testclient import TestClient

    from edge_agent.state import StateLayout
    from edge_agent.web.app import WebContext, create_app

    daemon, store = running
    _suspect_serving(daemon, store, signing_key)
    cfg = parse_config({"store": trusted_store(store.root, signing_key), "hotswap": {"poll_s": 0.2}})
    state = tmp_path / "state"
    c = TestClient(
        create_app(WebContext(cfg, StateLayout(state), state / "inbox", "127.0.0.1")),
        base_url="http://localhost",
        client=("127.0.0.1", 5000),
    )
    if way == "api":
        from edge_agent.web.auth import Tokens

        token = Tokens(state / "web").new("admin")
        r = c.post("/api/v1/engines/rollback", json={"to": "v0001"}, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.json()["state"] == "serving" and r.json()["current"] == "v0001", r.text
    else:
        import re

        csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/engines").text).group(1)
        r = c.post("/engines/rollback", data={"csrf": csrf, "to": "v0001", "confirm": "yes"})
        assert r.status_code == 200 and "v0001 is now in service" in r.text, r.text[-2000:]
    assert daemon.pipeline.classifier.engine.engine_version == "v0001"


def test_a_rollback_the_daemon_refuses_is_reported_as_refused_with_its_reason(running, signing_key, tmp_path, capsys):
    """A version whose network does not match its class list (signed): the rollback moves the pointer, the daemon
    refuses to serve it, and the command says so and exits 1 instead of reporting success."""
    import json

    from edge_agent.cli import main
    from engines.signing import sign_version

    daemon, store = running
    broken = republish(store, signing_key, make_current=False)
    manifest = json.loads((store.root / broken / "manifest.json").read_text())
    manifest["classes"] = manifest["classes"] + ["Not_in_the_network"]
    (store.root / broken / "manifest.json").write_text(json.dumps(manifest))
    sign_version(store.root / broken, signing_key)
    rc = main(
        [
            "engine",
            "rollback",
            "--to",
            broken,
            "--config",
            _config_file(tmp_path, store.root, signing_key),
            "--state-dir",
            str(tmp_path / "state"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 1 and "refused: the daemon refused it" in out and "outputs but the manifest lists" in out, out
    assert daemon.pipeline.classifier.engine.engine_version == "v0001"


def test_a_retrain_with_two_classes_swapped_or_one_renamed_is_refused_at_the_swap_and_after_a_restart(running, signing_key, tmp_path):
    daemon, store = running
    classes = list(store.open().classes)
    swapped = republish(store, signing_key, classes=[classes[1], classes[0], *classes[2:]])
    wait_until(lambda: swapped in daemon.watcher.refused, 10, "the swap refused at the hot swap")
    assert "swapped" in daemon.watcher.refused[swapped] and f"output 0 is {classes[1]!r}" in daemon.watcher.refused[swapped]
    renamed = republish(store, signing_key, classes=["Renamed", *classes[1:]])
    wait_until(lambda: renamed in daemon.watcher.refused, 10, "the rename refused at the hot swap")
    again, t = _restarted(tmp_path, store.root, signing_key, daemon)
    try:
        assert again.classifier.engine.engine_version == "v0001"
        assert "lacks" in again._refused_at_start[renamed] or "renamed" in again._refused_at_start[renamed]
    finally:
        again.request_stop()
        t.join(30)


def test_a_version_that_declares_its_renames_is_adopted_and_judged_per_class_on_the_golden_photos():
    import types

    from edge_agent.hotswap import SwapRefused, verify_candidate

    manifest = {"input": {"shape": [None, 3, 4, 4]}, "preprocess": {"size": 4}}

    def engine(classes, answers, **extra):
        def infer(x):
            out = np.zeros((len(x), len(classes)), np.float32)
            for i, g in enumerate(x):
                out[i, classes.index(answers[int(g[0, 0, 0])])] = 1
            return out

        m = {**manifest, "classes": classes, "parent": "v0001", **extra}
        return types.SimpleNamespace(version=types.SimpleNamespace(manifest=m), classes=classes, engine_version="v0002", infer=infer)

    old = {**manifest, "classes": ["a", "b", "c"]}
    # 14 golden photos of "c" and 2 of "a": the parent said a for photo kind 0, c for kind 2
    golden = [(np.full((3, 4, 4), 2, np.float32), 2)] * 14 + [(np.zeros((3, 4, 4), np.float32), 0)] * 2
    meant = engine(["b2", "b", "c"], {0: "b2", 2: "c"}, renames={"a": "b2"})
    assert verify_candidate(meant, old, "v0001", golden, 0.5)["agreement"] == 1.0
    with pytest.raises(SwapRefused, match="'renames' is not a map"):
        verify_candidate(engine(["a", "b", "c"], {0: "a", 2: "c"}, renames=["a"]), old, "v0001", golden, 0.5)
    # 88 % agree in all, but every photo of "a" now says "b": refused on that class alone
    with pytest.raises(SwapRefused, match="0% of the 2 golden photos it labelled 'a'"):
        verify_candidate(engine(["a", "b", "c"], {0: "b", 2: "c"}), old, "v0001", golden, 0.5)


def test_a_swapped_in_version_is_opened_with_the_shipped_check_photos_for_its_precision(running, signing_key, monkeypatch):
    import edge_agent.hotswap as hotswap
    from edge_agent._truth import precision_check

    daemon, store = running
    real, seen = hotswap.open_engine, []

    def spy(*a, **k):
        seen.append(k.get("check_photos"))
        return real(*a, **k)

    monkeypatch.setattr(hotswap, "open_engine", spy)
    v2 = republish(store, signing_key)
    wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == v2, 20, "swap")
    assert seen and all(c is precision_check for c in seen)  # INT8 checked on this machine, as at start-up
