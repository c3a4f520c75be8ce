"""Engines over the wire: one trainer, several daemons, tcp:// on 127.0.0.1 with CURVE, signed versions."""

from __future__ import annotations

import os
import shutil
import socket
import time

import pytest

from benchmarks.fleet_daemons import QUICK_TRAINER
from edge_agent.config import HandoffSection, default_store_path
from edge_agent.handoff.transport import CurveKeys, Link
from edge_agent.transfer.fetcher import EngineFetcher
from edge_agent.transfer.protocol import ProtocolError, decode, encode
from engines.signing import SIGNATURE, TrustedKeys, load_or_create_key
from engines.store import MANIFEST, EngineStore
from trainer.transfer import EngineServer

from .daemon_helpers import SHIPPED, wait_until

torch = pytest.importorskip("torch", reason="publishing a second version needs the trainer")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def curve(tmp_path_factory) -> dict:
    import zmq.auth

    root = tmp_path_factory.mktemp("curve")
    for name in ("trainer", "daemon", "authorized"):
        (root / name).mkdir()
    tpub, tsec = zmq.auth.create_certificates(root / "trainer", "trainer")
    dpub, dsec = zmq.auth.create_certificates(root / "daemon", "daemon")
    shutil.copy(dpub, root / "authorized" / "daemon.key")

    def enrolled(name: str) -> CurveKeys:
        """A device's own certificate, enrolled as ``name`` (a device is its certificate)."""
        if not (root / "authorized" / f"{name}.key").exists():
            (root / name).mkdir(exist_ok=True)
            pub, _ = zmq.auth.create_certificates(root / name, name)
            tmp = root / "authorized" / f".{name}.key.tmp"  # whole or not there, as `edge-trainer device add` writes it:
            shutil.copy(pub, tmp)  # a key read half-written refuses the handshake, and a refused client never reconnects
            os.replace(tmp, root / "authorized" / f"{name}.key")
        return CurveKeys(secret=str(root / name / f"{name}.key_secret"), server_public=str(tpub))

    return {
        "server": CurveKeys(secret=str(tsec), authorized_dir=str(root / "authorized")),
        "client": CurveKeys(secret=str(dsec), server_public=str(tpub)),
        "enrolled": enrolled,
        "root": root,
    }


def publish_v2(store: EngineStore, key) -> str:
    from trainer.publish import load_weights, publish_model

    cur = store.open()
    model = load_weights(cur)
    with torch.no_grad():
        model.head.bias.add_(0.01)
    return publish_model(model, cur.classes, store.root, training={"kind": "test"}, signing_key=key).name


@pytest.fixture
def farm(tmp_path, tiny_store, signing_key, curve):
    """A trainer store holding v0001 and v0002 (signed) behind an EngineServer; daemons' stores hold v0001."""
    shutil.copytree(tiny_store, tmp_path / "trainer")
    trainer_store = EngineStore(tmp_path / "trainer")
    v2 = publish_v2(trainer_store, signing_key)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    servers, fetchers = [], []

    def server(cls=EngineServer, rollout=None, offer_every_s: float = 0.5):
        s = cls(trainer_store, Link("", "", endpoint, curve["server"]), offer_every_s=offer_every_s, rollout=rollout)
        s.start()
        servers.append(s)
        return s

    def daemon(name: str, trust=None, cls=EngineFetcher, stall_s: float = 10.0, key: str = "", **settings) -> EngineFetcher:
        root = tmp_path / name
        if not root.exists():
            shutil.copytree(tiny_store, root)
        f = cls(
            EngineStore(root),
            trust or TrustedKeys({signing_key.public_hex: "test trainer"}),
            HandoffSection(heartbeat_s=0.2, **settings),
            Link("", "", endpoint, curve["enrolled"](key or name)),
            name,
            serving=lambda: EngineStore(root).current(),
            stall_s=stall_s,
        )
        f.start()
        fetchers.append(f)
        return f

    yield type(
        "Farm", (), {"server": staticmethod(server), "daemon": staticmethod(daemon), "v2": v2, "store": trainer_store, "servers": servers}
    )
    for w in fetchers + servers:
        w.stop()


def test_every_daemon_gets_the_new_version_and_the_fleet_lists_them(farm):
    server = farm.server()
    daemons = [farm.daemon(f"device-{i}") for i in range(3)]
    for d in daemons:
        # the store names the version current before the fetcher counts it installed: wait for both
        wait_until(lambda d=d: d.store.current() == farm.v2 and d.counters["installed"] >= 1, 30, f"{d.name} on {farm.v2}")
        assert d.counters["installed"] == 1 and d.refused == {}
        d.store.open(farm.v2, trust=d.trust)  # installed whole, signature and every file verified
    wait_until(lambda: all(r["engine_version"] == farm.v2 for r in server.fleet()), 10, "fleet reports the new version")
    fleet = server.fleet()
    assert [r["name"] for r in fleet] == ["device-0", "device-1", "device-2"]
    assert all(r["address"] == "127.0.0.1" and r["last_result"]["ok"] for r in fleet)
    size = sum(m["bytes"] for m in farm.store.read_manifest(farm.v2)["files"].values())
    assert all(r["bytes_sent"] == size for r in fleet)


def staged(tmp_path, **settings):
    from edge_agent.trainer_config import RolloutSection
    from trainer.rollout import Rollout

    return Rollout(RolloutSection(**{"period_s": 1.5, "min_photos": 0, **settings}), tmp_path / "rollout.json")


def test_a_staged_rollout_gives_the_canary_the_version_first_and_the_rest_once_it_served_it(farm, tmp_path):
    server = farm.server(rollout=staged(tmp_path))
    daemons = [farm.daemon(f"device-{i}") for i in range(3)]
    wait_until(lambda: all(any(r["name"] == d.name for r in server.fleet()) for d in daemons), 10, "all three connected")
    wait_until(lambda: daemons[0].store.current() == farm.v2, 30, "the canary has it")
    served = time.time()
    assert [d.store.current() for d in daemons[1:]] == ["v0001", "v0001"]  # the rest wait
    st = server.rollout_state()
    assert st["version"] == farm.v2 and st["stage"] == "canary" and st["canaries"] == ["device-0"]  # 10 % of 3: one
    for d in daemons[1:]:
        wait_until(lambda d=d: d.store.current() == farm.v2, 30, f"{d.name} after the canary period")
    assert time.time() - served >= 1.0 and server.rollout_state()["stage"] == "all"
    assert staged(tmp_path).state["stage"] == "all"  # kept on disk: a restarted trainer does not start over


def test_a_canary_whose_clock_runs_ahead_is_timed_on_the_trainers_clock_and_the_rollout_goes_on(tmp_path):
    from types import SimpleNamespace

    rollout = staged(tmp_path, period_s=1.0)
    ahead = time.time() + 40 * 86400  # the device says it began serving forty days from now
    canary = SimpleNamespace(name="device-0", engine_version="v0002", refused={}, pinned="", report={"since": ahead}, last_result=None)
    assert not rollout.judge("v0002", {"device-0": canary}) and rollout.state["canaries"] == ["device-0"]
    time.sleep(1.2)
    assert rollout.judge("v0002", {"device-0": canary}) and rollout.state["stage"] == "all"
    (tmp_path / "b").mkdir()
    again = staged(tmp_path / "b", period_s=1.0)  # and the trainer's own clock, set back since it saw the canary serve
    assert not again.judge("v0003", {"device-0": canary}) and not again.judge("v0003", {"device-0": canary})
    canary.engine_version = "v0003"
    assert not again.judge("v0003", {"device-0": canary})
    again.state["served"]["device-0"] = time.time() + 40 * 86400
    assert not again.judge("v0003", {"device-0": canary})
    time.sleep(1.2)
    assert again.judge("v0003", {"device-0": canary})


@pytest.mark.parametrize(
    "case, reason",
    [
        ("refuses", "canary device-0: refused v0002"),
        ("errors", "canary device-0: 3 inference errors with v0002 (at most 0 allowed)"),
        ("disagrees", "agreed with the version before it on 40% of its golden photos"),
        ("rolls back", "canary device-0: refused v0002: pinned to v0001 by a rollback from v0002"),
    ],
)
def test_a_canary_that_refuses_misbehaves_or_rolls_back_stops_the_rollout_and_says_why(farm, tmp_path, case, reason):
    server = farm.server(rollout=staged(tmp_path, period_s=600))
    report = {"refuses": {}, "errors": {"errors": 3, "photos": 50}, "disagrees": {"agreement": 0.4}, "rolls back": {}}[case]
    trust = TrustedKeys({"00" * 32: "someone else"}) if case == "refuses" else None
    canary = farm.daemon("device-0", trust=trust, cls=lambda *a, **k: EngineFetcher(*a, **k, report=lambda: report))
    others = [farm.daemon(f"device-{i}") for i in (1, 2)]
    if case == "rolls back":
        wait_until(lambda: canary.store.current() == farm.v2, 30, "the canary has it")
        time.sleep(1.5)  # the trainer saw it serve v2
        canary.store.rollback("v0001", trust=canary.trust)
    wait_until(lambda: (server.rollout_state() or {}).get("stage") == "stopped", 30, "the rollout stopped")
    assert reason in server.rollout_state()["reason"]
    time.sleep(1.5)  # offers go on every 0.5 s: none to the rest
    assert [d.store.current() for d in others] == ["v0001", "v0001"] and all(d.counters["offers"] == 0 for d in others)


def test_a_version_a_device_refused_on_its_own_disk_is_reported_and_answered_with_that_reason(farm):
    """A device that refused a version it already holds (a wrong trusted key after a restart, say) tells the trainer
    in every hello, so the trainer shows why and does not offer it that version again and again."""
    why = "v0002: signed by key 3f1c2a9b..., which this device does not trust (add it to [store] trusted_keys)"
    server = farm.server()
    d = farm.daemon("wrong-key", cls=lambda *a, **k: EngineFetcher(*a, **k, refused_here=lambda: {farm.v2: why}))
    assert d.hello()["refused"] == {farm.v2: why}
    wait_until(lambda: any(r["name"] == "wrong-key" and r["refused"].get(farm.v2) == why for r in server.fleet()), 10, "the trainer knows")
    time.sleep(1.5)  # hellos every 0.2 s, offers due every 0.5 s
    assert d.counters["offers"] == 0 and server.counters["offers"] == 0 and d.store.current() == "v0001"


def test_a_daemon_that_was_offline_catches_up_with_only_the_newest(farm, signing_key):
    v3 = publish_v2(farm.store, signing_key)  # v0002 and v0003 published while the daemon was away
    farm.server()
    d = farm.daemon("late")
    wait_until(lambda: d.store.current() == v3 and d.counters["installed"] >= 1, 30, "caught up")  # counted after
    assert farm.v2 not in d.store.versions() and d.counters["installed"] == 1


def test_a_local_rollback_stays_until_a_newer_version_arrives(farm, signing_key):
    """The trainer keeps offering its newest version; a device rolled back from it is pinned and refuses it (the
    fleet lists why) until a version newer than the one it left is published, which lifts the pin."""
    server = farm.server()
    d = farm.daemon("pinned")
    wait_until(lambda: d.store.current() == farm.v2, 30, "on v2")
    d.store.rollback("v0001", trust=d.trust)
    assert d.store.pin()["from"] == farm.v2
    wait_until(lambda: farm.v2 in d.refused, 10, "the offer of v2 refused")
    time.sleep(2)  # several more offers (every 0.5 s): still on v0001
    assert d.store.current() == "v0001" and "pinned to v0001" in d.refused[farm.v2]
    wait_until(lambda: "pinned" in str(next(r for r in server.fleet() if r["name"] == "pinned").get("refused")), 10, "fleet shows the pin")
    v3 = publish_v2(farm.store, signing_key)
    wait_until(lambda: d.store.current() == v3, 30, "a newer version moves it")
    assert d.store.pin() is None


def test_an_offer_never_moves_a_device_back(farm):
    """A replayed old offer (or a forged one: the daemon never reads its signature for a version it holds) of a
    version older than the one in service is refused."""
    farm.server()
    d = farm.daemon("forward-only")
    wait_until(lambda: d.store.current() == farm.v2, 30, "on v2")
    farm.servers[0].stop()
    manifest = (d.store.root / "v0001" / "manifest.json").read_bytes()

    sent = []
    d._send = lambda sock, frames: sent.append(decode(frames))
    d._on_offer(None, "v0001", "not-a-signature", manifest)
    assert d.store.current() == farm.v2 and "never move a device back" in d.refused["v0001"]
    assert sent[-1].kind == "result" and sent[-1].header["ok"] is False
    d._on_offer(None, farm.v2, "not-a-signature", b"{}")  # the version in service: nothing to do, nothing refused
    assert d.store.current() == farm.v2 and farm.v2 not in d.refused


class DyingFetcher(EngineFetcher):
    """Dies (like kill -9: no cleanup, the partial files stay in .incoming) after its fifth chunk."""

    def _on_chunk(self, sock, header, data):
        if self.counters["chunks"] >= 5:
            self._stop.set()
            return
        super()._on_chunk(sock, header, data)


def test_a_transfer_cut_in_the_middle_resumes(farm):
    farm.server()
    first = farm.daemon("cut", cls=DyingFetcher, transfer_chunk_kb=64, transfer_window=1)
    wait_until(lambda: first._stop.is_set(), 30, "part of the transfer, then death")
    first._thread.join(10)
    done_before = first.counters["bytes"]
    assert first.store.current() == "v0001"
    again = farm.daemon("cut", transfer_chunk_kb=64, transfer_window=1)
    wait_until(lambda: again.store.current() == farm.v2, 30, "resumed transfer done")
    size = sum(m["bytes"] for m in farm.store.read_manifest(farm.v2)["files"].values())
    assert again.counters["resumed_bytes"] > 0 and again.counters["bytes"] <= size - again.counters["resumed_bytes"] + 64 * 1024
    assert done_before + again.counters["bytes"] < 2 * size  # not started over
    again.store.open(farm.v2, trust=again.trust)


class GoneOnOffer(EngineFetcher):
    """Stops as an offer arrives, before answering it (a daemon restarted just then)."""

    def _on_offer(self, sock, version, signature, manifest):
        self.counters["offers"] += 1
        self._stop.set()


def test_a_daemon_restarted_just_after_an_offer_is_offered_again_on_its_new_connection_at_once(farm):
    """An offer made on a connection that then closed went nowhere: the next hello, on the new connection, gets it
    at once, not once the server's pause between offers of the same version to a device has passed."""
    farm.server(offer_every_s=60.0)
    first = farm.daemon("restarted", cls=GoneOnOffer)
    wait_until(lambda: first._stop.is_set(), 30, "offered, then gone")
    first._thread.join(10)
    again = farm.daemon("restarted")
    wait_until(lambda: again.store.current() == farm.v2, 10, "offered again on its new connection")


class DyingServer(EngineServer):
    """Stops answering (a trainer restarting) after its fifth chunk."""

    def _serve(self, router, identity, h):
        if self.counters["chunks"] >= 5:
            self._stop.set()
            return
        super()._serve(router, identity, h)


def test_a_transfer_survives_a_restart_of_the_trainer(farm):
    dying = farm.server(DyingServer)
    d = farm.daemon("patient", transfer_chunk_kb=64, transfer_window=2, stall_s=1.0)
    wait_until(lambda: dying._stop.is_set(), 30, "the trainer goes away mid-transfer")
    dying._thread.join(10)
    assert d.store.current() == "v0001"
    farm.server()  # back on the same address
    wait_until(lambda: d.store.current() == farm.v2, 30, "transfer finished after the restart")
    assert d.counters["stalls"] >= 1
    size = sum(m["bytes"] for m in farm.store.read_manifest(farm.v2)["files"].values())
    assert d.counters["bytes"] < size + 4 * 64 * 1024  # carried on from where it was, nothing fetched twice over


class AlteringServer(EngineServer):
    def _payload(self, data: bytes, request: dict) -> bytes:
        if request["file"] == "model.onnx" and request["offset"] == 0:
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data


def test_a_chunk_altered_in_flight_is_refused_and_the_engine_stays(farm):
    server = farm.server(AlteringServer)
    d = farm.daemon("victim")
    wait_until(lambda: farm.v2 in d.refused, 30, "refusal")
    assert "altered in transit" in d.refused[farm.v2]
    assert d.store.current() == "v0001" and farm.v2 not in d.store.versions()
    assert not d.store.incoming(farm.v2).exists()
    wait_until(lambda: farm.v2 in server.fleet()[0]["refused"], 10, "the trainer knows")


@pytest.mark.parametrize("case, reason", [("bad signature", "does not match its manifest"), ("untrusted key", "does not trust")])
def test_a_version_with_a_bad_or_untrusted_signature_is_refused_before_any_byte(farm, tmp_path, case, reason):
    vdir = farm.store.root / farm.v2
    if case == "bad signature":
        m = (vdir / MANIFEST).read_text().replace('"kind": "test"', '"kind": "evil"')
        (vdir / MANIFEST).write_text(m)
        trust = None
    else:
        trust = TrustedKeys({load_or_create_key(tmp_path / "other.key").public_hex: "someone else"})
    farm.server()
    d = farm.daemon("careful", trust=trust)
    wait_until(lambda: farm.v2 in d.refused, 30, "refusal")
    assert reason in d.refused[farm.v2]
    assert d.counters["chunks"] == 0 and d.store.current() == "v0001"


def test_an_unsigned_version_is_not_offered(farm):
    (farm.store.root / farm.v2 / SIGNATURE).unlink()
    server = farm.server()
    d = farm.daemon("waiting")
    wait_until(lambda: server.counters["hellos"] >= 3, 10, "hellos")
    assert server.counters["offers"] == 0 and d.store.current() == "v0001"


def test_garbage_frames_are_counted_not_fatal(farm, curve):
    import zmq

    from edge_agent.handoff.transport import client_socket

    server = farm.server()
    ctx = zmq.Context()
    sock = client_socket(ctx, zmq.DEALER, server.link.transfer, curve["client"])
    try:
        time.sleep(0.3)
        for frames in (
            [b"junk"],
            [b"EDGEX1", b"fetch", b"{not json"],
            encode("fetch", {"version": "v0002", "file": "../x", "offset": 0, "length": 1})[:2] + [b"{}"],
        ):
            sock.send_multipart(frames)
        sock.send_multipart(encode("fetch", {"version": farm.v2, "file": "model.onnx", "offset": 0, "length": 10}))
        assert sock.poll(5000)
        reply = decode(sock.recv_multipart())
        assert reply.kind == "missing" and "not offered" in reply.header["reason"]  # chunks only of a version it was offered
        sock.send_multipart(encode("hello", {"name": "daemon", "engine_version": "v0001", "queue": 0, "refused": {}}))
        assert sock.poll(5000) and decode(sock.recv_multipart()).kind == "offer"
        sock.send_multipart(encode("fetch", {"version": farm.v2, "file": "secret.txt", "offset": 0, "length": 10}))
        assert sock.poll(5000)
        reply = decode(sock.recv_multipart())
        assert reply.kind == "missing" and "no file" in reply.header["reason"]
        wait_until(lambda: server.counters["malformed"] >= 3, 10, "malformed counted")
    finally:
        sock.close(0)
        ctx.term()
    d = farm.daemon("after-garbage")
    wait_until(lambda: d.store.current() == farm.v2, 30, "still serving")


def test_the_protocol_refuses_what_it_must():
    for frames, why in (
        (encode("fetch", {"version": "v0002", "file": "model.onnx", "offset": -1, "length": 5}), "'offset' outside"),
        (encode("fetch", {"version": "v0002", "file": "../../etc/passwd", "offset": 0, "length": 5}), "'file' is not a valid"),
        (encode("fetch", {"version": "latest", "file": "model.onnx", "offset": 0, "length": 5}), "'version' is not a valid"),
        (encode("fetch", {"version": "v0002", "file": "model.onnx", "offset": 0, "length": 10**9}), "'length' outside"),
        (encode("chunk", {"version": "v0002", "file": "model.onnx", "offset": 0}), "without payload"),
        (encode("result", {"version": "v0002", "ok": 1, "reason": ""}), "wrong type"),
    ):
        with pytest.raises(ProtocolError, match=why):
            decode(frames)


# ---- the whole farm as processes ---------------------------------------------------


@pytest.mark.both_cores
@pytest.mark.slow
def test_three_daemons_one_trainer_over_tcp_curve(plantvillage, tmp_path, curve):
    """Three daemons (their own state directories) and one trainer on 127.0.0.1 with CURVE: photos dropped into each
    inbox, a retrain, and every daemon answers with the new version; one stopped during the publish catches up. What
    travels is measured, not the model: every one starts on the first release (daemon_helpers.first_release_store)."""
    import json
    import subprocess
    import sys

    from .daemon_helpers import FIRST_RELEASE_NEXT, REPO, DaemonProc, TrainerProc, db_rows, first_release_store, make_labelled, split_photos

    ports = {k: free_port() for k in ("handoff", "announce", "delivery")}
    endpoints = {
        "endpoint": f"tcp://127.0.0.1:{ports['handoff']}",
        "announce_endpoint": f"tcp://127.0.0.1:{ports['announce']}",
        "transfer_endpoint": f"tcp://127.0.0.1:{ports['delivery']}",
        "heartbeat_s": 0.3,
        "ack_timeout_s": 1.0,
    }
    trainer_state = tmp_path / "trainer-host"
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "keys", "--out", str(tmp_path / "keys"), "--state-dir", str(trainer_state)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
    trainer_pub = out.split("file:")[1].split()[0]
    stores = [first_release_store(tmp_path / f"engines-{i}") for i in range(4)]  # the trainer's, then each device's
    known = set(EngineStore(stores[0]).open().classes)  # the folder may hold classes the model lacks
    labelled, _ = split_photos(plantvillage, labelled_per_class=5)  # a small gate: the delivery is measured, not learning
    labelled_dir = make_labelled(tmp_path, {c: p for c, p in labelled.items() if c in known})
    t = TrainerProc(
        trainer_state,
        {
            "handoff": {**endpoints, "curve_secret_key": curve["server"].secret, "curve_authorized_dir": curve["server"].authorized_dir},
            "trainer": {**QUICK_TRAINER, "retrain_threshold": 30, "labelled_data": str(labelled_dir)},
            "rollout": {"period_s": 0, "min_photos": 0},  # staged (a canary first), without the wait
            "store": {"path": str(stores[0])},
        },
    ).start()

    def device(i: int) -> DaemonProc:
        return DaemonProc(
            tmp_path / f"device-{i}",
            {
                "handoff": {
                    **endpoints,
                    "curve_secret_key": curve["enrolled"](f"device-{i}").secret,
                    "curve_server_key": curve["client"].server_public,
                },
                "store": {"trusted_keys": [trainer_pub], "path": str(stores[1 + i])},
                "hotswap": {"poll_s": 0.5},
            },
        )

    daemons = []
    photos = [p for p in sorted(plantvillage.glob("*/*.jpg")) if p.parent.name in known][::37]
    try:
        for i in range(3):
            daemons.append(device(i).start())
            daemons[-1].wait_ready()
        for i, d in enumerate(daemons):
            for j, p in enumerate(photos[i::3][:14]):
                shutil.copy(p, d.inbox / f"{i}-{j}.jpg")
        wait_until(lambda: t.logged("retrain_due"), 120, "enough samples from the three daemons for a retrain")
        assert daemons[2].terminate() == 0  # away while the new version is published
        wait_until(lambda: t.logged("retrain_published"), 240, "the retrain published")
        for d in daemons[:2]:
            wait_until(lambda d=d: '"engine_swapped"' in d.log_path.read_text(), 60, f"{d.state.name} swapped")
            shutil.copy(photos[-1], d.inbox / "after.jpg")
            wait_until(
                lambda d=d: db_rows(d.state, "SELECT engine_version FROM results WHERE path LIKE '%after.jpg'") == [(FIRST_RELEASE_NEXT,)],
                30,
                f"{d.state.name} answers with {FIRST_RELEASE_NEXT}",
            )
        late = device(2).start()
        daemons[2] = late
        late.wait_ready()
        wait_until(lambda: '"engine_swapped"' in late.log_path.read_text().split('"event": "ready"')[-1], 60, "the late one catches up")
        fleet = json.loads(
            subprocess.run(
                [sys.executable, "-m", "trainer", "fleet", "--json", "--config", str(t.config_path), "--state-dir", str(trainer_state)],
                capture_output=True,
                text=True,
                cwd=REPO,
            ).stdout
        )
        assert sorted(r["name"] for r in fleet) == ["device-0", "device-1", "device-2"]
        assert all(r["address"] == "127.0.0.1" for r in fleet)
        assert sum(r["samples_received"] for r in fleet) >= 30
        wait_until(
            lambda: all(
                r["engine_version"] == FIRST_RELEASE_NEXT
                for r in json.loads(
                    subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "trainer",
                            "fleet",
                            "--json",
                            "--config",
                            str(t.config_path),
                            "--state-dir",
                            str(trainer_state),
                        ],
                        capture_output=True,
                        text=True,
                        cwd=REPO,
                    ).stdout
                )
            ),
            20,
            f"the fleet list shows everyone on {FIRST_RELEASE_NEXT}",
        )
        for d in daemons:
            assert d.terminate() == 0
        assert t.terminate() == 0
    finally:
        for proc in (*daemons, t):
            if proc.proc and proc.proc.poll() is None:
                proc.proc.kill()


class SlowServer(EngineServer):
    """Answers each chunk after a pause, so a transfer lasts long enough to kill the daemon in the middle of it."""

    def _payload(self, data: bytes, request: dict) -> bytes:
        time.sleep(0.01)
        return data


@pytest.mark.slow
def test_kill_9_of_the_daemon_mid_transfer_resumes_without_starting_over(tmp_path, signing_key, curve):
    import json

    from .daemon_helpers import DaemonProc

    shutil.copytree(default_store_path(), tmp_path / "trainer")
    trainer_store = EngineStore(tmp_path / "trainer")
    v2 = publish_v2(trainer_store, signing_key)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = SlowServer(trainer_store, Link("", "", endpoint, curve["server"]), offer_every_s=0.5)
    server.start()
    unused = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]  # no trainer hand-off in this test
    config = {
        "handoff": {
            "endpoint": unused[0],
            "announce_endpoint": unused[1],
            "transfer_endpoint": endpoint,
            "curve_secret_key": curve["client"].secret,
            "curve_server_key": curve["client"].server_public,
            "heartbeat_s": 0.3,
            "transfer_chunk_kb": 64,  # the shipped engine is ~30 MB: small enough chunks to kill it mid-way, not to crawl
            "transfer_window": 1,
            "name": "kill-me",
        },
        "store": {"trusted_keys": [signing_key.public_hex]},
        "hotswap": {"poll_s": 0.5},
    }
    state = tmp_path / "device"
    incoming = state / "engines" / ".incoming" / v2
    d = DaemonProc(state, config).start()
    try:
        d.wait_ready()
        wait_until(
            lambda: incoming.is_dir() and sum(f.stat().st_size for f in incoming.glob("model*")) > 256 * 1024,
            60,
            "part of the engine on disk",
        )
        d.kill()  # SIGKILL in the middle of the transfer
        partial = sum(f.stat().st_size for f in incoming.glob("model*"))
        size = sum(m["bytes"] for m in trainer_store.read_manifest(v2)["files"].values())
        assert 0 < partial < size and EngineStore(state / "engines").current() == SHIPPED
        sent_before = server.counters["bytes"]
        d = DaemonProc(state, config).start()
        d.wait_ready()
        wait_until(lambda: '"engine_swapped"' in d.log_path.read_text(), 120, "the engine, after the restart")
        resumed = [e for e in d.events() if e.get("event") == "transfer_resumed"]
        assert resumed and resumed[-1]["bytes_on_disk"] > 0
        assert server.counters["bytes"] - sent_before <= size - resumed[-1]["bytes_on_disk"] + 128 * 1024  # not started over
        EngineStore(state / "engines").open(v2, trust=TrustedKeys({signing_key.public_hex: "test"}))
        wait_until(lambda: json.loads((state / "status.json").read_text())["engine"]["engine_version"] == v2, 10, "status")
        assert d.terminate() == 0
    finally:
        if d.proc and d.proc.poll() is None:
            d.proc.kill()
        server.stop()


class FlakyFetcher(EngineFetcher):
    """Its first offer fails inside the handler (a bug, an I/O error)."""

    failed = False

    def _on_offer(self, sock, version, signature, manifest):
        if not FlakyFetcher.failed:
            FlakyFetcher.failed = True
            raise OSError("simulated failure while handling an offer")
        super()._on_offer(sock, version, signature, manifest)


def test_a_message_that_fails_in_its_handler_does_not_stop_the_fetcher(farm):
    farm.server()
    d = farm.daemon("flaky", cls=FlakyFetcher)
    wait_until(lambda: d.store.current() == farm.v2, 30, "installed at the next offer")
    assert FlakyFetcher.failed and d.alive() and d.counters["errors"] == 1


def test_a_hello_in_another_devices_name_is_refused_and_invented_names_make_no_rows(farm, curve):
    """A device is its certificate: it cannot speak for an enrolled device (refuse a version, claim a version in
    service), and ten thousand invented names from one key are one row, the key's."""
    import zmq

    from edge_agent.handoff.transport import client_socket

    curve["enrolled"]("greenhouse")
    server = farm.server()
    posing = farm.daemon("greenhouse", key="thief", cls=lambda *a, **k: EngineFetcher(*a, **k, refused_here=lambda: {farm.v2: "no"}))
    wait_until(lambda: server.counters["refused"] >= 3, 10, "the hellos in greenhouse's name refused")
    assert all(r["name"] != "greenhouse" for r in server.fleet()) and posing.counters["offers"] == 0
    posing.stop()
    ctx = zmq.Context()
    sock = client_socket(ctx, zmq.DEALER, server.link.transfer, curve["enrolled"]("inventor"))
    sock.setsockopt(zmq.SNDTIMEO, 30_000)  # a connection refused fails here, not at the suite's 300 s timeout
    try:
        started = time.monotonic()
        for i in range(10_000):
            sock.send_multipart(encode("hello", {"name": f"made-up-{i}", "engine_version": "v0001", "queue": 0, "refused": {}}))
        wait_until(lambda: server.counters["hellos"] >= 10_000, 30, "every hello handled")
        took = time.monotonic() - started
    finally:
        sock.close(0)
        ctx.term()
    assert sorted(r["name"] for r in server.fleet()) == ["inventor"], took
    assert len(server.fleet()) == 1


def test_a_revoked_device_that_stays_connected_is_offered_nothing_more_and_listed_as_revoked(farm, curve, signing_key):
    """The stolen device holds its connection open: from the revoke on it gets no offer, no chunk, its hellos
    are refused, and the fleet list says revoked; the others get the next version."""
    server = farm.server()
    stolen = farm.daemon("stolen", cls=lambda *a, **k: EngineFetcher(*a, **k, refused_here=lambda: {farm.v2: "kept on v0001"}))
    other = farm.daemon("other")
    wait_until(lambda: {r["name"] for r in server.fleet()} == {"stolen", "other"}, 10, "both connected")
    wait_until(lambda: other.store.current() == farm.v2, 30, "the other one on v2")
    (curve["root"] / "revoked").mkdir(exist_ok=True)
    os.replace(curve["root"] / "authorized" / "stolen.key", curve["root"] / "revoked" / "stolen.key")
    wait_until(lambda: next(r for r in server.fleet() if r["name"] == "stolen")["revoked"], 5, "the fleet says revoked")
    offers = stolen.counters["offers"]
    v3 = publish_v2(farm.store, signing_key)
    server.announce(v3)
    wait_until(lambda: other.store.current() == v3, 30, "the other one gets v3")
    time.sleep(1.0)
    assert stolen.counters["offers"] == offers and v3 not in stolen.store.versions()
    # refused either way: its messages on the open connection, or, once the revoke dropped it, its CURVE handshake
    # on reconnecting (which of the two comes first is the scheduler's; the full suite once saw only the second)
    assert server.counters["refused"] > 0 or server.handshakes_refused()
