"""A new device's engine store: the serving release before READY=1, the shipped releases before it copied after."""

from __future__ import annotations

import errno
import shutil
from types import SimpleNamespace

from edge_agent import seeding
from edge_agent.config import AppConfig, default_store_path
from edge_agent.seeding import PENDING, seed_rest
from edge_agent.state import resolve_store
from engines.signing import TrustedKeys
from engines.store import EngineStore

from .daemon_helpers import DaemonProc, wait_until

SHIPPED = EngineStore(default_store_path())
SERVING, OLDER = SHIPPED.current(), [v for v in SHIPPED.versions() if v != SHIPPED.current()]


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def info(self, event, **kw):
        self.lines.append((event, kw))

    warning = error = info


def test_the_daemons_first_seed_copies_only_the_serving_release_and_names_the_others_for_later(tmp_path):
    assert OLDER, "the shipped store keeps the releases before the one that serves"
    store = resolve_store(AppConfig(), tmp_path / "state", serving_only=True)
    assert store.versions() == [SERVING] and store.current() == SERVING
    assert (store.root / PENDING).read_text().split() == OLDER
    assert not list(tmp_path.glob("state/.tmp-*"))


def test_a_store_left_with_its_own_files_and_no_version_is_set_aside_and_seeded_anew(tmp_path):
    """Every version folder deleted by hand left ``current`` and the lock behind: the first start said "cannot copy
    the shipped engines ...: Directory not empty ...; free 0 MB or more on that disk", and no start served."""
    store = resolve_store(AppConfig(), tmp_path / "state", serving_only=True)
    for version in store.versions():
        shutil.rmtree(store.root / version)
    (store.root / ".seed-lock").touch()
    again = resolve_store(AppConfig(), tmp_path / "state", serving_only=True)
    assert again.versions() == [SERVING] and again.current() == SERVING
    (aside,) = tmp_path.glob("state/engines.no-version-*")
    assert (aside / "current").is_file()


def test_the_older_releases_are_copied_verified_and_signed_beside_the_one_in_service(tmp_path):
    store = resolve_store(AppConfig(), tmp_path / "state", serving_only=True)
    log = Log()
    assert seed_rest(store, default_store_path(), log) == OLDER
    assert store.versions() == SHIPPED.versions() and store.current() == SERVING  # none put in service
    for version in OLDER:
        assert store.open(version, trust=TrustedKeys.default()).signed_by == "the edge-agent project (release key)"
    assert not (store.root / PENDING).exists() and ("shipped_releases_copied", {"versions": OLDER}) in log.lines
    assert seed_rest(store, default_store_path(), log) == []  # done: nothing to do at the next start


def test_a_store_seeded_in_full_or_already_done_is_never_refilled(tmp_path):
    full = resolve_store(AppConfig(), tmp_path / "a")  # the command line's first use: every shipped version at once
    assert full.versions() == SHIPPED.versions() and not (full.root / PENDING).exists()
    shutil.rmtree(full.root / OLDER[0])  # a farmer removed an old release
    assert seed_rest(full, default_store_path()) == [] and OLDER[0] not in full.versions()
    store = resolve_store(AppConfig(), tmp_path / "b", serving_only=True)
    seed_rest(store, default_store_path())
    shutil.rmtree(store.root / OLDER[0])
    assert seed_rest(store, default_store_path()) == [] and OLDER[0] not in store.versions()


def test_a_disk_without_room_copies_nothing_and_keeps_the_releases_named_for_the_next_start(tmp_path, monkeypatch):
    store = resolve_store(AppConfig(), tmp_path / "state", serving_only=True)
    monkeypatch.setattr(seeding.shutil, "disk_usage", lambda p: SimpleNamespace(free=10 << 20))
    log = Log()
    assert seed_rest(store, default_store_path(), log) == []
    assert store.versions() == [SERVING] and (store.root / PENDING).read_text().split() == OLDER
    assert [event for event, _ in log.lines] == ["shipped_release_not_copied"] * len(OLDER)
    assert log.lines[0][1]["free_mb"] == 10
    monkeypatch.undo()  # room again: the next start copies them
    assert seed_rest(store, default_store_path()) == OLDER


def test_a_copy_the_disk_cuts_short_leaves_nothing_half_copied_and_that_release_named(tmp_path, monkeypatch):
    store = resolve_store(AppConfig(), tmp_path / "state", serving_only=True)
    real = shutil.copytree

    def full_on_first(src, dst, **kw):
        real(src, dst, **kw)
        if src.name == OLDER[0]:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return dst

    monkeypatch.setattr(seeding.shutil, "copytree", full_on_first)
    log = Log()
    assert seed_rest(store, default_store_path(), log) == OLDER[1:]
    assert OLDER[0] not in store.versions() and not store.incoming(OLDER[0]).exists()
    assert (store.root / PENDING).read_text().split() == [OLDER[0]]
    assert (
        "shipped_release_not_copied",
        {"engine_version": OLDER[0], "error": f"[Errno 28] No space left on device: '{store.incoming(OLDER[0])}'"},
    ) in log.lines


def test_a_damaged_shipped_file_is_not_installed(tmp_path, monkeypatch):
    store = resolve_store(AppConfig(), tmp_path / "state", serving_only=True)
    shipped = tmp_path / "shipped"
    shutil.copytree(default_store_path(), shipped)
    with open(shipped / OLDER[0] / "model.onnx", "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 8)
    log = Log()
    assert seed_rest(store, shipped, log) == OLDER[1:]
    assert OLDER[0] not in store.versions() and not store.incoming(OLDER[0]).exists()
    assert log.lines[0][0] == "shipped_release_not_copied" and "sha256" in log.lines[0][1]["error"]


def test_a_daemons_first_start_serves_the_shipped_release_and_then_holds_the_ones_before_it(tmp_path):
    d = DaemonProc(tmp_path / "state").start()
    try:
        d.wait_ready()
        store = EngineStore(tmp_path / "state" / "engines")
        wait_until(lambda: store.versions() == SHIPPED.versions(), 60, "the older releases copied")
        assert store.current() == SERVING
        copied = [e for e in d.events() if e["event"] == "shipped_releases_copied"]
        assert copied and copied[0]["versions"] == OLDER
        assert not (store.root / PENDING).exists()
    finally:
        assert d.terminate() == 0


def test_a_first_start_whose_serving_release_cannot_serve_copies_the_older_ones_at_once_and_serves_one(tmp_path, monkeypatch):
    import edge_agent.daemon as daemon_mod
    import edge_agent.state as state_mod
    from edge_agent.daemon import Daemon

    shipped = tmp_path / "shipped"
    shutil.copytree(default_store_path(), shipped)
    with open(shipped / SERVING / "model.onnx", "r+b") as f:  # the package's own copy of the release is damaged
        f.seek(100)
        f.write(b"\xff" * 8)
    for module in (state_mod, daemon_mod):
        monkeypatch.setattr(module, "default_store_path", lambda: shipped)
    d = Daemon(AppConfig(), tmp_path / "state")
    d._setup()
    try:
        assert d.classifier.engine.engine_version == OLDER[-1]  # the newest release before it, as before this change
        assert "sha256" in d._refused_at_start[SERVING]
        d._seed_state_store()  # after READY=1: the state store holds the one serving, so every release at once
        assert d.store.root == tmp_path / "state" / "engines"
        assert d.store.versions() == SHIPPED.versions() and not (d.store.root / PENDING).exists()
    finally:
        d._stop.set()
        d._shutdown()


def test_a_first_start_copies_nothing_before_ready_and_seeds_the_serving_release_just_after(tmp_path):
    from edge_agent.daemon import Daemon

    d = Daemon(AppConfig(), tmp_path / "state")
    d._setup()  # all that comes before READY=1
    try:
        assert d.classifier.engine.engine_version == SERVING and d.store.root == default_store_path()
        assert not EngineStore(tmp_path / "state" / "engines").versions()
        d._seed_state_store()
        assert d.store.root == tmp_path / "state" / "engines" and d.store_note is None
        assert d.store.versions() == [SERVING] and d.store.current() == SERVING
        assert (d.store.root / PENDING).read_text().split() == OLDER
    finally:
        d._stop.set()
        d._shutdown()


def test_a_store_another_process_seeded_meanwhile_stands_and_the_second_seed_leaves_nothing_behind(tmp_path, monkeypatch):
    import edge_agent.state as state_mod

    real = state_mod.os.rename

    def first_the_command_line(src, dst):  # another process's full seed lands between the daemon's copy and its rename
        monkeypatch.setattr(state_mod.os, "rename", real)
        shutil.copytree(default_store_path(), dst, ignore=shutil.ignore_patterns(".lock"))
        return real(src, dst)

    monkeypatch.setattr(state_mod.os, "rename", first_the_command_line)
    store = resolve_store(AppConfig(), tmp_path / "state", serving_only=True)
    assert store.versions() == SHIPPED.versions() and not (store.root / PENDING).exists()  # the full seed stands
    assert not list(tmp_path.glob("state/.tmp-*"))
