"""Backup and restore: a fresh state directory restored from one file serves the same engine with the same keys and
history; a damaged, tampered or hostile file restores nothing."""

from __future__ import annotations

import gzip
import io
import json
import stat
import tarfile
from pathlib import Path

import pytest

from edge_agent.backup import BackupError, backup
from edge_agent.config import AppConfig
from edge_agent.restore import restore
from edge_agent.results import ResultsDB
from edge_agent.state import resolve_store
from engines.signing import load_or_create_key

from .daemon_helpers import SHIPPED_NEXT
from .web_helpers import _second_version, make_state


@pytest.fixture(scope="module")
def device(tmp_path_factory) -> tuple[Path, dict]:
    """A state directory as a season leaves it: results, a review pool, a published second version, the trainer's
    signing key, a page token, golden photos; and its backup (``made["backup"]``), made once for the module."""
    pytest.importorskip("starlette", reason="the web page's token files")
    from edge_agent.web.auth import Tokens

    tmp_path = tmp_path_factory.mktemp("season")
    state = make_state(tmp_path)
    _second_version(state)
    key = load_or_create_key(state / "trainer" / "signing.key")
    token = Tokens(state / "web").new("admin")
    (state / "golden.npz").write_bytes(b"golden photos")
    (state / "web" / "thumbs").mkdir(parents=True, exist_ok=True)
    (state / "web" / "thumbs" / "x.jpg").write_bytes(b"a thumbnail")
    out = tmp_path / "backups" / "farm.tar.gz"
    manifest = backup(AppConfig(), state, out)
    return state, {"token": token, "key": key, "backup": out, "manifest": manifest}


def test_a_restored_state_directory_serves_the_same_engine_with_the_same_keys_and_history(tmp_path, device):
    from edge_agent.web.auth import Tokens

    state, was = device
    out, manifest = was["backup"], was["manifest"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and "web/thumbs/x.jpg" not in manifest["files"]
    fresh = tmp_path / "new-sd-card" / "state"
    done = restore(out, fresh)
    assert done.files == len(manifest["files"]) and done.moved_aside is None
    store = resolve_store(AppConfig(), fresh)
    assert store.current() == SHIPPED_NEXT
    store.open(SHIPPED_NEXT, verify=True)  # every file and its signature as before
    assert ResultsDB(fresh / "results.sqlite", readonly=True).counts() == ResultsDB(state / "results.sqlite", readonly=True).counts()
    assert (fresh / "trainer" / "signing.key").read_bytes() == (state / "trainer" / "signing.key").read_bytes()
    assert Tokens(fresh / "web").role_of(was["token"]) == "admin"
    assert sorted(p.name for p in (fresh / "queue" / "review").iterdir()) == sorted(p.name for p in (state / "queue" / "review").iterdir())
    assert (fresh / "golden.npz").read_bytes() == b"golden photos" and not (fresh / "web" / "thumbs").exists()


def test_a_power_cut_just_after_a_restore_onto_a_new_card_leaves_it_whole(card, device):
    """The restore staged its files and renamed the folder into place before the card had them: a power cut soon
    after (a board switched off once it said "restored") left empty files under their names, the ledger and the engine
    among them, and a second restore refused the folder ("already holds a results ledger")."""
    state, was = device
    fresh = card.path / "state"
    restore(was["backup"], fresh)
    card.commit_journal()  # (ext4 commits every 5 s: the rename is then on the card, whatever the data's state)
    card.pull_out()
    card.plug_in()
    store = resolve_store(AppConfig(), fresh)
    store.open(store.current(), verify=True)
    assert ResultsDB(fresh / "results.sqlite", readonly=True).counts() == ResultsDB(state / "results.sqlite", readonly=True).counts()
    assert (fresh / "trainer" / "signing.key").read_bytes() == (state / "trainer" / "signing.key").read_bytes()


def test_restore_will_not_overwrite_a_state_directory_with_results_unless_forced_and_then_keeps_it_aside(tmp_path, device):
    _, made = device
    out = made["backup"]
    other = make_state(tmp_path / "other")
    with pytest.raises(BackupError, match="already holds a results ledger"):
        restore(out, other)
    done = restore(out, other, force=True)
    assert done.moved_aside is not None and (done.moved_aside / "results.sqlite").is_file()


def _rewrite(src: Path, dst: Path, change) -> None:
    with tarfile.open(src, "r:gz") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar]
    with tarfile.open(dst, "w:gz", compresslevel=0) as tar:  # stored, not compressed: what is tested is the checks
        for m, data in change(members):
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))


@pytest.mark.parametrize(
    "what, why",
    [
        ("a file's bytes changed", "does not match its recorded sha256"),
        ("a member not in the manifest", "not a file the backup lists"),
        ("a member outside the state directory", "not a file the backup lists"),
        ("a symlink", "not a file the backup lists"),
        ("a file missing", "incomplete"),
        ("cut in half", "damaged"),
        ("not gzip", "not a readable backup"),
        ("no manifest first", "not an edge-agent backup"),
    ],
)
def test_a_damaged_tampered_or_hostile_backup_restores_nothing_and_says_why(tmp_path, device, what, why):
    good = device[1]["backup"]
    bad = tmp_path / "bad.tar.gz"
    if what == "cut in half":
        bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif what == "not gzip":
        bad.write_bytes(b"PK\x03\x04 a zip, not a backup")
    else:

        def change(members):
            out = list(members)
            if what == "a file's bytes changed":
                i = next(i for i, (m, _) in enumerate(out) if m.name == "results.sqlite")
                m, data = out[i]
                out[i] = (m, data[:-1] + bytes([data[-1] ^ 1]))
            elif what in ("a member not in the manifest", "a member outside the state directory"):
                info = tarfile.TarInfo("../escaped.txt" if "outside" in what else "extra.txt")
                out.append((info, b"x"))
            elif what == "a symlink":
                info = tarfile.TarInfo("evil-link")
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                out.append((info, b""))
            elif what == "a file missing":
                out = [(m, d) for m, d in out if m.name != "golden.npz"]
            elif what == "no manifest first":
                out = out[1:] + out[:1]
            return out

        _rewrite(good, bad, change)
    fresh = tmp_path / "fresh"
    with pytest.raises(BackupError, match=why):
        restore(bad, fresh)
    assert not fresh.exists() and not (tmp_path / "escaped.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-restore")]


def test_backup_of_a_folder_that_is_not_a_state_directory_is_refused(tmp_path):
    with pytest.raises(BackupError, match="no results and no engines"):
        backup(AppConfig(), tmp_path, tmp_path / "x.tar.gz")


def test_the_command_line_backs_up_and_restores_and_names_the_config_file_it_kept(tmp_path, device):
    import subprocess
    import sys

    state, _ = device
    conf = tmp_path / "etc" / "edge-agent.toml"
    conf.parent.mkdir()
    conf.write_text(f"[daemon]\nstate_dir = {json.dumps(str(state))}\n")
    repo = Path(__file__).resolve().parents[1]
    run = lambda *a: subprocess.run([sys.executable, "-m", "edge_agent", *a], capture_output=True, text=True, cwd=repo)  # noqa: E731
    out = run("backup", "--config", str(conf), "--out", str(tmp_path / "b.tar.gz"))
    assert out.returncode == 0 and "mode 0600" in out.stdout and str(conf) in out.stdout, out.stderr
    fresh = tmp_path / "fresh"
    back = run("restore", str(tmp_path / "b.tar.gz"), "--state-dir", str(fresh))
    assert back.returncode == 0 and f"was {conf}" in back.stdout, back.stderr
    assert gzip.open(tmp_path / "b.tar.gz").read(10)  # a plain .tar.gz anyone can list
    kept = next((fresh / "restored").rglob("edge-agent.toml"))
    assert kept.read_text() == conf.read_text()
    bad = run("restore", str(tmp_path / "b.tar.gz"), "--state-dir", str(fresh))
    assert bad.returncode == 2 and "already holds a results ledger" in bad.stderr


def test_a_state_directory_restored_to_another_path_keeps_its_queued_labels_and_the_trainers_photos(tmp_path):
    """Rows name their files by path: restored elsewhere (a new board, another mount point), the queue, the trainer's
    samples and its unlabelled pool find their photos there, instead of dropping every queued label as missing and
    training on none of the expert's photos; the unlabelled pool's rows still in its write-ahead log come along too."""
    from edge_agent.review.queue import label_photo
    from trainer.loop.unlabelled_pool import UnlabelledPool
    from trainer.samples import SampleStore

    state = make_state(tmp_path)
    classes = resolve_store(AppConfig(), state).open(verify=False).classes
    samples = SampleStore(state / "trainer")
    header = {"id": "a" * 64, "ext": ".jpg", "kind": "expert", "label": classes[0], "confidence": 1.0, "engine_version": "v1"}
    samples.add(header, b"an expert's photo")
    samples.close()
    pool = UnlabelledPool(state / "trainer", 10, 1 << 20)  # left open: its rows are in the write-ahead log
    pool.add(header | {"id": "b" * 64, "kind": "unlabelled", "verdict": "unsure"}, b"a photo nobody labelled")
    backup(AppConfig(), state, tmp_path / "farm.tar.gz")
    pool.close()
    fresh = tmp_path / "elsewhere" / "state"
    restore(tmp_path / "farm.tar.gz", fresh)

    [sample] = SampleStore(fresh / "trainer").all()
    assert Path(sample.file).parent == fresh / "trainer" / "samples" and Path(sample.file).read_bytes() == b"an expert's photo"
    [unlabelled] = UnlabelledPool(fresh / "trainer", 10, 1 << 20).photos()
    assert Path(unlabelled.file).read_bytes() == b"a photo nobody labelled" and str(fresh) in unlabelled.file
    from edge_agent.daemon import Daemon

    daemon = Daemon(AppConfig(), fresh)
    daemon._setup()  # the daemon's start points the queue's rows at the photos here
    daemon._stop.set()
    daemon._shutdown()
    db = ResultsDB(fresh / "results.sqlite")
    assert db.relocate_queue(fresh / "queue") == 0
    entries = db.queued_for_delivery(10) + [e for e, *_ in db.review_pool()]
    assert entries and all(Path(e.file).is_file() and Path(e.file).is_relative_to(fresh) for e in entries)
    labelled = label_photo(db, fresh / "queue", 1 << 20, classes, "p0", classes[1])
    moved = db.queue_entry(labelled.sha256)
    assert moved.kind == "expert" and Path(moved.file).parent == fresh / "queue" / "expert" and Path(moved.file).is_file()
    assert (state / "queue" / "review").is_dir() and len(list((state / "queue" / "review").iterdir())) == 2  # the original untouched


def test_before_a_daemon_starts_on_a_state_directory_restored_elsewhere_review_list_and_the_page_show_its_own_photos(tmp_path, capsys):
    """The queue's rows name the original's files until the daemon's start points them here: meanwhile the expert's
    list and the page name and serve the copies under the restored directory (the original is gone on a new board)."""
    from edge_agent.cli import main
    from edge_agent.web.photos import PhotoFiles
    from edge_agent.web.queries import Reader

    state = make_state(tmp_path)
    backup(AppConfig(), state, tmp_path / "farm.tar.gz")
    fresh = tmp_path / "elsewhere" / "state"
    restore(tmp_path / "farm.tar.gz", fresh)
    capsys.readouterr()
    assert main(["review", "list", "--state-dir", str(fresh), "--all", "--json"]) == 0
    listed = {j["sha256"]: j["file"] for j in map(json.loads, capsys.readouterr().out.splitlines())}
    assert len(listed) == 2
    assert all(Path(f).parent == fresh / "queue" / "review" and Path(f).is_file() for f in listed.values())
    assert main(["review", "list", "--state-dir", str(fresh), "--all"]) == 0
    out = capsys.readouterr().out
    assert out.count(str(fresh / "queue" / "review")) == 2 and str(state / "queue") not in out
    photos = PhotoFiles(fresh, fresh / "inbox", Reader(fresh / "results.sqlite"), 1 << 24, 10**8)
    assert {sha: photos.locate(sha) for sha in listed} == {sha: Path(f).resolve() for sha, f in listed.items()}


def test_a_row_whose_file_is_where_it_says_is_left_as_it_is(tmp_path, monkeypatch):
    from engines.durable import moved_here

    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "x.jpg").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert moved_here(str(tmp_path / "samples" / "x.jpg"), tmp_path) is None
    assert moved_here("samples/x.jpg", tmp_path) is None  # the same file, named relative to the working directory
    assert moved_here("/gone/samples/x.jpg", tmp_path) == tmp_path / "samples" / "x.jpg"
    assert moved_here("/gone/samples/y.jpg", tmp_path) is None  # not here either: the caller's own handling decides


def test_the_farms_notes_and_map_image_go_into_the_backup_wherever_they_are_kept(tmp_path):
    state = make_state(tmp_path)
    (state / "class-notes.toml").write_text('["Apple___Apple_scab"]\nname = "Schorf"\n', encoding="utf-8")  # written on the page
    farm = tmp_path / "etc" / "edge-agent"
    farm.mkdir(parents=True)
    (farm / "notes.toml").write_text('["Apple___Black_rot"]\nact = "Mumien entfernen."\n', encoding="utf-8")
    (farm / "orchard.jpg").write_bytes(b"\xff\xd8\xff an image of the farm")
    cfg = AppConfig()
    cfg = cfg.model_copy(
        update={
            "web": cfg.web.model_copy(
                update={"class_notes": str(farm / "notes.toml"), "map_image": str(farm / "orchard.jpg"), "map_bounds": [1, 2, 3, 4]}
            )
        }
    )
    manifest = backup(cfg, state, tmp_path / "b.tar.gz")
    assert "class-notes.toml" in manifest["files"]
    assert sorted(Path(p).name for p in manifest["outside"].values()) == ["notes.toml", "orchard.jpg"]
    done = restore(tmp_path / "b.tar.gz", tmp_path / "new" / "state")
    assert (done.state_dir / "class-notes.toml").read_text(encoding="utf-8") == (state / "class-notes.toml").read_text(encoding="utf-8")
    back = {Path(original).name: Path(now) for now, original in done.outside.items()}
    assert back["notes.toml"].read_bytes() == (farm / "notes.toml").read_bytes()
    assert back["orchard.jpg"].read_bytes() == (farm / "orchard.jpg").read_bytes()
