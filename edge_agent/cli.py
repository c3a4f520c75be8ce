"""``edge-agent``: the daemon side's command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from importlib import import_module
from pathlib import Path

from edge_agent._cli_common import load as _load
from edge_agent._cli_common import print_rows
from edge_agent._cli_common import state_db as _state_db
from edge_agent._cli_common import store_of as _store
from edge_agent.capture_place import NEAR_M
from edge_agent.names import printable

__all__ = ["main", "build_parser"]


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        help="TOML configuration file (default: $EDGE_AGENT_CONFIG, else /etc/edge-agent/edge-agent.toml where it exists, else built-in defaults)",
    )
    common.add_argument(
        "--log-level", default=argparse.SUPPRESS, choices=["debug", "info", "warning", "error"], help="overrides [log] level"
    )
    return common


def _command(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """Command ``name`` of ``edge_agent.<module>``, imported when it runs: `edge-agent run` loads none of the other
    commands' modules (their backups, signatures and reports cost a daemon's start tens of milliseconds)."""

    def run(args: argparse.Namespace) -> int:
        return getattr(import_module(f"edge_agent.{module}"), name)(args)

    run.__name__ = run.__qualname__ = name
    return run


# ---- classify -------------------------------------------------------------
def _walk(paths: list[str], extensions: set[str]) -> Iterator[Path]:
    """Named files as given; folders recursively, keeping image extensions, skipping hidden entries."""
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if not name.startswith(".") and Path(name).suffix.lower() in extensions:
                        yield Path(root) / name
        else:
            yield p


def _taken_at(path: Path):
    """When and where the photo at ``path`` was taken (:func:`edge_agent.capture.read_capture`; nothing where unreadable)."""
    from edge_agent.capture import Capture, read_capture

    try:
        return read_capture(path.read_bytes(), time.time())
    except OSError:
        return Capture()


def _classify(args: argparse.Namespace) -> int:
    from edge_agent._truth import precision_check
    from edge_agent.classifier import Classifier
    from edge_agent.ledger_rows import iso
    from edge_agent.log import get_logger
    from edge_agent.preprocess import ImageRejected
    from edge_agent.verdict import phrase
    from engines.loader import open_engine

    cfg = _load(args)
    engine = open_engine(_store(args, cfg), cfg.engine, check_photos=precision_check)
    engine.wait_checked()  # a version's first run here checks INT8 against FP32 once; this command waits for it
    clf = Classifier.configured(engine, cfg)
    log = get_logger("classify", engine_version=engine.engine_version)
    log.debug("engine_loaded", **engine.describe())
    failures = 0
    for path in _walk(args.paths, set(cfg.classify.extensions)):
        try:
            pred = clf.predict_file(path)
        except ImageRejected as exc:
            failures += 1
            log.warning("photo_rejected", photo=str(path), reason=str(exc))
            if args.json:
                print(json.dumps({"path": str(path), "error": str(exc)}), flush=True)
            else:
                print(printable(f"{path}: ERROR {exc}"), flush=True)
            continue
        if args.json:
            taken = _taken_at(path)
            row = {
                "path": str(path),
                "label": pred.label,
                "confidence": round(pred.confidence, 6),
                "verdict": pred.verdict,
                "verdict_reason": pred.verdict_reason,
                "top_k": [[c, p] for c, p in pred.top_k],
                "engine_version": pred.engine_version,
                "ms": pred.ms,
                "taken": None if taken.taken is None else iso(taken.taken),  # its EXIF, as the daemon keeps it
                "latitude": taken.place.lat if taken.place else None,
                "longitude": taken.place.lon if taken.place else None,
            }
            print(json.dumps(row), flush=True)
        else:
            others = ", ".join(f"{c} {p:.3f}" for c, p in pred.top_k[1:])
            why = f" - {pred.verdict_reason}" if pred.verdict_reason else ""
            print(
                printable(
                    f"{path}: {phrase(pred.verdict, pred.label)} ({pred.confidence:.3f}, {pred.verdict}{why})  next: {others}  "
                    f"[{pred.engine_version}, {pred.ms:.1f} ms]"
                ),
                flush=True,
            )
    return 1 if failures else 0


# ---- daemon ---------------------------------------------------------------
def _run(args: argparse.Namespace) -> int:
    from edge_agent.config import override
    from edge_agent.daemon import Daemon
    from edge_agent.state import resolve_state_dir

    cfg = override(_load(args), {"store.path": args.store}, "--store")
    daemon = Daemon(cfg, resolve_state_dir(args.state_dir, cfg), Path(args.inbox) if args.inbox else None)
    daemon.install_signal_handlers()
    return daemon.run()


def _parse_since(text: str | None) -> float | None:
    """ISO 8601 time, or a duration back from now: 90s, 15m, 2h, 3d."""
    import re
    from datetime import datetime, timezone

    if not text:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return time.time() - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"edge-agent: --since {text!r}: expected an ISO time (2026-05-01T12:00) or a duration (15m, 2h, 3d)") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def _parse_near(text: str | None, within: float) -> tuple:
    """``--near`` and ``--within`` as :meth:`ResultsDB.results` takes them (nothing when ``--near`` is not given)."""
    from edge_agent.capture_place import parse_place

    if text is None:
        return ()
    if not 1 <= within <= 10_000:  # also refuses nan
        raise SystemExit(f"edge-agent: --within {within:g}: from 1 to 10000 metres")
    try:
        return (parse_place(text), within)
    except ValueError as exc:
        raise SystemExit(f"edge-agent: --near: {exc}") from None


def _results(args: argparse.Namespace) -> int:
    from datetime import datetime

    from edge_agent.inbox_files import where_now
    from edge_agent.verdict import phrase

    near = _parse_near(args.near, args.within)
    cfg = _load(args)
    state, db = _state_db(args, cfg)

    def located(rows):
        for row in rows:  # where the photo is now (moved to processed/, or gone: pruned, deleted)
            now = where_now(state.root, row["path"], datetime.fromisoformat(row["created"]).timestamp())
            yield {**row, "path_now": str(now) if now else None}

    if args.csv:  # for a spreadsheet (edge_agent.export)
        from edge_agent.export import csv_lines

        sys.stdout.writelines(csv_lines(db.results(_parse_since(args.since), args.plant, *near)))
        return 0
    print_rows(
        located(db.results(_parse_since(args.since), args.plant, *near)),
        args.json,
        lambda row: (
            f"{row['created']}  {phrase(row['verdict'], row['label']):60} {row['confidence']:.3f}  {row['verdict'] or '-':9}  "
            f"{row['engine_version']}  {row['path_now'] or (row['path'] + ' (no longer kept)' if row['path'] else row['source'])}"
            + (f"  ({row['verdict_reason']})" if row["verdict_reason"] else "")
            + (f"  plant: {row['plant']}" if row["plant"] else "")
            + (f"  taken: {row['taken']}" if row["taken"] else "")
            + (f"  at: {row['latitude']},{row['longitude']}" if row["latitude"] is not None else "")
            + (f"  expert: {row['expert_label']}" if row["expert_label"] else "")
        ),
        flush=False,
    )
    return 0


def _backup(args: argparse.Namespace) -> int:
    from edge_agent.background import yielding_to_photos

    with yielding_to_photos():  # a daemon running on this card goes first, as with the backups it writes itself
        return _backup_now(args)


def _backup_now(args: argparse.Namespace) -> int:
    from edge_agent._backup_seal import SUFFIX, read_passphrase
    from edge_agent.backup import backup
    from edge_agent.state import resolve_state_dir

    cfg = _load(args)
    state = resolve_state_dir(args.state_dir, cfg)
    seal_with = args.passphrase_file or cfg.backup.passphrase_file
    if not args.out and cfg.backup.dir and not args.salvage:
        return _backup_into_dir(cfg, state, args.photos, seal_with)
    passphrase = read_passphrase(seal_with) if seal_with else None
    kind = "salvaged" if args.salvage else "backup"
    named = f"edge-agent-{kind}-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz" + (SUFFIX if passphrase else "")
    out = Path(args.out or (Path(cfg.backup.dir).expanduser() / named if cfg.backup.dir else named))
    if args.salvage:
        _off_the_card(state, out)
    manifest = backup(cfg, state, out, photos=args.photos, passphrase=passphrase, salvage=args.salvage)
    size = out.stat().st_size
    how = f"sealed with the passphrase in {seal_with}: a restore needs it" if passphrase else "mode 0600: it holds the device's keys"
    print(f"wrote {out} ({size / 1e6:.1f} MB, {len(manifest['files'])} files from {state}; {how})")
    if manifest["outside"]:
        print("also in it, from outside the state directory: " + ", ".join(manifest["outside"].values()))
    _said_changed(manifest.get("changed_unseen", []))
    if args.salvage:
        from edge_agent._backup_salvage import describe

        print("salvaged: what still read of the card, and only that:")
        print("\n".join(describe(manifest["salvaged"])))
    print(f"restore it with: edge-agent restore {out} --state-dir NEW_STATE_DIR" + (" --passphrase-file FILE" if passphrase else ""))
    return 0


def _off_the_card(state: Path, out: Path) -> None:
    """Refuse a salvage whose file would be written onto the failing card it is taken from."""
    from edge_agent.backup import BackupError

    folder = out.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        same = os.stat(folder).st_dev == os.stat(state).st_dev
    except OSError:
        return  # (said by the backup itself)
    if same:
        raise BackupError(f"{out}: on the same disk as {state}, the card it salvages: give --out FILE on another disk (a USB stick)")


def _backup_into_dir(cfg, state: Path, photos: bool, seal_with: str) -> int:
    """``edge-agent backup`` with ``[backup] dir`` set and no ``--out``: one written there now, as the daemon writes them."""
    from edge_agent.backup_folder import take
    from edge_agent.config import override

    cfg = override(cfg, {"backup.photos": photos or cfg.backup.photos, "backup.passphrase_file": seal_with})
    done = take(cfg, state)
    how = f"sealed with the passphrase in {seal_with}: a restore needs it" if seal_with else "not sealed: it holds the device's keys"
    print(f"wrote {done['path']} into [backup] dir ({done['written'] / 1e6:.1f} MB written, {done['bytes'] / 1e6:.1f} MB restores; {how})")
    if done["deleted"]:
        print(f"deleted this device's older backups there beyond keep = {cfg.backup.keep}: {', '.join(done['deleted'])}")
    if done["shared_kept"]:
        print(f"no shared file deleted: {done['shared_kept']}")
    _said_changed(done["changed_unseen"])
    print(
        f"restore it with: edge-agent restore {done['path']} --state-dir NEW_STATE_DIR" + (" --passphrase-file FILE" if seal_with else "")
    )
    return 0


def _asking_passphrase(archive: str, passphrase: bytes | None, do):
    """``do(passphrase)``, asking for the passphrase on a terminal where the backup is sealed and none was given."""
    from edge_agent.backup import BackupSealed

    try:
        return do(passphrase)
    except BackupSealed:
        if passphrase is not None or not sys.stdin.isatty():
            raise
        import getpass

        try:
            typed = getpass.getpass(f"{archive} is sealed; its passphrase: ").strip().encode()
        except (EOFError, KeyboardInterrupt):  # nothing typed: what it needs, said as without a terminal
            raise BackupSealed(f"{archive}: sealed with a passphrase, none typed (or give --passphrase-file FILE)") from None
        return do(typed)


def _restore(args: argparse.Namespace) -> int:
    from edge_agent._backup_seal import is_sealed, read_passphrase
    from edge_agent.restore import restore
    from edge_agent.state import resolve_state_dir

    passphrase = read_passphrase(args.passphrase_file) if args.passphrase_file else None
    if args.check:
        from edge_agent.restore import check

        done = _asking_passphrase(args.archive, passphrase, lambda p: check(Path(args.archive), passphrase=p))
        shared = f", {done.shared} of them from the shared files beside it" if done.shared else ""
        taken = time.strftime("%Y-%m-%d %H:%M", time.localtime(done.created_s)) if done.created_s else "at an unknown time"
        print(
            f"{args.archive}: whole, taken {taken}: {done.files} files{shared}, {done.bytes / 1e6:.1f} MB read from its disk, each matching its sha256"
        )
        _said_salvaged(done.salvaged)
        return 0
    cfg = _load(args)
    state = resolve_state_dir(args.state_dir, cfg)
    done = _asking_passphrase(args.archive, passphrase, lambda p: restore(Path(args.archive), state, force=args.force, passphrase=p))
    shared = f" ({done.shared} of them from the shared files beside it)" if done.shared else ""
    print(f"restored {done.files} files into {done.state_dir}{shared}")
    _said_salvaged(done.salvaged)
    if done.moved_aside:
        print(f"the state directory that was there is kept as {done.moved_aside}")
    for now, was in done.outside.items():
        print(f"  {now}: was {was}; copy it back there (sudo cp -a) or point the config at it")
    secret = cfg.backup.passphrase_file
    if is_sealed(Path(args.archive)) and not (secret and Path(secret).expanduser().is_file()):
        print(
            "the backup was sealed, and a passphrase is never in the backup it seals: write it again, one line, into "
            f"{secret or 'the file [backup] passphrase_file names'} (chmod 600) before the next backup, which fails until then"
        )
    print("next: edge-agent status --state-dir " + str(done.state_dir) + "  (then start the service)")
    return 0


def _said_changed(names: list[str]) -> None:
    """A warning of files a backup found changed on the card without being written."""
    if names:
        from edge_agent.backup import changed_unseen

        print(f"warning: {changed_unseen(names)}", file=sys.stderr)


def _said_salvaged(salvaged: dict | None) -> None:
    """What a salvaged backup lacks, printed by ``restore`` and ``restore --check``."""
    if salvaged is not None:
        from edge_agent._backup_salvage import describe

        print("it was salvaged from a card that failed some reads (edge-agent backup --salvage):")
        print("\n".join(describe(salvaged)))


def _web(args: argparse.Namespace) -> int:
    from edge_agent.config import override
    from edge_agent.state import resolve_state_dir
    from edge_agent.web import WebError, new_token, serve

    cfg = override(_load(args), {"web.bind": args.bind, "web.port": args.port}, "--bind/--port")
    state_dir = resolve_state_dir(args.state_dir, cfg)
    if args.new_token:
        token = new_token(state_dir, args.role)
        port = cfg.web.port
        print(
            f"token: {token}\nrole: {args.role}\nopen once from a phone or laptop (then it is kept in a cookie):\n"
            f"  http://<this device's address>:{port}/?token={token}\n"
            f"a program sends it as: curl -H 'Authorization: Bearer {token}' http://<address>:{port}/api/v1/health\n"
            f"serve it with: edge-agent web --state-dir {state_dir} --bind 0.0.0.0"
        )
        return 0
    try:
        return serve(cfg, state_dir)
    except WebError as exc:
        print(f"edge-agent: {exc}", file=sys.stderr)
        return 2


def _install_systemd(args: argparse.Namespace) -> int:
    from edge_agent.units import install, writable_folders

    folders = writable_folders(_load(args))
    written = install(
        Path(args.unit_dir),
        args.bin_dir,
        args.user,
        dry_run=args.dry_run,
        create_user=not args.no_user,
        jetson=args.jetson,
        writable=folders,
    )
    for path in written:
        print(f"wrote {path}")
    if written:
        print("next: sudo systemctl enable --now edge-agent.service edge-trainer.service edge-web.service")
    return 0


# ---- config ---------------------------------------------------------------
def _config_show(args: argparse.Namespace) -> int:
    from edge_agent.config_toml import dump_toml

    cfg = _load(args)
    print(dump_toml(cfg, comments=not args.bare), end="")
    return 0


# ---- parser ---------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="edge-agent", description="On-device plant-disease recognition.", parents=[common])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("classify", parents=[common], help="classify photos (files or folders)")
    c.add_argument("paths", nargs="+", metavar="PATH")
    c.add_argument("--json", action="store_true", help="one JSON object per photo per line")
    c.add_argument("--store", help="engine store (default: [store] path, else the shipped model)")
    c.set_defaults(func=_classify)

    r = sub.add_parser("run", parents=[common], help="run the daemon (hot folder and/or camera)")
    r.add_argument("--state-dir", help="results, queues, processed photos (default: $STATE_DIRECTORY or ./edge-state)")
    r.add_argument("--inbox", help="hot folder (default: [inbox] path, else <state-dir>/inbox)")
    r.add_argument("--store", help="engine store (default: [store] path, else the shipped model)")
    r.set_defaults(func=_run)

    st = sub.add_parser("status", parents=[common], help="counts, queues, engine, last errors")
    st.add_argument("--state-dir")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_command("_cli_status", "status"))

    res = sub.add_parser("results", parents=[common], help="export stored predictions")
    res.add_argument("--state-dir")
    res.add_argument(
        "--since",
        help="only photos classified since: an ISO time or a duration back from now (15m, 2h, 3d); the Photos page filters by when taken",
    )
    res.add_argument("--plant", help="only this plant's photos (an inbox subfolder's name)")
    res.add_argument("--near", metavar="LAT,LON", help="only photos taken near this place (their EXIF GPS), in degrees")
    res.add_argument("--within", type=float, default=NEAR_M, metavar="M", help=f"how near to --near, in metres (default {NEAR_M})")
    form = res.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="JSON lines")
    form.add_argument("--csv", action="store_true", help="CSV for a spreadsheet (one header row; text that looks like a formula is quoted)")
    res.set_defaults(func=_results)

    bk = sub.add_parser("backup", parents=[common], help="write one file that restores this device (engines, keys, history)")
    bk.add_argument("--state-dir")
    bk.add_argument(
        "--out",
        help="the backup file, whole (default: one into [backup] dir as the daemon writes them, else edge-agent-backup-<date>.tar.gz here)",
    )
    bk.add_argument("--passphrase-file", help="seal it with the passphrase on this file's first line (default: [backup] passphrase_file)")
    bk.add_argument("--photos", action="store_true", help="include processed/ (every kept photo; large)")
    bk.add_argument(
        "--salvage",
        action="store_true",
        help="a card that fails some reads: take off it what still reads, naming what does not (onto another disk; never recorded as the last backup)",
    )
    bk.set_defaults(func=_backup)
    rs = sub.add_parser("restore", parents=[common], help="put a backup into a new state directory")
    rs.add_argument("archive", help="the file `edge-agent backup` wrote")
    rs.add_argument("--state-dir")
    rs.add_argument("--force", action="store_true", help="move an existing state directory aside first")
    rs.add_argument("--check", action="store_true", help="read it whole from its disk and check every file's sha256; write nothing")
    rs.add_argument("--passphrase-file", help="the passphrase a sealed backup was sealed with, on this file's first line (else asked)")
    rs.set_defaults(func=_restore)

    rev = sub.add_parser("review", help="the expert review queue").add_subparsers(dest="action", required=True)
    rl = rev.add_parser("list", parents=[common], help="photos waiting for an expert")
    rl.add_argument("--state-dir")
    rl.add_argument("--json", action="store_true")
    rl.add_argument("--all", action="store_true", help="the whole pool, ranked (not only today's budget)")
    rl.set_defaults(func=_command("_cli_review", "review_list"))
    for action, func, helptext, what, whathelp in (
        (
            "label",
            _command("_cli_review", "review_label"),
            "give a photo its true class",
            "photo",
            "photo id (from review list), sha256 prefix, original path, or file name (refused where two photos had it)",
        ),
        (
            "label-plant",
            _command("_cli_review", "review_label_plant"),
            "give every photo of a plant the expert has not labelled the same class",
            "plant",
            "the plant's name (its inbox folder, or the name its photos were uploaded under)",
        ),
    ):
        rb = rev.add_parser(action, parents=[common], help=helptext)
        rb.add_argument(what, help=whathelp)
        rb.add_argument("label", help="the true class")
        rb.add_argument("--new-class", action="store_true", help="allow a class the model does not know yet")
        rb.add_argument("--state-dir")
        rb.set_defaults(func=func)
    rt = rev.add_parser("trust", parents=[common], help="each labelled class: checks, and how far it is from pseudo-labels")
    rt.add_argument("--state-dir")
    rt.add_argument("--json", action="store_true")
    rt.set_defaults(func=_command("_cli_review", "review_trust"))

    pl = sub.add_parser("plants", help="the plants photographed (inbox subfolders), each with one diagnosis").add_subparsers(
        dest="action", required=True
    )
    pls = pl.add_parser(
        "list", parents=[common], help="each plant, the most recently photographed first, with its newest visit's diagnosis"
    )
    pls.add_argument("--state-dir")
    pls.add_argument("--show", choices=("sick", "unsure"), default="", help="only those with a disease, or those left unsure")
    pls.add_argument("--name", default="", help="only the plants whose name holds this text (any case)")
    pls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    pls.add_argument("--json", action="store_true", help="JSON lines")
    pls.set_defaults(func=_command("_cli_plants", "plants_list"))
    plr = pl.add_parser(
        "rename", parents=[common], help="move a plant's photos to another name (a name typed wrong; an existing plant: merged)"
    )
    plr.add_argument("old", help="the plant's name now")
    plr.add_argument("new", help="its name from now on")
    plr.add_argument("--state-dir")
    plr.set_defaults(func=_command("_cli_plants", "plants_rename"))

    cls = sub.add_parser(
        "classes", parents=[common], help="what the model knows, crop by crop; with a class: what causes it, what to look for, what to do"
    )
    cls.add_argument("name", nargs="?", default="", help="one class: its model name (Tomato___Late_blight) or its name (late blight)")
    cls.add_argument("--state-dir")
    cls.add_argument("--json", action="store_true", help="JSON lines")
    cls.set_defaults(func=_command("_cli_classes", "classes"))

    web = sub.add_parser("web", parents=[common], help="the local web page (photos, review, engines, health, upload)")
    web.add_argument("--state-dir")
    web.add_argument("--bind", help="address to listen on (default: [web] bind, 127.0.0.1); others need --new-token first")
    web.add_argument("--port", type=int, help="port (default: [web] port, 8080)")
    web.add_argument("--new-token", action="store_true", help="print a new access token for other machines and exit")
    web.add_argument(
        "--role",
        choices=("read", "label", "admin"),
        default="admin",
        help="what --new-token's token may do: read (see only), label (also label and upload), admin (also roll back)",
    )
    web.set_defaults(func=_web)

    inst = sub.add_parser("install-systemd", parents=[common], help="install the systemd units for this environment")
    inst.add_argument("--unit-dir", default="/etc/systemd/system")
    inst.add_argument("--bin-dir", help="where edge-agent and edge-trainer live (default: this environment's bin)")
    inst.add_argument("--user", default="edge-agent", help="the service user (created unless --no-user)")
    inst.add_argument("--no-user", action="store_true", help="do not create the user")
    inst.add_argument("--dry-run", action="store_true", help="print the units instead of writing them")
    inst.add_argument("--jetson", action="store_true", help="also the daemon's drop-in that lets it reach a Jetson's GPU")
    inst.set_defaults(func=_install_systemd)

    cfg = sub.add_parser("config", help="inspect the configuration").add_subparsers(dest="action", required=True)
    show = cfg.add_parser("show", parents=[common], help="print the effective configuration with defaults")
    show.add_argument("--bare", action="store_true", help="no comments")
    show.set_defaults(func=_config_show)

    eng = sub.add_parser("engine", help="engine store: list, show, rollback, unpin").add_subparsers(dest="action", required=True)
    for name, func, helptext in (
        ("list", _command("_cli_engine", "engine_list"), "list versions (* marks the one in service; refusals and the pin below)"),
        ("show", _command("_cli_engine", "engine_show"), "verify a version and print its manifest"),
        (
            "rollback",
            _command("_cli_engine", "engine_rollback"),
            "switch current back to the parent (or --to VERSION), pin it there and wait until the daemon serves it (exit 1 if it does not)",
        ),
        ("unpin", _command("_cli_engine", "engine_unpin"), "lift a rollback's pin: the trainer's newer versions are taken again"),
    ):
        p = eng.add_parser(name, parents=[common], help=helptext)
        p.add_argument("--store", help="engine store (default: the daemon's: [store] path, else <state-dir>/engines)")
        if name == "list":
            p.add_argument("--json", action="store_true")
        if name == "show":
            p.add_argument("version", nargs="?", help="default: current")
        if name == "rollback":
            p.add_argument("--to", metavar="VERSION", help="version to switch to")
        p.add_argument(
            "--state-dir",
            help="the daemon's state dir: its store, and the trainer key it trusts (default: $STATE_DIRECTORY or ./edge-state)",
        )
        p.set_defaults(func=func)
    return parser


def _state_dir_of(args: argparse.Namespace) -> Path | None:
    """The state directory a command used, as it chose it (--state-dir, the config, $STATE_DIRECTORY, ./edge-state), or None."""
    from edge_agent.state import resolve_state_dir

    try:
        return resolve_state_dir(getattr(args, "state_dir", None), _load(args))
    except Exception:  # a config that cannot be read: its error was not the one being told  # noqa: BLE001
        return None


def main(argv: list[str] | None = None) -> int:
    import sqlite3

    from edge_agent.storage_errors import DAMAGED_RECORDS, LOCKED, access_problem, storage_problem
    from engines.errors import EdgeAgentError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (EdgeAgentError, FileNotFoundError) as exc:
        print(f"edge-agent: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except (sqlite3.DatabaseError, OSError) as exc:
        state_dir = _state_dir_of(args)
        problem = storage_problem(exc, state_dir)  # (the folder, for Python 3.10's codeless errors)
        if problem == "full":  # one line, not a traceback; never taken for a damaged ledger
            print(
                f"edge-agent: the disk is full ({exc}): free space (edge-agent status says what holds it), then try again", file=sys.stderr
            )
            return 2
        if problem == "locked":
            print(f"edge-agent: {LOCKED}", file=sys.stderr)
            return 2
        said = access_problem(exc, state_dir)
        if said:  # one line naming the file and the fix, not a traceback
            print(f"edge-agent: {said}", file=sys.stderr)
            return 2
        if not isinstance(exc, sqlite3.DatabaseError):
            raise
        if problem == "damaged" and state_dir is not None:  # what follows holds even where its size and time did not change
            from edge_agent.ledger_check import request_check

            request_check(state_dir)
        print(  # a truncated or rotted ledger (a failing SD card): one line, not a traceback
            f"edge-agent: the results database is unreadable ({exc}): {DAMAGED_RECORDS} (edge-agent status then says so)", file=sys.stderr
        )
        return 2
