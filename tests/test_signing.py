"""Signed engine versions: the trainer signs what it publishes, a daemon serves only what a trusted key signed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edge_agent.config import ConfigError, parse_config
from edge_agent.daemon import Daemon
from edge_agent.systemd import Notifier
from engines.signing import PROJECT_KEY, SIGNATURE, TrustedKeys, UntrustedVersion, load_or_create_key, read_public_key
from engines.store import MANIFEST, EngineStore

from .conftest import trusted_store
from .daemon_helpers import wait_until

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path, tiny_store) -> EngineStore:
    shutil.copytree(tiny_store, tmp_path / "store")
    return EngineStore(tmp_path / "store")


def test_a_signed_version_verifies_and_names_its_signer(store, signing_key):
    trust = TrustedKeys({signing_key.public_hex: "test trainer"})
    assert trust.check(store.root / "v0001") == "test trainer"
    assert store.open(trust=trust).name == "v0001"


@pytest.mark.parametrize(
    "damage, reason",
    [("manifest", "does not match its manifest"), ("unsigned", "not signed"), ("garbled", "malformed"), ("other key", "does not trust")],
)
def test_what_is_refused_and_why(store, signing_key, tmp_path, damage, reason):
    vdir = store.root / "v0001"
    if damage == "manifest":  # a file swapped and its new sha256 written into the manifest: the signature catches it
        m = json.loads((vdir / MANIFEST).read_text())
        m["files"]["model.onnx"]["sha256"] = "0" * 64
        (vdir / MANIFEST).write_text(json.dumps(m))
    elif damage == "unsigned":
        (vdir / SIGNATURE).unlink()
    elif damage == "garbled":
        (vdir / SIGNATURE).write_text("{not json")
    else:
        other = load_or_create_key(tmp_path / "other.key")
        from engines.signing import sign_manifest

        (vdir / SIGNATURE).write_bytes(sign_manifest((vdir / MANIFEST).read_bytes(), other))
    with pytest.raises(UntrustedVersion, match=reason):
        store.open(trust=TrustedKeys({signing_key.public_hex: "test trainer"}))


def test_keys_are_private_files_and_reload(tmp_path):
    key = load_or_create_key(tmp_path / "k" / "signing.key")
    assert (tmp_path / "k" / "signing.key").stat().st_mode & 0o777 == 0o600
    assert read_public_key(tmp_path / "k" / "signing.pub") == key.public_hex
    assert load_or_create_key(tmp_path / "k" / "signing.key").public_hex == key.public_hex
    (tmp_path / "bad.key").write_text("hello")
    with pytest.raises(ValueError, match="not an edge-agent signing key"):
        load_or_create_key(tmp_path / "bad.key")


def test_the_shipped_model_is_signed_by_the_project():
    from edge_agent.config import default_store_path

    trust = TrustedKeys.default()
    assert PROJECT_KEY.is_file() and len(trust.keys) == 2  # the release key, and the earlier key for what it signed
    assert trust.check(default_store_path() / "v1000") == "the edge-agent project (release key)"
    assert (
        read_public_key(PROJECT_KEY) == (REPO.parent / "shared/release/edge-agent-release.pub").read_text().strip()
        or not (REPO.parent / "shared/release").is_dir()
    )


def test_a_bad_trusted_key_is_a_clear_error(tmp_path):
    from edge_agent.trust import daemon_trust

    cfg = parse_config({"store": {"trusted_keys": ["not-a-key"]}})
    with pytest.raises(ValueError, match="trusted key 'not-a-key'"):
        daemon_trust(cfg, tmp_path)
    with pytest.raises(ConfigError, match="trusted_keys"):
        parse_config({"store": {"trusted_keys": "abc"}})


def test_a_photo_or_an_endless_file_given_as_a_trusted_key_stops_the_daemon_with_one_line_not_a_traceback(tmp_path, capsys):
    from edge_agent.cli import main
    from edge_agent.trust import daemon_trust
    from engines.errors import EdgeAgentError

    photo = next((REPO / "samples").glob("*.jpg"))
    for key in (photo, Path("/dev/zero")):  # binary: a decoding error before; endless: the memory filled before
        cfg = parse_config({"store": {"trusted_keys": [str(key)]}})
        with pytest.raises(EdgeAgentError, match=f"\\[store\\] trusted_keys: {key}: not an edge-agent public key"):
            daemon_trust(cfg, tmp_path)
    config = tmp_path / "farm.toml"
    config.write_text(f'[store]\ntrusted_keys = ["{photo}"]\n')
    assert main(["--config", str(config), "run", "--state-dir", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err
    assert "not an edge-agent public key" in err and "Traceback" not in err


def _daemon(tmp_path, store_cfg: dict):
    cfg = parse_config({"store": store_cfg, "handoff": {"enabled": False}, "hotswap": {"poll_s": 0.2}, "inbox": {"settle_s": 0.1}})
    daemon = Daemon(cfg, tmp_path / "state", notifier=Notifier({}))
    t = threading.Thread(target=daemon.run)
    t.start()
    wait_until(lambda: daemon.watcher is not None, 30, "daemon up")
    return daemon, t


def _republish(store: EngineStore, key) -> str:
    from trainer.publish import load_weights, publish_model

    cur = store.open()
    return publish_model(load_weights(cur), cur.classes, store.root, training={"kind": "test"}, signing_key=key).name


def test_daemon_refuses_a_version_from_an_untrusted_key_and_keeps_serving(store, signing_key, tmp_path):
    daemon, t = _daemon(tmp_path, trusted_store(store.root, signing_key))
    try:
        stranger = load_or_create_key(tmp_path / "stranger.key")
        v2 = _republish(store, stranger)
        wait_until(lambda: v2 in daemon.watcher.refused, 20, "refusal")
        assert "does not trust" in daemon.watcher.refused[v2]
        assert daemon.pipeline.classifier.engine.engine_version == "v0001"
        assert v2 in daemon.status()["hotswap"]["refused"]

        def cli_status() -> str:
            return subprocess.run(
                [sys.executable, "-m", "edge_agent", "status", "--state-dir", str(tmp_path / "state")],
                capture_output=True,
                text=True,
                cwd=REPO,
            ).stdout

        wait_until(lambda: f"REFUSED engine {v2}: {v2}: signed by key" in cli_status(), 20, "status says why")
        v3 = _republish(store, signing_key)  # the trusted trainer's next version is taken
        wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == v3, 30, "swap to the trusted version")
    finally:
        daemon.request_stop()
        t.join(30)


def test_daemon_starts_on_the_newest_trusted_version_when_current_is_not(store, signing_key, tmp_path):
    stranger = load_or_create_key(tmp_path / "stranger.key")
    v2 = _republish(store, stranger)
    assert store.current() == v2
    daemon, t = _daemon(tmp_path, trusted_store(store.root, signing_key))
    try:
        assert daemon.pipeline.classifier.engine.engine_version == "v0001"
        assert "does not trust" in daemon.status()["hotswap"]["refused"][v2]
    finally:
        daemon.request_stop()
        t.join(30)


def test_unsigned_versions_are_served_only_when_signatures_are_not_required(store, signing_key, tmp_path):
    (store.root / "v0001" / SIGNATURE).unlink()
    from engines.store import StoreError

    cfg = parse_config({"store": trusted_store(store.root, signing_key), "handoff": {"enabled": False}})
    with pytest.raises(StoreError, match="no version .* can be served: v0001: not signed"):
        Daemon(cfg, tmp_path / "state", notifier=Notifier({})).run()
    daemon, t = _daemon(tmp_path / "b", {"path": str(store.root), "require_signature": False})
    try:
        assert daemon.pipeline.classifier.engine.engine_version == "v0001"
    finally:
        daemon.request_stop()
        t.join(30)


def test_a_daemon_trusts_the_trainer_on_its_own_state_directory_without_being_told(tmp_path):
    """No configuration: the trainer makes its key (``keys``, or its first start), the daemon on that state directory
    trusts it. ``signing-key`` only shows it: where there is none it says where it looked and makes nothing."""
    from edge_agent.trust import daemon_trust

    state = tmp_path / "state"
    none = subprocess.run(
        [sys.executable, "-m", "trainer", "signing-key", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO
    )
    assert none.returncode == 2 and f"no engine-signing key at {state}/trainer/signing.key" in none.stderr and "--state-dir" in none.stderr
    assert not state.exists()  # nothing made in the wrong place
    subprocess.run(
        [sys.executable, "-m", "trainer", "keys", "--out", str(tmp_path / "keys"), "--state-dir", str(state)],
        capture_output=True,
        cwd=REPO,
        check=True,
    )
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "signing-key", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout
    public = out.split("public key:")[1].split()[0]
    assert (state / "trainer" / "signing.key").stat().st_mode & 0o777 == 0o600
    trust = daemon_trust(parse_config({}), state)
    assert public in trust.keys and read_public_key(PROJECT_KEY) in trust.keys
    assert daemon_trust(parse_config({"store": {"require_signature": False}}), state) is None


def test_edge_trainer_sign_signs_a_verified_version(store, tmp_path):
    (store.root / "v0001" / SIGNATURE).unlink()
    key = tmp_path / "release.key"
    subprocess.run(
        [sys.executable, "-m", "trainer", "sign", "--key", str(key), "--store", str(store.root)], cwd=REPO, check=True, capture_output=True
    )
    trust = TrustedKeys({read_public_key(key.with_suffix(".pub")): "release"})
    assert trust.check(store.root / "v0001") == "release"
    (store.root / "v0001" / "model.onnx").write_bytes(b"tampered")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "sign", "--key", str(key), "--store", str(store.root)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "does not match manifest" in proc.stderr  # nothing is vouched for unverified


def test_a_refused_unsigned_version_is_served_once_its_trainer_signs_it(store, signing_key, tmp_path):
    """Upgrade: the daemon starts before the trainer has signed its older versions; it takes them once signed."""
    from trainer.publish import load_weights, publish_model

    cur = store.open()
    v2 = publish_model(load_weights(cur), cur.classes, store.root, training={"kind": "test"}).name  # unsigned
    daemon, t = _daemon(tmp_path, trusted_store(store.root, signing_key))
    try:
        assert daemon.pipeline.classifier.engine.engine_version == "v0001" and "not signed" in daemon.watcher.refused[v2]
        subprocess.run(
            [sys.executable, "-m", "trainer", "sign", "--key", str(signing_key.path), "--store", str(store.root), "--version", v2],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == v2, 30, "the newly signed version")
        assert v2 not in daemon.status()["hotswap"]["refused"]
    finally:
        daemon.request_stop()
        t.join(30)


def test_a_state_directory_seeded_before_signing_adopts_the_shipped_signature(tmp_path):
    from edge_agent.config import default_store_path
    from edge_agent.upgrade import adopt_shipped_signatures

    shutil.copytree(default_store_path(), tmp_path / "engines")
    v = EngineStore(default_store_path()).current()
    (tmp_path / "engines" / v / SIGNATURE).unlink()
    assert adopt_shipped_signatures(EngineStore(tmp_path / "engines"), default_store_path()) == [v]
    assert TrustedKeys.default().check(tmp_path / "engines" / v) == "the edge-agent project (release key)"
    m = json.loads((tmp_path / "engines" / v / MANIFEST).read_text())  # a different manifest: nothing adopted
    (tmp_path / "engines" / v / SIGNATURE).unlink()
    m["metrics"] = {"changed": True}
    (tmp_path / "engines" / v / MANIFEST).write_text(json.dumps(m))
    assert adopt_shipped_signatures(EngineStore(tmp_path / "engines"), default_store_path()) == []


def test_the_trainer_signs_its_store_s_unsigned_versions_at_start(tmp_path, tiny_store):
    from edge_agent.trust import daemon_trust
    from trainer.service import TrainerService

    state = tmp_path / "state"
    shutil.copytree(tiny_store, state / "engines")
    (state / "engines" / "v0001" / SIGNATURE).unlink()
    cfg = parse_config({})
    TrainerService(cfg, state)
    assert daemon_trust(cfg, state).check(state / "engines" / "v0001").startswith("the trainer on this state directory")


def test_a_trainer_key_made_after_the_daemon_started_is_trusted_then(store, signing_key, tmp_path):
    """systemd starts both services at once: the daemon may look before the trainer on its state directory has made
    its key. A version that trainer signs is refused at first, and served once the key file appears."""
    daemon, t = _daemon(tmp_path, trusted_store(store.root, signing_key))
    try:
        local = tmp_path / "state" / "trainer" / "signing.key"
        v2 = _republish(store, load_or_create_key(tmp_path / "elsewhere" / "signing.key"))  # not yet where it belongs
        wait_until(lambda: v2 in daemon.watcher.refused, 20, "refused while the key is unknown")
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "elsewhere" / "signing.key", local)
        shutil.copy(tmp_path / "elsewhere" / "signing.pub", local.with_suffix(".pub"))
        wait_until(lambda: daemon.pipeline.classifier.engine.engine_version == v2, 30, "served once the key appeared")
    finally:
        daemon.request_stop()
        t.join(30)


def test_what_the_earlier_project_key_signed_is_still_trusted_after_the_key_changed():
    """The 23-class v0001's manifest and signature as shipped until the 38-class release (tests/fixtures/v0001): state
    directories made before keep serving it, and a manifest altered since is refused."""
    fixture = REPO / "tests" / "fixtures" / "v0001"
    trust = TrustedKeys.default()
    assert trust.check(fixture) == "the edge-agent project (earlier key, before the 38-class release)"
    with pytest.raises(UntrustedVersion, match="does not match its manifest"):
        trust.check(fixture, fixture.joinpath(MANIFEST).read_bytes().replace(b"LeafNet", b"LeafNex"))
