"""Where a photo file goes: out of the inbox when done, into quarantine with its reason, into the inbox from an upload."""

from __future__ import annotations

import errno
import json
import os

import pytest

from edge_agent import inbox_files
from edge_agent.inbox_files import InboxFiles, move_out, place


@pytest.mark.parametrize("after", ["move", "delete", "leave"])
def test_a_finished_photo_leaves_the_inbox_as_after_says(tmp_path, after):
    photo = tmp_path / "inbox" / "leaf.jpg"
    photo.parent.mkdir()
    photo.write_bytes(b"photo")
    InboxFiles(tmp_path, after).finish(photo)
    moved = list((tmp_path / "processed").rglob("leaf.jpg"))
    assert photo.exists() == (after == "leave")
    assert [f.read_bytes() for f in moved] == ([b"photo"] if after == "move" else [])


def test_the_processed_folder_is_made_again_after_someone_removed_it(tmp_path):
    """The first move after the removal fails (the photo stays where it was, for a retry); the next makes it again."""
    import shutil

    files = InboxFiles(tmp_path, "move")
    first, second = tmp_path / "a.jpg", tmp_path / "b.jpg"
    first.write_bytes(b"a"), second.write_bytes(b"b")
    files.finish(first)
    shutil.rmtree(tmp_path / "processed")
    with pytest.raises(OSError):
        files.finish(second)
    assert second.exists()
    files.finish(second)
    assert [f.name for f in (tmp_path / "processed").rglob("*.jpg")] == ["b.jpg"] and not second.exists()


def test_quarantine_keeps_the_photo_and_its_reason_under_a_free_shortened_name(tmp_path):
    files = InboxFiles(tmp_path, "move")
    long_name = "x" * 240 + ".jpg"
    src = tmp_path / long_name
    src.write_bytes(b"bad")
    first = files.quarantine(long_name, "abcd1234", {"reason": "empty file"}, src)
    second = files.quarantine(long_name, "abcd1234", {"reason": "again"}, data=b"frame")
    assert not src.exists() and first.read_bytes() == b"bad" and second.read_bytes() == b"frame"
    assert first.name.endswith("-abcd1234.jpg") and second.name.endswith("-abcd1234-1.jpg")
    assert len(os.fsencode(second.name + ".reason.json")) < 255
    assert json.loads(first.with_name(first.name + ".reason.json").read_text()) == {"reason": "empty file"}


def test_quarantine_on_a_full_disk_still_takes_the_photo_out_of_the_inbox_and_leaves_no_empty_reason_file(tmp_path):
    """A truncated photo (a copy the full disk cut short) is quarantined by a rename, which takes no room; its reason,
    which needs room, is left to the database and the log (before, the reason was written first: it failed, left an
    empty file, and the photo stayed in the inbox). The child's writes are capped at 8 bytes, as a full disk caps them."""
    import subprocess
    import sys
    import textwrap

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "leaf.jpg").write_bytes(b"\xff\xd8 cut short")
    child = textwrap.dedent(
        f"""
        import resource, signal
        from pathlib import Path
        from edge_agent.inbox_files import InboxFiles
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (8, 8))
        print(InboxFiles(Path({str(tmp_path)!r}), "move").quarantine("leaf.jpg", "ab12", {{"reason": "truncated JPEG"}}, Path({str(inbox / "leaf.jpg")!r})))
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (inbox / "leaf.jpg").exists()
    assert sorted(p.name for p in (tmp_path / "quarantine").iterdir()) == ["leaf.jpg"]
    assert (tmp_path / "quarantine" / "leaf.jpg").read_bytes() == b"\xff\xd8 cut short"


def test_place_writes_whole_files_under_a_free_name_and_leaves_nothing_when_the_disk_is_full(tmp_path, monkeypatch):
    inbox = tmp_path / "inbox"
    assert place(inbox, "up.jpg", b"one").name == "up.jpg"
    assert place(inbox, "up.jpg", b"two").name == "up-1.jpg"
    assert (inbox / "up.jpg").read_bytes() == b"one"

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(inbox_files.os, "fsync", full)
    with pytest.raises(OSError):
        place(inbox, "up.jpg", b"three")
    assert sorted(p.name for p in inbox.iterdir()) == ["up-1.jpg", "up.jpg"]


def test_move_out_picks_a_free_name_and_survives_a_crash_between_link_and_unlink(tmp_path):
    inbox, processed = tmp_path / "inbox", tmp_path / "processed"
    inbox.mkdir(), processed.mkdir()
    (processed / "leaf.jpg").write_bytes(b"an older photo of the same name")
    photo = inbox / "leaf.jpg"
    photo.write_bytes(b"new")
    assert move_out(photo, processed) == processed / "leaf-1.jpg"
    assert not photo.exists() and (processed / "leaf-1.jpg").read_bytes() == b"new"
    assert (processed / "leaf.jpg").read_bytes() == b"an older photo of the same name"
    again = inbox / "leaf.jpg"  # linked, then the power went: the same file under both names
    again.write_bytes(b"newer")
    os.link(again, processed / "leaf-2.jpg")
    assert move_out(again, processed) == processed / "leaf-2.jpg"
    assert not again.exists() and sorted(p.name for p in processed.iterdir()) == ["leaf-1.jpg", "leaf-2.jpg", "leaf.jpg"]


@pytest.mark.parametrize("err, how", [(errno.EPERM, "rename"), (errno.EXDEV, "copy")])
def test_move_out_without_hard_links_or_across_filesystems(tmp_path, monkeypatch, err, how):
    """FAT or fs.protected_hardlinks (EPERM): rename; the inbox on another filesystem (EXDEV): copy and delete."""
    inbox, processed = tmp_path / "inbox", tmp_path / "processed"
    inbox.mkdir(), processed.mkdir()
    (processed / "leaf.jpg").write_bytes(b"taken")
    photo = inbox / "leaf.jpg"
    photo.write_bytes(b"photo")
    used = []

    def no_link(*a, **k):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(inbox_files.os, "link", no_link)
    real_rename, real_move = inbox_files.os.rename, inbox_files.shutil.move
    monkeypatch.setattr(inbox_files.os, "rename", lambda *a: (used.append("rename"), real_rename(*a))[1])
    monkeypatch.setattr(inbox_files.shutil, "move", lambda *a: (used.append("copy"), real_move(*a))[1])
    assert move_out(photo, processed) == processed / "leaf-1.jpg"
    assert (
        used[0] == how and not photo.exists()
    )  # (shutil.move itself tries a rename first) and (processed / "leaf-1.jpg").read_bytes() == b"photo"
