"""The daemon's backups on a stick share their photos and engines: a day's backup writes what is new since the last,
every backup kept restores whole from its archive and the shared folder beside it, a shared file no backup names is
deleted with the last backup that named it (never one a backup still names, never while a backup there cannot be
read), and a backup whose shared files are missing or changed restores nothing and says what to copy."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import pytest

from edge_agent.backup import BackupError, BackupSealed, BackupStopped, backup, last_backup
from edge_agent.backup_folder import device_name, own_backups, take
from edge_agent.backup_schedule import backup_lines
from edge_agent.config import AppConfig
from edge_agent.restore import read_manifest, restore

from .backup_helpers import stick_cfg, stick_fixtures

DAY = 86400.0


stick, season, state = stick_fixtures()


@pytest.fixture()
def usb(tmp_path) -> Path:
    folder = tmp_path / "usb"
    folder.mkdir()
    return folder


def _photo(state: Path, name: str, size: int = 300_000, seed: int = 0) -> Path:
    """A labelled photo's bytes on the device (as random as a JPEG's: they do not compress)."""
    p = state / "trainer" / "photos" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(hashlib.shake_256(f"{name}{seed}".encode()).digest(size))
    return p


def _manifest_only(out: Path, manifest: dict) -> Path:
    """A backup archive at ``out`` holding ``manifest`` alone."""
    data = json.dumps(manifest).encode()
    with tarfile.open(out, "w:gz") as tar:
        info = tarfile.TarInfo("backup.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out


def _shared(usb: Path, device: str = "barn") -> dict[str, int]:
    root = usb / f"edge-agent-{device}.files"
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}


def _restored_files(state: Path) -> dict[str, str]:
    return {
        p.relative_to(state).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in state.rglob("*")
        if p.is_file() and p.name != "last-backup.json"
    }


def test_a_days_backup_writes_only_what_is_new_and_every_kept_backup_restores_whole(tmp_path, state, usb):
    cfg, t0 = stick_cfg(usb, keep=3), time.time()
    first = take(cfg, state, device="barn", now=t0)
    assert first["written"] > 50 << 20 and first["written"] >= first["bytes"] - (1 << 20)  # the engines, once
    photo = _photo(state, "scab-1.jpg")
    second = take(cfg, state, device="barn", now=t0 + DAY)
    assert second["bytes"] >= first["bytes"] + photo.stat().st_size
    assert second["written"] < photo.stat().st_size + (1 << 20)  # the new photo and the archive (databases, small files)
    lines = backup_lines(cfg.backup, last_backup(state), None, time.time())
    assert "MiB written, the rest shared with the backups before it" in lines[0][0]
    for archive, photos in ((Path(first["path"]), False), (Path(second["path"]), True)):
        dest = tmp_path / f"card-{archive.name}"
        restore(archive, dest)
        assert ((dest / "trainer" / "photos" / "scab-1.jpg").is_file()) is photos
        if photos:
            assert (dest / "trainer" / "photos" / "scab-1.jpg").read_bytes() == photo.read_bytes()
    restored, now = _restored_files(tmp_path / f"card-{Path(second['path']).name}"), _restored_files(state)
    assert {k: v for k, v in restored.items() if not k.endswith(".sqlite")} == {k: now[k] for k in restored if not k.endswith(".sqlite")}
    assert {k for k in now if k.startswith("engines/")} <= set(restored)


def test_a_shared_file_is_deleted_with_the_last_backup_that_names_it_and_nothing_else_there_is_touched(state, usb):
    cfg, t0 = stick_cfg(usb, keep=2), time.time()
    gone = _photo(state, "gone.jpg")
    take(cfg, state, device="barn", now=t0)
    gone_sha = hashlib.sha256(gone.read_bytes()).hexdigest()
    assert f"{gone_sha[:2]}/{gone_sha}" in _shared(usb)
    (usb / "edge-agent-barn.files" / "ab").mkdir(exist_ok=True)
    (usb / "edge-agent-barn.files" / "ab" / "notes.txt").write_text("the farmer's")  # not a name a backup writes
    (usb / "edge-agent-barn.files" / "README").write_text("the farmer's")
    gone.unlink()  # deleted on the device: the first backup is the last to name it
    take(cfg, state, device="barn", now=t0 + DAY)
    assert f"{gone_sha[:2]}/{gone_sha}" in _shared(usb)  # the first backup is kept: it names it still
    done = take(cfg, state, device="barn", now=t0 + 2 * DAY)
    assert len(done["deleted"]) == 1 and done["shared_deleted"] == 1 and done["shared_freed"] == 300_000
    assert f"{gone_sha[:2]}/{gone_sha}" not in _shared(usb)
    assert (usb / "edge-agent-barn.files" / "ab" / "notes.txt").exists() and (usb / "edge-agent-barn.files" / "README").exists()
    for archive in own_backups(usb, "barn"):  # each kept backup names only files that are there
        names = {m["shared"] for m in read_manifest(archive)["files"].values() if "shared" in m}
        assert names and names <= set(_shared(usb))


def test_a_backup_there_that_cannot_be_read_keeps_every_shared_file_until_it_is_deleted_itself(state, usb):
    cfg, t0 = stick_cfg(usb, keep=2), time.time()
    gone = _photo(state, "gone.jpg")
    take(cfg, state, device="barn", now=t0)
    sha = hashlib.sha256(gone.read_bytes()).hexdigest()
    gone.unlink()
    take(cfg, state, device="barn", now=t0 + DAY)
    own_backups(usb, "barn")[0].write_bytes(b"damaged on the stick")  # the one backup naming gone.jpg
    third = take(cfg, state, device="barn", now=t0 + 2 * DAY)  # deletes the damaged one: the rest can be read again
    assert third["shared_kept"] is None and f"{sha[:2]}/{sha}" not in _shared(usb)
    only = _photo(state, "only-in-the-fourth.jpg")
    fourth = take(stick_cfg(usb, keep=3), state, device="barn", now=t0 + 3 * DAY)
    only_sha = hashlib.sha256(only.read_bytes()).hexdigest()
    only.unlink()
    Path(fourth["path"]).write_bytes(b"damaged too")  # the one backup naming it cannot be read: it names what it may
    fifth = take(stick_cfg(usb, keep=3), state, device="barn", now=t0 + 4 * DAY)
    assert "not a readable backup" in fifth["shared_kept"] and f"{only_sha[:2]}/{only_sha}" in _shared(usb)


def test_making_room_never_deletes_a_shared_file_the_new_backup_names(tmp_path, state, usb, monkeypatch):
    t0 = time.time()
    photo = _photo(state, "scab-1.jpg")
    kept = photo.read_bytes()
    take(stick_cfg(usb), state, device="barn", now=t0)
    photo.unlink()  # the second backup does not name it
    take(stick_cfg(usb), state, device="barn", now=t0 + DAY)
    photo.write_bytes(kept)  # back (a label restored): the third names the copy only the first named
    real = shutil.disk_usage
    monkeypatch.setattr(  # no room while both older backups are there
        "edge_agent.backup_folder.shutil.disk_usage",
        lambda path: type(real(path))(1 << 40, 0, 0 if len(own_backups(usb, "barn")) >= 2 else 1 << 40),
    )
    done = take(stick_cfg(usb), state, device="barn", now=t0 + 2 * DAY)
    assert len(done["deleted"]) == 1 and done["written"] < len(kept)  # the first went; its copy of the photo stayed
    restored = restore(Path(done["path"]), tmp_path / "card")
    assert (restored.state_dir / "trainer" / "photos" / "scab-1.jpg").read_bytes() == kept


def test_a_backup_whose_shared_files_are_missing_or_changed_restores_nothing_and_says_what_to_copy(tmp_path, state, usb):
    _photo(state, "scab-1.jpg")
    done = take(stick_cfg(usb), state, device="barn")
    archive = Path(done["path"])
    elsewhere = tmp_path / "copied" / archive.name
    elsewhere.parent.mkdir()
    shutil.copy(archive, elsewhere)  # the archive alone, without its folder
    with pytest.raises(BackupError, match=r"kept in the folder edge-agent-barn\.files beside it, and .* is not there: copy"):
        restore(elsewhere, tmp_path / "card")
    assert not (tmp_path / "card").exists()
    root = usb / "edge-agent-barn.files"
    one = sorted(p for p in root.rglob("*") if p.is_file())[0]
    one.rename(one.with_name(one.name + ".x"))
    with pytest.raises(BackupError, match=r"lacks 1 of them"):
        restore(archive, tmp_path / "card")
    one.with_name(one.name + ".x").rename(one)
    data = bytearray(one.read_bytes())
    data[100] ^= 1
    one.write_bytes(bytes(data))
    with pytest.raises(BackupError, match="does not match its recorded sha256"):
        restore(archive, tmp_path / "card")
    assert not (tmp_path / "card").exists() and not list(tmp_path.glob(".tmp-restore-*"))


def test_a_manifest_naming_a_shared_file_outside_its_folder_is_refused(tmp_path, state, usb):

    done = take(stick_cfg(usb), state, device="barn")
    manifest = read_manifest(Path(done["path"]))
    name = next(n for n, m in manifest["files"].items() if "shared" in m)
    for shared_dir, shared in (("edge-agent-barn.files", "../../etc/passwd"), ("..", manifest["files"][name]["shared"])):
        forged = manifest | {"shared_dir": shared_dir}
        forged["files"] = manifest["files"] | {name: manifest["files"][name] | {"shared": shared}}
        out = _manifest_only(usb / "edge-agent-barn-20200101-000000.tar.gz", forged)
        with pytest.raises(BackupError, match="a shared file is named outside its folder: refused"):
            restore(out, tmp_path / "card")


def test_sealed_shared_files_hold_nothing_readable_and_a_new_passphrase_starts_new_copies(tmp_path, state, usb):
    secret = tmp_path / "passphrase"
    secret.write_text("correct horse battery staple\n")
    photo = _photo(state, "scab-1.jpg")
    t0 = time.time()
    first = take(stick_cfg(usb, passphrase_file=str(secret)), state, device="barn", now=t0)
    files = _shared(usb)
    assert files and all(n.endswith(".sealed") for n in files)
    for p in (usb / "edge-agent-barn.files").rglob("*.sealed"):
        assert photo.read_bytes()[:4096] not in p.read_bytes()
    second = take(stick_cfg(usb, passphrase_file=str(secret)), state, device="barn", now=t0 + DAY)
    assert second["written"] < 1 << 20 and _shared(usb) == files  # the same key opens them: named again
    secret.write_text("a new passphrase\n")
    third = take(stick_cfg(usb, passphrase_file=str(secret)), state, device="barn", now=t0 + 2 * DAY)
    assert third["written"] > 50 << 20 and set(files) < set(_shared(usb))  # new copies; the old ones kept for the backups before
    with pytest.raises(BackupSealed):
        restore(Path(first["path"]), tmp_path / "card")
    restore(Path(first["path"]), tmp_path / "old", passphrase=b"correct horse battery staple")
    restore(Path(third["path"]), tmp_path / "new", passphrase=b"a new passphrase")
    for dest in ("old", "new"):
        assert (tmp_path / dest / "trainer" / "photos" / "scab-1.jpg").read_bytes() == photo.read_bytes()
    with pytest.raises(BackupError, match="cannot be opened: the wrong passphrase"):
        restore(Path(third["path"]), tmp_path / "wrong", passphrase=b"correct horse battery staple")


def test_a_sealed_stick_names_no_file_by_the_sha256_of_what_it_holds(tmp_path, state, usb):
    """Sealed shared files were named by the sha256 of the photo or engine they hold: one who found the stick and had
    the same photo could tell it was there. Their names are keyed with the backup's key now, and found again by the
    next backup of the same passphrase (nothing written twice)."""
    secret = tmp_path / "passphrase"
    secret.write_text("correct horse battery staple\n")
    _photo(state, "scab-1.jpg")
    t0 = time.time()
    take(stick_cfg(usb, passphrase_file=str(secret)), state, device="barn", now=t0)
    held = {
        hashlib.sha256(p.read_bytes()).hexdigest()
        for p in state.rglob("*")
        if p.is_file() and not p.is_symlink() and p.stat().st_size >= 64 << 10
    }
    names = [n.split("/")[1].split("-")[0] for n in _shared(usb)]
    assert len(held) >= 2 and len(names) >= 2 and not held & set(names)  # no name is a sha256 of the device's files
    second = take(stick_cfg(usb, passphrase_file=str(secret)), state, device="barn", now=t0 + DAY)
    assert second["written"] < 1 << 20


def test_sealed_shared_files_named_by_their_sha256_before_still_restore_and_are_written_once_more_keyed(tmp_path, state, usb, monkeypatch):
    """A stick of sealed backups from before keyed names: they restore as they are; the next backup writes its files
    under keyed names once, and the old names go with the last backup that names them."""
    from edge_agent._backup_seal import Sealer

    secret = tmp_path / "passphrase"
    secret.write_text("correct horse battery staple\n")
    photo = _photo(state, "scab-1.jpg")
    t0 = time.time()
    with monkeypatch.context() as m:
        m.setattr(Sealer, "shared_name", lambda self, sha: f"{sha}-{self.salt.hex()}.sealed")  # as backups before named them
        old = take(stick_cfg(usb, passphrase_file=str(secret), keep=1), state, device="barn", now=t0)
    legacy = set(_shared(usb))
    assert f"{hashlib.sha256(photo.read_bytes()).hexdigest()[:2]}/{hashlib.sha256(photo.read_bytes()).hexdigest()}" in {
        n.rsplit("-", 1)[0] for n in legacy
    }
    restore(Path(old["path"]), tmp_path / "old", passphrase=b"correct horse battery staple")
    assert (tmp_path / "old" / "trainer" / "photos" / "scab-1.jpg").read_bytes() == photo.read_bytes()
    new = take(stick_cfg(usb, passphrase_file=str(secret), keep=1), state, device="barn", now=t0 + DAY)
    assert new["written"] > 50 << 20 and not legacy & set(_shared(usb))  # written keyed; the old ones went with their backup
    restore(Path(new["path"]), tmp_path / "new", passphrase=b"correct horse battery staple")
    assert (tmp_path / "new" / "trainer" / "photos" / "scab-1.jpg").read_bytes() == photo.read_bytes()


def test_a_backup_stopped_half_way_leaves_no_archive_and_the_next_reuses_the_shared_files_it_wrote_whole(state, usb):
    for i in range(3):
        _photo(state, f"p{i}.jpg")
    calls = iter(range(10**6))
    n_files = len(backup(AppConfig(), state, usb.parent / "count.tar.gz")["files"])
    with pytest.raises(BackupStopped):  # stopped while the shared files are written
        take(stick_cfg(usb), state, device="barn", should_stop=lambda: next(calls) >= n_files + 2)
    assert own_backups(usb, "barn") == [] and not list(usb.rglob(".tmp-*"))
    whole = _shared(usb)
    assert whole
    done = take(stick_cfg(usb), state, device="barn")
    assert done["written"] < done["bytes"] - sum(whole.values()) + (1 << 20)  # what was written whole is not written again


def test_a_shared_file_left_half_written_by_a_killed_backup_is_deleted_by_the_next(state, usb):
    take(stick_cfg(usb), state, device="barn")
    half = usb / "edge-agent-barn.files" / "ab" / f".tmp-4242-{'ab' + '0' * 62}"
    half.parent.mkdir(exist_ok=True)
    half.write_bytes(b"half")
    take(stick_cfg(usb), state, device="barn", now=time.time() + DAY)
    assert not half.exists()


def test_shared_files_off_writes_every_backup_whole_in_one_file_restorable_by_itself(tmp_path, state, usb):
    done = take(stick_cfg(usb, shared_files=False), state, device="barn")
    assert not (usb / "edge-agent-barn.files").exists() and done["written"] == done["bytes"] > 50 << 20
    assert read_manifest(Path(done["path"]))["format"] == 1  # what versions before shared files restore
    moved = tmp_path / "elsewhere" / Path(done["path"]).name
    moved.parent.mkdir()
    shutil.move(done["path"], moved)
    restore(moved, tmp_path / "card")


def test_a_backup_in_a_format_this_version_does_not_know_is_refused_with_the_formats_it_restores(tmp_path, usb):
    out = _manifest_only(usb / "future.tar.gz", {"format": 3, "files": {}})
    with pytest.raises(BackupError, match="backup format 3, this version restores formats 1, 2"):
        restore(out, tmp_path / "card")


def test_a_disk_that_takes_no_file_over_4_gib_is_said_with_what_to_do(tmp_path, state, monkeypatch):
    real = os.fdopen

    class TooLarge:
        def __init__(self, raw):
            self.raw = raw

        def write(self, data):
            raise OSError(errno.EFBIG, "File too large")

        def __getattr__(self, name):
            return getattr(self.raw, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.raw.close()

    monkeypatch.setattr("edge_agent.backup.os.fdopen", lambda fd, mode: TooLarge(real(fd, mode)))
    with pytest.raises(BackupError, match=r"File too large \(its disk takes no file over 4 GiB, as FAT32: format it exFAT or ext4"):
        backup(AppConfig(), state, tmp_path / "out" / "whole.tar.gz")
    assert not [p for p in (tmp_path / "out").iterdir()]


def _aged(state: Path) -> None:
    """Every file in ``state`` as last changed on one day of 2023 (long settled)."""
    then = 1_700_000_000
    for p in state.rglob("*"):
        if p.is_file():
            os.utime(p, (then, then))


def test_a_backup_reads_again_only_the_files_new_or_changed_since_the_last(tmp_path, state, monkeypatch):
    import edge_agent.backup as backup_module

    real, read = backup_module._hash, []
    monkeypatch.setattr(backup_module, "_hash", lambda src: read.append(src) or real(src))
    _aged(state)
    first = backup(AppConfig(), state, tmp_path / "1.tar.gz")
    assert len(read) == len(first["files"])
    appended = state / "trainer" / "samples" / "x.jpg"
    appended.parent.mkdir(parents=True, exist_ok=True)
    appended.write_bytes(b"a photo, half")
    _aged(state)
    read.clear()
    second = backup(AppConfig(), state, tmp_path / "2.tar.gz")
    databases = {n for n in second["files"] if n.endswith(".sqlite")}
    assert len(read) == len(databases) + 1  # the databases (copied anew) and the new photo
    with open(appended, "ab") as f:  # changed in place: the same inode, its times ticked
        f.write(b", and the rest")
    os.utime(appended, (time.time() - 3600, time.time() - 3500))
    read.clear()
    third = backup(AppConfig(), state, tmp_path / "3.tar.gz")
    assert (
        len(read) == len(databases) + 1
        and third["files"]["trainer/samples/x.jpg"]["sha256"] == hashlib.sha256(appended.read_bytes()).hexdigest()
    )
    restored = restore(tmp_path / "3.tar.gz", tmp_path / "card").state_dir
    assert (restored / "trainer" / "samples" / "x.jpg").read_bytes() == b"a photo, half, and the rest"
    assert not (restored / "backup-hashes.json").exists()  # a new card reads every file once


def test_a_file_changed_just_before_a_backup_or_a_garbled_record_is_read_again(tmp_path, state, monkeypatch):
    import edge_agent.backup as backup_module

    real, read = backup_module._hash, []
    monkeypatch.setattr(backup_module, "_hash", lambda src: read.append(Path(src)) or real(src))
    _aged(state)
    fresh = state / "trainer" / "samples" / "fresh.jpg"
    fresh.parent.mkdir(parents=True, exist_ok=True)
    fresh.write_bytes(b"written a moment ago")  # its times may tick no further on a write within the same tick
    backup(AppConfig(), state, tmp_path / "1.tar.gz")
    read.clear()
    manifest = backup(AppConfig(), state, tmp_path / "2.tar.gz")
    assert len(read) == sum(n.endswith(".sqlite") for n in manifest["files"]) + 1
    (state / "backup-hashes.json").write_text('{"engines/x": "garbled", "trainer/samples/fresh.jpg": [1, 2, 3, "f00"]}')
    read.clear()
    manifest = backup(AppConfig(), state, tmp_path / "3.tar.gz")
    assert len(read) == len(manifest["files"])
    restore(tmp_path / "3.tar.gz", tmp_path / "card")


def _rot(path: Path) -> None:
    """One bit of ``path`` flipped in place, its size and times kept: what a card that returns other bytes than were
    written gives back."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("where", ["archive", "shared"])
def test_a_file_that_changed_on_the_card_unseen_is_read_again_so_the_backup_restores_and_the_card_is_named(
    tmp_path, state, usb, where, monkeypatch
):
    """Its hash was taken from the record of the last backup (size and times unchanged) while its bytes were the
    card's new ones: the backup was written with a hash its own bytes did not match, and every restore of it (and
    `restore --check`) refused the whole backup, each day's, until the `keep` newest were all such."""
    small = state / "trainer" / "samples" / "note.json"
    small.parent.mkdir(parents=True, exist_ok=True)
    small.write_bytes(b'{"a label": "written once"}' * 10)
    photo = _photo(state, "rot.jpg")
    _aged(state)
    if where == "archive":
        backup(AppConfig(), state, tmp_path / "1.tar.gz")
        rotted, out, shared = small, tmp_path / "2.tar.gz", None
    else:
        take(stick_cfg(usb), state)
        rotted, out, shared = photo, tmp_path / "usb" / "2.tar.gz", usb / f"edge-agent-{device_name()}.files"
        shutil.rmtree(shared)  # (its copy gone from the stick: written anew from the card)
    _rot(rotted)
    done = backup(AppConfig(), state, out, shared=shared)
    name = rotted.relative_to(state).as_posix()
    assert done["changed_unseen"] == [name]
    assert done["files"][name]["sha256"] == hashlib.sha256(rotted.read_bytes()).hexdigest()
    restored = restore(out, tmp_path / "card").state_dir
    assert (restored / name).read_bytes() == rotted.read_bytes()


def test_files_changed_on_the_card_unseen_are_said_by_status_for_a_month_and_alerted_once(tmp_path, state, usb):
    """A warning on the command line, and a log line, reached no farmer: status and the Health page say it now, and a
    phone gets one alert, until a month has passed or the state is on a new card."""
    from edge_agent.alerts.messages import status_events
    from edge_agent.backup import card_suspect
    from edge_agent.config import BackupSection

    small = state / "trainer" / "samples" / "note.json"
    small.parent.mkdir(parents=True, exist_ok=True)
    small.write_bytes(b"a label" * 50)
    _aged(state)
    backup(AppConfig(), state, tmp_path / "1.tar.gz")
    assert card_suspect(last_backup(state), time.time()) is None
    _rot(small)
    backup(AppConfig(), state, tmp_path / "2.tar.gz")
    found = card_suspect(last_backup(state), time.time())
    assert found["files"] == ["trainer/samples/note.json"]
    backup(AppConfig(), state, tmp_path / "3.tar.gz")  # the next finds nothing new: what was found is still said
    assert card_suspect(last_backup(state), time.time()) == found
    lines = backup_lines(BackupSection(), last_backup(state), None, time.time())
    said = next(text for text, warn in lines if warn and text.startswith("CARD FAILING: 1 file changed on it without being written"))
    assert "trainer/samples/note.json" in said and "put a new card in soon" in said
    assert card_suspect(last_backup(state), time.time() + 31 * DAY) is None
    restored = restore(tmp_path / "3.tar.gz", tmp_path / "new-card").state_dir
    assert card_suspect(last_backup(restored), time.time()) is None
    before = {"engine": "v1000", "refused": {}, "healthy": True, "backup": None, "card_suspect": None}
    events = status_events("shed", before, before | {"card_suspect": found}, [])
    assert [(kind, body["event"], body["title"]) for kind, body in events] == [
        ("health", "card_failing", "edge-agent shed: its SD card is failing")
    ]
    assert status_events("shed", before | {"card_suspect": found}, before | {"card_suspect": found}, []) == []


def test_a_file_that_reads_as_other_bytes_each_time_fails_the_backup_naming_the_card(tmp_path, state, monkeypatch):
    import edge_agent.backup as backup_module

    small = state / "trainer" / "samples" / "note.json"
    small.parent.mkdir(parents=True, exist_ok=True)
    small.write_bytes(b"a label" * 50)
    real_open, opened = backup_module._Reading.__init__, []

    def opening(self, path):  # every second read of it gives one bit other
        real_open(self, path)
        data = path.read_bytes()
        if data == small.read_bytes():
            if len(opened) % 2:
                self.f = io.BytesIO(bytes([data[0] ^ 1]) + data[1:])
            opened.append(path)

    monkeypatch.setattr(backup_module._Reading, "__init__", opening)
    with pytest.raises(BackupError) as refused:
        backup(AppConfig(), state, tmp_path / "farm.tar.gz")
    assert str(refused.value).startswith(f"{small}: read twice, other bytes each time: the card returns other bytes"), refused.value
    assert not (tmp_path / "farm.tar.gz").exists()


def test_edge_agent_backup_with_a_folder_configured_writes_one_there_as_the_daemon_does(tmp_path, state, usb, capsys):
    from edge_agent.backup_schedule import BackupSchedule
    from edge_agent.cli import main

    config = tmp_path / "edge-agent.toml"
    config.write_text(f'[backup]\ndir = "{usb}"\n')
    assert main(["backup", "--config", str(config), "--state-dir", str(state)]) == 0
    said = capsys.readouterr().out
    kept = own_backups(usb, device_name())
    assert len(kept) == 1 and f"wrote {kept[0]} into [backup] dir" in said and "MB restores; not sealed" in said
    assert (usb / f"edge-agent-{device_name()}.files").is_dir()
    schedule = BackupSchedule(stick_cfg(usb), state)
    assert schedule.next_due(time.time()) > time.time() + 23 * 3600  # the schedule counts it as the last
    assert main(["backup", "--config", str(config), "--state-dir", str(state), "--out", str(tmp_path / "whole.tar.gz")]) == 0
    assert read_manifest(tmp_path / "whole.tar.gz")["format"] == 1  # --out: one file, whole


def test_a_backup_asked_for_by_hand_waits_for_the_daemons_and_a_stopping_daemon_gives_up_waiting(state, usb):
    import fcntl
    import threading

    from edge_agent.backup_folder import LOCK

    with open(state / LOCK, "a+") as held:  # the daemon's backup, being written
        fcntl.flock(held, fcntl.LOCK_EX)
        done: list = []
        waiting = threading.Thread(target=lambda: done.append(take(stick_cfg(usb), state, device="barn")))
        waiting.start()
        time.sleep(0.6)
        assert not done and own_backups(usb, "barn") == []
        with pytest.raises(BackupStopped, match="stopped while another backup of it was being written"):
            take(stick_cfg(usb), state, device="barn", should_stop=lambda: True)
        fcntl.flock(held, fcntl.LOCK_UN)
    waiting.join(60)
    assert len(done) == 1 and own_backups(usb, "barn") == [Path(done[0]["path"])]


@pytest.mark.parametrize("lies_about", ["a shared file", "the archive"])
def test_a_stick_that_gives_back_other_bytes_than_were_written_fails_the_backup_and_keeps_nothing_of_it(
    state, usb, monkeypatch, lies_about
):
    from edge_agent._backup_readback import ReadBackMismatch

    before = take(stick_cfg(usb), state, device="barn", now=time.time() - DAY)
    _photo(state, "new.jpg")
    shared_before = _shared(usb)

    def dropped(f):  # the stick, asked for the file again, gives back something else (a counterfeit's wrapped-around blocks)
        path = Path(f.name)
        if (lies_about == "the archive") == path.name.startswith("edge-agent-barn-"):
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))

    monkeypatch.setattr("edge_agent._backup_readback.uncached", dropped)
    with pytest.raises(ReadBackMismatch, match="a failing stick, or a counterfeit one that holds less than it claims"):
        take(stick_cfg(usb), state, device="barn")
    assert own_backups(usb, "barn") == [Path(before["path"])] and last_backup(state)["path"] == str(Path(before["path"]).resolve())
    if lies_about == "a shared file":
        assert _shared(usb) == shared_before  # the new photo's copy, read back wrong, is gone
    monkeypatch.undo()
    monkeypatch.setattr("edge_agent.backup_folder._same_disk", lambda a, b: False)
    done = take(stick_cfg(usb), state, device="barn")  # a stick that behaves again: written whole
    restore(Path(done["path"]), usb.parent / "card")


def test_restore_check_reads_a_backup_whole_from_its_disk_and_writes_nothing(tmp_path, state, usb, capsys, monkeypatch):
    from edge_agent.cli import main
    from edge_agent.restore import check

    secret = tmp_path / "pass"
    secret.write_text("correct horse battery staple\n")
    _photo(state, "scab.jpg")
    done = take(stick_cfg(usb, passphrase_file=str(secret)), state, device="barn")
    read: list[Path] = []
    monkeypatch.setattr("edge_agent._backup_readback.drop_cached", lambda p: read.append(Path(p)))
    checked = check(Path(done["path"]), passphrase=b"correct horse battery staple")
    root = usb / "edge-agent-barn.files"
    manifest = read_manifest(Path(done["path"]), b"correct horse battery staple")
    assert set(read) == {Path(done["path"])} | set(root.rglob("*.sealed"))  # each read from the disk, not from memory
    assert checked.shared == sum("shared" in m for m in manifest["files"].values()) and checked.files == len(manifest["files"])
    assert main(["restore", done["path"], "--check", "--passphrase-file", str(secret)]) == 0
    said = capsys.readouterr().out
    assert f"{done['path']}: whole, taken " in said and f"{checked.files} files, {checked.shared} of them from the shared files" in said
    assert not (tmp_path / "edge-state").exists() and not list(tmp_path.glob(".tmp-*"))
    one = sorted(root.rglob("*.sealed"))[-1]
    data = bytearray(one.read_bytes())
    data[-5] ^= 1
    one.write_bytes(bytes(data))
    assert main(["restore", done["path"], "--check", "--passphrase-file", str(secret)]) == 2
    assert "damaged or changed" in capsys.readouterr().err


def test_every_week_the_stick_is_read_back_and_a_damaged_photo_is_deleted_and_written_again_by_the_next_backup(tmp_path, state, usb):
    from edge_agent.backup_schedule import BackupSchedule

    cfg, t0 = stick_cfg(usb, keep=3), time.time()
    photo = _photo(state, "scab.jpg")
    sha = hashlib.sha256(photo.read_bytes()).hexdigest()
    first = take(cfg, state, device="barn", now=t0)
    assert first["checked"] and last_backup(state)["checked"] == t0  # the first: every file read back
    copy = usb / "edge-agent-barn.files" / sha[:2] / sha
    data = bytearray(copy.read_bytes())
    data[1000] ^= 0xFF  # the stick damages it, weeks after it was written whole
    copy.write_bytes(bytes(data))
    second = take(cfg, state, device="barn", now=t0 + DAY)
    assert second["checked"] is None and last_backup(state)["checked"] == t0  # not due: a day since
    lines = backup_lines(cfg.backup, last_backup(state), BackupSchedule(cfg, state).status(), t0 + DAY)
    assert any("every photo and engine on the stick read back whole" in text for text, _ in lines)
    from edge_agent.web.metrics import Exposition, _backup

    x = Exposition()
    _backup(x, last_backup(state), None)
    assert f"edge_agent_backup_checked_timestamp_seconds {t0!r}" in x.lines  # /metrics: alert on its age
    with pytest.raises(
        BackupError, match=r"1 of the \d+ photos and engines .* read back damaged from the stick .*deleted, with the backup just written"
    ):
        take(cfg, state, device="barn", now=t0 + 8 * DAY)
    assert not copy.exists() and len(own_backups(usb, "barn")) == 2  # the week's backup, naming it, is gone too
    again = take(cfg, state, device="barn", now=t0 + 8 * DAY + 3600)  # an hour later: written again, read back whole
    assert copy.read_bytes() == photo.read_bytes() and again["checked"] and last_backup(state)["checked"] == t0 + 8 * DAY + 3600
    restored = restore(Path(again["path"]), tmp_path / "card")
    assert (restored.state_dir / "trainer" / "photos" / "scab.jpg").read_bytes() == photo.read_bytes()
