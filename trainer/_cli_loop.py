"""``edge-trainer serve``, ``retrain``, ``salvage`` and ``status``: the device's learning loop on the trainer's side."""

from __future__ import annotations

import argparse
import time

from edge_agent.engine_keep import engines_line
from trainer._cli_common import STATE_HELP, add_config_options, running, service_config

__all__ = ["add_commands"]


def _inference_first(cfg) -> None:
    """The trainer's CPU and disk after the daemon's (``[trainer] nice``; its disk then in the idle IO class), set
    before anything it imports starts a thread, so every thread of it (numpy's, ZeroMQ's, a retrain's) inherits them."""
    if cfg.trainer.nice:
        import os

        from edge_agent.background import idle_io

        os.nice(cfg.trainer.nice)
        if (kept := idle_io()) is not None:
            from edge_agent.log import get_logger

            get_logger("trainer").info("trainer_priority", kept=kept)


def _serve(args: argparse.Namespace) -> int:
    import signal

    cfg, state = service_config(args)
    _inference_first(cfg)
    from trainer.service import TrainerService

    service = TrainerService(cfg, state)
    signal.signal(signal.SIGTERM, service.request_stop)
    signal.signal(signal.SIGINT, service.request_stop)
    return service.run()


def _retrain(args: argparse.Namespace) -> int:
    from edge_agent.state import looked_for, resolve_store, trainer_state_dir
    from edge_agent.trust import trainer_key_path
    from engines.signing import load_key
    from trainer.samples import SampleStore

    cfg, state = service_config(args)
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
    if running(root / "status.json"):
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
    _inference_first(cfg)
    from edge_agent.instance import holding_state
    from trainer.retrain import retrain  # torch: only once there is a retrain to run

    with holding_state(root, "trainer"):  # no `serve` starts on these files while this retrain runs
        result = retrain(cfg, resolve_store(cfg, state), SampleStore(root), root / "strategy", signing_key=load_key(key))
    print(
        f"{'published ' + result.published if result.published else 'not published'}: {result.reason} ({result.samples} samples, {result.seconds:.0f} s)"
    )
    return 0 if result.published else 1


def _salvage(args: argparse.Namespace) -> int:
    from edge_agent.state import looked_for, trainer_state_dir
    from trainer.samples import SampleStore

    cfg, state = service_config(args)
    root = trainer_state_dir(cfg, state)
    if not (root / "samples.sqlite").is_file():  # never a new trainer's files in a mistyped folder
        raise looked_for("trainer samples", root / "samples.sqlite", args.state_dir, cfg, "`edge-trainer serve` makes it", "trainer")
    from edge_agent.instance import holding_state

    with holding_state(root, "trainer"):  # (a running trainer: it has the file open; StateInUse says to stop it first)
        samples = SampleStore(root, recover="all")
        samples.close()
    print(samples.recovered or f"{root / 'samples.sqlite'} reads whole: nothing to salvage")
    return 0


def _status(args: argparse.Namespace) -> int:
    import json

    from edge_agent.state import as_stopped, last_written, looked_for, trainer_state_dir

    cfg, state = service_config(args)
    path = trainer_state_dir(cfg, state) / "status.json"
    live = running(path)
    try:
        st = json.loads(path.read_text())
    except FileNotFoundError:
        raise looked_for("trainer status", path, args.state_dir, cfg, "`edge-trainer serve` writes it", "trainer") from None
    st = st if live else as_stopped(st)
    st["running"] = live is not None
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    last = st.get("last_retrain")
    c = st.get("samples") or {}
    when = f"; {wrote}" if (wrote := last_written(st)) else ""
    print(f"trainer: {'running, ' + st['state'] if live else 'not running (edge-trainer serve, or systemctl start edge-trainer)' + when}")
    kept = f" (the {st['pseudo_per_class']} newest of each class; {st['pseudo_deleted']} older deleted)" if st.get("pseudo_deleted") else ""
    print(
        f"samples: {c.get('pseudo', 0)} pseudo-labels{kept} and {c.get('expert', 0)} expert labels; {c.get('new', 0)} new since the "
        f"last retrain ({c.get('new_expert', 0)} of them expert labels)"
        + (f"; {st['labels_corrected']} put right by the expert since the start" if st.get("labels_corrected") else "")
        + (
            f"; {st['pseudo_withdrawn']} pseudo-labels withdrawn by the devices (kept as unlabelled photos)"
            if st.get("pseudo_withdrawn")
            else ""
        )
    )
    pool = st.get("unlabelled_pool") or {}
    if pool.get("photos"):
        devices = len(pool.get("by_device") or {})
        print(
            f"unlabelled: {pool['photos']} photos from {devices} device{'' if devices == 1 else 's'} "
            f"({pool.get('bytes', 0) / 2**20:.1f} MiB; at most {pool.get('limit_photos')} photos, {pool.get('limit_bytes', 0) >> 20} MiB)"
        )
    shrink = st.get("reducing_photos") if live else None
    if shrink and shrink.get("paused"):
        print(f"reducing stored photos to [handoff] photo_side: paused ({shrink['paused']}); tried again in {shrink['again_in_s']} s")
    elif shrink:
        print(
            f"reducing stored photos to [handoff] photo_side: {shrink['left']} left to check, {shrink['reduced']} reduced "
            f"({shrink['bytes_saved'] / 2**20:.1f} MiB freed so far; between retrains)"
        )
    term = (last or {}).get("metrics", {}).get("unlabelled")
    if term:
        taught = term.get("taken", term.get("pool_photos", 0))
        why = term.get("reason") or "the field check preferred the candidate without them"
        print(f"unlabelled photos in the last retrain: {f'{taught} taught it' if term.get('kept') else f'none kept: {why}'}")
    nxt = st.get("next_publish") or {}
    if nxt.get("sentence") and not st.get("blocked"):
        print(f"next: {nxt['sentence']}")
    if last:
        outcome = f"published {last['published']}" if last["published"] else "not published"
        print(f"last retrain: {outcome}: {last['reason']}")
        trained = last.get("metrics", {}).get("samples") or {}
        if trained.get("waiting"):
            used = trained["expert"] + trained["pseudo"]
            print(
                f"  trained on {used} of the {used + trained['waiting']} labels it could, the new ones first; "
                f"{trained['waiting']} wait for a later retrain's draw ([trainer] labels_per_retrain)"
            )
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
        for problem in lab.get("problems") or []:
            print(f"  problem: {problem}")
    if st.get("engines"):
        e = st["engines"]
        print(f"{engines_line(e['versions'], e['bytes'], e['keep'], e['deleted'], 'in all')} (store {st.get('store')})")
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
    if st.get("backup") or not (state / "results.sqlite").exists():  # a trainer alone on its machine: its own backups
        from edge_agent.backup import last_backup
        from edge_agent.backup_schedule import backup_lines

        for text, _warn in backup_lines(cfg.backup, last_backup(state), st.get("backup") if live else None, time.time()):
            print(f"backup: {text}")
    if live and (problem := st.get("store_problem")):
        why = "the disk is full" if problem.get("full") else problem.get("error", "?")
        since = problem.get("since", 0)
        when = time.strftime("%H:%M" if time.time() - since < 20 * 3600 else "%Y-%m-%d %H:%M", time.localtime(since))
        print(f"LABELS NOT STORED since {when}: {why}; the devices keep them and send them again")
    if st.get("blocked"):
        print(f"NOT RETRAINING: {st['blocked']}")
    elif live and st.get("waiting_for_room"):
        print(f"NOT RETRAINING: {st['waiting_for_room']}")
    elif st.get("waiting_for_new_samples"):
        print("the last retrain failed: waiting for new samples before the next")
    return 0


def add_commands(sub, parents: list) -> None:
    """Register the loop's commands on the ``edge-trainer`` subparsers."""
    sp = sub.add_parser("serve", parents=parents, help="receive labels from the daemon, retrain, gate, publish (the service)")
    add_config_options(sp, STATE_HELP)
    sp.add_argument("--retrain-threshold", type=int, help="overrides [trainer] retrain_threshold")
    sp.set_defaults(func=_serve)
    sp = sub.add_parser("retrain", parents=parents, help="retrain now (asks a running `serve`, else runs here)")
    add_config_options(sp, STATE_HELP)
    sp.add_argument("--force", action="store_true", help="retrain even when its candidate could not be published (to look at it)")
    sp.set_defaults(func=_retrain)
    sp = sub.add_parser(
        "salvage", parents=parents, help="keep the labels that can still be read of a damaged samples.sqlite (the file kept beside)"
    )
    add_config_options(sp, STATE_HELP)
    sp.set_defaults(func=_salvage)
    sp = sub.add_parser("status", parents=parents, help="samples, state, last retrain")
    add_config_options(sp, STATE_HELP)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=_status)
