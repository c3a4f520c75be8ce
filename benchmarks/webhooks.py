"""One broken webhook beside a good one: does the good one still get every alert, and how soon?

``python -m benchmarks.webhooks --out DIR [--alerts 30] [--every-s 0.5]``

For each way an endpoint breaks (``hang``, ``garbage``, ``drip``, ``cut``, ``redirect``, ``refuse``; and ``none``,
two good endpoints, as the baseline), the daemon's alert worker runs with the default settings (``timeout_s`` 10,
the default backoff) and two ``[[webhooks]]``: the broken one first. ``--alerts`` disease results are recorded
``--every-s`` apart; measured: how many reached the good endpoint and the time from the result's record to its
arrival (p50, p95, max). Then the broken endpoint is fixed and the time until its backlog has arrived is measured.
Writes ``webhooks.json`` and ``webhooks.md``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from edge_agent.alerts.config import AlertsSection, MqttSection, WebhookSection
from edge_agent.alerts.worker import AlertWorker
from edge_agent.ledger_rows import ResultRow
from edge_agent.results import ResultsDB
from tests.bad_endpoints import BadEndpoint

__all__ = ["run_case"]

CASES = ("none", "hang", "garbage", "drip", "cut", "redirect", "refuse")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_case(mode: str, alerts: int, every_s: float, recover_s: float = 120.0) -> dict:
    """Two webhooks (the first broken by ``mode``), ``alerts`` alerts; what reached the good one, when."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        db = ResultsDB(tmp / "results.sqlite")
        bad, good = BadEndpoint("ok" if mode == "none" else mode), BadEndpoint("ok")
        hooks = [WebhookSection(url=bad.url), WebhookSection(url=good.url)]
        worker = AlertWorker(AlertsSection(quiet_period_s=0), MqttSection(), hooks, db.path, tmp, "bench")
        worker.start()
        raised = []
        try:
            for i in range(alerts):
                sha = f"{i:064x}"
                raised.append(time.time())
                db.commit([ResultRow(sha, sha[:16], None, "inbox", f"Tomato___Disease_{i}", 0.97, [], "v1", {}, verdict="confident")])
                time.sleep(every_s)
            deadline = time.time() + 15
            while len(good.got) < alerts and time.time() < deadline:
                time.sleep(0.05)
            lags = [t - raised[json.loads(body)["result_id"] - 1] for t, body in good.got]  # a fresh ledger: row ids 1, 2, ...
            alive = worker.alive() and all(t.is_alive() for t in worker._couriers)
            error = worker.status()["destinations"]["webhook:0"]["error"]  # before the fix
            fixed = time.time()
            bad.mode = "ok"
            backlog_s = None
            while time.time() - fixed < recover_s:
                if "webhook:0" not in worker.outbox.counts()["pending"]:
                    backlog_s = time.time() - fixed
                    break
                time.sleep(0.1)
            ids = {"good": [json.loads(b)["result_id"] for _, b in good.got], "bad": [json.loads(b)["result_id"] for _, b in bad.got]}
            return {
                "mode": mode,
                "good_missing": alerts - len(set(ids["good"])),
                "good_doubled": len(ids["good"]) - len(set(ids["good"])),
                "bad_missing_after_fix": alerts - len(set(ids["bad"])),
                "bad_doubled": len(ids["bad"]) - len(set(ids["bad"])),
                "alerts": alerts,
                "good_received": len(good.got),
                "good_lag_p50_s": round(_pct(lags, 0.5), 3),
                "good_lag_p95_s": round(_pct(lags, 0.95), 3),
                "good_lag_max_s": round(max(lags), 3) if lags else None,
                "worker_alive": alive,
                "bad_error": error,
                "bad_received_after_fix": len(bad.got),
                "bad_backlog_delivered_s": None if backlog_s is None else round(backlog_s, 1),
            }
        finally:
            worker.stop()
            bad.close()
            good.close()
            db.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--alerts", type=int, default=30)
    ap.add_argument("--every-s", type=float, default=0.5)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in args.cases:
        rows.append(run_case(mode, args.alerts, args.every_s))
        print(json.dumps(rows[-1]), flush=True)
    (args.out / "webhooks.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        f"# One broken webhook beside a good one ({args.alerts} alerts, {args.every_s} s apart, default timeout_s 10)",
        "",
        "`python -m benchmarks.webhooks --out " + str(args.out) + "`",
        "",
        "| broken endpoint | good one received (missing, doubled) | good lag p50 / p95 / max (s) | worker alive | broken one's error | "
        "its backlog after the fix (missing, doubled) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['good_received']} / {r['alerts']} ({r['good_missing']}, {r['good_doubled']}) | "
            f"{r['good_lag_p50_s']} / {r['good_lag_p95_s']} / {r['good_lag_max_s']} | "
            f"{'yes' if r['worker_alive'] else 'NO'} | {(r['bad_error'] or '-')[:90]} | "
            f"{r['bad_received_after_fix']} in {r['bad_backlog_delivered_s']} s ({r['bad_missing_after_fix']}, {r['bad_doubled']}) |"
        )
    (args.out / "webhooks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
