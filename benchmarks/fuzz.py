"""Random and mutated frames at the trainer's and the daemon's sockets: both stay up, memory stays flat, real work goes on.

``python -m benchmarks.fuzz --out DIR [--frames 100000] [--seed 22]``

1. The trainer's hand-off receiver (a :class:`trainer.receiver.Receiver` on an ipc socket) gets ``--frames`` frames
   from a DEALER: valid hand-off and transfer frames mutated (bytes flipped, cut, repeated, digits swapped for huge
   numbers, NaN and infinities) and random bytes; then a real sample, which must be stored and acknowledged.
2. The daemon's sender (a :class:`edge_agent.handoff.sender.Sender`) gets as many from a fake trainer's ROUTER;
   then a real engine announcement, which it must hear.

Reports frames sent, how many each side counted as malformed, whether each side is alive and did the real work,
and this process's RSS before and after (both sides run in it; "before" is after a warm-up of 500 frames a side). Writes ``DIR/fuzz.json`` and ``DIR/fuzz.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["mutate", "seed_frames"]

HUGE = [b"9" * 400, b"1e999", b"-1e999", b"NaN", b"Infinity", b"-0", b"1.7976931348623157e309", b"18446744073709551616"]


def seed_frames() -> list[list[bytes]]:
    """Valid frames of every kind on the hand-off and transfer wires, to mutate."""
    from edge_agent.handoff.protocol import encode
    from edge_agent.transfer.protocol import encode as encode_transfer

    sample = {
        "id": "a" * 64,
        "kind": "pseudo",
        "label": "Apple___Apple_scab",
        "confidence": 0.95,
        "engine_version": "v1000",
        "ext": ".jpg",
        "device": "d",
    }
    return [
        encode("sample", sample, b"\xff\xd8jpeg\xff\xd9"),
        encode("ack", {"id": "b" * 64}),
        encode("heartbeat", {"role": "trainer", "time": 1.5}),
        encode("engine", {"version": "v1001"}),
        encode("refused", {"id": "c" * 64, "reason": "no"}),
        encode_transfer("hello", {"name": "d", "engine_version": "v1000", "queue": 3, "refused": {"v1001": "bad"}}),
        encode_transfer("fetch", {"version": "v1001", "file": "model.onnx", "offset": 0, "length": 10}),
        encode_transfer("result", {"version": "v1001", "ok": True, "reason": "installed"}),
    ]


def mutate(frames: list[bytes], rng: random.Random) -> list[bytes]:
    """``frames`` with one frame damaged: a byte flipped, cut short, repeated, its digits swapped for huge numbers, or
    replaced by random bytes; now and then a frame added or dropped."""
    frames = list(frames)
    i = rng.randrange(len(frames))
    b = bytearray(frames[i])
    op = rng.randrange(7)
    if op == 0 and b:
        b[rng.randrange(len(b))] = rng.randrange(256)
    elif op == 1:
        b = b[: rng.randrange(len(b) + 1)]
    elif op == 2:
        b = b * rng.randrange(2, 50)
    elif op == 3:
        for d in b"0123456789":
            if rng.random() < 0.3:
                b = b.replace(bytes([d]), rng.choice(HUGE), 1)
    elif op == 4:
        b = bytearray(os.urandom(rng.randrange(64)))
    elif op == 5:
        frames.append(os.urandom(rng.randrange(16)))
    elif len(frames) > 1:
        frames.pop()
    if op not in (5, 6):
        frames[i] = bytes(b)
    return frames


def _frames(rng: random.Random, n: int):
    pool = seed_frames()
    for k in range(n):
        yield (mutate(rng.choice(pool), rng) if k % 10 else [os.urandom(rng.randrange(1, 40)) for _ in range(rng.randrange(1, 6))])


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _wait(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def fuzz_trainer(work: Path, n: int, rng: random.Random) -> dict:
    import zmq

    from edge_agent.config import HandoffSection
    from edge_agent.handoff.protocol import decode, encode
    from edge_agent.handoff.transport import Link, client_socket
    from trainer.receiver import Receiver
    from trainer.samples import SampleStore

    endpoints = f"ipc://{work}/handoff.sock", f"ipc://{work}/engines.sock"
    store = SampleStore(work / "trainer")
    receiver = Receiver(store, HandoffSection(), Link(*endpoints), classes=lambda: ["Apple___Apple_scab"])
    receiver.start()
    ctx = zmq.Context()
    sock = client_socket(ctx, zmq.DEALER, endpoints[0], None)
    t0 = time.perf_counter()
    try:
        _wait(lambda: sock.poll(10, zmq.POLLOUT), 5)
        for frames in _frames(rng, n):
            sock.send_multipart(frames)
        photo = b"\xff\xd8 a real photo \xff\xd9"
        sha = hashlib.sha256(photo).hexdigest()
        sock.send_multipart(
            encode(
                "sample",
                {"id": sha, "kind": "expert", "label": "Apple___Apple_scab", "confidence": 1.0, "engine_version": "v1000", "ext": ".jpg"},
                photo,
            )
        )
        acked = False
        end = time.monotonic() + 60
        while time.monotonic() < end and not acked:
            if sock.poll(500):
                try:
                    msg = decode(sock.recv_multipart())
                    acked = msg.kind == "ack" and msg.header["id"] == sha
                except Exception:  # noqa: BLE001 - the receiver answers mutated samples too
                    pass
        return {
            "frames": n,
            "seconds": round(time.perf_counter() - t0, 1),
            "malformed_counted": receiver.counters["malformed"],
            "refused_labels": receiver.counters["refused"],
            "alive": receiver.alive(),
            "real_sample_stored": acked and store.has(sha),
        }
    finally:
        sock.close(0)
        ctx.term()
        receiver.stop()
        store.close()


def fuzz_daemon(work: Path, n: int, rng: random.Random) -> dict:
    import zmq

    from edge_agent.config import HandoffSection
    from edge_agent.handoff.protocol import encode
    from edge_agent.handoff.sender import Sender
    from edge_agent.handoff.transport import Link, server_socket
    from edge_agent.results import ResultsDB
    from edge_agent.spool import PhotoSpool

    endpoints = f"ipc://{work}/d-handoff.sock", f"ipc://{work}/d-engines.sock"
    db = ResultsDB(work / "results.sqlite")
    spool = PhotoSpool(work / "queue", 1 << 30)
    heard: list[str] = []
    sender = Sender(db, spool, HandoffSection(heartbeat_s=0.2), Link(*endpoints), on_engine=heard.append)
    ctx = zmq.Context()
    router = server_socket(ctx, zmq.ROUTER, endpoints[0], None)
    router.setsockopt(zmq.SNDHWM, 0)  # a ROUTER drops what its peer cannot take yet: keep every frame, the last one included
    sender.start()
    t0 = time.perf_counter()
    try:
        router.poll(10_000)
        peer = router.recv_multipart()[0]
        for frames in _frames(rng, n):
            router.send_multipart([peer, *frames])
            while router.poll(0):
                router.recv_multipart()  # the sender's heartbeats
        router.send_multipart([peer, *encode("engine", {"version": "v1042"})])
        ok = _wait(lambda: "v1042" in heard, 600)  # after every frame before it: the queue is worked through in order
        return {
            "frames": n,
            "seconds": round(time.perf_counter() - t0, 1),
            "malformed_counted": sender.counters["malformed"],
            "alive": sender.alive(),
            "real_announcement_heard": ok,
        }
    finally:
        sender.stop()
        router.close(0)
        ctx.term()
        db.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=22)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:  # a warm-up: libraries loaded, sockets and caches made
        fuzz_trainer(Path(tmp), 500, rng)
        fuzz_daemon(Path(tmp), 500, rng)
    before = _rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = fuzz_trainer(Path(tmp), args.frames, rng)
        daemon = fuzz_daemon(Path(tmp), args.frames, rng)
    after = _rss_mb()
    result = {
        "seed": args.seed,
        "trainer": trainer,
        "daemon": daemon,
        "rss_mb_before": round(before, 1),
        "rss_mb_after": round(after, 1),
        "rss_growth_mb": round(after - before, 1),
    }
    ok = (
        trainer["alive"]
        and trainer["real_sample_stored"]
        and daemon["alive"]
        and daemon["real_announcement_heard"]
        and after - before <= 50
    )
    result["passed"] = ok
    (out / "fuzz.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "fuzz.md").write_text(
        f"# Fuzzing the hand-off sockets\n\n`python -m benchmarks.fuzz --out DIR --frames {args.frames} --seed {args.seed}`\n\n"
        "| side | frames | counted malformed | alive after | real work after | seconds |\n|---|---|---|---|---|---|\n"
        f"| trainer (receiver) | {trainer['frames']} | {trainer['malformed_counted']} | {trainer['alive']} | sample stored: {trainer['real_sample_stored']} | {trainer['seconds']} |\n"
        f"| daemon (sender) | {daemon['frames']} | {daemon['malformed_counted']} | {daemon['alive']} | announcement heard: {daemon['real_announcement_heard']} | {daemon['seconds']} |\n\n"
        f"RSS of the process running both: {before:.0f} MB before, {after:.0f} MB after ({after - before:+.0f} MB; target within 50 MB). "
        f"{'Passed.' if ok else 'FAILED.'}\n"
    )
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
