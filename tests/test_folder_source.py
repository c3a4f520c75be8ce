"""The hot-folder source: which files it offers, when, and what it refuses, without the pipeline."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edge_agent.config import InboxSection
from edge_agent.inbox_files import move_out
from edge_agent.sources.folder import FolderSource

from .conftest import encode, leaf_image
from .daemon_helpers import wait_until


class Collector:
    def __init__(self):
        self.items = []

    def __call__(self, arrival):
        self.items.append(arrival)

    def names(self):
        return sorted(a.path.name for a in self.items)


@contextmanager
def watching(inbox: Path, poll_s: float = 0.05, **settings) -> Iterator[tuple[FolderSource, Collector]]:
    """A started folder source over ``inbox`` and what it handed over; stopped on the way out."""
    c = Collector()
    s = FolderSource(inbox, InboxSection(**{"settle_s": 0.3, "rescan_interval_s": 1.0, **settings}), c, poll_s=poll_s)
    s.start()
    try:
        yield s, c
    finally:
        s.stop()


def test_folder_backlog_subfolders_and_ignored_files(tmp_path):
    inbox = tmp_path / "inbox"
    (inbox / "field_a").mkdir(parents=True)
    (inbox / "backlog.jpg").write_bytes(b"1")
    with watching(inbox) as (src, c):
        (inbox / "field_a" / "leaf.JPG").write_bytes(b"2")
        (inbox / "scan.tif").write_bytes(b"7")  # a scanner's TIFF is read like any photo
        (inbox / ".hidden.jpg").write_bytes(b"3")
        (inbox / "download.jpg.part").write_bytes(b"4")
        (inbox / "notes.txt").write_text("5")
        (inbox / ".cache").mkdir()
        (inbox / ".cache" / "x.jpg").write_bytes(b"6")
        wait_until(lambda: len(c.items) >= 3, 10, "len(c.items) >= 3")
        time.sleep(1.5)  # one rescan later: nothing more
        assert c.names() == ["backlog.jpg", "leaf.JPG", "scan.tif"]
        assert src.unsupported == {".txt": 1}  # counted once, although rescanned; hidden and temporary files are not


def test_rsync_style_temp_then_rename(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    with watching(inbox) as (src, c):
        tmp = inbox / ".photo.jpg.Xy12Ab"
        tmp.write_bytes(b"partial")
        time.sleep(0.6)
        assert c.items == []
        tmp.rename(inbox / "photo.jpg")
        wait_until(lambda: c.names() == ["photo.jpg"], 10, 'c.names() == ["photo.jpg"]')


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
    with watching(inbox) as (src, c):
        path = inbox / "slow.jpg"
        with open(path, "wb") as f:
            for _ in range(8):
                f.write(b"x" * 1000)
                f.flush()
                time.sleep(0.15)
                assert c.items == []  # still growing
        wait_until(lambda: c.names() == ["slow.jpg"], 10, 'c.names() == ["slow.jpg"]')
        assert path.stat().st_size == 8000


def test_symlink_out_of_inbox_is_refused(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"x")
    (inbox / "inside.jpg").write_bytes(b"y")
    with watching(inbox) as (src, c):
        (inbox / "evil.jpg").symlink_to(secret)
        (inbox / "ok_link.jpg").symlink_to(inbox / "inside.jpg")
        wait_until(lambda: len(c.items) == 3, 10, "len(c.items) == 3")
        by = {a.path.name: a.refused for a in c.items}
        assert "outside the inbox" in by["evil.jpg"]
        assert by["ok_link.jpg"] is None and by["inside.jpg"] is None


def test_rescan_catches_missed_events(tmp_path, monkeypatch):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    with watching(inbox) as (src, c):
        src._observer.stop()  # the OS drops every event from now on
        src._observer.join()
        (inbox / "missed.jpg").write_bytes(b"x")
        wait_until(lambda: c.names() == ["missed.jpg"], 5, 'c.names() == ["missed.jpg"]')


def test_release_keep_does_not_offer_again(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jpg").write_bytes(b"x")
    with watching(inbox) as (src, c):
        wait_until(lambda: len(c.items) == 1, 10, "len(c.items) == 1")
        src.release(inbox / "a.jpg", keep=True)
        time.sleep(1.5)
        assert len(c.items) == 1
        (inbox / "a.jpg").write_bytes(b"changed content")
        wait_until(lambda: len(c.items) == 2, 10, "len(c.items) == 2")


def test_folder_source_backs_off_a_second_after_an_error(tmp_path, monkeypatch):
    """A failing pass (e.g. the inbox vanished) is logged and retried once a second, not every poll."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    calls = []

    def broken(self):
        calls.append(time.monotonic())
        raise OSError("inbox vanished")

    monkeypatch.setattr(FolderSource, "_settle", broken)
    with watching(inbox) as (src, _):  # poll_s 0.05
        time.sleep(1.5)
    assert 1 <= len(calls) <= 3, f"{len(calls)} failing passes in 1.5 s"


def test_the_daemons_own_reads_and_moves_raise_no_folder_events(tmp_path):
    """Reading a photo and moving it out must not wake the folder source (each event is a dispatch and a stat)."""
    inbox, processed = tmp_path / "inbox", tmp_path / "processed"
    inbox.mkdir(), processed.mkdir()
    with watching(inbox, rescan_interval_s=60) as (src, c):
        calls = []
        real_notice = src.notice
        src.notice = lambda p: (calls.append(p.name), real_notice(p))
        photo = inbox / "leaf.jpg"
        photo.write_bytes(encode(leaf_image(1)))
        wait_until(lambda: c.names() == ["leaf.jpg"], 10, 'c.names() == ["leaf.jpg"]')
        time.sleep(0.3)
        before = len(calls)
        assert before >= 1  # the arrival itself was an event
        for _ in range(3):
            photo.read_bytes()
        move_out(photo, processed)
        time.sleep(1.0)  # longer than watchdog's half-second wait to pair a rename out
        assert calls[before:] == []


def test_an_inbox_that_cannot_be_listed_is_said_once_and_its_photos_are_taken_once_it_reads_again(tmp_path, monkeypatch):
    """os.walk leaves out a folder it cannot list (a USB stick or card pulled out or failing: EIO; a folder the
    service's user may not read): the daemon watched nothing and looked healthy, saying nothing. Now it says so once,
    status and the Health page show it, and the photos in it are taken once it reads again."""
    import errno

    from structlog.testing import capture_logs

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    real_walk = os.walk

    def failing_walk(top, onerror=None, **kw):
        if onerror is not None:
            onerror(OSError(errno.EIO, "Input/output error", os.fspath(top)))
        return iter(())

    with capture_logs() as logs, watching(inbox) as (src, c):
        monkeypatch.setattr(os, "walk", failing_walk)
        src._wake.set()
        wait_until(lambda: src.unreadable == "Input/output error", 5, "the inbox said unreadable")
        src._wake.set()
        time.sleep(0.5)  # looked at again: not said again
        monkeypatch.setattr(os, "walk", real_walk)
        (inbox / "late.jpg").write_bytes(encode(leaf_image(1)))
        src._wake.set()
        wait_until(lambda: c.names() == ["late.jpg"] and src.unreadable is None, 10, "the photo taken once it reads again")
    events = [e["event"] for e in logs]
    assert events.count("inbox_unreadable") == 1 and events.count("inbox_readable_again") == 1
    assert src.counters["inbox_unreadable"] == 1


def test_status_and_the_health_page_show_an_inbox_that_cannot_be_listed(tmp_path, capsys):
    import json

    from edge_agent.cli import main
    from edge_agent.results import ResultsDB
    from edge_agent.state import StateLayout

    from .test_cli_status import LIVE
    from .web_helpers import client

    layout = StateLayout(tmp_path / "state")
    layout.create()
    ResultsDB(layout.db).close()
    doc = {
        "pid": os.getpid(),
        "updated": time.time(),
        **LIVE,
        "inbox": "/media/stick/photos",
        "folder": {"unreadable": "Input/output error"},
    }
    (layout.root / "status.json").write_text(json.dumps(doc))
    main(["status", "--state-dir", str(layout.root)])
    out = capsys.readouterr().out
    assert "INBOX UNREADABLE: /media/stick/photos cannot be listed (Input/output error: a USB stick or card" in out, out
    page = client(layout.root).get("/health").text
    assert 'id="inbox-unreadable"' in page and "cannot be listed (Input/output error" in page
