"""Where a state directory keeps things, and how it and the engine store are found.

Light on purpose (no engine, no OpenCV): the daemon, the command line, the web page and the trainer all use it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent.config import AppConfig, default_store_path
from edge_agent.storage_errors import NO_ROOM
from engines.durable import fsync_dir, set_aside, sync_filesystem
from engines.errors import EdgeAgentError
from engines.store import EngineStore

if TYPE_CHECKING:
    from edge_agent.handoff.transport import Link

__all__ = [
    "as_stopped",
    "last_written",
    "StateDiskFull",
    "resolve_store_or_shipped",
    "StateLayout",
    "StateNotFound",
    "StateNotAFolder",
    "SYSTEM_STATE",
    "looked_for",
    "device_name",
    "handoff_link",
    "resolve_state_dir",
    "resolve_store",
    "store_to_read",
    "runtime_dir",
    "seed_store",
    "trainer_state_dir",
    "inbox_dir",
    "live_status",
    "daemon_live",
    "served",
    "trainer_live",
    "write_status",
    "STATUS_SLOT_BYTES",
]

#: A status file is padded to at least this size (one filesystem block: no more written than an unpadded one), so that
#: on a full disk it can still be overwritten in place.
STATUS_SLOT_BYTES = 4096


#: Where the systemd units keep the state (``StateDirectory=edge-agent``): named in "not found" errors.
SYSTEM_STATE = Path("/var/lib/edge-agent")


class StateNotFound(EdgeAgentError, FileNotFoundError):
    """A command that only reads found nothing where it looked (it never makes a state directory, a key or a store)."""


class StateNotAFolder(EdgeAgentError, NotADirectoryError):
    """The state directory chosen is a file."""


def _why_here(cli_value: str | None, cfg: AppConfig, section: str = "daemon") -> str:
    """Which rule of :func:`resolve_state_dir` chose the directory, in words."""
    conf = cfg.source or "no configuration file (--config, $EDGE_AGENT_CONFIG, /etc/edge-agent/edge-agent.toml)"
    if section == "trainer" and cfg.trainer.state_dir:
        return f"[trainer] state_dir in {conf}"
    if cli_value:
        return "--state-dir"
    if cfg.daemon.state_dir:
        return f"[daemon] state_dir in {conf}"
    if os.environ.get("STATE_DIRECTORY"):
        return "$STATE_DIRECTORY"
    conf = f"no [daemon] state_dir in {cfg.source}" if cfg.source else conf
    return f"the default ./edge-state in {Path.cwd()}: no --state-dir, {conf}, no $STATE_DIRECTORY"


def looked_for(what: str, path: Path, cli_value: str | None, cfg: AppConfig, fix: str, section: str = "daemon") -> StateNotFound:
    """The error of a command that found no ``what`` at ``path``: where it looked, why there, and ``fix``."""
    hint = ""
    if SYSTEM_STATE.is_dir() and not Path(path).resolve().is_relative_to(SYSTEM_STATE):
        hint = f"; the services keep their state in {SYSTEM_STATE}: add --state-dir {SYSTEM_STATE}"
    return StateNotFound(f"no {what} at {path} (looked there because of {_why_here(cli_value, cfg, section)}){hint}; {fix}")


def resolve_state_dir(cli_value: str | None, cfg: AppConfig) -> Path:
    """--state-dir, else [daemon] state_dir, else $STATE_DIRECTORY (systemd), else ./edge-state; a file there is
    refused (:class:`StateNotAFolder`), a folder not there yet is made by whoever writes first."""
    if cli_value:
        path = Path(cli_value).expanduser()
    elif cfg.daemon.state_dir:
        path = Path(cfg.daemon.state_dir).expanduser()
    elif os.environ.get("STATE_DIRECTORY"):
        path = Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    else:
        path = Path("edge-state")
    if path.exists() and not path.is_dir():
        raise StateNotAFolder(
            f"{path} is a file, not a folder (the state directory, chosen by {_why_here(cli_value, cfg)}); "
            "give a folder, or a path where one can be made"
        )
    return path


def runtime_dir(state_dir: Path) -> Path:
    """$RUNTIME_DIRECTORY (systemd), else <state>/run: where the hand-off sockets live."""
    if os.environ.get("RUNTIME_DIRECTORY"):
        return Path(os.environ["RUNTIME_DIRECTORY"].split(":")[0])
    return state_dir / "run"


def resolve_store(cfg: AppConfig, state_dir: Path, serving_only: bool = False) -> EngineStore:
    """[store] path, else <state>/engines, seeded from the shipped store on first use (with ``serving_only``, the
    daemon's start, only the release that serves: :mod:`edge_agent.seeding` copies the others after READY=1) and
    given the shipped release once after a package upgrade (:func:`edge_agent.upgrade.adopt_shipped_release`)."""
    if cfg.store.path:
        return EngineStore(cfg.store.resolved())
    store = EngineStore(state_dir / "engines")
    if not store.versions():
        shipped = default_store_path()
        versions = [EngineStore(shipped).current()] if serving_only else None
        try:
            seed_store(shipped, store.root, versions)
        except OSError as exc:
            raise StateDiskFull(_seed_failed(exc, store.root, versions)) from None
    else:
        from edge_agent.upgrade import adopt_shipped_release

        adopt_shipped_release(store, default_store_path())
    return store


def store_to_read(cfg: AppConfig, state_dir: Path) -> EngineStore:
    """The store a command or page that only looks reads: [store] path, else <state>/engines where the daemon has made
    it, else the package's shipped store where it lies (what the daemon's first start serves). Nothing is copied or
    put in service: ``engine list`` or ``classify`` on a state directory the daemon has not used writes no 107 MB
    copy, and a look after a package upgrade leaves the new release for the daemon's start to adopt."""
    if cfg.store.path:
        return EngineStore(cfg.store.resolved())
    store = EngineStore(state_dir / "engines")
    return store if store.versions() else EngineStore(default_store_path())


class StateDiskFull(EdgeAgentError):
    """The state directory cannot take what the daemon must write there (the shipped engines, on first start)."""


def _seed_failed(exc: OSError, dst: Path, versions: list[str] | None = None) -> str:
    shipped = default_store_path()
    roots = [shipped / v for v in versions] if versions else [shipped]
    need = sum(f.stat().st_size for root in roots for f in root.rglob("*") if f.is_file())
    free = shutil.disk_usage(dst.parent).free if dst.parent.exists() else 0
    return (
        f"cannot copy the shipped engines ({need / 1e6:.0f} MB) into {dst}: {exc.strerror or exc} ({free / 1e6:.0f} MB free "
        f"there); free {max(need - free, 0) / 1e6:.0f} MB or more on that disk, or set [daemon] state_dir to a disk with room"
    )


def resolve_store_or_shipped(cfg: AppConfig, state_dir: Path, serving_only: bool = True) -> tuple[EngineStore, str | None]:
    """:func:`resolve_store` (seeding only the release that serves, unless ``serving_only`` is off), or, when the state
    disk cannot take it, the package's own store read as it is (serving, not updating) and the one line that says what
    to free; for the daemon, which then serves."""
    try:
        return resolve_store(cfg, state_dir, serving_only=serving_only), None
    except StateDiskFull as exc:
        return EngineStore(default_store_path()), f"{exc}; serving the package's shipped engines read-only until then"


def seed_store(src: Path, dst: Path, versions: list[str] | None = None) -> None:
    """Copy a store (its versions, or only ``versions``, and ``current``) into an empty ``dst``, atomically; the
    versions left out are named in ``dst``'s :data:`edge_agent.seeding.PENDING` for :func:`edge_agent.seeding.seed_rest`."""
    from edge_agent.seeding import PENDING

    tmp = dst.with_name(f".tmp-{dst.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    left = sorted(set(EngineStore(src).versions()) - set(versions)) if versions is not None else []
    try:  # file by file (copytree would gather the errors and lose their errno): the first failure stops it
        for folder, dirs, files in os.walk(src):
            dirs[:] = [d for d in dirs if not d.startswith(".tmp-") and (folder != str(src) or d not in left)]
            here = tmp / Path(folder).relative_to(src)
            here.mkdir(parents=True, exist_ok=True)
            for name in files:
                if name != ".lock" and not name.startswith(".tmp-"):
                    shutil.copy2(Path(folder) / name, here / name, follow_symlinks=False)
        if left:
            (tmp / PENDING).write_text("".join(f"{v}\n" for v in left))
        # on the disk before the rename: a power cut at a first boot left a store of empty files, `current` among
        # them, that no start could serve from (ext4 shut down under it: the copies are written back seconds later)
        sync_filesystem(tmp)
    except OSError:  # a full disk: leave nothing half-copied behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dst.exists() and not any(dst.iterdir()):
        dst.rmdir()
    elif dst.exists() and not EngineStore(dst).versions():  # a store's own files with no version (its folders deleted
        set_aside(dst, "no-version")  # by hand): kept beside, rather than no start serving ("Directory not empty")
    try:
        os.rename(tmp, dst)
        fsync_dir(dst.parent)
    except OSError as exc:  # another process (the command line, the page, the trainer) seeded it meanwhile: theirs stands
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not EngineStore(dst).versions():
            raise


def inbox_dir(cfg: AppConfig, state_dir: Path) -> Path:
    """[inbox] path, else <state>/inbox: the hot folder."""
    return Path(cfg.inbox.path).expanduser() if cfg.inbox.path else state_dir / "inbox"


def trainer_state_dir(cfg: AppConfig, state_dir: Path) -> Path:
    """[trainer] state_dir, else <state>/trainer: the trainer's samples, strategy state and status.json."""
    return Path(cfg.trainer.state_dir).expanduser() if cfg.trainer.state_dir else state_dir / "trainer"


@dataclass(frozen=True)
class StateLayout:
    root: Path

    @property
    def db(self) -> Path:
        return self.root / "results.sqlite"

    @property
    def queue(self) -> Path:
        return self.root / "queue"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    def create(self) -> None:
        for d in (self.root, self.root / "processed", self.root / "quarantine", self.queue):
            d.mkdir(parents=True, exist_ok=True)


#: A status file is read by its service's user and group (the page, ``status`` run by an operator in the group),
#: never by every user: it names photos, devices and errors.
STATUS_MODE = 0o640


def write_status(path: Path, doc: dict) -> str | None:
    """Write a service's status: atomically (a new file renamed over), padded to :data:`STATUS_SLOT_BYTES`; where
    that fails for want of space, in place into the blocks the file already holds, with ``disk_full`` set, so that
    ``status`` and the Health page still see a running service and why it is in trouble. Returns the error of the
    atomic write (None when it worked); raises OSError only when neither way could write."""
    from engines.durable import atomic_write

    body = json.dumps(doc, indent=2).encode() + b"\n"
    try:
        atomic_write(path, body.ljust(STATUS_SLOT_BYTES), durable=False, mode=STATUS_MODE)
        return None
    except OSError as exc:
        if exc.errno not in NO_ROOM:
            raise
        why = f"disk full: {exc.strerror}"
    doc = {**doc, "disk_full": why}
    with open(path, "r+b") as f:  # no new blocks: only the bytes the file already has (at least the slot)
        room = os.fstat(f.fileno()).st_size
        body = json.dumps(doc, separators=(",", ":")).encode()
        if len(body) > room:  # the essentials only
            keep = ("pid", "started", "updated", "uptime_s", "healthy", "state", "engine", "counters", "disk_full")
            body = json.dumps({k: doc[k] for k in keep if k in doc}, separators=(",", ":")).encode()
        if len(body) > room:
            raise OSError(errno.ENOSPC, f"{why}, and {path} is too small to hold even the essentials")
        f.write(body.ljust(room))
    return why


def live_status(path: Path, stale_s: float | None = None) -> tuple[dict, bool]:
    """A service's ``status.json`` and whether the service is running: its pid is alive and, with ``stale_s``,
    the file was refreshed within that many seconds. ({}, False) when there is no readable file."""
    for attempt in range(2):  # an in-place write (a full disk) may be caught half done: look once more
        try:
            live = json.loads(path.read_text())
            break
        except ValueError:
            if attempt:
                return {}, False
            time.sleep(0.05)
        except OSError:
            return {}, False
    pid = live.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return live, False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return live, False
    except PermissionError:  # alive, but another user's
        pass
    return live, stale_s is None or time.time() - float(live.get("updated", 0)) < stale_s


def daemon_live(cfg: AppConfig, state_dir: Path) -> tuple[dict, bool]:
    """The daemon's status, and whether it runs: alive and refreshed within 5 status intervals (10 s at least)."""
    return live_status(StateLayout(state_dir).status, max(10.0, 5 * cfg.daemon.status_interval_s))


def served(cfg: AppConfig, state_dir: Path, store: EngineStore) -> dict:
    """One answer, for the status, ``engine list`` and every page, to "which version serves, and which are refused":
    ``serving`` (the running daemon's engine; the store's pointer when it is not running), ``current`` (the store's
    pointer: it can differ, when the daemon refused that version), ``refused`` (version -> why, from the wire or its
    own disk) and ``pinned`` (a rollback's pin, or None)."""
    from engines.store import StoreError

    live, running = daemon_live(cfg, state_dir)
    try:
        current = store.current()
    except StoreError:
        current = None
    engine = (live.get("engine") or {}).get("engine_version") if running else None
    refused = {**(live.get("hotswap") or {}).get("refused", {}), **(live.get("transfer") or {}).get("refused", {})} if running else {}
    try:
        pin = store.pin()
    except OSError:
        pin = None
    return {"serving": engine or current, "current": current, "running": running, "refused": dict(sorted(refused.items())), "pinned": pin}


def trainer_live(cfg: AppConfig, state_dir: Path) -> tuple[dict, bool]:
    """The trainer's status (it may be busy training for long: not judged by age), and whether it runs."""
    return live_status(trainer_state_dir(cfg, state_dir) / "status.json")


def last_written(status: dict) -> str | None:
    """When a service that is not running last wrote its ``status``, in words ("it last wrote its status 3 h ago"), for
    ``status`` and the Health page; None where the status says no time."""
    from edge_agent.spans import ago

    updated = status.get("updated")
    return f"it last wrote its status {ago(time.time() - updated)}" if isinstance(updated, (int, float)) else None


def as_stopped(trainer_status: dict) -> dict:
    """A trainer's last status as said while it is not running: a retrain it found due starts when it runs (its status
    says "when the trainer is free")."""
    nxt = trainer_status.get("next_publish") or {}
    if nxt.get("waiting_for") != "nothing":
        return trainer_status
    return {**trainer_status, "next_publish": {**nxt, "sentence": "a retrain is due: it starts when the trainer runs"}}


def handoff_link(cfg: AppConfig, state_dir: Path) -> Link:
    """[handoff]'s sockets (configured, else ipc:// sockets in the runtime directory) and its CURVE keys for tcp://."""
    from edge_agent.handoff.transport import CurveKeys, Link, default_endpoints

    h = cfg.handoff
    default_handoff, default_announce, default_transfer = default_endpoints(runtime_dir(state_dir))
    curve = CurveKeys(h.curve_secret_key, h.curve_server_key, h.curve_authorized_dir) if h.curve_secret_key else None
    return Link(h.endpoint or default_handoff, h.announce_endpoint or default_announce, h.transfer_endpoint or default_transfer, curve)


def device_name(cfg: AppConfig) -> str:
    """[handoff] name, else its certificate's name (``<name>.key_secret``: the trainer knows a device by its key),
    else the host name: how the trainer's fleet list names this daemon."""
    import re
    import socket

    from edge_agent.names import DEVICE_NAME

    if not cfg.handoff.name and cfg.handoff.curve_secret_key:
        stem = Path(cfg.handoff.curve_secret_key).name.removesuffix(".key_secret")
        if DEVICE_NAME.fullmatch(stem):
            return stem
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip("._-")[:64]  # one rule: DEVICE_NAME
    return cfg.handoff.name or host or "daemon"
