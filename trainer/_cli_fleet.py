"""``edge-trainer signing-key``, ``fleet``, ``keys`` and ``device``: the devices a trainer serves and the keys they share."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer._cli_common import STATE_HELP, add_config_options, running, service_config

__all__ = ["add_commands"]


def _signing_key(args: argparse.Namespace, create: bool = False) -> int:
    """This trainer's engine-signing public key, for each daemon's trusted_keys (made only by ``keys`` and ``serve``)."""
    from edge_agent.state import looked_for
    from edge_agent.trust import trainer_key_path
    from engines.signing import load_key, load_or_create_key

    cfg, state = service_config(args)
    path = trainer_key_path(cfg, state)
    if not create and not path.is_file():
        raise looked_for("engine-signing key", path, args.state_dir, cfg, "`edge-trainer keys` or `edge-trainer serve` makes it", "trainer")
    key = load_or_create_key(path, remake_unfinished=True) if create else load_key(path)
    print(f"public key: {key.public_hex}")
    print(f"file:       {key.path.with_suffix('.pub')}")
    print('daemons that take engines from this trainer: [store] trusted_keys = ["<the public key or a copy of the file>"]')
    print("(a daemon on this same state directory trusts it already)")
    return 0


def _fleet(args: argparse.Namespace) -> int:
    """The daemons this trainer serves: name, address, last seen, engine version, samples, queue."""
    import json
    import time

    from edge_agent.names import printable
    from edge_agent.state import looked_for, trainer_state_dir

    cfg, state = service_config(args)
    path = trainer_state_dir(cfg, state) / "status.json"
    if not path.is_file():
        raise looked_for("trainer status", path, args.state_dir, cfg, "`edge-trainer serve` writes it", "trainer")
    live = running(path)
    if live is None:
        print(
            f"edge-trainer: the trainer at {path.parent} is not running (edge-trainer serve, or systemctl start edge-trainer)",
            file=sys.stderr,
        )
        return 2
    fleet = live.get("fleet", [])
    if args.json:
        print(json.dumps(fleet, indent=2))
        return 0
    print(f"{'name':20} {'address':16} {'last seen':>10} {'engine':8} {'pinned':8} {'samples':>8} {'queue':>6}  note")
    for d in fleet:
        ago = f"{time.time() - d['last_seen']:.0f} s ago"
        note = "; ".join(f"refused {v}: {r}" for v, r in d["refused"].items())
        if d.get("revoked"):
            note = "REVOKED: its messages are refused and it was disconnected" + (f"; {note}" if note else "")
        if not note and d.get("last_result") and not d["last_result"]["ok"]:
            note = d["last_result"]["reason"]
        print(  # names and reasons come from devices: never raw escape sequences on the operator's terminal
            printable(
                f"{d['name'][:20]:20} {d['address'][:16]:16} {ago:>10} {d['engine_version']:8} {d.get('pinned') or '-':8} "
                f"{d['samples_received']:>8} {d['queue']:>6}  {note}"
            )
        )
    if not fleet:
        print("(no daemon has connected yet)")
    r = live.get("rollout")
    if r and r.get("version"):
        canaries = ", ".join(r.get("canaries") or []) or "chosen when devices connect"
        line = {
            "all": "done: every device may take it",
            "canary": f"canaries first ({canaries}), the rest once they have served it {r.get('period_s', 0):.0f} s",
            "stopped": f"STOPPED: {r.get('reason')}",
        }.get(r.get("stage"), r.get("stage"))
        print(printable(f"rollout of {r['version']}: {line}"))
    for h in live.get("handshakes_refused") or []:
        print(
            printable(
                f"REFUSED CONNECTION from {h['address']}: {h['count']} handshakes ({h['reason']}); edge-trainer device add NAME for a new device"
            )
        )
    return 0


def _keys_dir(args: argparse.Namespace, cfg) -> Path:
    """``--out``/``--keys``, else the folder holding ``[handoff] curve_authorized_dir``."""
    from trainer.devices import KeysError

    given = getattr(args, "out", None) or getattr(args, "keys", None)
    if given:
        return Path(given).expanduser()
    if cfg.handoff.curve_authorized_dir:
        return Path(cfg.handoff.curve_authorized_dir).expanduser().parent
    raise KeysError('which keys folder? give --out DIR (or set [handoff] curve_authorized_dir = "DIR/authorized" in the configuration)')


def _keys(args: argparse.Namespace) -> int:
    """The trainer's CURVE certificate (made once; ``--force`` replaces it) and authorized/ folder; then the trainer's
    engine-signing key (made if missing) and what to tell the devices."""
    from trainer.devices import make_trainer_keys

    cfg, _ = service_config(args)
    out = _keys_dir(args, cfg)
    public, secret, made = make_trainer_keys(out, force=args.force)
    if made:
        print(f"made the trainer's certificate: {public} (secret: {secret}, 0600)")
    else:
        print(
            f"kept the trainer's certificate {public} (made before; --force makes a new one, and every device then needs the new trainer.key)"
        )
    print(f'trainer: [handoff] curve_secret_key = "{secret}", curve_authorized_dir = "{out / "authorized"}"')
    print(f"devices: edge-trainer device add NAME --keys {out}  (one certificate per device)")
    print()
    return _signing_key(args, create=True)  # and the key engines are signed with, which each device must trust


def _device(args: argparse.Namespace) -> int:
    """Add, revoke or list one device's CURVE certificate."""
    from edge_agent.trust import trainer_key_path
    from trainer.devices import add_device, list_devices, revoke_device

    cfg, state = service_config(args)
    out = _keys_dir(args, cfg)
    if args.action == "list":
        names = list_devices(out)
        print("\n".join(names) if names else f"(no device authorized in {out / 'authorized'})")
        return 0
    if args.action == "revoke":
        where = revoke_device(out, args.name)
        print(f"revoked {args.name}: its key moved to {where}; its next handshake is refused (the trainer needs no restart)")
        return 0
    signing_pub = trainer_key_path(cfg, state).with_suffix(".pub")
    dev = add_device(out, args.name, force=args.force, signing_pub=signing_pub)
    print(f"made {args.name}'s certificate in {dev.folder}/ and authorized it (the trainer needs no restart)")
    there = "/var/lib/edge-agent/keys"
    print(f"copy {dev.folder}/ to the device as {there}/ (owned by the edge-agent user, 0700); its configuration then says:")
    print(f'  [handoff] curve_secret_key = "{there}/{dev.secret.name}"')
    print(f'  [handoff] curve_server_key = "{there}/trainer.key"')
    print(f'  [handoff] name = "{args.name}"')
    if (dev.folder / "signing.pub").is_file():
        print(f'  [store] trusted_keys = ["{there}/signing.pub"]')
    else:
        print(f"  (no engine-signing key at {signing_pub} yet: edge-trainer keys makes it; then device add {args.name} --force)")
    return 0


def add_commands(sub, parents: list) -> None:
    """Register the fleet's commands on the ``edge-trainer`` subparsers."""
    sp = sub.add_parser("signing-key", parents=parents, help="print this trainer's engine-signing public key (made by keys or serve)")
    add_config_options(sp, STATE_HELP)
    sp.set_defaults(func=_signing_key)
    sp = sub.add_parser("fleet", parents=parents, help="the daemons this trainer serves: name, address, last seen, engine, samples, queue")
    add_config_options(sp, STATE_HELP)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=_fleet)
    k = sub.add_parser("keys", parents=parents, help="make the trainer's CURVE certificate (once) and engine-signing key")
    k.add_argument("--out", help="keys folder for trainer/ and authorized/ (default: where [handoff] curve_authorized_dir is)")
    k.add_argument("--force", action="store_true", help="replace an existing trainer certificate (every device then needs the new one)")
    add_config_options(k, "the trainer's state dir, where its engine-signing key is made (default as for serve)")
    k.set_defaults(func=_keys)
    dv = sub.add_parser("device", parents=parents, help="add, revoke or list a device's CURVE certificate")
    dv.add_argument("action", choices=["add", "revoke", "list"])
    dv.add_argument("name", nargs="?", default="", help="the device's name (its [handoff] name)")
    dv.add_argument("--keys", help="keys folder (default: where [handoff] curve_authorized_dir is)")
    dv.add_argument("--force", action="store_true", help="add: replace the device's existing certificate")
    add_config_options(dv, None)
    dv.set_defaults(func=_device)
