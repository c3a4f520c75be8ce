"""``edge-agent status``: what the daemon is doing, what it has kept and what it refused, in a screen or as JSON."""

from __future__ import annotations

import argparse
import json
import shutil
import time

from edge_agent._cli_common import load, state_db
from edge_agent.backup import last_backup
from edge_agent.backup_schedule import backup_lines, requested
from edge_agent.engine_keep import engines_line
from edge_agent.ledger_check import check_line
from edge_agent.names import printable
from edge_agent.storage_errors import READ_ONLY_DISK
from engines.durable import read_only_disk

__all__ = ["status"]


def status(args: argparse.Namespace) -> int:
    from edge_agent.state import daemon_live, last_written

    cfg = load(args)
    state, db = state_db(args, cfg)
    live, running = daemon_live(cfg, state.root)
    out = {"running": running, "state_dir": str(state.root), **db.counts(), "per_class": db.per_class()}
    out["per_class_confident"] = db.per_class_confident()
    out["trusted_classes"] = _trusted(db, cfg.labels)
    out["withdrawn_pseudo_labels"] = {label: {"withdrawn": n, "confirmed": c} for label, (n, c) in db.withdrawn_counts().items()}
    for key in (
        "uptime_s",
        "healthy",
        "engine",
        "in_flight",
        "queue_depths",
        "spool",
        "counters",
        "last_errors",
        "camera",
        "folder",
        "inbox",
        "handoff",
        "hotswap",
        "transfer",
        "ledger",
        "ledger_check",
        "disk_full",
        "retention",
        "store_problem",
        "clock_behind",
        "backup",
    ):
        if key in live:
            out[key] = live[key]
    out["last_backup"] = last_backup(state.root)
    out["read_only"] = read_only_disk(state.root)  # (now: a daemon on such a disk cannot write its status)
    try:
        from edge_agent.state import store_to_read
        from edge_agent.upgrade import pending_release

        store = store_to_read(cfg, state.root)
        out["pinned"], out["release_pending"] = store.pin(), pending_release(store)
    except Exception:  # noqa: BLE001 - no store to read: status still reports the rest
        out["pinned"], out["release_pending"] = None, None
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    last = None if running else last_written(live)
    print(f"daemon: {'running' if running else 'not running'}  (state {state.root}){'; ' + last if last else ''}")
    if out.get("disk_full"):
        print(f"DISK FULL: {out['disk_full']} (results, queues and status cannot grow until space is freed)")
    if out.get("store_problem"):
        print(f"STATE DISK FULL: {out['store_problem']}")
    if out["read_only"]:
        print(f"STATE DISK READ-ONLY: {READ_ONLY_DISK}")
    if out.get("clock_behind"):
        print(f"CLOCK BEHIND: {out['clock_behind']}")
    kept = out.get("retention")
    if kept and "photos" in kept:
        since = f" since {kept['oldest_photo_day']}" if kept.get("oldest_photo_day") else ""
        try:  # now, not as the daemon's last status said it (a full disk keeps it from writing its status)
            free = shutil.disk_usage(state.root).free
        except OSError:
            free = kept["free_bytes"]
        print(
            f"kept: {kept['photos']} photos ({kept['photo_bytes'] >> 20} MiB){since}, for {kept['photo_days']:g} days, never below "
            f"{kept['floor_bytes'] / 2**30:.1f} GiB free ({free / 2**30:.1f} GiB free now); pruned since start: "
            f"{kept['pruned_photos']} photos, {kept['pruned_results']} results"
        )
        if "engines" in kept:
            print(
                engines_line(
                    kept["engines"], kept["engine_bytes"], kept.get("engine_versions", 0), kept.get("pruned_engines", 0), "since start"
                )
            )
        if kept.get("trainer_photos"):
            print(f"trainer's labels: {kept['trainer_photos']} photos ({kept['trainer_bytes'] >> 20} MiB), the expert's kept always")
        if kept.get("clock_note"):
            print(f"clock: {kept['clock_note']}")
        if kept.get("below_floor"):
            print(f"BELOW THE DISK FLOOR with nothing more of ours to remove; largest here: {kept.get('largest')}")
    schedule = out.get("backup") if running else None
    for text, _warn in backup_lines(cfg.backup, out["last_backup"], schedule, time.time(), requested(state.root)):
        print(printable(f"backup: {text}"))
    if "engine" in out:
        e = out["engine"]
        now = f"uptime {out.get('uptime_s', 0):.0f} s  healthy: {out.get('healthy')}" if running else "when it last ran"
        print(f"engine: {e['engine_version']} ({e['type']}, {e['provider']}, {e['precision']})  {now}")
        if e.get("precision_reason"):
            print(f"precision: {e['precision']} ({e['precision_reason']})")
        print(f"signed by: {e.get('signed_by') or 'not checked ([store] require_signature = false)'}")
        if e.get("verdict"):
            print(f"verdict: {e['verdict']}")
    h = out.get("handoff") if running else None  # (a stopped daemon is connected to nothing, whatever it last said)
    if h:
        t = h.get("trainer") or {}
        heard = f", last heard {time.time() - t['heard']:.0f} s ago" if t.get("heard") else ""
        what = f"{t.get('state', '?')}, serving {t.get('version', '?')}" if t.get("state") else ""
        print(
            f"trainer ({t.get('endpoint', '?')}): "
            + (f"connected: {what}{heard}" if h.get("trainer_alive") else (h.get("problem") or "not heard from") + heard)
        )
    print(
        f"processed {out['processed']}  quarantined {out['quarantined']}  pseudo-labels queued {out['queued_pseudo_labels']}  "
        f"expert labels {out['queued_expert_labels']}  review queue {out['review_queue']}"
    )
    print(_trust_line(out["trusted_classes"], cfg.labels))
    if out["withdrawn_pseudo_labels"]:
        print(_withdrawn_line(out["withdrawn_pseudo_labels"]))
    if "queue_depths" in out and running:
        lq = out["spool"]
        print(
            f"in flight {out['in_flight']}  queues {out['queue_depths']}  label spool {lq['bytes'] >> 20}/{lq['quota_bytes'] >> 20} MiB{'  FULL: not queuing' if lq['full'] else ''}"
        )
    unsupported = out.get("folder", {}).get("unsupported") or {}
    if unsupported:
        print(
            "ignored (not a format the daemon reads; left in the inbox): "
            + ", ".join(f"{n} {ext} file{'s' if n > 1 else ''}" for ext, n in sorted(unsupported.items()))
        )
    if (out.get("folder") or {}).get("missing"):
        print(f"INBOX MISSING: {out.get('inbox')} is gone; photos dropped into it are picked up once it is back")
    if (out.get("folder") or {}).get("unreadable"):
        print(
            f"INBOX UNREADABLE: {out.get('inbox')} cannot be listed ({out['folder']['unreadable']}: a USB stick or card "
            "pulled out or failing? see dmesg); photos in it are picked up once it reads again"
        )
    if out.get("ledger"):
        print(f"LEDGER: {out['ledger']}")
    records = check_line(out.get("ledger_check"), time.time()) if running else None
    if records:
        print(f"records: {records}")
    if out.get("release_pending"):
        print(
            f"release {out['release_pending']} installed by the upgrade, not serving yet: the farm's own version serves until the "
            "trainer's field check finds the release (or its retrain on the farm's labels) no worse (edge-trainer serve decides)"
        )
    if out["pinned"]:
        pin = out["pinned"]
        print(
            f"PINNED to {pin['version']} by a rollback from {pin['from']} ({pin.get('at')}): offers of {pin['from']} or older "
            f"are refused until a newer version arrives; edge-agent engine unpin lifts it"
            + (f" ({pin['problem']})" if pin.get("problem") else "")
        )
    refused = {**(out.get("hotswap") or {}).get("refused", {}), **(out.get("transfer") or {}).get("refused", {})}
    for version, why in sorted(refused.items()):
        print(f"REFUSED engine {version}: {why}")
    downloading = (out.get("transfer") or {}).get("downloading")
    if downloading:
        print(f"receiving engine {downloading['version']}: {downloading['bytes'] >> 10} of {downloading['of'] >> 10} KiB")
    if out["per_class"]:
        print("answers by best guess (of them, sure):")
    for label, n in out["per_class"].items():
        sure = out["per_class_confident"].get(label, 0)
        print(printable(f"  {n:6d}  {label}" + ("" if sure == n else f"  ({sure} sure)")))
    for err in out.get("last_errors", [])[-5:]:
        print(printable(f"  error: {err.get('photo', '')} {err['error']}"))  # a photo's name is anyone's
    return 0


def _trusted(db, policy) -> dict[str, dict] | None:
    """The classes whose sure answers become pseudo-labels now, each with its audits (None: every class, no test)."""
    from edge_agent.review.checks import trust_table

    if policy.trust_checks == 0:
        return None
    rows = trust_table(db, policy)[0]
    return {r.label: {"audits": r.audits, "right_audits": r.right_audits} for r in rows if r.trusted}


def _withdrawn_line(withdrawn: dict[str, dict]) -> str:
    """What the status says of the delivered pseudo-labels taken back (:mod:`edge_agent.review.withdraw`)."""
    n = sum(w["withdrawn"] for w in withdrawn.values())
    waiting = n - sum(w["confirmed"] for w in withdrawn.values())
    said = ", ".join(f"{w['withdrawn']} of {label}" for label, w in withdrawn.items())
    return f"withdrawn: {said} (a sure answer of the class by their engine found wrong); " + (
        f"{waiting} not yet taken back by the trainer" if waiting else "all taken back by the trainer"
    )


def _trust_line(trusted: dict[str, dict] | None, policy) -> str:
    """What the status says of trust: which classes make pseudo-labels, and how right their audits were."""
    if trusted is None:
        return "trust: every class's sure answers become pseudo-labels ([labels] trust_checks = 0)"
    if not trusted:
        return "trust: no class makes pseudo-labels now: every sure answer goes to the expert as a check (`edge-agent review trust` says what each waits for)"
    said = ", ".join(
        f"{label} (audits {t['right_audits']} of {t['audits']} right)" if t["audits"] else label for label, t in trusted.items()
    )
    return f"trust: pseudo-labels from {said}; {policy.audit_share * 100:g} % of their sure answers still checked"
