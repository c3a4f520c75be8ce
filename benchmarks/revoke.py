"""How soon a revoke cuts off a device that never disconnects.

``python -m benchmarks.revoke --out DIR [--rounds 5] [--every-ms 20]``

A trainer's receiver on tcp:// 127.0.0.1 with CURVE, and two enrolled devices' senders (the daemon's real
``Sender``, heartbeat 0.2 s): "stolen" queues a labelled photo every ``--every-ms`` and keeps its connection open;
"kept" goes on beside it. ``trainer.devices.revoke_device`` (what ``edge-trainer device revoke`` runs) is called
while photos flow. Measured per round: the time from the revoke to the last sample of the stolen device the trainer
took (goal: under one heartbeat, 0.2 s; negative: the last one came before the revoke), how many it sent after
the revoke that were refused, the time until the stolen device's own status says it is refused, and whether the
kept device delivered after it. Writes ``revoke.json`` and ``revoke.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from edge_agent.config import HandoffSection
from edge_agent.handoff.sender import Sender
from edge_agent.handoff.transport import CurveKeys, Link
from edge_agent.ledger_rows import QueueEntry
from edge_agent.results import ResultsDB
from edge_agent.spool import PhotoSpool, SpoolItem
from trainer.devices import add_device, make_trainer_keys, revoke_device
from trainer.receiver import Receiver
from trainer.samples import SampleStore

__all__ = ["one_round"]

HEARTBEAT_S = 0.2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _queue(db: ResultsDB, spool: PhotoSpool, n: int) -> str:
    data = b"\xff\xd8" + hashlib.sha256(str((n, time.time_ns())).encode()).digest() * 64 + b"\xff\xd9"
    sha = hashlib.sha256(data).hexdigest()
    [f] = spool.put_many([SpoolItem("pseudo", sha, data)])
    db.commit([], [QueueEntry(sha, sha[:16], "pseudo", "Tomato___healthy", 0.97, "v0001", str(f), len(data))])
    return sha


def one_round(tmp: Path, every_s: float) -> dict:
    keys = tmp / "keys"
    make_trainer_keys(keys)
    trainer_pub = str(keys / "trainer" / "trainer.key")
    endpoints = (f"tcp://127.0.0.1:{_port()}", f"tcp://127.0.0.1:{_port()}")
    server = CurveKeys(str(keys / "trainer" / "trainer.key_secret"), authorized_dir=str(keys / "authorized"))
    arrivals: dict[str, float] = {}
    store = SampleStore(tmp / "trainer")
    add = store.add

    def timed_add(header: dict, photo: bytes) -> bool:  # when the trainer took each sample
        new = add(header, photo)
        arrivals.setdefault(header["id"], time.monotonic())
        return new

    store.add = timed_add
    receiver = Receiver(store, HandoffSection(heartbeat_s=HEARTBEAT_S), Link(*endpoints, curve=server))
    senders = {}
    for name in ("stolen", "kept"):
        dev = add_device(keys, name)
        db, spool = ResultsDB(tmp / name / "results.sqlite"), PhotoSpool(tmp / name / "queue", 1 << 30)
        link = Link(*endpoints, curve=CurveKeys(str(dev.secret), server_public=trainer_pub))
        senders[name] = (Sender(db, spool, HandoffSection(heartbeat_s=HEARTBEAT_S, ack_timeout_s=0.5), link, device=name), db, spool)
    receiver.start()
    for s, _, _ in senders.values():
        s.start()
    sent: dict[str, float] = {}
    stop = threading.Event()

    def feed() -> None:
        n = 0
        while not stop.is_set():
            sent[_queue(senders["stolen"][1], senders["stolen"][2], n)] = time.monotonic()
            n += 1
            time.sleep(every_s)

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        feeder.start()
        time.sleep(2.0)  # photos flowing
        revoked = time.monotonic()
        revoke_device(keys, "stolen")
        told = None
        while time.monotonic() - revoked < 10:
            if "handshake refused?" in (senders["stolen"][0].status().get("problem") or ""):
                told = time.monotonic() - revoked
                break
            time.sleep(0.01)
        time.sleep(1.0)
        stop.set()
        feeder.join()
        kept = _queue(senders["kept"][1], senders["kept"][2], -1)
        deadline = time.monotonic() + 20
        while kept not in arrivals and time.monotonic() < deadline:
            time.sleep(0.05)
        stolen_taken = [arrivals[s] for s in sent if s in arrivals]
        after = [s for s, t in sent.items() if t >= revoked]
        return {
            "photos_sent_before_revoke": len(sent) - len(after),
            "last_taken_minus_revoke_s": round(max(stolen_taken) - revoked, 3) if stolen_taken else None,
            "sent_after_revoke": len(after),
            "taken_after_revoke": sum(1 for s in after if s in arrivals),
            "device_told_s": None if told is None else round(told, 3),
            "refused_messages": receiver.counters["revoked"],
            "kept_device_delivered": kept in arrivals,
        }
    finally:
        stop.set()
        for s, db, _ in senders.values():
            s.stop()
            db.close()
        receiver.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--every-ms", type=float, default=20)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(one_round(Path(tmp), args.every_ms / 1000))
        print(json.dumps(rows[-1]), flush=True)
    (args.out / "revoke.json").write_text(json.dumps(rows, indent=2) + "\n")
    last = [r["last_taken_minus_revoke_s"] for r in rows if r["last_taken_minus_revoke_s"] is not None]
    told = [r["device_told_s"] for r in rows if r["device_told_s"] is not None]
    lines = [
        f"# A revoke against a device that stays connected ({args.rounds} rounds, a photo every {args.every_ms:g} ms, heartbeat {HEARTBEAT_S} s)",
        "",
        f"`python -m benchmarks.revoke --out {args.out}`",
        "",
        "| round | last sample taken - revoke (s) | sent after the revoke | taken after it | device told refused (s) | other device delivered |",
        "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows):
        lines.append(
            f"| {i + 1} | {r['last_taken_minus_revoke_s']} | {r['sent_after_revoke']} | {r['taken_after_revoke']} | {r['device_told_s']} | "
            f"{'yes' if r['kept_device_delivered'] else 'NO'} |"
        )
    if last:
        lines += ["", f"Last sample taken after the revoke: max {max(last):+.3f} s (goal: under {HEARTBEAT_S} s)."]
    if told:
        lines.append(f"Device told it is refused: {statistics.mean(told):.2f} +- {statistics.pstdev(told):.2f} s after the revoke.")
    (args.out / "revoke.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
