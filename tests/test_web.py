"""The web page's endpoints, each with the ways it fails: access, CSRF, labels, rollback, upload, images."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web page's dependencies are not installed")
import httpx  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from edge_agent.config import AppConfig  # noqa: E402
from edge_agent.ledger_rows import ResultRow  # noqa: E402
from edge_agent.results import ResultsDB  # noqa: E402
from edge_agent.state import StateLayout, resolve_store  # noqa: E402
from edge_agent.web.auth import TokenFile  # noqa: E402

from .daemon_helpers import SHIPPED, SHIPPED_NEXT  # noqa: E402
from .web_helpers import GATE, LOCAL, REMOTE, _photos, _second_version, app_for, client, csrf_of, make_state, sha_of  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def state(tmp_path) -> Path:
    """A state directory as the daemon leaves it (web_helpers.make_state)."""
    return make_state(tmp_path)


# ---- pages ------------------------------------------------------------------
def test_every_page_renders_for_a_local_client(state):
    c = client(state)
    first = c.get("/")
    assert first.headers["location"] == "/photos"
    assert "edge_session" in c.cookies  # set on the first response, out of reach of scripts and of other sites
    assert "httponly" in first.headers["set-cookie"].lower() and "samesite=strict" in first.headers["set-cookie"].lower()
    r = c.get("/photos")
    assert r.status_code == 200 and r.text.count('class="card"') == 6
    r = c.get("/review")
    assert r.status_code == 200 and 'data-key="1"' in r.text and "p0" in r.text  # the least sure photo first
    r = c.get("/engines")
    assert r.status_code == 200 and SHIPPED in r.text and "in service" in r.text
    r = c.get("/health")
    assert r.status_code == 200 and "<svg" in r.text and "down" in r.text  # no daemon running here
    assert c.get("/upload").status_code == 200
    assert c.get("/static/style.css").status_code == 200


def test_while_the_ledger_is_locked_the_photos_page_and_the_api_say_so_with_503_never_no_photos(state, monkeypatch):
    """The page once showed "No photos yet" (and the API an empty list) when SQLite could not read the ledger in time."""
    import sqlite3

    from edge_agent.web.queries import Reader

    monkeypatch.setattr(Reader, "wait_s", 0.2)
    c = client(state)
    assert c.get("/photos").text.count('class="card"') == 6
    holder = sqlite3.connect(state / "results.sqlite", isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("DELETE FROM results WHERE 0")  # a write: the lock is taken and kept
        page = c.get("/photos")
        assert page.status_code == 503 and page.headers["retry-after"] == "5"
        assert "could not be read just now" in page.text and "No photos yet" not in page.text
        api = c.get("/api/v1/results")
        assert api.status_code == 503 and "could not be read just now" in api.json()["error"]
    finally:
        holder.close()
    assert c.get("/photos").text.count('class="card"') == 6


def test_skip_moves_to_the_next_question_and_past_the_last_offers_to_start_again(state):
    c = client(state)
    first = c.get("/review").text
    second = c.get("/review", params={"i": 1}).text
    assert 'data-photo="p0"' in first and 'data-photo="p1"' in second
    done = c.get("/review", params={"i": 2}).text
    assert "You skipped the 2 remaining questions" in done and "data-photo" not in done


def test_photos_filter_by_class_and_day_and_page(state):
    c = client(state)
    label = ResultsDB(state / "results.sqlite", readonly=True).per_class()
    some = next(iter(label))
    r = c.get("/photos", params={"label": some})
    assert r.text.count('class="card"') == label[some]
    assert c.get("/photos", params={"from": "2001-01-01", "to": "2001-01-02"}).text.count('class="card"') == 0
    today = time.strftime("%Y-%m-%d")
    assert c.get("/photos", params={"from": today, "to": today}).text.count('class="card"') == 6
    assert c.get("/photos", params={"from": "not-a-date", "page": "x"}).status_code == 400  # a bad filter says why


def test_a_page_of_a_fresh_state_directory_says_there_is_nothing_yet(tmp_path):
    c = client(tmp_path / "empty")
    assert "No photos yet" in c.get("/photos").text
    assert "review queue is empty" in c.get("/review").text
    assert c.get("/health").status_code == 200


# ---- access -----------------------------------------------------------------
def test_a_remote_client_without_a_token_gets_401_everywhere(state):
    c = client(state, REMOTE)
    for path in ("/", "/photos", "/review", "/engines", "/health", "/upload", "/static/style.css"):
        r = c.get(path)
        assert r.status_code == 401, path
        assert "edge-agent web --new-token" in r.text
    assert c.post("/review/label", data={"photo": "p0", "label": "x"}).status_code == 401


def test_a_remote_client_with_the_token_gets_in_and_keeps_it_in_a_cookie(state):
    token = TokenFile(state / "web" / "token.sha256").new()
    c = client(state, REMOTE)
    assert c.get("/photos", params={"token": "wrong"}).status_code == 401
    assert c.get("/photos", headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = c.get("/photos", params={"token": token, "label": ""})
    assert r.status_code == 303 and "token" not in r.headers["location"]
    assert c.get("/photos").status_code == 200  # the cookie now
    fresh = client(state, REMOTE)
    assert fresh.get("/health", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_a_page_bound_to_another_address_wants_the_token_even_from_loopback(state):
    token = TokenFile(state / "web" / "token.sha256").new()
    c = client(state, LOCAL, bind="0.0.0.0")
    assert c.get("/photos").status_code == 401
    assert c.get("/photos", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_the_token_is_stored_hashed_and_private(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "web", "--state-dir", str(tmp_path / "s"), "--new-token"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    token = proc.stdout.split("token: ", 1)[1].split()[0]
    stored = tmp_path / "s" / "web" / "token.sha256"
    assert token not in stored.read_text() and stored.read_text().strip() == hashlib.sha256(token.encode()).hexdigest()
    assert stored.stat().st_mode & 0o777 == 0o600
    assert f"?token={token}" in proc.stdout


def test_binding_an_open_address_without_a_token_refuses_to_start(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "web", "--state-dir", str(tmp_path / "s"), "--bind", "0.0.0.0", "--port", str(_free_port())],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--new-token" in proc.stderr


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _serve(state, bind: str = "127.0.0.1"):
    """``edge-agent web`` on ``state`` in a process of its own, listening on a free port of ``bind``."""
    port = _free_port(bind)
    argv = [sys.executable, "-m", "edge_agent", "web", "--state-dir", str(state), "--port", str(port)]
    proc = subprocess.Popen(
        argv + (["--bind", bind] if bind != "127.0.0.1" else []), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        _wait_listening(bind, port, proc)
    except BaseException:
        proc.kill()
        raise
    return proc, port


def _wait_listening(host: str, port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else proc.returncode
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError("web page never listened")


def test_a_real_server_on_a_second_loopback_address_refuses_requests_without_the_token(state):
    """127.0.0.2 is 'another address': every request needs the token; and a server on 127.0.0.1 refuses a
    client whose address is 127.0.0.2."""
    token = TokenFile(state / "web" / "token.sha256").new()
    proc, port = _serve(state, "127.0.0.2")
    try:
        base = f"http://127.0.0.2:{port}"
        assert httpx.get(base + "/photos").status_code == 401
        assert httpx.get(base + "/photos", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(base + "/photos", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)
    proc, port = _serve(state)
    try:
        from_second = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        assert from_second.get(f"http://127.0.0.1:{port}/photos").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/photos").status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


# ---- CSRF -------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, data", [("/review/label", {"photo": "p0", "label": "Apple___healthy"}), ("/engines/rollback", {"to": SHIPPED, "confirm": "yes"})]
)
def test_a_post_without_the_csrf_token_is_refused(state, path, data):
    c = client(state)
    assert c.post(path, data=data).status_code == 403  # no cookie at all
    csrf_of(c)
    assert c.post(path, data=data).status_code == 403  # cookie, but no field
    assert c.post(path, data={**data, "csrf": "forged"}).status_code == 403
    assert ResultsDB(state / "results.sqlite", readonly=True).counts()["queued_expert_labels"] == 0


def test_an_upload_without_the_csrf_token_is_refused(state):
    c = client(state)
    csrf_of(c)
    r = c.post("/upload", files={"photos": ("a.jpg", _photos(1)[0].read_bytes(), "image/jpeg")})
    assert r.status_code == 403
    assert not any((state / "inbox").glob("*")) if (state / "inbox").exists() else True


# ---- labels -----------------------------------------------------------------
def test_labelling_takes_the_path_of_review_label_into_the_trainers_queue(state):
    c = client(state)
    token = csrf_of(c)
    sha = sha_of(state, "p0")
    r = c.post("/review/label", data={"csrf": token, "photo": sha, "label": "Apple___healthy", "i": "0"})
    assert r.status_code == 303 and "done=p0" in r.headers["location"]
    db = ResultsDB(state / "results.sqlite", readonly=True)
    entry = db.queue_entry(sha)
    assert entry.kind == "expert" and entry.label == "Apple___healthy" and "/expert/" in entry.file
    assert Path(entry.file).is_file()
    assert [q.photo_id for q in db.queued_for_delivery(10)] == ["p0"]  # what the hand-off sends to the trainer
    assert "p0" not in c.get("/review").text.split("question")[0]


def test_labelling_an_unknown_photo_or_class_says_why(state):
    c = client(state)
    token = csrf_of(c)
    r = c.post("/review/label", data={"csrf": token, "photo": "0" * 64, "label": "Apple___healthy"})
    assert r.status_code == 404 and "no photo" in r.text
    sha = sha_of(state, "p1")
    r = c.post("/review/label", data={"csrf": token, "photo": sha, "label": "Banana___black_sigatoka"})
    assert r.status_code == 400 and "not a known class" in r.text
    assert ResultsDB(state / "results.sqlite", readonly=True).queue_entry(sha).kind == "review"
    r = c.post("/review/label", data={"csrf": token, "photo": sha, "label": "Banana___black_sigatoka", "new_class": "1"})
    assert r.status_code == 303
    assert ResultsDB(state / "results.sqlite", readonly=True).queue_entry(sha).label == "Banana___black_sigatoka"


# ---- engines ----------------------------------------------------------------
def test_rollback_needs_confirmation_and_an_existing_version(state):
    _second_version(state)
    c = client(state)
    token = csrf_of(c)
    assert f"Roll back to {SHIPPED}" in c.get("/engines").text
    r = c.post("/engines/rollback", data={"csrf": token, "to": "v0009", "confirm": "yes"})
    assert r.status_code == 404 and "v0009" in r.text
    assert c.post("/engines/rollback", data={"csrf": token, "to": SHIPPED}).status_code == 400
    store = resolve_store(AppConfig(), state)
    assert store.current() == SHIPPED_NEXT
    r = c.post("/engines/rollback", data={"csrf": token, "to": SHIPPED, "confirm": "yes"})
    assert r.status_code == 303 and store.current() == SHIPPED
    page = c.get("/engines").text
    assert f"Pinned to {SHIPPED}" in page and f"rollback from {SHIPPED_NEXT}" in page  # offers of it are refused now
    assert c.post("/engines/unpin", data={"csrf": "forged"}).status_code == 403 and store.pin() is not None
    assert c.post("/engines/unpin", data={"csrf": token}).status_code == 303 and store.pin() is None
    assert "Pinned to" not in c.get("/engines").text


def test_rollback_to_a_tampered_version_is_refused(state):
    _second_version(state)
    store = resolve_store(AppConfig(), state)
    store.set_current(SHIPPED_NEXT)
    with open(store.root / SHIPPED / "model.onnx", "r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02")
    c = client(state)
    r = c.post("/engines/rollback", data={"csrf": csrf_of(c), "to": SHIPPED, "confirm": "yes"})
    assert r.status_code == 409 and store.current() == SHIPPED_NEXT


def test_rollback_to_a_version_no_trusted_key_signed_is_refused(state):
    _second_version(state)  # published without a signature
    store = resolve_store(AppConfig(), state)
    store.set_current(SHIPPED)
    c = client(state)
    r = c.post("/engines/rollback", data={"csrf": csrf_of(c), "to": SHIPPED_NEXT, "confirm": "yes"})
    assert r.status_code == 409 and "not signed" in r.text and store.current() == SHIPPED


# ---- upload -----------------------------------------------------------------
def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels (a decompression bomb's header) and ends properly."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def _upload(c: TestClient, *files: tuple[str, bytes]):
    return c.post("/upload", data={"csrf": csrf_of(c)}, files=[("photos", (n, b, "application/octet-stream")) for n, b in files])


def test_an_upload_lands_in_the_inbox_under_a_safe_name_and_links_to_its_result(state):
    c = client(state)
    data = _photos(8)[7].read_bytes()
    r = _upload(c, ("../../../etc/evil name.jpg", data))
    assert r.status_code == 201
    stored = list((state / "inbox").iterdir())
    assert len(stored) == 1 and stored[0].name.startswith("upload-") and stored[0].suffix == ".jpg"
    assert stored[0].read_bytes() == data and not (state.parent / "etc").exists()
    sha = hashlib.sha256(data).hexdigest()
    assert f"/photo/{sha}?name={stored[0].name}" in r.text and "evil name.jpg" in r.text
    page = c.get(f"/photo/{sha}", params={"name": stored[0].name})
    assert "Waiting for the daemon" in page.text and 'http-equiv="refresh"' in page.text


def test_an_oversized_upload_is_refused_and_nothing_is_stored(state):
    c = client(state, max_file_bytes=20_000)
    big = next(p for p in GATE.glob("*/*.jpg") if p.stat().st_size > 20_000)
    r = _upload(c, ("big.jpg", big.read_bytes()))
    assert r.status_code == 413 and "too large" in r.text
    assert not (state / "inbox").exists() or not any((state / "inbox").iterdir())


def test_a_non_image_or_a_decompression_bomb_is_refused_with_the_reason(state):
    c = client(state)
    r = _upload(c, ("notes.jpg", b"these are not pixels" * 50))
    assert r.status_code == 415 and "not a supported image" in r.text
    r = _upload(c, ("bomb.png", _png_header(30000, 30000)))
    assert r.status_code == 413 and "decompression bomb" in r.text
    r = _upload(c, ("empty.jpg", b""))
    assert r.status_code == 415 and "empty file" in r.text
    half = _photos(1)[0].read_bytes()
    r = _upload(c, ("half.jpg", half[: len(half) // 2]))
    assert r.status_code == 415
    assert not (state / "inbox").exists() or not any((state / "inbox").iterdir())


def test_an_upload_of_several_photos_stores_the_good_ones_and_says_why_not_the_others(state):
    c = client(state)
    r = _upload(c, ("a.jpg", _photos(8)[6].read_bytes()), ("b.txt", b"hello"), ("c.jpg", _photos(8)[7].read_bytes()))
    assert r.status_code == 201
    assert r.text.count("see its result") == 2 and r.text.count("refused: not a supported image") == 1
    assert len(list((state / "inbox").iterdir())) == 2


def test_an_upload_onto_a_full_disk_says_so_and_leaves_no_part_file(state, monkeypatch):
    import errno

    import edge_agent.inbox_files as inbox_files

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    c = client(state)  # (its secret written first: the patch below is os.fsync itself)
    monkeypatch.setattr(inbox_files.os, "fsync", full)
    r = _upload(c, ("a.jpg", _photos(8)[7].read_bytes()))
    assert r.status_code == 507 and "the device&#39;s disk is full: nothing was written" in r.text, r.text
    assert list((state / "inbox").iterdir()) == []


def test_an_upload_into_an_inbox_that_cannot_be_written_is_not_called_a_full_disk(state, monkeypatch):
    """A permission refused (the inbox made by another user) is the device's fault, named with the folder, not a 507
    telling the farmer to free space that is there."""
    import errno

    import edge_agent.inbox_files as inbox_files

    def refused(fd):
        raise PermissionError(errno.EACCES, "Permission denied")

    c = client(state)  # (its secret written first: the patch below is os.fsync itself)
    monkeypatch.setattr(inbox_files.os, "fsync", refused)
    r = _upload(c, ("a.jpg", _photos(8)[7].read_bytes()))
    assert r.status_code == 500 and "could not store the photo in " in r.text and "Permission denied" in r.text, r.text
    assert "disk is full" not in r.text and list((state / "inbox").iterdir()) == []


def test_an_upload_with_no_file_is_a_clear_error(state):
    c = client(state)
    r = c.post("/upload", data={"csrf": csrf_of(c)})
    assert r.status_code == 400 and "no photo" in r.text


# ---- photos -----------------------------------------------------------------
def test_images_are_served_by_sha256_from_the_state_directory_only(state):
    c = client(state)
    for pid in ("p0", "p3"):  # one in the review pool, one moved to processed/
        r = c.get(f"/img/thumb/{sha_of(state, pid)}")
        assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg" and r.content[:3] == b"\xff\xd8\xff"
    assert (state / "web" / "thumbs" / "thumb").is_dir()  # cached
    for bad in (
        "/img/thumb/..%2F..%2Fresults.sqlite",
        "/img/thumb/" + "g" * 64,
        "/img/huge/" + sha_of(state, "p0"),
        "/img/thumb/../../results.sqlite",
        "/photo/..%2Fresults.sqlite",
    ):
        assert c.get(bad).status_code == 404, bad


def test_a_result_pointing_outside_the_state_directory_is_not_served(state, tmp_path):
    """A photo the daemon left outside the state directory and the inbox (a symlink target, a moved inbox) is not
    served, even though its result names the file and the bytes match."""
    outside = tmp_path / "secret.jpg"
    shutil.copy(_photos(10)[9], outside)
    sha = hashlib.sha256(outside.read_bytes()).hexdigest()
    db = ResultsDB(state / "results.sqlite")
    assert db.commit([ResultRow(sha, "px", str(outside), "folder", "a", 0.9, [["a", 0.9]], "v0001", {})]) == [True]
    db.close()
    c = client(state)
    assert c.get(f"/img/thumb/{sha}").status_code == 404
    (state / "inbox").mkdir(exist_ok=True)
    (state / "inbox" / "secret.jpg").symlink_to(outside)  # a link from inside pointing out is not followed out
    db = ResultsDB(state / "results.sqlite")
    db._db.execute("UPDATE results SET path = ? WHERE sha256 = ?", (str(state / "inbox" / "secret.jpg"), sha))
    db.close()
    assert c.get(f"/img/thumb/{sha}").status_code == 404
    shutil.copy(outside, state / "processed" / time.strftime("%Y-%m-%d") / "secret.jpg")  # moved in by the daemon
    assert c.get(f"/img/thumb/{sha}").status_code == 200


def test_a_quarantined_upload_shows_its_reason(state):
    db = ResultsDB(state / "results.sqlite")
    db.add_quarantine("upload-20261122-101010-abcdef012345.jpg", None, "undecodable JPEG (corrupt image data)", "folder")
    db.close()
    c = client(state)
    r = c.get("/photo/" + "a" * 64, params={"name": "upload-20261122-101010-abcdef012345.jpg"})
    assert "Quarantined" in r.text and "undecodable JPEG" in r.text


def test_the_web_process_imports_neither_opencv_nor_onnxruntime_nor_torch():
    code = (
        "import sys, edge_agent.web.app, edge_agent.cli; "
        "print(json.dumps(sorted(m for m in ('cv2', 'onnxruntime', 'torch', 'numpy') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, cwd=REPO, check=True)
    assert json.loads(out.stdout) == []


def test_a_heic_upload_is_stored_as_heic_and_its_thumbnail_is_made(state):
    import io

    import numpy as np

    pillow_heif = pytest.importorskip("pillow_heif", reason="pillow-heif is not installed")
    from PIL import Image

    rgb = np.asarray(Image.open(_photos(9)[8]).convert("RGB"))
    out = io.BytesIO()
    pillow_heif.from_pillow(Image.fromarray(rgb)).save(out, quality=90)
    c = client(state)
    r = _upload(c, ("IMG_0042.HEIC", out.getvalue()))
    assert r.status_code == 201
    stored = next((state / "inbox").iterdir())
    assert stored.suffix == ".heic"
    # once the daemon has a result for it, the page shows it like any photo
    sha = hashlib.sha256(out.getvalue()).hexdigest()
    db = ResultsDB(state / "results.sqlite")
    db.commit([ResultRow(sha, "ph", str(stored), "folder", "Apple___healthy", 0.9, [["Apple___healthy", 0.9]], "v0001", {})])
    db.close()
    thumb = c.get(f"/img/thumb/{sha}")
    assert thumb.status_code == 200 and thumb.content[:3] == b"\xff\xd8\xff"


def test_an_unsure_or_unknown_answer_reads_as_such_not_as_a_disease_name(state):
    db = ResultsDB(StateLayout(state).db)
    classes = resolve_store(AppConfig(), state).open(verify=False).classes
    src = _photos(8)
    rows = []
    for i, verdict in ((6, "unsure"), (7, "unknown")):
        sha = hashlib.sha256(src[i].read_bytes() + b"v").hexdigest()
        rows.append(ResultRow(sha, f"v{i}", str(src[i]), "folder", classes[3], 0.93, [[classes[3], 0.93]], "v1000", {}, verdict=verdict))
    db.commit(rows, [])
    db.close()
    c = client(state)
    page = c.get("/photos").text
    assert 'class="verdict unsure">Not sure: ask an expert<' in page and 'class="verdict unknown">Not a plant I know<' in page
    assert page.count("best guess: ") == 2  # the class is only a guess there; the six confident-era rows show their class
    assert page.count('class="conf ">93 %<') == 2 and 'class="conf high">93 %<' not in page  # a guess's 93 % is not green
    photo = c.get(f"/photo/{rows[1].sha256}").text
    assert "Not a plant I know" in photo and "Best guess:" in photo and '<dd id="verdict">unknown</dd>' in photo
    old = c.get(f"/photo/{sha_of(state, 'p3')}").text  # a result stored before verdicts existed
    assert "not recorded (before verdicts)" in old and "Best guess" not in old


def test_a_photo_not_answered_confidently_says_why_on_its_page_and_in_the_api(state):
    """A 0.9998 answer marked "not sure" puzzles a farmer unless the page says why (the sample apple scab leaf)."""
    db = ResultsDB(StateLayout(state).db)
    classes = resolve_store(AppConfig(), state).open(verify=False).classes
    src = _photos(8)
    why = "further from the training photos than a confident answer may be"
    sha = hashlib.sha256(src[6].read_bytes() + b"why").hexdigest()
    top = [[classes[3], 0.9998]]
    db.commit([ResultRow(sha, "pw", str(src[6]), "folder", classes[3], 0.9998, top, "v1000", {}, verdict="unsure", verdict_reason=why)], [])
    db.close()
    c = client(state)
    assert f'<span class="muted" id="verdict-reason">({why})</span>' in c.get(f"/photo/{sha}").text
    assert f'class="verdict unsure" title="{why}">Not sure: ask an expert<' in c.get("/photos").text
    assert c.get(f"/api/v1/results/{sha}").json()["verdict_reason"] == why
    old = c.get(f"/api/v1/results/{sha_of(state, 'p3')}").json()  # stored before reasons were kept
    assert old["verdict_reason"] is None and 'id="verdict-reason"' not in c.get(f"/photo/{sha_of(state, 'p3')}").text


def test_the_page_reads_a_ledger_a_daemon_not_yet_upgraded_wrote_without_verdict_reasons(state):
    """The web server may start on the new release before the daemon has opened (and upgraded) the ledger."""
    import sqlite3

    path = StateLayout(state).db
    with sqlite3.connect(path) as con:
        con.execute("ALTER TABLE results DROP COLUMN verdict_reason")
    c = client(state)
    page = c.get("/photos")
    assert page.status_code == 200 and page.text.count('class="card"') == 6
    assert c.get(f"/photo/{sha_of(state, 'p3')}").status_code == 200
    assert c.get("/api/v1/results").json()["results"][0]["verdict_reason"] is None


def test_query_parameters_out_of_range_are_a_400_with_the_reason_not_a_500(state):
    c = client(state)
    for query, why in (
        ("page=99999999999999999999", "not a number"),
        ("page=-3", "not a number"),
        ("to=9999-12-31", "9999-12-31"),
        ("from=yesterday", "not a day"),
        ("from=0001-01-01", "0001-01-01"),
    ):
        r = c.get(f"/photos?{query}")
        assert r.status_code == 400 and why in r.text, query
    assert c.get("/review?i=99999999999999999999").status_code == 400
    assert c.get("/photos?page=2&from=2026-01-01&to=2026-12-31").status_code == 200


def test_a_page_on_another_port_cannot_forge_a_csrf_token_by_tossing_a_cookie(state):
    """Cookies are not isolated by port: another page on this host can set ``edge_session`` to a value it knows (and
    could read a script-visible cookie). The token is an HMAC of the session with this installation's secret, so it
    can neither read nor compute the one that goes with it."""
    import hashlib
    import hmac

    victim = client(state)
    token = csrf_of(victim)
    attacker = client(state)
    attacker.cookies.set("edge_session", "attacker-chosen-session-value")
    for guess in ("attacker-chosen-session-value", token, hmac.new(b"", b"attacker-chosen-session-value", hashlib.sha256).hexdigest()[:40]):
        r = attacker.post("/engines/unpin", data={"csrf": guess})
        assert r.status_code == 403, guess
    assert victim.post("/engines/unpin", data={"csrf": token}).status_code == 303  # the session's own token works
    assert (state / "web" / "csrf.key").stat().st_mode & 0o077 == 0  # the secret is the owner's alone


def test_a_body_that_lies_about_its_length_is_cut_off_at_the_cap_as_it_streams(state):
    """``Content-Length: 1000`` with a chunked body of 300 MiB: the bytes are counted as they arrive; past the upload
    cap (50 photos of 20 kB + 1 MiB here) nothing more is read and the answer is 413."""
    import asyncio

    from edge_agent.web.app import MAX_FILES_PER_UPLOAD

    app = app_for(state, max_file_bytes=20_000)
    chunk = b"x" * (1 << 16)
    pulled, sent = [0], []

    head = b'--zzz\r\nContent-Disposition: form-data; name="photos"; filename="a.jpg"\r\nContent-Type: image/jpeg\r\n\r\n'

    async def receive():  # one file part that never ends
        pulled[0] += 1
        return {"type": "http.request", "body": (head if pulled[0] == 1 else b"") + chunk, "more_body": pulled[0] < 300 * 16}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/upload",
        "raw_path": b"/upload",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8080"),
            (b"content-length", b"1000"),
            (b"transfer-encoding", b"chunked"),
            (b"cookie", b"edge_session=" + b"s" * 32),
            (b"content-type", b"multipart/form-data; boundary=zzz"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
        "scheme": "http",
        "http_version": "1.1",
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413
    assert pulled[0] * len(chunk) <= MAX_FILES_PER_UPLOAD * 20_000 + (1 << 20) + len(chunk)  # at the cap, not 300 MiB later
    assert not (state / "inbox").exists() or not any((state / "inbox").iterdir())


def test_a_thousand_idle_connections_neither_take_the_page_down_nor_flood_the_log(state, tmp_path):
    """1,100 connections that never send a request (the cap is 200 here: the longest idle make room): the page still
    answers within 1 s at p95, idle ones
    are closed after the first-request deadline, and what was refused is one log line, not a traceback each."""
    cfg = tmp_path / "web.toml"
    cfg.write_text("[web]\nmax_connections = 200\nidle_timeout_s = 2.0\n")
    port = _free_port()
    log = tmp_path / "web.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edge_agent", "web", "--config", str(cfg), "--state-dir", str(state), "--port", str(port)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    idle = []
    try:
        _wait_listening("127.0.0.1", port, proc)
        for _ in range(1100):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), 2))
            except OSError:
                break
        took = []
        for _ in range(20):
            t0 = time.monotonic()
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
            took.append(time.monotonic() - t0)
        assert sorted(took)[18] < 1.0, took  # p95
        time.sleep(3.0)  # past the deadline: every idle connection was closed by the server
        closed = 0
        for s in idle:
            s.settimeout(0.5)
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
        assert closed == len(idle)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        assert proc.wait(10) == 0
    text = log.read_text()
    assert "Traceback" not in text and text.count("connections_closed") <= 2 and len(text) < 20_000


def test_the_engines_page_says_whether_the_trainers_last_retrain_published_a_version(state):
    import os

    (state / "trainer").mkdir(exist_ok=True)
    status = state / "trainer" / "status.json"
    for last, says in (
        ({"published": "v4001", "reason": "candidate is not worse"}, "last retrain published v4001"),
        ({"published": None, "reason": "field check: top-1 0.80 < current 0.85"}, "last candidate not published: field check: top-1 0.80"),
    ):
        status.write_text(json.dumps({"pid": os.getpid(), "updated": time.time(), "state": "idle", "last_retrain": last}))
        line = client(state).get("/engines").text.split('id="engines-trainer"')[1].split("</p>")[0]
        assert says in line and ("not published" in line) is (last["published"] is None), line


def test_the_health_page_says_when_the_trainer_here_cannot_store_labels(state):
    """A trainer on this state directory whose disk is full stores no label: the Trainer tile says so (its status had
    it, no page did); a trainer that stores them again says nothing of it."""
    import os

    (state / "trainer").mkdir(exist_ok=True)
    status = state / "trainer" / "status.json"
    for problem in ({"error": "OSError(28, 'No space left on device')", "full": True, "since": time.time()}, None):
        status.write_text(json.dumps({"pid": os.getpid(), "updated": time.time(), "state": "idle", "store_problem": problem}))
        tile = client(state).get("/health").text.split('id="trainer"')[1].split("</div>")[0]
        assert ('id="trainer-store-problem"' in tile) is (problem is not None)
        if problem:
            assert "labels not stored: the disk is full: the devices keep them" in tile
        assert ('<p class="big">labels not stored</p>' in tile) is (problem is not None)  # not "idle" above it


def test_the_health_pages_daemon_tile_shows_a_stopped_daemons_last_status_as_old_not_as_live(state):
    """A daemon stopped three hours ago showed "up 0 min" and its pipeline's queues "now" under "down"."""
    import os

    engine = {"engine_version": "v4000", "provider": "CPUExecutionProvider", "precision": "int8"}
    live = {"uptime_s": 60, "engine": engine, "queue_depths": {"decode": 3}}
    for pid, updated in ((0, time.time() - 3 * 3600), (os.getpid(), time.time())):
        (state / "status.json").write_text(json.dumps({"pid": pid, "updated": updated, **live}))
        page = client(state).get("/health").text
        tile = page.split('id="daemon"')[1].split("</div>")[0]
        if pid:
            assert "running" in tile and "up 1 min" in tile and "last wrote" not in tile
            assert "in the pipeline now: decode 3" in page
        else:
            assert "down" in tile and "when it last ran" in tile and "up 1 min" not in tile
            assert '<p class="small" id="daemon-last">it last wrote its status 3 h ago</p>' in tile
            assert "in the pipeline now" not in page


def test_the_health_page_says_first_when_the_state_directorys_disk_is_mounted_read_only(state, monkeypatch):
    """A failing SD card remounts itself read-only: the daemon records nothing and cannot even write its status."""
    assert 'id="read-only"' not in client(state).get("/health").text
    monkeypatch.setattr("edge_agent.web.app.read_only_disk", lambda path: path == state)
    tile = client(state).get("/health").text.split('id="daemon"')[1].split("</div>")[0]
    assert '<p class="warn" id="read-only">the state directory&#39;s disk is mounted read-only: nothing is recorded' in tile
    assert "edge-agent backup --out FILE" in tile


def test_the_trainer_tile_of_a_stopped_trainer_says_a_due_retrain_starts_when_it_runs_not_when_it_is_free(state):
    """Seen on the Health page of a card gone read-only: "not running" over "a retrain is due: it starts when the
    trainer is free"."""
    import os

    (state / "trainer").mkdir(exist_ok=True)
    due = {"sentence": "a retrain is due: it starts when the trainer is free", "waiting_for": "nothing"}
    for pid, says in ((0, "it starts when the trainer runs"), (os.getpid(), "it starts when the trainer is free")):
        st = {"pid": pid, "updated": time.time(), "state": "idle", "samples": {"new": 30}, "next_publish": due}
        (state / "trainer" / "status.json").write_text(json.dumps(st))
        tile = client(state).get("/health").text.split('id="trainer"')[1].split("</div>")[0]
        assert f"<strong>Next version:</strong> a retrain is due: {says}." in tile, tile


def test_the_health_page_says_when_the_trainer_here_waits_for_room_to_retrain(state):
    """A trainer whose disk has no room for a retrain's version starts none and says so: the Trainer tile heads it
    "waiting for room" and says what it waits for; with room again, nothing of it."""
    import os

    (state / "trainer").mkdir(exist_ok=True)
    status = state / "trainer" / "status.json"
    why = "the disk is full: a retrain writes about 80 MiB and 3 MiB is free; it starts once there is room (the labels wait)"
    for waiting in (why, None):
        status.write_text(json.dumps({"pid": os.getpid(), "updated": time.time(), "state": "idle", "waiting_for_room": waiting}))
        tile = client(state).get("/health").text.split('id="trainer"')[1].split("</div>")[0]
        assert ('id="trainer-room"' in tile) is (waiting is not None) and (why in tile) is (waiting is not None)
        assert ('<p class="big">waiting for room</p>' in tile) is (waiting is not None), tile


def test_the_engines_page_says_whether_the_unlabelled_photos_taught_each_version_and_how_many_labels_waited(state):
    store = resolve_store(AppConfig(), state)
    v1 = store.open(SHIPPED)
    base = {k: v for k, v in v1.manifest.items() if k not in ("version", "files", "created", "parent", "metrics")}
    gate = {"publish": True, "reason": "not worse", "candidate_top1": 0.9, "current_top1": 0.9, "tolerance": 0.02}
    terms = [
        {"taken": 57, "kept": True},
        {"taken": 90, "kept": False},
        {"field_photos": 6, "kept": False, "reason": "the field check holds 6 of the 12 photos the unlabelled term waits for"},
    ]
    names = [
        store.publish({n: v1.path / n for n in v1.manifest["files"]}, {**base, "metrics": {"gate": gate, "unlabelled": t}}).name
        for t in terms
    ]
    many = {"pseudo": 0, "expert": 800, "waiting": 412}  # a season's labels past [trainer] labels_per_retrain
    names.append(store.publish({n: v1.path / n for n in v1.manifest["files"]}, {**base, "metrics": {"gate": gate, "samples": many}}).name)
    page = client(state).get("/engines").text
    cell = {n: page.split(f'data-version="{n}"')[1].split('class="small trained-on"')[1].split("</td>")[0] for n in [*names, SHIPPED]}
    assert "57 unlabelled photos" in cell[names[0]] and "no unlabelled" not in cell[names[0]]
    assert "no unlabelled photos: the field check preferred the candidate without them" in cell[names[1]]
    assert "no unlabelled photos: the field check holds 6 of the 12 photos" in cell[names[2]]
    assert "unlabelled" not in cell[SHIPPED]  # the shipped model: trained before any field photo
    assert "800 expert labels<br><span" in cell[names[3]] and "412 more labels waited for a later retrain" in cell[names[3]]
    assert "waited" not in cell[names[0]]
    assert "release (efficientnet-lite0, fine-tuned from ImageNet weights)" in page.split(f'data-version="{SHIPPED}"')[1]
    assert "release (LeafNet5, trained from scratch)" in page.split('data-version="v1000"')[1]


def test_the_pages_of_a_state_directory_the_daemon_has_not_used_show_the_shipped_engines_and_copy_nothing(tmp_path):
    """`edge-agent web` started before the daemon ever ran: every page that names the classes or the engines copied the
    whole shipped store (107 MB) into <state>/engines. Now they read the shipped store where it lies."""
    state = tmp_path / "state"
    state.mkdir()
    c = client(state)
    for path in ("/engines", "/api/v1/engines", "/classes", "/health"):
        assert c.get(path).status_code == 200, path
    assert SHIPPED in c.get("/engines").text
    assert c.get("/api/v1/engines").json()["current"] == SHIPPED
    assert not (state / "engines").exists()
