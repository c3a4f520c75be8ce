"""A card that fails some reads: a backup names the file it cannot read and says how to take the rest; ``backup
--salvage`` takes off the card what still reads (an engine version only whole, a database block by block), names what
it left out, and restores into a state directory that serves."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import edge_agent.backup as backup_module
from edge_agent.backup import RECORD, BackupError, backup
from edge_agent.config import AppConfig
from edge_agent.restore import check, restore
from edge_agent.results import ResultsDB
from edge_agent.state import resolve_store

from .daemon_helpers import SHIPPED, SHIPPED_NEXT
from .web_helpers import _second_version, make_state


def _failing_reads(monkeypatch, module, *bad: Path) -> None:
    """``open`` in ``module`` fails with EIO for ``bad`` (a card's unreadable sectors under those files), by whatever
    name (a backup reads a hard link it made)."""
    real = open
    inodes = {(os.stat(p).st_dev, os.stat(p).st_ino) for p in bad}

    def opened(path, *args, **kwargs):
        st = os.stat(path) if isinstance(path, (str, Path)) and os.path.exists(path) else None
        if st is not None and (st.st_dev, st.st_ino) in inodes:
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(module, "open", opened, raising=False)


@pytest.fixture()
def season(tmp_path) -> Path:
    """A state directory with a second engine version in service (the farm's own), its review pool and results."""
    state = make_state(tmp_path)
    _second_version(state)
    return state


def test_a_backup_that_meets_a_file_it_cannot_read_names_it_and_says_how_to_take_the_rest(season, tmp_path, monkeypatch):
    """It said "<the backup file>: could not write the backup: Input/output error" where the card's probe passed (a
    card with bad sectors under some files still writes new ones), blaming the USB stick."""
    photo = sorted((season / "queue" / "review").iterdir())[0]
    _failing_reads(monkeypatch, backup_module, photo)
    out = tmp_path / "stick" / "farm.tar.gz"
    with pytest.raises(BackupError) as refused:
        backup(AppConfig(), season, out)
    said = str(refused.value)
    assert said.startswith(f"{photo}: could not be read for the backup (Input/output error)"), said
    assert "edge-agent backup --salvage --out FILE" in said and not out.exists()


def test_a_folder_the_backup_cannot_list_fails_it_rather_than_being_left_out(season, tmp_path, monkeypatch):
    """``os.walk`` passes over a folder it cannot list: the backup restored without the review pool, saying nothing."""
    real = os.scandir
    pool = season / "queue" / "review"

    def listing(path="."):
        if isinstance(path, (str, Path)) and Path(path) == pool:
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", listing)
    with pytest.raises(BackupError) as refused:
        backup(AppConfig(), season, tmp_path / "farm.tar.gz")
    assert str(refused.value).startswith(f"{pool}: could not be read for the backup"), refused.value
    found = backup(AppConfig(), season, tmp_path / "salvaged.tar.gz", salvage=True)
    assert found["salvaged"]["unreadable"] == {"queue/review/": "Input/output error"}
    assert not any(name.startswith("queue/review/") for name in found["files"])


def test_a_salvage_leaves_out_what_does_not_read_and_restores_a_state_directory_that_serves_the_newest_whole_engine(
    season, tmp_path, monkeypatch
):
    import edge_agent._backup_salvage as salvage_module

    photo = sorted((season / "queue" / "review").iterdir())[0]
    engine_file = season / "engines" / SHIPPED_NEXT / "model.onnx"
    _failing_reads(monkeypatch, salvage_module, photo, engine_file)
    out = tmp_path / "stick" / "salvaged.tar.gz"
    manifest = backup(AppConfig(), season, out, salvage=True)
    salvaged = manifest["salvaged"]
    assert salvaged["unreadable"] == {
        f"queue/review/{photo.name}": "Input/output error",
        f"engines/{SHIPPED_NEXT}/model.onnx": "Input/output error",
    }
    assert salvaged["versions_left_out"] == {f"engines/{SHIPPED_NEXT}": f"engines/{SHIPPED_NEXT}/model.onnx"}
    assert salvaged["current"] == {"engines/current": SHIPPED} and salvaged["damaged"] == {}
    assert not any(n.startswith(f"engines/{SHIPPED_NEXT}/") for n in manifest["files"])
    assert not (season / RECORD).exists()  # not the state's last backup: the schedule still asks for a whole one
    assert check(out).salvaged == salvaged

    fresh = tmp_path / "new-card" / "state"
    done = restore(out, fresh)
    assert done.salvaged == salvaged
    store = resolve_store(AppConfig(), fresh)
    assert store.current() == SHIPPED and store.versions()[-1] == SHIPPED
    store.open(SHIPPED, verify=True)
    assert ResultsDB(fresh / "results.sqlite", readonly=True).counts() == ResultsDB(season / "results.sqlite", readonly=True).counts()
    assert sorted(p.name for p in (fresh / "queue" / "review").iterdir()) == sorted(
        p.name for p in (season / "queue" / "review").iterdir() if p != photo
    )


def test_a_current_that_does_not_read_names_the_newest_whole_version_and_with_none_whole_the_device_starts_as_new(
    season, tmp_path, monkeypatch
):
    import edge_agent._backup_salvage as salvage_module
    from edge_agent.seeding import unseeded

    _failing_reads(monkeypatch, salvage_module, season / "engines" / "current")
    found = backup(AppConfig(), season, tmp_path / "a.tar.gz", salvage=True)["salvaged"]
    assert found["current"] == {"engines/current": SHIPPED_NEXT} and found["versions_left_out"] == {}
    restore(tmp_path / "a.tar.gz", tmp_path / "a")
    assert resolve_store(AppConfig(), tmp_path / "a").current() == SHIPPED_NEXT

    models = sorted((season / "engines").glob("v*/model.onnx"))
    (season / "engines" / ".seed-lock").touch()  # (as a first start leaves it: a store's own file, in no version)
    _failing_reads(monkeypatch, salvage_module, *models)
    found = backup(AppConfig(), season, tmp_path / "b.tar.gz", salvage=True)["salvaged"]
    assert len(found["versions_left_out"]) == len(models) > 1 and found["current"] == {"engines/current": None}
    restore(tmp_path / "b.tar.gz", tmp_path / "b")
    assert not (tmp_path / "b" / "engines").exists() and unseeded(AppConfig(), tmp_path / "b")  # a first start: the shipped release


def test_a_lost_trainer_key_is_said_with_what_keeps_the_farms_own_versions_served(season, tmp_path, monkeypatch):
    """The trainer's first start on the new card makes a new key and writes its signing.pub over the old one: the
    versions signed before would no longer be trusted. Done as the salvage says, they are."""
    import shutil

    import edge_agent._backup_salvage as salvage_module
    from edge_agent._backup_salvage import describe
    from edge_agent.config import override
    from edge_agent.trust import daemon_trust
    from engines.signing import UntrustedVersion, load_or_create_key, sign_version

    key_file = season / "trainer" / "signing.key"
    sign_version(season / "engines" / SHIPPED_NEXT, load_or_create_key(key_file))
    _failing_reads(monkeypatch, salvage_module, key_file)
    found = backup(AppConfig(), season, tmp_path / "s.tar.gz", salvage=True)["salvaged"]
    (said,) = [line for line in describe(found) if line.startswith("trainer/signing.key: the trainer makes a new signing key")]
    assert "add that file to [store] trusted_keys" in said
    fresh = restore(tmp_path / "s.tar.gz", tmp_path / "new").state_dir
    kept = shutil.copy(fresh / "trainer" / "signing.pub", tmp_path / "trainer-before.pub")  # as it says, before the trainer starts
    load_or_create_key(fresh / "trainer" / "signing.key")  # the trainer's first start: a new key
    store = resolve_store(AppConfig(), fresh)
    with pytest.raises(UntrustedVersion):
        store.open(SHIPPED_NEXT, trust=daemon_trust(AppConfig(), fresh))
    trusted = daemon_trust(override(AppConfig(), {"store.trusted_keys": [str(kept)]}), fresh)
    store.open(SHIPPED_NEXT, trust=trusted)


def test_a_sealed_salvage_restores_with_its_passphrase_and_says_what_it_lacks(season, tmp_path, monkeypatch):
    import edge_agent._backup_salvage as salvage_module
    from edge_agent.backup import BackupSealed

    photo = sorted((season / "queue" / "review").iterdir())[0]
    _failing_reads(monkeypatch, salvage_module, photo)
    out = tmp_path / "salvaged.tar.gz.sealed"
    backup(AppConfig(), season, out, passphrase=b"farm words", salvage=True)
    assert b"queue/review" not in out.read_bytes()  # (sealed: nothing of it readable)
    with pytest.raises(BackupSealed):
        restore(out, tmp_path / "a")
    done = restore(out, tmp_path / "b", passphrase=b"farm words")
    assert list(done.salvaged["unreadable"]) == [f"queue/review/{photo.name}"]
    assert check(out, passphrase=b"farm words").salvaged == done.salvaged


def _rows(n: int, start: int) -> list:
    from edge_agent.results import ResultRow

    return [
        ResultRow(
            f"{i:064x}", f"p{i}", f"/in/p{i}.jpg", "folder", "Apple___Black_rot", 0.9, [["Apple___Black_rot", 0.9]], "v0001", {"total": 1.0}
        )
        for i in range(start, start + n)
    ]


def test_a_database_that_does_not_read_whole_is_copied_by_block_and_its_readable_rows_kept_after_the_restore(season, tmp_path, monkeypatch):
    db = ResultsDB(season / "results.sqlite")
    db.commit(_rows(3000, 100), [])
    db.close()
    total = ResultsDB(season / "results.sqlite", readonly=True).counts()["processed"]
    ledger = str(season / "results.sqlite")
    size = os.path.getsize(ledger)
    bad = (size // 4096 // 2) * 4096  # a block in the middle of the ledger: rows, not its schema
    real_pread = os.pread

    def pread(fd, n, offset):
        if offset == bad and os.readlink(f"/proc/self/fd/{fd}") == ledger:
            raise OSError(errno.EIO, "Input/output error")
        return real_pread(fd, n, offset)

    def unread(state_dir, name, src, dst):  # SQLite itself meets the bad block
        if name == "results.sqlite":
            raise sqlite3.OperationalError("disk I/O error")
        return real_copy(state_dir, name, src, dst)

    real_copy = backup_module._checked_copy
    monkeypatch.setattr(backup_module, "_checked_copy", unread)
    monkeypatch.setattr(os, "pread", pread)
    out = tmp_path / "salvaged.tar.gz"
    manifest = backup(AppConfig(), season, out, salvage=True)
    monkeypatch.undo()
    assert manifest["salvaged"]["damaged"] == {"results.sqlite": 1} and manifest["salvaged"]["unreadable"] == {}
    fresh = tmp_path / "new-card" / "state"
    restore(out, fresh)
    recovered, note = ResultsDB.open_or_recover(fresh / "results.sqlite")  # as the daemon's first start does
    kept = recovered.counts()["processed"]
    recovered.close()
    assert note and 0 < kept < total, (note, kept, total)


def test_the_salvage_command_refuses_to_write_onto_the_card_it_salvages_and_says_what_it_left_out(season, tmp_path):
    run = [sys.executable, "-m", "edge_agent", "backup", "--salvage", "--state-dir", str(season)]
    onto_card = subprocess.run([*run, "--out", str(season / "farm.tar.gz")], capture_output=True, text=True)
    assert onto_card.returncode == 2 and "on the same disk as" in onto_card.stderr and "another disk" in onto_card.stderr, onto_card.stderr
    assert not (season / "farm.tar.gz").exists()
    stick = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.stat("/dev/shm").st_dev != os.stat(season).st_dev else None
    if stick is None:
        pytest.skip("no second disk to salvage onto")
    out = stick / f"salvaged-{os.getpid()}.tar.gz"
    try:
        done = subprocess.run([*run, "--out", str(out)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "salvaged: what still read of the card" in done.stdout and "every file read: nothing is missing" in done.stdout, done.stdout
        assert json.loads(json.dumps(check(out).salvaged))["unreadable"] == {}
    finally:
        out.unlink(missing_ok=True)


def test_on_a_real_card_with_rotted_files_the_backup_names_one_and_the_salvage_takes_the_rest_into_a_device_that_serves(card, tmp_path):
    """An ext4 card whose inodes under a review photo and the farm's engine rotted (reading them fails with EUCLEAN
    in the kernel), where every other file reads and the card still writes."""
    state = make_state(card.path)
    _second_version(state)
    photo = sorted((state / "queue" / "review").iterdir())[0]
    engine_file = state / "engines" / SHIPPED_NEXT / "model.onnx"
    card.rot(photo, engine_file)
    with pytest.raises(OSError):
        engine_file.read_bytes()
    with pytest.raises(BackupError) as refused:
        backup(AppConfig(), state, tmp_path / "farm.tar.gz")
    said = str(refused.value)
    assert said.startswith(f"{engine_file}: could not be read for the backup (Structure needs cleaning)"), said
    assert "--salvage" in said and not (tmp_path / "farm.tar.gz").exists()

    out = tmp_path / "stick" / "salvaged.tar.gz"
    done = subprocess.run(
        [sys.executable, "-m", "edge_agent", "backup", "--salvage", "--state-dir", str(state), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert f"queue/review/{photo.name}: Structure needs cleaning" in done.stdout, done.stdout
    assert f"engines/{SHIPPED_NEXT}: left out whole (engines/{SHIPPED_NEXT}/model.onnx could not be read)" in done.stdout
    assert f"engines/current: now {SHIPPED}, the newest engine kept whole" in done.stdout

    fresh = tmp_path / "new-card" / "state"
    said = subprocess.run(
        [sys.executable, "-m", "edge_agent", "restore", str(out), "--state-dir", str(fresh)], capture_output=True, text=True
    )
    assert said.returncode == 0 and "salvaged from a card that failed some reads" in said.stdout, said.stdout + said.stderr
    store = resolve_store(AppConfig(), fresh)
    assert store.current() == SHIPPED
    store.open(SHIPPED, verify=True)
    status = subprocess.run([sys.executable, "-m", "edge_agent", "status", "--state-dir", str(fresh)], capture_output=True, text=True)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stdout + status.stderr
