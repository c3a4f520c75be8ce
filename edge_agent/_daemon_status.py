"""What the running daemon reports of itself: the status file each round, and what its alerts and the notifier are told.

:class:`DaemonStatus` is a part of :class:`edge_agent.daemon.Daemon` (its pipeline, sources, workers and state
directory), kept in a module of its own beside it.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from edge_agent.capture_time import clock_behind
from edge_agent.state import write_status

if TYPE_CHECKING:
    from edge_agent.config import AppConfig
    from edge_agent.pipeline import Pipeline
    from edge_agent.state import StateLayout

__all__ = ["DaemonStatus"]


class DaemonStatus:
    """The daemon's status and its round (a part of :class:`edge_agent.daemon.Daemon`, which sets these and the
    sources and workers the status reads)."""

    cfg: AppConfig
    state: StateLayout
    pipeline: Pipeline

    def status(self) -> dict:
        """What ``edge-agent status``, the web page and the alerts read of the running daemon (the status file's JSON)."""
        p = self.pipeline
        out = {
            "pid": os.getpid(),
            "started": self.started,
            "updated": time.time(),
            "uptime_s": round(time.time() - self.started, 1),
            "healthy": self.healthy,
            "engine": p.classifier.engine.describe() | {"verdict": p.classifier.judge.mode},
            "inbox": str(self.inbox) if self.folder else None,
            "counters": dict(p.counters),
            "in_flight": p.in_flight,
            "queue_depths": p.depths(),
            "spool": {"bytes": self.spool.used_bytes, "quota_bytes": self.spool.max_bytes, "full": p.queue_full},
            "last_errors": list(p.last_errors),
            "ledger": self.ledger_note,
            "store_problem": self.store_note,
            "clock_behind": clock_behind(list(p.camera_clocks)),
        }
        if self.folder:
            out["folder"] = {
                **self.folder.counters,
                "unsupported": dict(self.folder.unsupported),
                "missing": self.folder.missing,
                "unreadable": self.folder.unreadable,
            }
        if self.camera:
            out["camera"] = {**self.camera.counters, "connected": self.camera.connected}
        if self.sender:
            out["handoff"] = self.sender.status()
        if self.fetcher:
            out["transfer"] = self.fetcher.status()
        if self.watcher:
            out["hotswap"] = {"swaps": self.watcher.swaps, "refused": self.watcher.refused, "looked": self.watcher.looked}
        if self.alerts:
            out["alerts"] = self.alerts.status()
        if self.retention:
            out["retention"] = self.retention.status()
        if self.backups:
            out["backup"] = self.backups.status()
        if self.ledger_check:
            out["ledger_check"] = self.ledger_check.status()
        out["board"] = self.board.read()
        out["latency_ms"] = self.pipeline.latency.as_dict()
        out["trust"] = self._trust_status()
        return out

    def _trust_status(self) -> dict:
        """Which classes make pseudo-labels as the pipeline last read the checks, and what was taken back since the
        start (:mod:`edge_agent.review.withdraw`): what the alerts tell of the device's learning."""
        known = self.pipeline.labels.trust.known()
        w = self.pipeline.withdrawals
        last = w.last
        return {
            "trusted": None if known is None else sorted(known),
            "withdrawals": w.taken,
            "last_withdrawal": None
            if last is None
            else {"found": [list(pair) for pair in last.found], "returned_to_review": last.pooled, "to_withdraw_from_trainer": last.marked},
        }

    def _trainer_next(self) -> dict | None:
        """What the next version waits for, as a trainer on this state directory last said (None: none here, or a
        status that cannot be read): what Home Assistant shows."""
        from edge_agent.state import as_stopped, trainer_live

        try:
            status, _ = trainer_live(self.cfg, self.state.root)
            nxt = as_stopped(status).get("next_publish") if status else None
        except (OSError, ValueError, AttributeError):  # (a status file that is not a JSON object)
            return None
        return nxt if isinstance(nxt, dict) else None

    def _write_status(self) -> None:
        """One status round: the alerts told, the status file written, a change of trouble logged once, systemd told."""
        st = self.status()
        if self.alerts is not None:
            try:
                self.alerts.observe(st | {"next_publish": self._trainer_next() if self.alerts.mqtt is not None else None})
            except Exception as exc:  # noqa: BLE001 - a locked or full disk: the next status round tries again
                self.log.warning("alerts_observe_failed", error=repr(exc))
        try:
            trouble = write_status(self.state.status, st)
        except OSError as exc:
            trouble = str(exc)
            self.db.damaged(exc)  # a disk that fails every write (EIO): the main loop stops the daemon, as the ledger's would
        if trouble != self._status_trouble:  # said once when it starts and once when it ends
            self.log.error("status_write_failed", error=trouble) if trouble else self.log.info("status_write_recovered")
            self._status_trouble = trouble
        if bool(st["clock_behind"]) != self._clock_behind:  # said once when it starts and once when it ends
            self.log.warning("clock_behind", note=st["clock_behind"]) if st["clock_behind"] else self.log.info("clock_no_longer_behind")
            self._clock_behind = bool(st["clock_behind"])
        c = st["counters"]
        self.notifier.status(
            f"{c['processed']} classified, {c['quarantined']} quarantined, {c['queued_pseudo']} pseudo-labels queued, "
            f"{st['in_flight']} in flight, engine {st['engine']['engine_version']}"
        )
