"""A power cut loses nothing the daemon said it had: what a first start copies, each result and its photo, are on
the disk before they are relied on (an ext4 card shut down without its last writes, as a power cut leaves it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engines.store import EngineStore

from .daemon_helpers import DaemonProc, db_rows, wait_until


def test_a_power_cut_just_after_a_first_start_seeded_the_engine_store_leaves_it_whole(card):
    """Found cutting the power of a new board 0.3 s after READY=1: the store its first start had copied held empty
    files, `current` among them (the copies were renamed into place before the disk had them), and every later start
    failed with "current points at '', which is not a complete version"."""
    from edge_agent.config import default_store_path
    from edge_agent.state import seed_store

    shipped = EngineStore(default_store_path())
    serving = shipped.current()
    seed_store(shipped.root, card.path / "engines", [serving])
    card.commit_journal()  # (ext4 commits every 5 s: the rename is then on the disk, whatever the data's state)
    card.pull_out()
    card.plug_in()
    store = EngineStore(card.path / "engines")
    assert store.current() == serving and store.open(serving).name == serving  # every file's sha256 checked


def test_a_power_cut_while_photos_are_classified_loses_no_photo_and_no_result_and_the_next_start_takes_the_rest(card, plantvillage):
    """40 lab photos in the inbox of a daemon whose state is on the card, the power cut part-way (281 by hand, cut
    after 144): after fsck the next start gives every photo exactly one result, its file in processed/ and its queued
    copy."""
    import os

    photos = sorted(plantvillage.glob("*/*.jpg"))[::97][:40]
    d = DaemonProc(card.path / "state")
    os.sync()
    d.start().wait_ready()
    for p in photos:
        shutil.copy(p, d.inbox / p.name)
    os.sync()  # the photos are on the card (a farmer's copy finished), the results not all yet
    wait_until(lambda: len(db_rows(d.state, "SELECT id FROM results")) >= 10, 60, "some photos classified")
    card.pull_out()
    d.kill()
    card.plug_in()
    d.start().wait_ready()
    wait_until(lambda: not list(d.inbox.glob("*.jpg")), 60, "the inbox emptied")
    assert d.terminate() == 0
    rows = db_rows(d.state, "SELECT sha256 FROM results")
    queued = db_rows(d.state, "SELECT file FROM label_queue")
    processed = list((d.state / "processed").glob("*/*"))
    assert len(rows) == len({r for (r,) in rows}) == len(processed) == len(photos)
    assert all(os.path.getsize(f) > 0 for f in processed) and all(os.path.isfile(f) for (f,) in queued)


def test_a_power_cut_just_after_the_trainer_made_its_signing_key_or_the_page_a_token_keeps_both(card):
    """Cutting the power of a new board half a second after its trainer and page first started left `signing.key`,
    `signing.pub` and the page's secret empty, and the token just printed unknown: the trainer's every start then
    failed with a traceback ("not an edge-agent signing key")."""
    from edge_agent.web.auth import Tokens
    from engines.signing import load_key, load_or_create_key

    made = load_or_create_key(card.path / "trainer" / "signing.key")
    token = Tokens(card.path / "web").new("label")
    card.pull_out()  # (the journal's last transactions lost with the rest)
    card.plug_in()
    assert load_key(card.path / "trainer" / "signing.key").public_hex == made.public_hex
    assert (card.path / "trainer" / "signing.pub").read_text().strip() == made.public_hex
    assert Tokens(card.path / "web").role_of(token) == "label"


def test_a_signing_key_left_empty_by_a_power_cut_is_made_anew_where_it_is_the_trainers_own_and_said_where_it_is_not(tmp_path):
    """A key and its .pub both empty could have signed nothing anyone can check: the trainer makes a new one. A key
    named for a release, or one that holds something else, is never replaced; it is a one-line error, not a traceback."""
    from engines.errors import EdgeAgentError
    from engines.signing import load_or_create_key

    key, pub = tmp_path / "signing.key", tmp_path / "signing.pub"
    key.write_text("")
    pub.write_text("")
    with pytest.raises(EdgeAgentError, match="signing.key: not an edge-agent signing key"):
        load_or_create_key(key)  # (a release key: loaded, never made)
    made = load_or_create_key(key, remake_unfinished=True)
    assert pub.read_text().strip() == made.public_hex and oct(key.stat().st_mode & 0o777) == "0o600"
    assert load_or_create_key(key, remake_unfinished=True).public_hex == made.public_hex  # made once
    key.write_text("not a key\n")
    with pytest.raises(EdgeAgentError, match="not an edge-agent signing key"):
        load_or_create_key(key, remake_unfinished=True)


def test_a_power_cut_just_after_a_device_was_revoked_does_not_bring_it_back(card):
    """A revocation moved the device's key out of authorized/ and said it was done before the card had the move: a
    power cut soon after gave the trainer the key back, and the revoked device was accepted again."""
    from trainer.devices import add_device, list_devices, make_trainer_keys, revoke_device

    keys = card.path / "keys"
    make_trainer_keys(keys)
    for name in ("shed", "greenhouse"):
        add_device(keys, name)
    revoke_device(keys, "greenhouse")
    card.pull_out()  # (the journal's last transactions lost with the rest)
    card.plug_in()
    assert list_devices(keys) == ["shed"] and (keys / "revoked" / "greenhouse.key").is_file()
    assert (keys / "devices" / "shed" / "shed.key_secret").stat().st_size > 0 and (keys / "trainer" / "trainer.key").stat().st_size > 0


def test_a_power_cut_just_after_a_canary_stopped_a_rollout_keeps_it_stopped(card):
    """A rollout's stop was written without being flushed: a power cut soon after could bring back the rollout as it
    was before the stop. Each change of stage is on the disk before the trainer acts on it."""
    from types import SimpleNamespace

    from edge_agent.trainer_config import RolloutSection
    from trainer.rollout import Rollout

    settings = RolloutSection(period_s=1.5, min_photos=0)
    rollout = Rollout(settings, card.path / "rollout.json")
    assert not rollout.allowed("shed", "v4002")  # a new version: no one until the canaries are chosen
    refused = SimpleNamespace(
        name="shed", engine_version="v4001", refused={"v4002": "agreed on 40 %"}, last_result=None, pinned=False, report={}
    )
    assert not rollout.judge("v4002", {"shed": refused}) and rollout.state["stage"] == "stopped"
    card.pull_out()
    card.plug_in()
    again = Rollout(settings, card.path / "rollout.json")
    assert again.state["stage"] == "stopped" and again.state["version"] == "v4002" and "agreed on 40 %" in again.state["reason"]


def test_without_syncfs_a_folder_is_made_durable_file_by_file(tmp_path, monkeypatch):
    """Where syncfs(2) is missing, sync_filesystem fsyncs the files it is given, else every file under the folder, and
    their folders (what seeding, a restore and the keys folder rely on)."""
    import ctypes

    import engines.durable as durable

    (tmp_path / "v4000").mkdir()
    for name in ("current", "v4000/model.onnx", "v4000/manifest.json"):
        (tmp_path / name).write_text(name)
    synced = []
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: (_ for _ in ()).throw(OSError("no libc here")))
    monkeypatch.setattr(durable, "fsync_file", lambda f: synced.append(("file", Path(f))))
    monkeypatch.setattr(durable, "fsync_dir", lambda d: synced.append(("dir", Path(d))))
    durable.sync_filesystem(tmp_path)
    files = {p for kind, p in synced if kind == "file"}
    assert files == {tmp_path / "current", tmp_path / "v4000" / "model.onnx", tmp_path / "v4000" / "manifest.json"}
    assert {p for kind, p in synced if kind == "dir"} == {tmp_path, tmp_path / "v4000"}
    synced.clear()
    durable.sync_filesystem(tmp_path, [tmp_path / "current"])
    assert synced == [("file", tmp_path / "current"), ("dir", tmp_path)]
