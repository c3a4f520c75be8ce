"""Staged rollout: a new version goes to canary devices first, and to the rest only once every canary has served it
for ``[rollout] period_s`` and ``min_photos`` photos, with no more than ``max_errors`` inference errors and at least
``min_agreement`` with the version before it; a canary that refuses it, rolls back from it or misbehaves stops the
rollout, and the reason stays on the Fleet page (and in ``edge-trainer fleet``) until the next version.

The rollout's state is kept in ``<trainer>/rollout.json``: a restarted trainer resumes where it was.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Protocol

from edge_agent.log import get_logger
from edge_agent.trainer_config import RolloutSection
from engines.durable import atomic_write

__all__ = ["Rollout", "RolloutPeer"]


class RolloutPeer(Protocol):
    """What a rollout reads of a device (the engine server's :class:`trainer.transfer.Peer`)."""

    name: str
    engine_version: str
    refused: dict
    pinned: str
    report: dict
    last_result: dict | None


def _device_since(report: dict, now: float) -> float:
    """When the device says it began serving the version, on its own clock; 0 (not known) when that clock is ahead
    of this one: a canary whose clock runs ahead would otherwise never have served long enough."""
    since = float(report.get("since", 0.0))
    return since if since <= now else 0.0


class Rollout:
    """Which devices may be offered the version in service, judged again on every :meth:`judge`."""

    def __init__(self, settings: RolloutSection, path: Path) -> None:
        self.settings, self.path = settings, path
        self.log = get_logger("trainer.rollout")
        try:
            self.state = json.loads(path.read_text())
            if not isinstance(self.state, dict) or "version" not in self.state:
                raise ValueError("not a rollout")
        except (OSError, ValueError):
            self.state = {"version": "", "stage": "all", "canaries": [], "served": {}, "reason": "", "started": 0.0}

    # ---- what the engine server asks ------------------------------------------------
    def allowed(self, device: str, version: str) -> bool:
        """May ``device`` be offered ``version`` now? (A version not seen before starts its rollout: no one is offered
        it until the canaries are chosen.)"""
        if not self.settings.staged:
            return True
        if version != self.state["version"]:
            self._start(version)
        if self.state["stage"] == "all":
            return True
        return self.state["stage"] == "canary" and device in self.state["canaries"]

    def describe(self) -> dict:
        """The rollout as the Fleet page shows it."""
        return {**self.state, "staged": self.settings.staged, "period_s": self.settings.period_s}

    # ---- judging ------------------------------------------------------------------------
    def judge(self, version: str, peers: dict[str, RolloutPeer]) -> bool:
        """Look at the fleet for ``version`` (the version in service); True when the rest may now receive it."""
        if not self.settings.staged:
            return False
        if version != self.state["version"]:
            self._start(version)
        st = self.state
        if st["stage"] != "canary":
            return False
        if not st["canaries"]:
            self._choose(peers)
            if not st["canaries"]:
                return False
        now, healthy = time.time(), 0
        for name in st["canaries"]:
            peer = peers.get(name)
            if peer is None:
                continue  # not connected (yet, or any more): the rollout waits for it
            why = self._problem(peer, version)
            if why:
                return self._stop(f"canary {name}: {why}")
            if peer.engine_version == version:
                if st["served"].setdefault(name, now) > now:  # this clock was set back since: count from now
                    st["served"][name] = now
                since = max(_device_since(peer.report, now), st["served"][name])
                if now - since >= self.settings.period_s and int(peer.report.get("photos", 0)) >= self.settings.min_photos:
                    healthy += 1
        if healthy == len(st["canaries"]):
            st["stage"], st["promoted"] = "all", now
            self._save()
            self.log.info("rollout_promoted", engine_version=version, canaries=st["canaries"])
            return True
        self._save(durable=False)  # (a tick: the next one writes it again)
        return False

    def _problem(self, peer: RolloutPeer, version: str) -> str | None:
        """Why this canary stops the rollout of ``version``, or None."""
        s = self.settings
        if version in peer.refused:
            return f"refused {version}: {peer.refused[version]}"
        last = peer.last_result
        if last and last.get("version") == version and not last.get("ok"):
            return f"refused {version}: {last.get('reason', '')}"
        if peer.engine_version != version and self.state["served"].get(peer.name) and peer.pinned:
            return f"rolled back from {version} to {peer.engine_version} (pinned)"
        if peer.engine_version == version:
            errors = int(peer.report.get("errors", 0))
            if errors > s.max_errors:
                return f"{errors} inference errors with {version} (at most {s.max_errors} allowed)"
            agreement = float(peer.report.get("agreement", -1.0))
            if 0 <= agreement < s.min_agreement:
                return f"{version} agreed with the version before it on {agreement:.0%} of its golden photos (at least {s.min_agreement:.0%} needed)"
        return None

    def _start(self, version: str) -> None:
        self.state = {"version": version, "stage": "canary", "canaries": [], "served": {}, "reason": "", "started": time.time()}
        self.log.info("rollout_started", engine_version=version)
        self._save()

    def _choose(self, peers: dict[str, RolloutPeer]) -> None:
        """The canaries among the connected devices: the configured names first, then by name."""
        names = sorted(peers)
        n = min(len(names), max(self.settings.canary_min, math.ceil(self.settings.canary_share * len(names))))
        preferred = [d for d in self.settings.canaries if d in peers]
        chosen = (preferred + [d for d in names if d not in preferred])[:n]
        if chosen:
            self.state["canaries"] = chosen
            self.log.info("rollout_canaries", engine_version=self.state["version"], canaries=chosen, of=len(names))
            self._save()

    def _stop(self, reason: str) -> bool:
        self.state["stage"], self.state["reason"], self.state["stopped"] = "stopped", reason, time.time()
        self.log.error("rollout_stopped", engine_version=self.state["version"], reason=reason)
        self._save()
        return False

    def _save(self, durable: bool = True) -> None:
        """The rollout's state on disk; a stage changed (started, canaries chosen, promoted, stopped) is flushed to it
        before the trainer acts on it, so a power cut cannot take back a stop."""
        try:
            atomic_write(self.path, json.dumps(self.state, indent=1).encode(), durable=durable)
        except OSError as exc:  # a full disk: the rollout goes on in memory
            self.log.warning("rollout_not_saved", error=str(exc))
