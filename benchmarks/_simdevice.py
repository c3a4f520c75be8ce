"""Lightweight simulated devices for ``benchmarks.fleet``: many DEALER sockets in one process, each a device that
speaks the real engine-transfer protocol over tcp:// with its own CURVE certificate (hello every heartbeat, the
offer's signature checked, chunks fetched with a window, every file's sha256 checked), holding nothing on disk.

``python -m benchmarks._simdevice --spec SPEC.json --out OUT.jsonl``: one JSON line per device once it serves the
offered version (name, when it connected, was offered, finished; bytes), until ``SPEC.stop`` exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import tempfile
import time
from pathlib import Path


class _Dev:
    def __init__(self, name: str, sock) -> None:
        self.name, self.sock = name, sock
        self.version = "v1000"
        self.next_hello = 0.0
        self.job = None  # (version, files [(name, size, sha)], {file: hasher}, {file: next offset}, outstanding, t_offer)
        self.done = False


def main(argv: list[str] | None = None) -> int:
    import zmq

    from edge_agent.handoff.transport import CurveKeys, client_socket
    from edge_agent.transfer.protocol import decode, encode
    from engines.signing import TrustedKeys

    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    spec = json.loads(Path(a.spec).read_text())
    trust = TrustedKeys({spec["trusted"]: "the trainer"})
    chunk, window, hb = spec.get("chunk", 1 << 20), spec.get("window", 4), spec.get("heartbeat_s", 2.0)
    ctx = zmq.Context()
    ctx.MAX_SOCKETS = 16384
    devs = {}
    for d in spec["devices"]:
        sock = client_socket(ctx, zmq.DEALER, spec["endpoint"], CurveKeys(d["secret"], server_public=spec["server_key"]))
        dev = _Dev(d["name"], sock)
        dev.version = spec.get("version", "v1000")
        dev.next_hello = time.monotonic() + random.random() * hb  # devices do not start in step
        devs[sock] = dev
    poller = zmq.Poller()
    for sock in devs:
        poller.register(sock, zmq.POLLIN)
    verified: dict[tuple, bool] = {}
    out = open(a.out, "a", buffering=1)
    stop = Path(a.spec).with_suffix(".stop")
    tmp = Path(tempfile.mkdtemp(prefix="simdev-"))

    def fill(dev: _Dev) -> None:
        version, files, _, nxt, outstanding, _ = dev.job
        for name, size, _ in files:
            while len(outstanding) < window and nxt[name] < size:
                off = nxt[name]
                n = min(chunk, size - off)
                try:
                    dev.sock.send_multipart(encode("fetch", {"version": version, "file": name, "offset": off, "length": n}), zmq.NOBLOCK)
                except zmq.Again:
                    return
                outstanding.append((name, off, n))
                nxt[name] = off + n
            if len(outstanding) >= window:
                return

    while not stop.exists():
        now = time.monotonic()
        for dev in devs.values():
            if now >= dev.next_hello:
                dev.next_hello = now + hb
                hello = {"name": dev.name, "engine_version": dev.version, "queue": 0, "refused": {}}
                try:
                    dev.sock.send_multipart(encode("hello", hello), zmq.NOBLOCK)
                except zmq.Again:
                    pass
        for sock, _ in poller.poll(100):
            dev = devs[sock]
            for _ in range(64):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                msg = decode([f.bytes for f in frames])
                h = msg.header
                if msg.kind == "offer" and dev.job is None and h["version"] != dev.version:
                    key = (h["version"], h["signature"])
                    if key not in verified:  # the real check, once per version (every device would do the same)
                        vdir = tmp / h["version"]
                        vdir.mkdir(exist_ok=True)
                        (vdir / "manifest.json").write_bytes(msg.payload)
                        (vdir / "manifest.sig").write_text(h["signature"])
                        trust.check(vdir, msg.payload)
                        verified[key] = True
                    doc = json.loads(msg.payload)
                    files = [(n, int(m["bytes"]), m["sha256"]) for n, m in doc["files"].items()]
                    dev.job = (
                        h["version"],
                        files,
                        {n: hashlib.sha256() for n, _, _ in files},
                        {n: 0 for n, _, _ in files},
                        [],
                        time.time(),
                    )
                    fill(dev)
                elif msg.kind == "chunk" and dev.job is not None:
                    version, files, hashers, nxt, outstanding, t_offer = dev.job
                    name, off, n = outstanding.pop(0)
                    assert (h["file"], h["offset"]) == (name, off), "chunks arrive in the order asked"
                    hashers[name].update(msg.payload)
                    fill(dev)
                    if not outstanding and all(nxt[f] >= size for f, size, _ in files):
                        bad = [f for f, _, sha in files if hashers[f].hexdigest() != sha]
                        ok = not bad
                        sock.send_multipart(
                            encode("result", {"version": version, "ok": ok, "reason": "installed" if ok else f"sha256 of {bad}"})
                        )
                        if ok:
                            dev.version = version
                            dev.next_hello = 0.0  # tell the trainer at once what it serves
                        out.write(
                            json.dumps(
                                {
                                    "name": dev.name,
                                    "version": version,
                                    "ok": ok,
                                    "offered": t_offer,
                                    "done": time.time(),
                                    "bytes": sum(s for _, s, _ in files),
                                }
                            )
                            + "\n"
                        )
                        dev.job = None
    for sock in devs:
        sock.close(0)
    ctx.term()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
