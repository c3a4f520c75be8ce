"""``edge-trainer``: the learning side's command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _train(args: argparse.Namespace) -> int:
    from trainer.data import DatasetError
    from trainer.train import TrainSettings, train_supervised

    settings = TrainSettings(seed=args.seed, int8=not args.no_int8, threads=args.threads, batch_size=args.batch_size)
    if args.epochs is not None:
        settings.epochs = args.epochs
    if args.patience is not None:
        settings.patience = args.patience
    if args.lr is not None:
        settings.lr = args.lr
    settings.init = args.init
    settings.swa_epochs = args.swa_epochs
    settings.calibrate = not args.no_calibrate
    try:
        version = train_supervised(args.data, args.store, settings, progress=not args.no_progress)
    except DatasetError as exc:
        print(f"edge-trainer: bad dataset: {exc}", file=sys.stderr)
        return 2
    m = version.manifest["metrics"]
    line = f"published {version.name} to {args.store}: val top-1 {m['val']['top1']:.4f}"
    if "test" in m:
        line += f", test top-1 {m['test']['top1']:.4f} on {version.manifest['training']['split']['test_photos']} held-out photos"
    if "int8" in m:
        line += f", INT8 agreement {m['int8']['top1_agreement_with_fp32']:.4f}"
    print(line)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from trainer.data import DatasetError
    from trainer.train import recalibrate

    try:
        version = recalibrate(args.data, args.store, args.version, batchnorm=args.batchnorm)
    except DatasetError as exc:
        print(f"edge-trainer: cannot calibrate: {exc}", file=sys.stderr)
        return 2
    c = version.manifest["metrics"]["calibration"]
    print(
        f"published {version.name} (from {version.manifest['parent']}) to {args.store}: temperature {c['temperature']:.3f}, "
        f"validation ECE {c['ece_before']:.3f} -> {c['ece_after']:.3f} on {c['photos']} photos"
    )
    return 0


def _service_config(args: argparse.Namespace):
    from edge_agent.config import load_config
    from edge_agent.state import resolve_state_dir

    cfg = load_config(getattr(args, "config", None))
    if getattr(args, "retrain_threshold", None):
        cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"retrain_threshold": args.retrain_threshold})})
    return cfg, resolve_state_dir(getattr(args, "state_dir", None), cfg)


def _serve(args: argparse.Namespace) -> int:
    import signal

    from trainer.service import TrainerService

    cfg, state = _service_config(args)
    service = TrainerService(cfg, state)
    signal.signal(signal.SIGTERM, service.request_stop)
    signal.signal(signal.SIGINT, service.request_stop)
    return service.run()


def _running(status_file) -> dict | None:
    """The status of a running `serve` (pid alive, refreshed within 30 s), else None."""
    from edge_agent.state import live_status

    st, running = live_status(status_file, 30)
    return st if running else None


def _retrain(args: argparse.Namespace) -> int:
    from edge_agent.state import looked_for, resolve_store
    from edge_agent.trust import trainer_key_path
    from engines.signing import load_key
    from trainer.samples import SampleStore
    from trainer.service import retrain, trainer_state_dir

    cfg, state = _service_config(args)
    root = trainer_state_dir(cfg, state)
    if (root / "samples.sqlite").is_file() and not args.force:  # say up front when no candidate could be published
        from trainer.field_check import too_few_to_judge
        from trainer.loop.next_publish import plan

        samples = SampleStore(root)
        try:
            every, least, stored = cfg.trainer.field_check_every, cfg.trainer.field_check_min, samples.all()
            if too_few_to_judge(stored, every, least) is not None:
                nxt = plan(stored, samples.counts(), cfg.trainer)
                print(f"edge-trainer: no retrain: its candidate could not be published yet: {nxt.sentence}. --force retrains anyway.")
                return 1
        finally:
            samples.close()
    if _running(root / "status.json"):
        (root / "retrain.request").touch()
        print(f"asked the running trainer to retrain (see `edge-trainer status --state-dir {state}`)")
        return 0
    if not (root / "samples.sqlite").is_file():  # never a new trainer (key, store, samples) in the wrong folder
        raise looked_for(
            "trainer samples", root / "samples.sqlite", args.state_dir, cfg, "retrain runs where `edge-trainer serve` has run", "trainer"
        )
    key = trainer_key_path(cfg, state)
    if not key.is_file():
        raise looked_for("engine-signing key", key, args.state_dir, cfg, "`edge-trainer keys` or `edge-trainer serve` makes it", "trainer")
    if not cfg.store.path and not (state / "engines").is_dir():
        raise looked_for("engine store", state / "engines", args.state_dir, cfg, "retrain runs where `edge-trainer serve` has run")
    if cfg.trainer.nice:
        import os

        os.nice(cfg.trainer.nice)  # inference first, here too
    result = retrain(cfg, resolve_store(cfg, state), SampleStore(root), root / "strategy", signing_key=load_key(key))
    print(
        f"{'published ' + result.published if result.published else 'not published'}: {result.reason} ({result.samples} samples, {result.seconds:.0f} s)"
    )
    return 0 if result.published else 1


def _status(args: argparse.Namespace) -> int:
    import json

    from edge_agent.state import looked_for
    from trainer.service import trainer_state_dir

    cfg, state = _service_config(args)
    path = trainer_state_dir(cfg, state) / "status.json"
    live = _running(path)
    try:
        st = json.loads(path.read_text())
    except FileNotFoundError:
        raise looked_for("trainer status", path, args.state_dir, cfg, "`edge-trainer serve` writes it", "trainer") from None
    st["running"] = live is not None
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    last = st.get("last_retrain")
    c = st.get("samples") or {}
    print(f"trainer: {'running, ' + st['state'] if live else 'not running (edge-trainer serve, or systemctl start edge-trainer)'}")
    print(
        f"samples: {c.get('pseudo', 0)} pseudo-labels and {c.get('expert', 0)} expert labels; {c.get('new', 0)} new since the "
        f"last retrain ({c.get('new_expert', 0)} of them expert labels)"
    )
    pool = st.get("unlabelled_pool") or {}
    if pool.get("photos"):
        devices = len(pool.get("by_device") or {})
        print(
            f"unlabelled: {pool['photos']} photos from {devices} device{'' if devices == 1 else 's'} "
            f"({pool.get('bytes', 0) / 2**20:.1f} MiB; at most {pool.get('limit_photos')} photos, {pool.get('limit_bytes', 0) >> 20} MiB)"
        )
    nxt = st.get("next_publish") or {}
    if nxt.get("sentence") and not st.get("blocked"):
        print(f"next: {nxt['sentence']}")
    if last:
        outcome = f"published {last['published']}" if last["published"] else "not published"
        print(f"last retrain: {outcome}: {last['reason']}")
    else:
        print("last retrain: none yet")
    r = st.get("retraining")
    if live and r:
        epoch = f" epoch {r['epoch']} of {r['epochs']}" if "epoch" in r else ""
        print(f"retraining: {r['phase']}{epoch} ({time.time() - r['since']:.0f} s in)")
    step = (last or {}).get("metrics", {}).get("step")
    if step:
        what = (
            "the weights kept, only the BatchNorm statistics recomputed on the photos seen"
            if step["step"] == 0
            else f"{step['step']:g} of the way from the engine in service to the retrained weights"
        )
        print(f"pseudo-labels only: step {step['step']:g} chosen of {[t['step'] for t in step['tried']]} on the gate photos: {what}")
    if st.get("labelled"):
        lab = st["labelled"]
        print(f"true labels: {lab.get('replay_photos', 0)} to replay, {lab.get('validation_photos', 0)} for the gate ({lab.get('origin')})")
    gate = (last or {}).get("metrics", {}).get("gate")
    if gate and "candidate_top1" in gate:
        field = gate.get("field") or {}
        on_field = (
            f"; field check {field['field_candidate_top1']:.4f} vs {field['field_current_top1']:.4f} on {field['field_photos']} held-back expert labels"
            if "field_candidate_top1" in field
            else (
                f"; field check: {field['reason']}"
                if field.get("field_photos")
                else "; no field check then (no expert labels had arrived)"
                if not c.get("expert")
                else "; no field check then (before the expert labels that arrived since)"
            )
        )
        print(f"last gate: lab {gate['candidate_top1']:.4f} vs {gate['current_top1']:.4f}{on_field}")
    if st.get("blocked"):
        print(f"NOT RETRAINING: {st['blocked']}")
    elif st.get("waiting_for_new_samples"):
        print("the last retrain failed: waiting for new samples before the next")
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

    cfg, _ = _service_config(args)
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

    cfg, state = _service_config(args)
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


def _fleet(args: argparse.Namespace) -> int:
    """The daemons this trainer serves: name, address, last seen, engine version, samples, queue."""
    import json
    import time

    from edge_agent.names import printable
    from edge_agent.state import looked_for
    from trainer.service import trainer_state_dir

    cfg, state = _service_config(args)
    path = trainer_state_dir(cfg, state) / "status.json"
    if not path.is_file():
        raise looked_for("trainer status", path, args.state_dir, cfg, "`edge-trainer serve` writes it", "trainer")
    live = _running(path)
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


def _signing_key(args: argparse.Namespace, create: bool = False) -> int:
    """This trainer's engine-signing public key, for each daemon's trusted_keys (made only by ``keys`` and ``serve``)."""
    from edge_agent.state import looked_for
    from edge_agent.trust import trainer_key_path
    from engines.signing import load_key, load_or_create_key

    cfg, state = _service_config(args)
    path = trainer_key_path(cfg, state)
    if not create and not path.is_file():
        raise looked_for("engine-signing key", path, args.state_dir, cfg, "`edge-trainer keys` or `edge-trainer serve` makes it", "trainer")
    key = load_or_create_key(path) if create else load_key(path)
    print(f"public key: {key.public_hex}")
    print(f"file:       {key.path.with_suffix('.pub')}")
    print('daemons that take engines from this trainer: [store] trusted_keys = ["<the public key or a copy of the file>"]')
    print("(a daemon on this same state directory trusts it already)")
    return 0


def _sign(args: argparse.Namespace) -> int:
    """Sign an existing store version with a key (release use: the shipped model and the project's key)."""
    from engines.signing import TrustedKeys, load_or_create_key, sign_version
    from engines.store import EngineStore

    key = load_or_create_key(args.key)
    store = EngineStore(args.store)
    version = store.open(args.version)  # the files must match the manifest before it is vouched for
    sign_version(version.path, key)
    TrustedKeys({key.public_hex: "this key"}).check(version.path)
    print(f"signed {store.root}/{version.name} with {key.public_hex}")
    return 0


def _release(args: argparse.Namespace) -> int:
    """Train, calibrate, build INT8, sign and write the shipped model's store (the release; resumable)."""
    import shutil
    import time

    from engines.store import EngineStore
    from trainer.release import ReleaseSettings, release

    out = Path(args.out)
    staging = out.with_name(f".{out.name}.release-tmp")
    shutil.rmtree(staging, ignore_errors=True)
    chosen = {"epochs": args.epochs, "augmentation": args.augmentation, "head_epochs": args.head_epochs, "lr": args.lr, "size": args.size}
    chosen["freeze_batchnorm"] = args.freeze_batchnorm
    chosen["device"] = args.device
    settings = ReleaseSettings(**{k: v for k, v in chosen.items() if v is not None})
    t0 = time.perf_counter()
    if args.training_from:
        from trainer.release import reuse_training

        reuse_training(args.training_from, args.work, settings)
    version = release(args.data, staging, args.key, args.work, settings, progress=sys.stderr.isatty(), watch_field=args.watch_field)
    if out.exists():  # earlier releases stay loadable beside the new one (a device may pin one)
        for old in EngineStore(out).versions():
            if old != version.name:
                shutil.copytree(out / old, staging / old)
        shutil.rmtree(out)
    staging.rename(out)
    m = version.manifest
    print(
        f"{out}/{version.name}: test top-1 {m['metrics']['test']['top1']}, {m['metrics']['verdict']['share_confident']:.3f} "
        f"of test photos confident ({m['metrics']['verdict']['confident_top1']} of those right); "
        f"{time.perf_counter() - t0:.0f} s in all, {m['training']['train_seconds']:.0f} s of training"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-trainer", description="Train and publish edge-agent models.")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="auto", choices=["auto", "json", "console"])
    # The same options after the subcommand too (`edge-trainer serve --log-level debug`); SUPPRESS keeps a value
    # given before the subcommand when none is given after it.
    logging_opts = argparse.ArgumentParser(add_help=False)
    logging_opts.add_argument("--log-level", default=argparse.SUPPRESS, choices=["debug", "info", "warning", "error"])
    logging_opts.add_argument("--log-format", default=argparse.SUPPRESS, choices=["auto", "json", "console"])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, helptext in (
        ("serve", _serve, "receive labels from the daemon, retrain, gate, publish (the service)"),
        ("retrain", _retrain, "retrain now (asks a running `serve`, else runs here)"),
        ("status", _status, "samples, state, last retrain"),
        ("signing-key", _signing_key, "print this trainer's engine-signing public key (made by keys or serve)"),
        ("fleet", _fleet, "the daemons this trainer serves: name, address, last seen, engine, samples, queue"),
    ):
        sp = sub.add_parser(name, parents=[logging_opts], help=helptext)
        sp.add_argument(
            "--config",
            help="TOML configuration (default: $EDGE_AGENT_CONFIG, else /etc/edge-agent/edge-agent.toml where it exists, else defaults)",
        )
        sp.add_argument("--state-dir", help="the daemon's state dir (default: $STATE_DIRECTORY or ./edge-state)")
        if name == "serve":
            sp.add_argument("--retrain-threshold", type=int, help="overrides [trainer] retrain_threshold")
        if name in ("status", "fleet"):
            sp.add_argument("--json", action="store_true")
        if name == "retrain":
            sp.add_argument("--force", action="store_true", help="retrain even when its candidate could not be published (to look at it)")
        sp.set_defaults(func=func)
    k = sub.add_parser("keys", parents=[logging_opts], help="make the trainer's CURVE certificate (once) and engine-signing key")
    k.add_argument("--out", help="keys folder for trainer/ and authorized/ (default: where [handoff] curve_authorized_dir is)")
    k.add_argument("--force", action="store_true", help="replace an existing trainer certificate (every device then needs the new one)")
    k.add_argument(
        "--config",
        help="TOML configuration (default: $EDGE_AGENT_CONFIG, else /etc/edge-agent/edge-agent.toml where it exists, else defaults)",
    )
    k.add_argument("--state-dir", help="the trainer's state dir, where its engine-signing key is made (default as for serve)")
    k.set_defaults(func=_keys)
    dv = sub.add_parser("device", parents=[logging_opts], help="add, revoke or list a device's CURVE certificate")
    dv.add_argument("action", choices=["add", "revoke", "list"])
    dv.add_argument("name", nargs="?", default="", help="the device's name (its [handoff] name)")
    dv.add_argument("--keys", help="keys folder (default: where [handoff] curve_authorized_dir is)")
    dv.add_argument("--force", action="store_true", help="add: replace the device's existing certificate")
    dv.add_argument(
        "--config",
        help="TOML configuration (default: $EDGE_AGENT_CONFIG, else /etc/edge-agent/edge-agent.toml where it exists, else defaults)",
    )
    dv.add_argument("--state-dir", help=argparse.SUPPRESS)
    dv.set_defaults(func=_device)
    sg = sub.add_parser("sign", parents=[logging_opts], help="sign a store version with a key (release use)")
    sg.add_argument("--key", required=True, help="secret key file (*.key; made if missing, its .pub beside it)")
    sg.add_argument("--store", required=True)
    sg.add_argument("--version", help="default: the current version")
    sg.set_defaults(func=_sign)
    r = sub.add_parser("release", parents=[logging_opts], help="train and write the shipped model's store, signed (make release)")
    r.add_argument("--data", required=True, help="the lab photos (../shared/data/plantvillage)")
    r.add_argument("--key", required=True, help="the project's release key (../shared/release/edge-agent-release.key)")
    r.add_argument("--out", default="edge_agent/default_store", help="the store to write (replaced once the release is done)")
    r.add_argument("--work", default="train-work/release", help="checkpoints: a run that finds one resumes from it")
    r.add_argument("--epochs", type=int, default=None, help="training epochs (default: the release's 3)")
    r.add_argument("--augmentation", choices=["lab", "flips", "field"], default=None, help="training augmentation (default: the release's)")
    r.add_argument("--head-epochs", type=int, default=None, help="epochs training the new head alone first (default: the release's)")
    r.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the release's)")
    r.add_argument(
        "--freeze-batchnorm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep the pretrained BatchNorm statistics while fine-tuning",
    )
    r.add_argument("--size", type=int, default=None, help="input side, a multiple of 32 (default: the release's 192)")
    r.add_argument("--device", default=None, help="where training runs: cpu (default), or cuda on a machine with an NVIDIA GPU")
    r.add_argument(
        "--training-from",
        default=None,
        help="a store version of an earlier release of the same recipe whose training is reused instead of training again",
    )
    r.add_argument(
        "--watch-field",
        default=None,
        help="field photos (../shared/data/field) scored after every epoch, for the training history only: they never choose anything",
    )
    r.set_defaults(func=_release)
    t = sub.add_parser("train", parents=[logging_opts], help="supervised training from a folder of class folders")
    t.add_argument("--data", required=True, help="folder of <Class name>/<photo> folders")
    t.add_argument("--store", required=True, help="engine store to publish to (created if missing)")
    t.add_argument("--epochs", type=int, default=None, help="maximum epochs (default 80)")
    t.add_argument("--patience", type=int, default=None, help="early-stopping patience in epochs (default 20)")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-3)")
    t.add_argument(
        "--swa-epochs", type=int, default=0, help="average the weights of the last N epochs (SWA); kept only if validation prefers it"
    )
    t.add_argument("--init", metavar="STORE[:VERSION]", help="start from a store version's weights (same classes) instead of scratch")
    t.add_argument("--seed", type=int, default=20251120, help="seed for the split, initialisation and augmentation")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    t.add_argument("--no-int8", action="store_true", help="skip the INT8 ONNX Runtime variant")
    t.add_argument(
        "--no-calibrate",
        action="store_true",
        help="publish the model as trained, without the softmax temperature fitted on the validation split",
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=_train)
    c = sub.add_parser(
        "calibrate", parents=[logging_opts], help="fold a softmax temperature, fitted on a version's validation photos, into a new version"
    )
    c.add_argument("--data", required=True, help="the folder of <Class name>/<photo> folders the version was trained on")
    c.add_argument("--store", required=True, help="engine store holding the version; the calibrated child is published there")
    c.add_argument("--version", help="version to calibrate (default: current)")
    c.add_argument(
        "--batchnorm",
        action="store_true",
        help="first set its BatchNorm statistics to the exact ones over its training split (versions published "
        "before they were exact, such as the shipped v0001, averaged per-batch statistics)",
    )
    c.set_defaults(func=_calibrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    from edge_agent.log import configure_logging
    from engines.errors import EdgeAgentError

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        return args.func(args)
    except EdgeAgentError as exc:
        print(f"edge-trainer: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
