"""``/metrics``: the daemon's and trainer's status, the results database and the alert outbox in Prometheus' text format.

Read on each scrape from what the services already write (their status files, SQLite read-only): the page process
adds no work to the daemon. Counters from a status file count since that service started (Prometheus handles the
reset a restart makes); counters from the database count since the state directory was made.
"""

from __future__ import annotations

import math
from pathlib import Path

from edge_agent.backup import last_backup
from edge_agent.results import query_readonly
from edge_agent.web.context import WebContext

__all__ = ["CONTENT_TYPE", "render", "Exposition"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float) and math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v) if isinstance(v, float) else str(int(v))


class Exposition:
    """Metric families in the text format: each family's HELP and TYPE once, then its samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._seen: set[str] = set()

    def family(self, name: str, kind: str, help_text: str) -> None:
        if name not in self._seen:
            self._seen.add(name)
            self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels: str) -> None:
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{text}}} {_num(value)}" if text else f"{name} {_num(value)}")

    def one(self, name: str, kind: str, help_text: str, value: float, **labels: str) -> None:
        self.family(name, kind, help_text)
        self.sample(name, value, **labels)

    def histogram(self, name: str, help_text: str, hist: dict, scale: float, **labels: str) -> None:
        """A cumulative histogram from ``{"buckets", "counts", "sum", "count"}`` (:mod:`edge_agent.latency`)."""
        self.family(name, "histogram", help_text)
        running = 0
        for bound, n in zip(hist["buckets"], hist["counts"]):
            running += n
            self.sample(f"{name}_bucket", running, **labels, le=_num(round(bound * scale, 6)))
        self.sample(f"{name}_bucket", hist["count"], **labels, le="+Inf")
        self.sample(f"{name}_sum", round(hist["sum"] * scale, 6), **labels)
        self.sample(f"{name}_count", hist["count"], **labels)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _database(x: Exposition, db: Path) -> None:
    rows = query_readonly(db, "SELECT label, COALESCE(verdict, 'none'), COUNT(*) FROM results GROUP BY label, verdict")
    x.family("edge_agent_photos_total", "counter", "Photos classified, by class and verdict (since the state directory was made).")
    for label, verdict, n in rows:
        x.sample("edge_agent_photos_total", n, **{"class": label, "verdict": verdict})
    if not db.is_file():
        return
    x.family("edge_agent_label_queue", "gauge", "Photos in the label queue, by kind (pseudo, expert, review).")
    for kind, n in query_readonly(db, "SELECT kind, COUNT(*) FROM label_queue GROUP BY kind"):
        x.sample("edge_agent_label_queue", n, kind=kind)
    quarantined = query_readonly(db, "SELECT COUNT(*) FROM quarantine")
    x.one(
        "edge_agent_quarantined_total",
        "counter",
        "Files refused (not an image, a bomb, truncated).",
        quarantined[0][0] if quarantined else 0,
    )


def _daemon(x: Exposition, st: dict, up: bool) -> None:
    x.one("edge_agent_daemon_up", "gauge", "1 while the daemon runs and refreshes its status.", up)
    if not st:
        return
    x.one(
        "edge_agent_clock_behind",
        "gauge",
        "1 while photos from phones say this device's clock is behind (edge-agent status says by how much).",
        bool(st.get("clock_behind")),
    )
    engine = st.get("engine") or {}
    x.one(
        "edge_agent_engine_info",
        "gauge",
        "The engine in service.",
        1,
        version=str(engine.get("engine_version", "")),
        backend=str(engine.get("type", "")),
        precision=str(engine.get("precision", "")),
    )
    counters = st.get("counters") or {}
    x.family("edge_agent_daemon_events_total", "counter", "The daemon's pipeline events since it started.")
    for key, n in sorted(counters.items()):
        x.sample("edge_agent_daemon_events_total", n, event=key)
    x.one("edge_agent_in_flight", "gauge", "Photos inside the pipeline now.", st.get("in_flight", 0))
    x.family("edge_agent_queue_depth", "gauge", "Photos waiting at each pipeline stage.")
    for stage, n in (st.get("queue_depths") or {}).items():
        x.sample("edge_agent_queue_depth", n, stage=stage)
    spool = st.get("spool") or {}
    x.one("edge_agent_spool_bytes", "gauge", "Bytes of photos kept for the trainer.", spool.get("bytes", 0))
    x.one("edge_agent_spool_quota_bytes", "gauge", "The spool's quota ([labels] max_spool_mb).", spool.get("quota_bytes", 0))
    hot = st.get("hotswap") or {}
    x.one("edge_agent_engine_swaps_total", "counter", "Engine versions put in service while running.", hot.get("swaps", 0))
    refused = hot.get("refused") or {}
    x.one("edge_agent_engine_refused_versions", "gauge", "Engine versions refused (bad signature, failed check).", len(refused))
    trust = st.get("trust") or {}
    if trust.get("trusted") is not None:  # not before the daemon has read the expert's checks, nor with trust_checks = 0
        x.family("edge_agent_class_trusted", "gauge", "1 for each class whose sure answers become pseudo-labels.")
        for label in trust["trusted"]:
            x.sample("edge_agent_class_trusted", 1, label=label)
    if trust:
        x.one(
            "edge_agent_withdrawals_total", "counter", "Times pseudo-labels were taken back since the start.", trust.get("withdrawals", 0)
        )
    for stage, hist in (st.get("latency_ms") or {}).items():
        x.histogram(
            "edge_agent_latency_seconds", "Seconds per photo: total (arrival to result), infer, preprocess.", hist, 0.001, stage=stage
        )
    alerts = st.get("alerts") or {}
    if alerts:
        dests = sorted(
            {k.split(":", 1)[1] for k in alerts if ":" in k} | set(alerts.get("pending", {})) | set(alerts.get("destinations", {}))
        )
        for name, key, text in (
            ("edge_agent_alerts_sent_total", "sent", "Notifications delivered, by destination."),
            ("edge_agent_alerts_failed_total", "failed", "Delivery attempts that failed (each is retried), by destination."),
        ):
            x.family(name, "counter", text)
            for d in dests:
                x.sample(name, alerts.get(f"{key}:{d}", 0), destination=d)
        x.family("edge_agent_alerts_pending", "gauge", "Notifications waiting on disk, by destination.")
        for d in dests:
            x.sample("edge_agent_alerts_pending", (alerts.get("pending") or {}).get(d, 0), destination=d)
        x.one("edge_agent_alerts_dropped_total", "counter", "Notifications dropped to keep [alerts] queue_mb.", alerts.get("dropped", 0))
    kept = st.get("retention")
    if kept:
        x.one("edge_agent_retention_photos", "gauge", "Processed photos kept on disk.", kept.get("photos", 0))
        x.one("edge_agent_retention_photo_bytes", "gauge", "Bytes of processed photos kept on disk.", kept.get("photo_bytes", 0))
        x.one(
            "edge_agent_retention_pruned_photos_total",
            "counter",
            "Processed photos removed by age or for the disk floor.",
            kept.get("pruned_photos", 0),
        )
        x.one("edge_agent_retention_pruned_results_total", "counter", "Result rows removed by age.", kept.get("pruned_results", 0))
        if "engines" in kept:
            x.one("edge_agent_engine_versions", "gauge", "Engine versions held in the store.", kept["engines"])
            x.one("edge_agent_engine_bytes", "gauge", "Bytes of the engine versions held in the store.", kept.get("engine_bytes", 0))
            x.one(
                "edge_agent_retention_pruned_engines_total",
                "counter",
                "Old retrained engine versions deleted ([retention] engine_versions).",
                kept.get("pruned_engines", 0),
            )
        if "trainer_photos" in kept:
            x.one("edge_agent_trainer_label_bytes", "gauge", "Bytes of the label photos a trainer here holds.", kept["trainer_bytes"])
        x.one("edge_agent_disk_free_bytes", "gauge", "Free bytes on the state directory's disk.", kept.get("free_bytes", 0))
        x.one(
            "edge_agent_disk_floor_bytes", "gauge", "The free space retention keeps ([retention] min_free_*).", kept.get("floor_bytes", 0)
        )
    board = st.get("board") or {}
    temps = board.get("temperature_c") or {}
    if temps:
        x.family("edge_agent_temperature_celsius", "gauge", "Board temperatures (the kernel's thermal zones).")
        for zone, c in temps.items():
            x.sample("edge_agent_temperature_celsius", c, zone=zone)
    if isinstance(board.get("power_w"), (int, float)):
        x.one("edge_agent_power_watts", "gauge", "Board power (jtop's total rail).", board["power_w"])


def _alert_ledger(x: Exposition, path: Path) -> None:
    rows = query_readonly(path, "SELECT label, COUNT(*) FROM alerts GROUP BY label")
    x.family("edge_agent_alerts_total", "counter", "Alerts raised by the [alerts] rules, by class.")
    for label, n in rows:
        x.sample("edge_agent_alerts_total", n, **{"class": label})


def _trainer(x: Exposition, st: dict, up: bool) -> None:
    x.one("edge_agent_trainer_up", "gauge", "1 while a trainer runs on this machine.", up)
    if not st:
        return
    x.family("edge_agent_retrains_total", "counter", "Retrains since the trainer started, by outcome.")
    for outcome, n in (st.get("retrains") or {}).items():
        x.sample("edge_agent_retrains_total", n, outcome=outcome)
    nxt = st.get("next_publish") or {}
    if "expert_labels_needed" in nxt:
        x.one(
            "edge_agent_next_publish_expert_labels_needed",
            "gauge",
            "Expert labels the next published version waits for (0: none; the status says why in words).",
            nxt["expert_labels_needed"],
        )
    x.family("edge_agent_trainer_samples", "gauge", "Samples the trainer holds, by kind.")
    for kind, n in (st.get("samples") or {}).items():
        if isinstance(n, (int, float)):
            x.sample("edge_agent_trainer_samples", n, kind=kind)


def render(ctx: WebContext) -> str:
    """Every metric, as one scrape's text."""
    x = Exposition()
    (daemon, daemon_up), (trainer, trainer_up) = ctx.daemon(), ctx.trainer()
    _database(x, ctx.state.db)
    _daemon(x, daemon, daemon_up)
    _alert_ledger(x, ctx.state.root / "alerts.sqlite")
    _backup(x, last_backup(ctx.state.root), daemon.get("backup") if daemon_up else None)
    _trainer(x, trainer, trainer_up)
    return x.text()


def _backup(x: Exposition, last: dict | None, schedule: dict | None) -> None:
    x.one(
        "edge_agent_backup_last_timestamp_seconds",
        "gauge",
        "When the last backup of this state directory was taken (0: never; edge-agent backup or [backup] dir).",
        last["time"] if last else 0,
    )
    checked = (last or {}).get("checked")
    if isinstance(checked, (int, float)):
        x.one(
            "edge_agent_backup_checked_timestamp_seconds",
            "gauge",
            "When every photo and engine on the stick last read back whole ([backup] check_every_days).",
            checked,
        )
    if schedule is not None:
        x.one(
            "edge_agent_backup_failing",
            "gauge",
            "1 while the daemon's last try to write a backup into [backup] dir failed.",
            bool(schedule.get("failed")),
        )
