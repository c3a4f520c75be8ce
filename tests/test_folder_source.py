"""The hot-folder source: which files it offers, when, and what it refuses, without the pipeline."""

from __future__ import annotations

import time
from pathlib import Path

from edge_agent.config import InboxSection
from edge_agent.inbox_files import move_out
from edge_agent.sources.folder import FolderSource

from .conftest import encode, leaf_image


class Collector:
    def __init__(self):
        self.items = []

    def __call__(self, arrival):
        self.items.append(arrival)

    def names(self):
        return sorted(a.path.name for a in self.items)


def run_source(inbox: Path, poll_s: float = 0.05, **settings) -> tuple[FolderSource, Collector]:
    c = Collector()
    s = FolderSource(inbox, InboxSection(**{"settle_s": 0.3, "rescan_interval_s": 1.0, **settings}), c, poll_s=poll_s)
    s.start()
    return s, c


def wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_folder_backlog_subfolders_and_ignored_files(tmp_path):
    inbox = tmp_path / "inbox"
    (inbox / "field_a").mkdir(parents=True)
    (inbox / "backlog.jpg").write_bytes(b"1")
    src, c = run_source(inbox)
    try:
        (inbox / "field_a" / "leaf.JPG").write_bytes(b"2")
        (inbox / "scan.tif").write_bytes(b"7")  # a scanner's TIFF is read like any photo
        (inbox / ".hidden.jpg").write_bytes(b"3")
        (inbox / "download.jpg.part").write_bytes(b"4")
        (inbox / "notes.txt").write_text("5")
        (inbox / ".cache").mkdir()
        (inbox / ".cache" / "x.jpg").write_bytes(b"6")
        assert wait_for(lambda: len(c.items) >= 3)
        time.sleep(1.5)  # one rescan later: nothing more
        assert c.names() == ["backlog.jpg", "leaf.JPG", "scan.tif"]
        assert src.unsupported == {".txt": 1}  # counted once, although rescanned; hidden and temporary files are not
    finally:
        src.stop()


def test_rsync_style_temp_then_rename(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    src, c = run_source(inbox)
    try:
        tmp = inbox / ".photo.jpg.Xy12Ab"
        tmp.write_bytes(b"partial")
        time.sleep(0.6)
        assert c.items == []
        tmp.rename(inbox / "photo.jpg")
        assert wait_for(lambda: c.names() == ["photo.jpg"])
    finally:
        src.stop()


def test_settle_pass_reports_when_to_look_again(tmp_path):
    """The source sleeps only until the next candidate is due, and not at all after a hand-over,
    so a burst flows into the pipeline without idle gaps of ``poll_s``."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    c = Collector()
    src = FolderSource(inbox, InboxSection(settle_s=0.3), c, poll_s=5.0)
    (inbox / "a.jpg").write_bytes(b"1")
    src.notice(inbox / "a.jpg")
    first = src._settle()  # first look: size recorded, due one settle time later
    assert 0.25 <= first <= 0.3 and c.items == []
    time.sleep(0.1)
    assert 0.1 <= src._settle() <= 0.21  # still settling: due in what is left, not poll_s
    time.sleep(0.25)
    assert src._settle() == 0.0 and c.names() == ["a.jpg"]  # handed over: look again at once
    assert src._settle() == 5.0  # nothing pending: poll_s


def test_slow_writer_is_not_read_until_settled(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    src, c = run_source(inbox)
    try:
        path = inbox / "slow.jpg"
        with open(path, "wb") as f:
            for _ in range(8):
                f.write(b"x" * 1000)
                f.flush()
                time.sleep(0.15)
                assert c.items == []  # still growing
        assert wait_for(lambda: c.names() == ["slow.jpg"])
        assert path.stat().st_size == 8000
    finally:
        src.stop()


def test_symlink_out_of_inbox_is_refused(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"x")
    (inbox / "inside.jpg").write_bytes(b"y")
    src, c = run_source(inbox)
    try:
        (inbox / "evil.jpg").symlink_to(secret)
        (inbox / "ok_link.jpg").symlink_to(inbox / "inside.jpg")
        assert wait_for(lambda: len(c.items) == 3)
        by = {a.path.name: a.refused for a in c.items}
        assert "outside the inbox" in by["evil.jpg"]
        assert by["ok_link.jpg"] is None and by["inside.jpg"] is None
    finally:
        src.stop()


def test_rescan_catches_missed_events(tmp_path, monkeypatch):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    src, c = run_source(inbox)
    try:
        src._observer.stop()  # the OS drops every event from now on
        src._observer.join()
        (inbox / "missed.jpg").write_bytes(b"x")
        assert wait_for(lambda: c.names() == ["missed.jpg"], timeout=5)
    finally:
        src.stop()


def test_release_keep_does_not_offer_again(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jpg").write_bytes(b"x")
    src, c = run_source(inbox)
    try:
        assert wait_for(lambda: len(c.items) == 1)
        src.release(inbox / "a.jpg", keep=True)
        time.sleep(1.5)
        assert len(c.items) == 1
        (inbox / "a.jpg").write_bytes(b"changed content")
        assert wait_for(lambda: len(c.items) == 2)
    finally:
        src.stop()


def test_folder_source_backs_off_a_second_after_an_error(tmp_path, monkeypatch):
    """A failing pass (e.g. the inbox vanished) is logged and retried once a second, not every poll."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    calls = []

    def broken(self):
        calls.append(time.monotonic())
        raise OSError("inbox vanished")

    monkeypatch.setattr(FolderSource, "_settle", broken)
    src, _ = run_source(inbox)  # poll_s 0.05
    try:
        time.sleep(1.5)
    finally:
        src.stop()
    assert 1 <= len(calls) <= 3, f"{len(calls)} failing passes in 1.5 s"


def test_the_daemons_own_reads_and_moves_raise_no_folder_events(tmp_path):
    """Reading a photo and moving it out must not wake the folder source (each event is a dispatch and a stat)."""
    inbox, processed = tmp_path / "inbox", tmp_path / "processed"
    inbox.mkdir(), processed.mkdir()
    src, c = run_source(inbox, rescan_interval_s=60)
    calls = []
    real_notice = src.notice
    src.notice = lambda p: (calls.append(p.name), real_notice(p))
    try:
        photo = inbox / "leaf.jpg"
        photo.write_bytes(encode(leaf_image(1)))
        assert wait_for(lambda: c.names() == ["leaf.jpg"])
        time.sleep(0.3)
        before = len(calls)
        assert before >= 1  # the arrival itself was an event
        for _ in range(3):
            photo.read_bytes()
        move_out(photo, processed)
        time.sleep(1.0)  # longer than watchdog's half-second wait to pair a rename out
        assert calls[before:] == []
    finally:
        src.stop()
