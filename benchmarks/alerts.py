"""Alerts end to end: the real daemon, a local mosquitto and a local webhook receiver.

``python -m benchmarks.alerts --out DIR [--rounds 3] [--photos 3000] [--outage-s 60] [--phases quiet outage throughput]``

* quiet: every lab gate photo (38 classes) dropped into the inbox in batches; each class the daemon is confident of a
  disease must raise exactly one alert on MQTT and one on the webhook (the default rules: one per class per hour),
  and the time from the result's record to the alert's arrival is measured (p50, p95, max);
* outage: the broker and the webhook receiver stopped for ``--outage-s`` while photos arrive, and the daemon restarted
  in the middle of it; when both are back, every alert must arrive, once;
* throughput: the same photos through the daemon with alerts off and on (MQTT and a webhook), ``--rounds`` times each,
  alternating; photos per second, mean +- sd.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchmarks.daemon import _start, _write_config, end_to_end
from edge_agent.results import query_readonly
from tests.broker import Broker, free_port

REPO = Path(__file__).resolve().parents[1]
GATE = REPO / "edge_agent" / "default_data" / "gate"


class Heard:
    """What arrived, with the time it arrived: (time, channel, body)."""

    def __init__(self) -> None:
        self.items: list[tuple[float, str, dict]] = []
        self.lock = threading.Lock()

    def add(self, channel: str, body: dict) -> None:
        with self.lock:
            self.items.append((time.time(), channel, body))

    def on(self, channel: str) -> list[tuple[float, dict]]:
        with self.lock:
            return [(t, b) for t, c, b in self.items if c == channel]


class WebhookReceiver:
    """A local HTTP server that records each POSTed alert; :meth:`stop` and :meth:`start` on the same port."""

    def __init__(self, heard: Heard) -> None:
        self.heard, self.port, self.server = heard, free_port(), None

    def start(self) -> None:
        heard = self.heard

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("X-Edge-Agent-Event") == "alert":
                    heard.add("webhook", json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"


def _subscriber(port: int, heard: Heard):
    """A persistent-session QoS 1 subscriber to every device's alert topic (it keeps what the broker queued for it)."""
    import paho.mqtt.client as mqtt

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"bench-alerts-{port}", clean_session=False)
    client.on_connect = lambda c, u, f, rc, p: c.subscribe("edge-agent/+/alert", qos=1)
    client.on_message = lambda c, u, msg: heard.add("mqtt", json.loads(msg.payload))
    client.reconnect_delay_set(1, 2)
    client.connect("127.0.0.1", port, 30)
    client.loop_start()
    return client


def _persistent(broker: Broker, root: Path) -> None:
    """Keep sessions and queued QoS 1 messages across a broker restart (the subscriber's, not the daemon's)."""
    broker.conf.write_text(
        f"listener {broker.port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {root}/\nautosave_interval 1\n"
    )


def _config(work: Path, broker_port: int, webhook: str) -> Path:
    return _write_config(
        work,
        {"mqtt.host": '"127.0.0.1"', "mqtt.port": str(broker_port), "alerts.retry_max_s": "30"},
        f'\n[[webhooks]]\nurl = "{webhook}"\n',
    )


def _drop(photos: list[Path], inbox: Path, batch: int = 50, pause_s: float = 1.0) -> None:
    staging = inbox.parent / "staging"
    staging.mkdir(exist_ok=True)
    for i in range(0, len(photos), batch):
        for j, p in enumerate(photos[i : i + batch]):
            shutil.copy(p, staging / f"{i + j:05d}-{p.name}")
        for f in sorted(staging.iterdir()):
            os.rename(f, inbox / f.name)
        time.sleep(pause_s)


def _wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.2)


def _count(db: Path) -> int:
    return (query_readonly(db, "SELECT COUNT(*) FROM results") or [(0,)])[0][0]


def _expected(db: Path) -> set[str]:
    """The classes the default rules alert on: a confident result of a class not named *healthy."""
    rows = query_readonly(db, "SELECT DISTINCT label FROM results WHERE verdict = 'confident'")
    return {r[0] for r in rows if not r[0].lower().endswith("healthy")}


def _per_class(items: list[tuple[float, dict]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, b in items:
        out[b["label"]] = out.get(b["label"], 0) + 1
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Rig:
    """A local mosquitto, a webhook receiver and a subscriber, all heard in :attr:`heard`; with them, the daemon."""

    def __init__(self, work: Path, persistent: bool = False) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.work, self.heard = work, Heard()
        self.broker = Broker(work)
        if persistent:
            _persistent(self.broker, work)
        self.hook = WebhookReceiver(self.heard)
        self.proc = None
        self.config: Path | None = None

    def __enter__(self) -> Rig:
        self.broker.start()
        self.hook.start()
        self.sub = _subscriber(self.broker.port, self.heard)
        self.config = _config(self.work, self.broker.port, self.hook.url)
        return self

    def start_daemon(self, state: Path) -> None:
        self.proc, _ = _start(state, self.config, self.work / "n.sock")

    def stop_daemon(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)

    def wait_for_alerts(self, n: int, timeout: float) -> None:
        _wait(lambda: len(self.heard.on("mqtt")) >= n and len(self.heard.on("webhook")) >= n, timeout, "the alerts")
        time.sleep(10)  # anything more that comes is a duplicate

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.stop_daemon()
        self.sub.loop_stop()
        self.hook.stop()
        self.broker.stop()


def _once_per_class(items: list[tuple[float, dict]], expected: set[str]) -> dict:
    per = _per_class(items)
    return {
        "alerts": len(items),
        "distinct_alerts": len({b["alert_id"] for _, b in items}),
        "exactly_one_per_class": set(per) == expected and all(n == 1 for n in per.values()),
        "extra": {k: n for k, n in per.items() if n != 1 or k not in expected},
        "missing": sorted(expected - set(per)),
    }


def quiet(work: Path, photos: list[Path]) -> dict:
    with Rig(work) as rig:
        state = work / "state"
        rig.start_daemon(state)
        _drop(photos, state / "inbox")
        db = state / "results.sqlite"
        _wait(lambda: _count(db) >= len(photos), 600, "every result")
        expected = _expected(db)
        rig.wait_for_alerts(len(expected), 60)
        created = dict(query_readonly(db, "SELECT id, created FROM results"))
        out: dict = {"photos": len(photos), "classes_expected": len(expected)}
        for channel in ("mqtt", "webhook"):
            items = rig.heard.on(channel)
            lat = [t - created[b["result_id"]] for t, b in items]
            out[channel] = _once_per_class(items, expected) | {
                "latency_s_p50": round(_pct(lat, 0.5), 3),
                "latency_s_p95": round(_pct(lat, 0.95), 3),
                "latency_s_max": round(max(lat), 3),
            }
        return out


def outage(work: Path, photos: list[Path], outage_s: float) -> dict:
    with Rig(work, persistent=True) as rig:
        state = work / "state"
        rig.start_daemon(state)
        time.sleep(2)
        rig.broker.stop()
        rig.hook.stop()
        down = time.monotonic()
        _drop(photos, state / "inbox", pause_s=0.5)
        db = state / "results.sqlite"
        _wait(lambda: _count(db) >= len(photos), 600, "every result")
        time.sleep(3)
        pending_before_restart = _pending(state)
        rig.stop_daemon()  # the daemon restarted during the outage
        rig.start_daemon(state)
        time.sleep(max(0.0, outage_s - (time.monotonic() - down)))
        pending_at_restore = _pending(state)
        outage_took = time.monotonic() - down
        rig.broker.start()
        rig.hook.start()
        restored = time.time()
        expected = _expected(db)
        rig.wait_for_alerts(len(expected), 300)
        out: dict = {
            "photos": len(photos),
            "outage_s": round(outage_took, 1),
            "daemon_restarted_during_outage": True,
            "classes_expected": len(expected),
            "queued_on_disk_before_restart": pending_before_restart,
            "queued_on_disk_at_restore": pending_at_restore,
        }
        for channel in ("mqtt", "webhook"):
            items = rig.heard.on(channel)
            out[channel] = _once_per_class(items, expected) | {
                "s_after_restore_to_last": round(max(t for t, _ in items) - restored, 2) if items else None
            }
        return out


def _pending(state: Path) -> dict:
    rows = query_readonly(state / "alerts.sqlite", "SELECT dest, COUNT(*) FROM outbox WHERE kind = 'alert' GROUP BY dest")
    return dict(rows)


def throughput(work: Path, photos: list[Path], rounds: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    heard = Heard()
    broker = Broker(work)
    broker.start()
    hook = WebhookReceiver(heard)
    hook.start()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for r in range(rounds):
            for arm in ("off", "on"):
                run = work / f"{arm}-{r}"
                if arm == "off":
                    res = end_to_end(photos, run, {"alerts.enabled": "false"})
                else:
                    res = end_to_end(
                        photos, run, {"mqtt.host": '"127.0.0.1"', "mqtt.port": str(broker.port)}, f'\n[[webhooks]]\nurl = "{hook.url}"\n'
                    )
                rates[arm].append(res["end_to_end_photos_per_s"])
                print(f"  throughput {arm} round {r}: {rates[arm][-1]:.1f} photos/s", file=sys.stderr, flush=True)
    finally:
        hook.stop()
        broker.stop()
    out = {
        arm: {"mean": round(statistics.mean(v), 2), "sd": round(statistics.stdev(v), 2) if len(v) > 1 else 0.0, "runs": v}
        for arm, v in rates.items()
    }
    out["on_vs_off"] = round(out["on"]["mean"] / out["off"]["mean"] - 1, 4)
    out["alerts_heard_on_webhook"] = len(heard.on("webhook"))
    return out


def _distinct(photos: list[Path], n: int, where: Path) -> list[Path]:
    """``n`` photos with distinct bytes: the gate photos again, each copy with a counter after the JPEG's end (decoders
    ignore it), so a long run is not answered as duplicates."""
    where.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        src = photos[i % len(photos)]
        dst = where / f"{i:05d}.jpg"
        dst.write_bytes(src.read_bytes() + (b"" if i < len(photos) else f"copy{i}".encode()))
        out.append(dst)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--photos", type=int, default=3000, help="photos per throughput run (the gate photos, copied distinct)")
    ap.add_argument("--outage-s", type=float, default=60.0)
    ap.add_argument("--phases", nargs="+", default=["quiet", "outage", "throughput"])
    args = ap.parse_args()
    gate = sorted(GATE.glob("*/*.jpg"))
    by_class: dict[str, list[Path]] = {}
    for p in gate:
        by_class.setdefault(p.parent.name, []).append(p)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "command": " ".join(sys.argv)}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        if "quiet" in args.phases:
            result["quiet"] = quiet(Path(tmp) / "quiet", gate)
            print(json.dumps(result["quiet"]), file=sys.stderr, flush=True)
        if "outage" in args.phases:
            some = [p for ps in by_class.values() for p in ps[:10]]
            result["outage"] = outage(Path(tmp) / "outage", some, args.outage_s)
            print(json.dumps(result["outage"]), file=sys.stderr, flush=True)
        if "throughput" in args.phases:
            result["throughput"] = throughput(Path(tmp) / "tp", _distinct(gate, args.photos, Path(tmp) / "copies"), args.rounds)
    (args.out / "alerts.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
