"""The versioned engine store: atomic publish, verification, rollback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engines import store as store_mod
from engines.store import EngineStore, OfferRefused, StoreError, TamperedError

STEPS = ["tmpdir", "file", "manifest", "renamed", "current"]


def _manifest(classes=("a", "b")) -> dict:
    return {
        "classes": list(classes),
        "input": {"name": "input", "shape": [None, 3, 128, 128], "dtype": "float32"},
        "preprocess": {"size": 128},
        "artifacts": {"onnx": "model.onnx"},
        "metrics": {"val": {"top1": 0.5}},
    }


def _publish(store: EngineStore, tmp_path: Path, payload: bytes = b"onnx-bytes", **kw):
    src = tmp_path / f"src-{payload[:8].hex()}.onnx"
    src.write_bytes(payload)
    return store.publish({"model.onnx": src, "extra.bin": src}, _manifest(), **kw)


def test_publish_and_open(tmp_path):
    store = EngineStore(tmp_path / "store")
    v1 = _publish(store, tmp_path, b"one")
    assert v1.name == "v0001" and store.current() == "v0001"
    v2 = _publish(store, tmp_path, b"two")
    assert v2.name == "v0002" and store.current() == "v0002"
    assert v2.manifest["parent"] == "v0001" and v1.manifest["parent"] is None
    assert store.versions() == ["v0001", "v0002"]
    opened = store.open()
    assert opened.artifact("onnx").read_bytes() == b"two"
    assert set(opened.manifest["files"]) == {"model.onnx", "extra.bin"}
    assert opened.manifest["created"] and opened.manifest["classes"] == ["a", "b"]
    assert oct(os.stat(opened.path).st_mode & 0o777) == "0o755"


def test_publish_without_switching_current(tmp_path):
    store = EngineStore(tmp_path / "store")
    _publish(store, tmp_path, b"one")
    _publish(store, tmp_path, b"two", make_current=False)
    assert store.current() == "v0001" and store.versions() == ["v0001", "v0002"]


def test_tampered_file_is_refused(tmp_path):
    store = EngineStore(tmp_path / "store")
    v = _publish(store, tmp_path, b"original")
    (v.path / "model.onnx").write_bytes(b"evil")
    with pytest.raises(TamperedError, match="does not match manifest"):
        store.open()


def test_missing_file_is_refused(tmp_path):
    store = EngineStore(tmp_path / "store")
    v = _publish(store, tmp_path)
    (v.path / "extra.bin").unlink()
    with pytest.raises(TamperedError, match="missing"):
        store.open()


def test_manifest_problems(tmp_path):
    store = EngineStore(tmp_path / "store")
    v = _publish(store, tmp_path)
    mpath = v.path / "manifest.json"
    m = json.loads(mpath.read_text())
    mpath.write_text(json.dumps(m | {"version": "v0009"}))
    with pytest.raises(StoreError, match="manifest says version"):
        store.open()
    mpath.write_text("{not json")
    with pytest.raises(StoreError, match="unreadable manifest"):
        store.open()
    del m["classes"]
    mpath.write_text(json.dumps(m))
    with pytest.raises(StoreError, match="lacks 'classes'"):
        store.open()


def test_bad_current_pointer_and_empty_store(tmp_path):
    store = EngineStore(tmp_path / "store")
    with pytest.raises(StoreError, match="no current version"):
        store.current()
    _publish(store, tmp_path)
    (store.root / "current").write_text("v0042\n")
    with pytest.raises(StoreError, match="not a complete version"):
        store.current()


def test_artifact_must_be_among_files(tmp_path):
    store = EngineStore(tmp_path / "store")
    src = tmp_path / "m.onnx"
    src.write_bytes(b"x")
    with pytest.raises(StoreError, match="not among the files"):
        store.publish({"other.onnx": src}, _manifest())
    with pytest.raises(StoreError, match="bad file name"):
        store.publish({"../escape": src, "model.onnx": src}, _manifest())


@pytest.mark.parametrize("fail_at", range(len(STEPS) + 1))
def test_publish_interrupted_at_each_step_leaves_current_complete(tmp_path, monkeypatch, fail_at):
    store = EngineStore(tmp_path / "store")
    _publish(store, tmp_path, b"good")
    seen = []

    def step(name):
        seen.append(name)
        if len(seen) == fail_at + 1:
            raise KeyboardInterrupt(f"crash at {name}")

    monkeypatch.setattr(store_mod, "_step", step)
    try:
        _publish(store, tmp_path, b"new")
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    cur = store.open()  # verifies every sha256
    assert cur.name in ("v0001", "v0002")
    assert cur.artifact("onnx").read_bytes() == (b"good" if cur.name == "v0001" else b"new")
    # the next publish cleans up the leftovers and still works
    nxt = _publish(store, tmp_path, b"next")
    assert store.current() == nxt.name
    assert not [p for p in store.root.iterdir() if p.name.startswith(".tmp-")]


def test_a_publish_the_disk_cannot_take_leaves_nothing_half_written_and_the_version_in_service(tmp_path, monkeypatch):
    """A retrain's version on a full disk: the part copied before ENOSPC was left in ``.tmp-*`` until the next publish
    (up to a version's 33 MB on a disk already full); it goes at once now, and the next publish takes the same name."""
    store = EngineStore(tmp_path / "store")
    _publish(store, tmp_path, b"good")
    copy = store_mod.shutil.copyfile

    def half_then_full(src, dst, *a, **k):
        Path(dst).write_bytes(Path(src).read_bytes()[:2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_mod.shutil, "copyfile", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        _publish(store, tmp_path, b"new version")
    assert [p.name for p in store.root.iterdir() if p.name.startswith(".tmp-")] == []
    assert store.current() == "v0001" and store.versions() == ["v0001"]
    monkeypatch.setattr(store_mod.shutil, "copyfile", copy)
    assert _publish(store, tmp_path, b"new version").name == "v0002"


@pytest.mark.parametrize("kill_at", STEPS)
def test_publish_killed_with_sigkill_at_each_step(tmp_path, kill_at):
    store = EngineStore(tmp_path / "store")
    _publish(store, tmp_path, b"good")
    src = tmp_path / "new.onnx"
    src.write_bytes(b"new")
    code = textwrap.dedent(
        f"""
        import os, signal
        from engines import store as s
        def step(name):
            if name == {kill_at!r}:
                os.kill(os.getpid(), signal.SIGKILL)
        s._step = step
        s.EngineStore({str(store.root)!r}).publish({{"model.onnx": {str(src)!r}}}, {_manifest()!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1])
    assert proc.returncode == -signal.SIGKILL
    cur = store.open()
    assert cur.name in ("v0001", "v0002")
    assert cur.artifact("onnx").read_bytes() == (b"good" if cur.name == "v0001" else b"new")


def test_rollback(tmp_path):
    store = EngineStore(tmp_path / "store")
    _publish(store, tmp_path, b"1")
    _publish(store, tmp_path, b"2")
    _publish(store, tmp_path, b"3")
    assert store.rollback().name == "v0002"
    assert store.current() == "v0002"
    assert store.rollback(to="v0001").name == "v0001"
    with pytest.raises(StoreError, match="no parent and no older version"):
        store.rollback()


def test_rollback_refuses_tampered_target(tmp_path):
    store = EngineStore(tmp_path / "store")
    v1 = _publish(store, tmp_path, b"1")
    _publish(store, tmp_path, b"2")
    (v1.path / "model.onnx").write_bytes(b"tampered")
    with pytest.raises(TamperedError):
        store.rollback()
    assert store.current() == "v0002"


def test_a_version_name_that_is_a_path_is_refused_before_any_file_outside_the_store_is_read(tmp_path):
    store = EngineStore(tmp_path / "store")
    _publish(store, tmp_path, b"1")
    _publish(store, tmp_path, b"2")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(store.root / "v0001", outside / "v0001")  # a whole version, manifest and all, beside the store
    for name in ("../outside/v0001", "v0002/..", "/etc", "v1"):
        with pytest.raises(StoreError, match="a version is named v and four digits or more"):
            store.rollback(to=name)
        with pytest.raises(StoreError, match="a version is named v and four digits or more"):
            store.open(name)
    assert store.current() == "v0002"


def test_a_rollback_pins_the_store_until_a_newer_version_than_the_one_left_is_installed(tmp_path):
    store = EngineStore(tmp_path / "store")
    for b in (b"1", b"2", b"3"):
        _publish(store, tmp_path, b)
    assert store.pin() is None and store.offer_refusal("v0004") is None
    assert "never move a device back" in store.offer_refusal("v0002")
    store.rollback()  # v0003 -> v0002
    store.rollback()  # v0002 -> v0001: still pinned from the newest left, v0003
    pin = store.pin()
    assert pin["version"] == "v0001" and pin["from"] == "v0003"
    assert "rollback from v0003" in store.offer_refusal("v0003") and "rollback from v0003" in store.offer_refusal("v0002")
    assert store.offer_refusal("v0004") is None
    store.install("v0002")  # an older one put back in service (by a person, not an offer) keeps the pin
    assert store.pin() is not None
    incoming = store.incoming("v0004")
    incoming.mkdir(parents=True)
    src = store.root / "v0003"
    for f in src.iterdir():
        (incoming / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((incoming / "manifest.json").read_text())
    manifest["version"] = "v0004"
    (incoming / "manifest.json").write_text(json.dumps(manifest))
    store.install("v0004")
    assert store.current() == "v0004" and store.pin() is None


def test_a_pin_left_behind_by_a_newer_version_put_in_service_reads_as_lifted(tmp_path):
    """Putting a version in service writes ``current`` and then removes the pin: a reader between the two writes
    (the fleet's heartbeat, the page) or a crash there must not see the device pinned while it serves the newer one."""
    store = EngineStore(tmp_path / "store")
    for b in (b"1", b"2", b"3"):
        _publish(store, tmp_path, b)
    store.rollback(to="v0001")
    pin_file = (store.root / "pinned").read_bytes()
    _publish(store, tmp_path, b"4")  # lifts the pin and deletes its file
    (store.root / "pinned").write_bytes(pin_file)  # as if the process stopped before the delete
    assert store.current() == "v0004" and store.pin() is None and store.offer_refusal("v0005") is None


def test_a_rollback_writes_its_pin_before_it_switches_so_no_offer_slips_between(tmp_path, monkeypatch):
    """An offer checked after the switch and before the pin would have put the version rolled back from in service
    again: the pin is on disk when ``current`` changes, both under the store's lock."""
    store = EngineStore(tmp_path / "store")
    for b in (b"1", b"2"):
        _publish(store, tmp_path, b)
    seen = []
    write_current = EngineStore._write_current
    monkeypatch.setattr(EngineStore, "_write_current", lambda self, v: (seen.append(self.pin()), write_current(self, v)))
    store.rollback()
    assert seen and seen[0]["version"] == "v0001" and seen[0]["from"] == "v0002"
    assert store.current() == "v0001" and store.pin()["from"] == "v0002"


def test_a_version_put_in_service_while_a_rollback_verifies_its_target_is_pinned_against_too(tmp_path, monkeypatch):
    """A rollback verifies the version it goes back to before it takes the store's lock; a newer version another
    process puts in service meanwhile is one it rolls back from, so its offers are refused after."""
    store = EngineStore(tmp_path / "store")
    for b in (b"1", b"2", b"3"):
        _publish(store, tmp_path, b)
    store.set_current("v0002")
    other = EngineStore(store.root)  # the daemon's fetcher, say
    open_version = EngineStore.open

    def open_then_switch(self, version, *a, **kw):
        opened = open_version(self, version, *a, **kw)
        if self is store and other.current() == "v0002":
            other.set_current("v0003", offered=True)
        return opened

    monkeypatch.setattr(EngineStore, "open", open_then_switch)
    store.rollback(to="v0001")
    assert store.current() == "v0001" and store.pin()["from"] == "v0003"
    assert "pinned to v0001" in store.offer_refusal("v0003")


def test_an_offered_version_is_checked_again_under_the_lock_when_it_is_put_in_service(tmp_path):
    """The fetcher checks an offer when it arrives and again when it installs it: a rollback made while the bytes
    came in turns it away (OfferRefused, a StoreError), and nothing changes in service."""
    store = EngineStore(tmp_path / "store")
    for b in (b"1", b"2"):
        _publish(store, tmp_path, b)
    assert store.offer_refusal("v0002") is None  # the check on arrival: v0002 is already in service
    store.rollback()  # then an operator rolls back
    with pytest.raises(OfferRefused, match="pinned to v0001 by a rollback from v0002"):
        store.set_current("v0002", offered=True)
    incoming = store.incoming("v0003")
    incoming.mkdir(parents=True)
    for f in (store.root / "v0002").iterdir():
        (incoming / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((incoming / "manifest.json").read_text())
    manifest["version"] = "v0003"
    (incoming / "manifest.json").write_text(json.dumps(manifest))
    _publish(store, tmp_path, b"4", version="v0004")  # a newer one put in service while v0003's bytes came in
    with pytest.raises(OfferRefused, match="older than v0004 in service"):
        store.install("v0003", offered=True)
    assert store.current() == "v0004" and "v0003" not in store.versions()
    store.set_current("v0002")  # a person may still put any version in service
    assert store.current() == "v0002"


def test_an_unreadable_pin_refuses_offers_and_says_how_to_lift_it(tmp_path):
    store = EngineStore(tmp_path / "store")
    _publish(store, tmp_path, b"1")
    (store.root / "pinned").write_text("{half")
    assert "unreadable: delete it to unpin" in store.offer_refusal("v0002")
    store.unpin()
    assert store.offer_refusal("v0002") is None


def test_a_file_of_a_version_that_is_a_link_out_of_the_store_is_refused(tmp_path):
    v = _publish(EngineStore(tmp_path / "store"), tmp_path, b"1")
    outside = tmp_path / "elsewhere.onnx"
    outside.write_bytes((v.path / "model.onnx").read_bytes())  # the same bytes: the sha256 alone would pass
    (v.path / "model.onnx").unlink()
    os.symlink(outside, v.path / "model.onnx")
    with pytest.raises(TamperedError, match="a link"):
        EngineStore(tmp_path / "store").open()
    with pytest.raises(TamperedError, match="unreadable"):
        v.read_verified("model.onnx")
