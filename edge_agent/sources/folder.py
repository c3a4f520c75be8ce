"""Hot-folder source: photos dropped into the inbox, however they arrive.

Candidates come from watchdog events and from a periodic rescan (which also
catches events the OS dropped, and the backlog at start-up). A file is handed
on only once its size and mtime have not changed for ``settle_s``; a file that
still looks truncated after that is given ``incomplete_grace_s`` more before it
is quarantined (a camera app writing slowly). Hidden files, temporary names
(rsync's ``.name.XXXXXX``, ``*.part``, ...) and other extensions are ignored.
A symlink whose target lies outside the inbox is refused.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_agent.config import InboxSection
from edge_agent.log import display_name, get_logger
from edge_agent.worker import Worker, name_threads

__all__ = ["FolderSource", "Arrival"]


@dataclass
class Arrival:
    path: Path
    refused: str | None = None  # reason to quarantine without reading


@dataclass
class _Pending:
    size: int
    mtime_ns: int
    changed: float


class FolderSource(Worker):
    """Watches ``inbox`` and calls ``emit(Arrival)`` once per settled photo.

    The consumer calls :meth:`release` when a photo is finished (so a rescan may
    see the path again, e.g. a new file with the same name) and :meth:`retry`
    when it should be looked at again later.
    """

    thread_name = "source-folder"

    def __init__(self, inbox: Path, settings: InboxSection, emit: Callable[[Arrival], None], poll_s: float = 0.2) -> None:
        super().__init__()
        self.inbox = inbox
        self.real_inbox = Path(os.path.realpath(inbox))
        self.settings = settings
        self.poll_s = poll_s  # how often settling files are looked at
        self.emit = emit
        self.log = get_logger("source.folder", inbox=str(inbox))
        self._pending: dict[Path, _Pending] = {}
        self._incomplete_since: dict[Path, float] = {}  # truncated-looking files: when first found so
        self._owned: set[Path] = set()  # emitted, not yet released
        self._kept: dict[Path, tuple[int, int]] = {}  # finished but left in place: (size, mtime_ns)
        self._lock = threading.Lock()
        self._observer = None
        self._missing = False  # the inbox folder is gone (since the last look)
        self._unreadable: str | None = None  # why the inbox folder could not be listed at the last look, if it could not
        self.counters = {"seen": 0, "emitted": 0, "ignored": 0, "rescans": 0, "inbox_missing": 0, "inbox_unreadable": 0}
        self.unsupported: dict[str, int] = {}  # extension -> files left alone because the daemon cannot read them
        self._unsupported_seen: set[Path] = set()

    # ---- filters ----------------------------------------------------------------
    def wanted(self, path: Path) -> bool:
        try:
            rel = path.relative_to(self.inbox)
        except ValueError:
            return False
        if any(part.startswith(".") for part in rel.parts):
            return False
        if not self.settings.recursive and len(rel.parts) > 1:
            return False
        name = path.name.lower()
        if any(name.endswith(s) for s in self.settings.ignore_suffixes):
            return False  # a file still being written under a temporary name: its final name comes later
        if path.suffix.lower() in self.settings.extensions:
            return True
        self._unsupported(path)
        return False

    def _unsupported(self, path: Path) -> None:
        """A file the daemon will not read: counted per extension, logged once (never silently dropped)."""
        with self._lock:
            if path in self._unsupported_seen or len(self._unsupported_seen) >= 100_000 or not path.is_file():
                return
            self._unsupported_seen.add(path)
            ext = path.suffix.lower() or "(none)"
            self.unsupported[ext] = self.unsupported.get(ext, 0) + 1
            self.counters["ignored"] += 1
        self.log.warning(
            "file_ignored",
            photo=display_name(path),
            extension=ext,
            reason=f"not a format the daemon reads (it takes {', '.join(self.settings.extensions)}); left in the inbox",
        )

    # ---- candidates ---------------------------------------------------------------
    def notice(self, path: Path) -> None:
        """A file may have appeared or changed."""
        if not self.wanted(path):
            return
        with self._lock:
            if path in self._owned or path in self._pending:
                return
            kept = self._kept.get(path)
        if kept is not None:
            try:
                st = path.stat()
            except OSError:
                return
            if (st.st_size, st.st_mtime_ns) == kept:
                return
        with self._lock:
            self._pending[path] = _Pending(-1, -1, time.monotonic())
            self.counters["seen"] += 1

    def release(self, path: Path, keep: bool = False) -> None:
        """The consumer is done with ``path``; with ``keep`` (after = "leave") it is not offered again unless it changes."""
        stat = None
        if keep:
            try:
                st = path.stat()
                stat = (st.st_size, st.st_mtime_ns)
            except OSError:
                pass
        with self._lock:
            self._owned.discard(path)
            if stat is not None:
                self._kept[path] = stat

    def retry(self, path: Path) -> None:
        with self._lock:
            self._owned.discard(path)
            self._pending[path] = _Pending(-1, -1, time.monotonic())

    def rescan(self) -> None:
        self.counters["rescans"] += 1
        failed: list[OSError] = []
        try:
            walker = (
                os.walk(self.inbox, onerror=failed.append) if self.settings.recursive else [(str(self.inbox), [], os.listdir(self.inbox))]
            )
            for root, dirs, files in walker:
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                for name in files:
                    self.notice(Path(root) / name)
        except OSError as exc:
            failed.append(exc)
        self._listed(next((e for e in failed if e.filename in (str(self.inbox), self.inbox)), None))

    def _listed(self, exc: OSError | None) -> None:
        """Say once when the inbox folder cannot be listed (a USB stick or card pulled out or failing: EIO) and once
        when it can again (then watched anew); os.walk alone said nothing, and the daemon looked healthy."""
        if exc is not None and self._unreadable is None:
            self._unreadable = exc.strerror or str(exc)
            self.counters["inbox_unreadable"] += 1
            self.log.error("inbox_unreadable", error=self._unreadable, action="photos in it are picked up once it reads again")
        elif exc is None and self._unreadable is not None:
            self._unreadable = None
            self._watch_again("inbox_readable_again")

    def _watch_again(self, event: str) -> None:
        """Say ``event`` (the inbox is back, or reads again) and watch it anew: a watch dies with what it watched."""
        self.log.info(event)
        try:
            self._watch()
        except OSError as exc:  # gone or unreadable again already: the next look says so
            self.log.warning("inbox_watch_failed", error=str(exc))

    def _settle(self) -> float:
        """Hand on every settled candidate; returns the seconds until the next one could settle."""
        now = time.monotonic()
        ready: list[Arrival] = []
        next_due = self.poll_s
        with self._lock:
            items = list(self._pending.items())
        for path, p in items:
            try:
                st = os.lstat(path)
            except OSError as exc:  # gone; or unreadable (a name too long, no permission): dropped, said once
                with self._lock:
                    self._pending.pop(path, None)
                if not isinstance(exc, FileNotFoundError):
                    self.log.warning("inbox_entry_unreadable", file=display_name(path), error=exc.strerror)
                continue
            refused = None
            link = stat.S_ISLNK(st.st_mode)
            if link:
                target = Path(os.path.realpath(path))
                if not target.is_relative_to(self.real_inbox):
                    refused = f"symlink points outside the inbox ({target})"
                else:
                    try:
                        st = target.stat()
                    except FileNotFoundError:
                        refused = "dangling symlink"
                    except OSError as exc:  # a symlink loop (ELOOP), a target it may not read
                        refused = f"unusable symlink ({exc.strerror})"
            if refused is None and not link and not stat.S_ISREG(st.st_mode):
                with self._lock:
                    self._pending.pop(path, None)
                continue
            if refused is None and (st.st_size, st.st_mtime_ns) != (p.size, p.mtime_ns):
                p.size, p.mtime_ns, p.changed = st.st_size, st.st_mtime_ns, now
                next_due = min(next_due, self.settings.settle_s)
                continue
            if refused is None and now - p.changed < self.settings.settle_s:
                next_due = min(next_due, p.changed + self.settings.settle_s - now)
                continue
            with self._lock:
                self._pending.pop(path, None)
                self._owned.add(path)
            ready.append(Arrival(path, refused))
        for arrival in ready:
            self.counters["emitted"] += 1
            self.emit(arrival)  # may block: back-pressure from the pipeline
        return 0.0 if ready else next_due  # after a (possibly long) hand-over, look again at once

    def recently_modified(self, path: Path) -> bool:
        """True while a (truncated-looking) file is younger than the grace period, and was first found truncated less
        than the grace period ago: a file whose clock is in the future (a camera's wrong date, ``cp -p``) is judged
        once the grace period has passed here, not never."""
        grace = self.settings.incomplete_grace_s
        first = self._incomplete_since.setdefault(path, time.monotonic())
        if len(self._incomplete_since) > 10_000:  # bounded: the oldest entries go
            for old in list(self._incomplete_since)[:1000]:
                self._incomplete_since.pop(old, None)
        try:
            young = time.time() - path.stat().st_mtime < grace and time.monotonic() - first < grace
        except OSError:
            young = False
        if not young:
            self._incomplete_since.pop(path, None)
        return young

    # ---- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        from watchdog.events import FileSystemEventHandler

        source = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.is_directory:
                    if event.event_type in ("created", "moved"):
                        source._wake.set()  # a folder moved in: rescan it
                    return
                for attr in ("dest_path", "src_path"):
                    p = getattr(event, attr, None)
                    if p:
                        source.notice(Path(os.fsdecode(p)))

        self._wake = threading.Event()
        self._handler = Handler()
        self._watch()
        self.rescan()  # the backlog present at start-up
        super().start()

    def _watch(self) -> None:
        """(Re)start the inotify watch on the inbox: a watch dies with the folder it watched."""
        from watchdog.observers import Observer

        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
        self._observer = Observer()
        self._observer.schedule(self._handler, str(self.inbox), recursive=self.settings.recursive, event_filter=_arrival_events())
        before = set(threading.enumerate())
        self._observer.start()
        name_threads([t for t in threading.enumerate() if t not in before], "watchdog")

    @property
    def missing(self) -> bool:
        """Whether the inbox folder is gone (since the last look)."""
        return self._missing

    @property
    def unreadable(self) -> str | None:
        """Why the inbox folder could not be listed at the last look (the OS's words), or None."""
        return self._unreadable

    def _inbox_present(self) -> bool:
        """Whether the inbox is there; says so once when it goes and once when it comes back (then watched anew)."""
        present = self.inbox.is_dir()
        if not present and not self._missing:
            self._missing = True
            self.counters["inbox_missing"] += 1
            self.log.error(
                "inbox_missing",
                found="a file, not a folder" if self.inbox.exists() else "nothing",
                action="photos dropped in are picked up once it is back",
            )
        elif present and self._missing:
            self._missing = False
            self._watch_again("inbox_back")
            self._wake.set()
        return present

    def _run(self) -> None:
        next_scan = time.monotonic() + self.settings.rescan_interval_s
        while not self._stop.is_set():
            if not self._inbox_present():
                self._stop.wait(0.5)
                continue
            try:
                if self._wake.is_set() or time.monotonic() >= next_scan:
                    self._wake.clear()
                    self.rescan()
                    next_scan = time.monotonic() + self.settings.rescan_interval_s
                wait = self._settle()
            except Exception as exc:  # e.g. the inbox vanished: say so and keep trying
                self.log.error("folder_source_error", error=repr(exc))
                wait = 1.0
            if wait > 0:  # until the next candidate is due (_settle caps it at poll_s), or 1 s after an error
                self._stop.wait(wait)

    def _on_stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)


def _arrival_events() -> list:
    """The watchdog events that can mean a photo arrived: created, renamed in (rsync), closed after writing, and
    folders created or moved in. The daemon's own reads (open / close-without-write), its moves out of the inbox
    (deletions for inotify, see edge_agent.pipeline.move_out) and every write() of a copy are not asked of the kernel:
    each would be an event to read, dispatch and stat for nothing. Settling is judged by stat, not by events."""
    from watchdog.events import DirCreatedEvent, DirMovedEvent, FileClosedEvent, FileCreatedEvent, FileMovedEvent

    return [FileCreatedEvent, FileMovedEvent, FileClosedEvent, DirCreatedEvent, DirMovedEvent]
