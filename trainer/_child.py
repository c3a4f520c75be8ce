"""A retrain in a child process: the trainer service gives all of a retrain's memory back when it ends.

The child (started with ``spawn``: no lock, thread or socket of the service is copied) opens the store, the samples
and the signing key itself, runs :func:`trainer.retrain.retrain`, and sends its progress, its publish and its
result back over a pipe. SIGTERM to the child asks the retrain to stop at its next check (nothing is marked or
published then); the service sends it when it is asked to stop, and kills the child if it has not ended in time.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from edge_agent.config import AppConfig
from edge_agent.log import get_logger, logging_settings
from edge_agent.storage_errors import storage_problem
from engines.errors import EdgeAgentError
from trainer.loop.room import MARGIN
from trainer.retrain import RetrainResult
from trainer.stop import Stopped

__all__ = ["RetrainDamaged", "RetrainDiskFull", "RetrainFailed", "retrain_in_child"]


class RetrainFailed(EdgeAgentError, RuntimeError):
    """The retrain's process failed (its error as it said it) or died."""


class RetrainDiskFull(RetrainFailed):
    """The retrain failed for want of room on the disk (the trainer waits for room, not for new samples)."""


class RetrainDamaged(RetrainFailed):
    """The retrain met a damaged page in the trainer's labels or pool (the trainer stops for its start to keep them)."""


def _child(
    conn, cfg: AppConfig, store_root: str, samples_root: str, strategy_dir: str, key_path: str, log_level: str, log_format: str
) -> None:
    from edge_agent.log import configure_logging
    from engines.signing import load_key
    from engines.store import EngineStore
    from trainer.retrain import retrain
    from trainer.samples import SamplesDamaged, SampleStore

    configure_logging(log_level, log_format)
    _die_with_parent()
    parent_pid = os.getppid()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the service, which stops the child in order
    samples = None
    try:
        samples = SampleStore(samples_root)  # (never replaced here: the service owns the file)
        result = retrain(
            cfg,
            EngineStore(store_root),
            samples,
            Path(strategy_dir),
            announce=lambda v: conn.send(("announce", v)),
            should_stop=lambda: stop.is_set() or os.getppid() != parent_pid,
            signing_key=load_key(key_path),
            progress=lambda phase, **info: conn.send(("progress", phase, info)),
        )
        conn.send(("result", asdict(result)))
    except Stopped as exc:
        conn.send(("stopped", str(exc)))
    except Exception as exc:  # noqa: BLE001 - the service records it and waits for new samples
        damaged = isinstance(exc, SamplesDamaged) or storage_problem(exc) == "damaged"
        conn.send(("error", repr(exc), _for_want_of_room(exc, Path(store_root)), damaged))
    finally:
        if samples is not None:
            samples.close()
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # no wait at interpreter shutdown for a thread a library left behind: the work is done


def _for_want_of_room(exc: BaseException, root: Path) -> bool:
    """Whether a retrain failed on a full disk: by the error's code, or (torch and ONNX say it in words alone) by the
    disk of ``root`` or of the temporary folder left with less than :data:`trainer.loop.room.MARGIN` free."""
    if storage_problem(exc, root) == "full":
        return True
    for folder in (root, Path(tempfile.gettempdir())):
        try:
            if shutil.disk_usage(folder).free < MARGIN:
                return True
        except OSError:
            continue
    return False


def _died(code: int | None) -> str:
    """What the service says of a retrain's process that ended without a word, by its exit code."""
    if code == -signal.SIGKILL:
        return (
            "the retrain's process was killed (SIGKILL), most likely by the kernel for want of memory (`dmesg` says "
            '"Out of memory: Killed process"): a retrain takes about 1.2-1.5 GB beside the daemon; close other programs, '
            "or lower [trainer] micro_batch (photos a training pass takes at once: 8 to 4 measured 176 MB less)"
        )
    return f"the retrain's process died (exit code {code})"


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the service dies (a SIGKILL of the service must not leave a retrain
    running that would publish behind a restarted one's back); elsewhere the parent's pid is watched instead."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def retrain_in_child(
    cfg: AppConfig,
    store_root: Path,
    samples_root: Path,
    strategy_dir: Path,
    key_path: Path,
    announce: Callable[[str], None],
    progress: Callable[..., None],
    should_stop: Callable[[], bool],
    stop_grace_s: float = 4.0,
) -> RetrainResult:
    """One retrain in a child process; the same outcomes as :func:`trainer.retrain.retrain` (raises
    :class:`trainer.stop.Stopped` once ``should_stop()``, :class:`RetrainFailed` when the child fails or dies,
    :class:`RetrainDiskFull` where it failed for want of room)."""
    log = get_logger("trainer.child")
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    level, fmt = logging_settings()  # the child's lines join the service's log, alike
    proc = ctx.Process(
        target=_child,
        args=(
            child,
            cfg,
            str(store_root),
            str(samples_root),
            str(strategy_dir),
            str(key_path),
            level if level in ("debug", "info", "warning", "error") else "info",
            fmt,
        ),
        name="edge-trainer-retrain",
    )
    proc.start()
    child.close()
    log.info("retrain_child_started", pid=proc.pid)
    outcome: tuple | None = None
    stop_sent: float | None = None
    eof = False
    try:
        while True:
            if should_stop() and stop_sent is None:
                stop_sent = time.monotonic()
                proc.terminate()  # SIGTERM: the retrain stops at its next check
            if stop_sent is not None and time.monotonic() - stop_sent > stop_grace_s and proc.is_alive():
                log.warning("retrain_child_killed", pid=proc.pid, after_s=stop_grace_s)
                proc.kill()
            if eof:
                if not proc.is_alive():
                    break
                time.sleep(0.1)
                continue
            try:
                msg = parent.recv() if parent.poll(0.2) else None
            except (EOFError, OSError):  # the child closed its end: it has sent all it will
                eof = True
                continue
            if msg is None:
                if not proc.is_alive() and not parent.poll(0):
                    break
            elif msg[0] == "progress":
                progress(msg[1], **msg[2])
            elif msg[0] == "announce":
                announce(msg[1])
            else:
                outcome = msg
    finally:
        proc.join(stop_grace_s + 2)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        parent.close()
    if outcome is None:
        if stop_sent is not None:
            raise Stopped("stop requested (the retrain's process ended)")
        raise RetrainFailed(_died(proc.exitcode))
    kind, payload, *full = outcome
    if kind == "result":
        return RetrainResult(**payload)
    if kind == "stopped":
        raise Stopped(payload)
    full, damaged = (list(full) + [False, False])[:2]
    raise (RetrainDiskFull if full else RetrainDamaged if damaged else RetrainFailed)(payload)
