"""A season of phone photos does not fill the trainer's disk: a photo larger than ``[handoff] photo_side`` goes to the
trainer reduced to it, upright, as JPEG with no metadata, and gives the model nearly the tensor the daemon saw; a
smaller one, one that cannot be decoded, or one whose copy would be no smaller goes as it is."""

from __future__ import annotations

import hashlib
import io
import time

import cv2
import numpy as np
import pytest
from PIL import Image

from edge_agent.capture import read_capture
from edge_agent.handoff.reduce import reduced
from edge_agent.imageheader import read_header
from edge_agent.preprocess import DEFAULT_SPEC, decode_bgr, preprocess_bytes

from .test_no_place import _exif


def _scene(h: int, w: int, seed: int = 5) -> np.ndarray:
    """A photo-like BGR image: smooth shapes at every scale down to a few pixels, and sensor noise."""
    rng = np.random.default_rng(seed)
    img = np.zeros((h, w, 3), np.float32)
    for cells, weight in ((6, 60), (40, 30), (200, 15)):
        small = rng.uniform(0, 255, (cells, max(2, cells * w // h), 3)).astype(np.float32)
        img += weight / 105 * cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    img += rng.normal(0, 3, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _jpeg(img: np.ndarray, orientation: int = 1, quality: int = 92) -> bytes:
    out = io.BytesIO()
    Image.fromarray(img[:, :, ::-1]).save(out, "JPEG", quality=quality, exif=_exif(orientation))
    return out.getvalue()


@pytest.fixture(scope="module")
def phone_photo() -> bytes:
    """A 2400 x 1800 JPEG stored sideways (orientation 6) with a position and a time in its EXIF."""
    return _jpeg(_scene(1800, 2400), orientation=6)


def test_a_phone_sized_photo_goes_upright_at_the_side_as_jpeg_without_any_metadata(phone_photo):
    assert read_capture(phone_photo, time.time()).place is not None
    copy, ext = reduced(phone_photo, 1024)
    assert ext == ".jpg" and len(copy) < len(phone_photo) / 2
    header = read_header(copy)
    assert header.format == "jpeg" and header.orientation == 1
    assert (header.width, header.height) == (1024, 1360)  # upright (1800 x 2400), the aspect kept in whole blocks
    assert header.width % 16 == 0 and header.height % 16 == 0
    assert read_capture(copy, time.time()).place is None and not Image.open(io.BytesIO(copy)).getexif()
    upright, got = (cv2.resize(decode_bgr(d), (256, 340), interpolation=cv2.INTER_AREA).astype(int) for d in (phone_photo, copy))
    assert np.abs(got - upright).mean() < 2 < np.abs(got - upright[::-1, ::-1]).mean()  # the same picture, the same way up


def test_with_send_place_the_copy_keeps_the_position_and_time_upright_without_the_old_thumbnail(phone_photo):
    copy, ext = reduced(phone_photo, 1024, keep_exif=True)
    assert ext == ".jpg" and read_header(copy).orientation == 1 and (read_header(copy).width, read_header(copy).height) == (1024, 1360)
    assert read_capture(copy, time.time() + 3600) == read_capture(phone_photo, time.time() + 3600)  # where and when
    got, upright = (cv2.resize(decode_bgr(d), (256, 340), interpolation=cv2.INTER_AREA).astype(int) for d in (copy, phone_photo))
    assert np.abs(got - upright).mean() < 2  # not turned a second time by its orientation
    exif = Image.open(io.BytesIO(copy)).getexif()
    assert exif.get(0x0112) == 1 and exif.get_ifd(0x8825) and not exif.get_ifd(1)  # no thumbnail stored the old way up
    assert reduced(phone_photo, 1024, keep_exif=False)[0] == reduced(phone_photo, 1024)[0]


def test_with_send_place_a_photo_whose_exif_cannot_be_set_upright_goes_as_taken():
    img = _scene(1800, 2400)
    bad = io.BytesIO()
    Image.fromarray(img[:, :, ::-1]).save(bad, "JPEG", quality=92, exif=b"Exif\x00\x00MM\x00*\x00\x00\x7f\xff")  # no directory
    data = bad.getvalue()
    if b"\x7f\xff" not in data:
        pytest.skip("this Pillow rewrote the block")
    assert reduced(data, 1024) is not None  # without send_place nothing of it is kept: reduced as ever
    assert reduced(data, 1024, keep_exif=True) is None  # the position it may hold cannot be kept upright: as taken


@pytest.mark.parametrize("size", [192, 224, 256])
def test_the_reduced_copy_gives_the_model_nearly_the_tensor_the_daemon_sees(phone_photo, size):
    spec = DEFAULT_SPEC.__class__(size=size, mean=(0.5,) * 3, std=(1 / 255,) * 3)  # the tensor in pixel levels
    daemon, trainer = preprocess_bytes(phone_photo, spec), preprocess_bytes(reduced(phone_photo, 1024)[0], spec)
    levels = np.abs(daemon - trainer)
    assert levels.mean() < 1.0 and levels.max() <= 12


def test_a_copy_with_part_blocks_at_its_edges_would_have_moved_the_tensor_further(phone_photo, monkeypatch):
    """Why each side is a whole number of JPEG blocks: the copy of 1365 px, the aspect to the pixel, is further off."""
    from edge_agent.handoff import reduce as _reduce

    spec = DEFAULT_SPEC.__class__(size=192, mean=(0.5,) * 3, std=(1 / 255,) * 3)
    daemon = preprocess_bytes(phone_photo, spec)
    whole = np.abs(daemon - preprocess_bytes(reduced(phone_photo, 1024)[0], spec)).mean()
    monkeypatch.setattr(_reduce, "_whole_blocks", round)
    assert read_header(reduced(phone_photo, 1024)[0]).height == 1365
    part = np.abs(daemon - preprocess_bytes(reduced(phone_photo, 1024)[0], spec)).mean()
    assert part > whole * 1.3


@pytest.mark.parametrize("fmt", ["PNG", "HEIF"])
def test_a_large_png_or_heic_goes_as_a_jpeg_copy_too(fmt):
    if fmt == "HEIF":
        pytest.importorskip("pillow_heif").register_heif_opener()
    out = io.BytesIO()
    Image.fromarray(_scene(1500, 2000)[:, :, ::-1]).save(out, fmt, exif=_exif(1), **({"quality": 95} if fmt == "HEIF" else {}))
    assert read_capture(out.getvalue(), time.time()).place is not None
    copy, ext = reduced(out.getvalue(), 1024)
    assert ext == ".jpg" and read_header(copy).format == "jpeg" and (read_header(copy).height, read_header(copy).width) == (1024, 1360)
    assert read_capture(copy, time.time()).place is None


def test_a_photo_no_larger_than_the_side_or_with_no_side_set_goes_as_it_is(phone_photo):
    assert reduced(_jpeg(_scene(1024, 1400)), 1024) is None  # its shorter side is the side already
    assert reduced(phone_photo, 0) is None  # photo_side = 0: as taken
    assert reduced(phone_photo, 1800) is None


def test_a_photo_this_module_cannot_decode_goes_as_it_is_without_an_error(phone_photo):
    assert reduced(phone_photo[: len(phone_photo) // 2], 1024) is None  # half copied
    assert reduced(b"not a photo", 1024) is None
    broken = bytearray(phone_photo)
    broken[len(broken) // 2 : len(broken) // 2 + 4000] = bytes(4000)
    out = reduced(bytes(broken), 1024)  # libjpeg decodes what it can of a damaged scan, or refuses: never a raise
    assert out is None or out[1] == ".jpg"


def test_a_photo_that_runs_out_of_memory_or_fails_to_encode_goes_as_it_is(phone_photo, monkeypatch):
    def fails(*_a, **_k):
        raise MemoryError

    monkeypatch.setattr(cv2, "resize", fails)
    assert reduced(phone_photo, 1024) is None
    monkeypatch.undo()
    monkeypatch.setattr(cv2, "imencode", lambda *a, **k: (False, None))
    assert reduced(phone_photo, 1024) is None


def test_a_photo_exactly_twice_the_side_is_reduced_though_its_reduced_decode_is_the_side_already():
    copy, _ = reduced(_jpeg(_scene(2048, 2720, seed=4)), 1024)  # libjpeg's half scale gives 1024 x 1360 itself
    assert (read_header(copy).width, read_header(copy).height) == (1360, 1024)


def test_a_photo_whose_copy_would_be_no_smaller_goes_as_it_is():
    flat = cv2.imencode(".png", np.full((1100, 1100, 3), 120, np.uint8))[1].tobytes()  # a few kB however large
    assert reduced(flat, 1024) is None


def test_the_same_photo_gives_the_same_copy_so_a_resend_is_the_same_photo(phone_photo):
    assert reduced(phone_photo, 1024) == reduced(phone_photo, 1024)


def test_the_trainer_stores_a_phone_photo_reduced_and_keeps_the_devices_id(tmp_path, phone_photo):
    pytest.importorskip("zmq")
    from edge_agent.ledger_rows import QueueEntry
    from edge_agent.spool import SpoolItem

    from .daemon_helpers import wait_until
    from .test_handoff import delivering, make_sender

    small = _jpeg(_scene(600, 800, seed=6))
    for side in (1024, 0):
        root = tmp_path / str(side)
        endpoints = (f"ipc://{root}/run/handoff.sock", f"ipc://{root}/run/engines.sock")
        sender, db, spool, _ = make_sender(root, endpoints, photo_side=side, send_place=True)
        entries = []
        for data in (phone_photo, small):
            sha = hashlib.sha256(data).hexdigest()
            [f] = spool.put_many([SpoolItem("expert", sha, data)])
            entries.append(QueueEntry(sha, sha[:16], "expert", "Apple___Apple_scab", 1.0, "v0001", str(f), len(data)))
        db.commit([], entries)
        with delivering(sender, root, endpoints, photo_side=side) as store:  # (a trainer reduces what it gets: its own side)
            wait_until(lambda db=db: not db.queued_for_delivery(10), 20, "acknowledged")
            got = {s.id: open(s.file, "rb").read() for s in store.all()}
        assert got[hashlib.sha256(small).hexdigest()] == small  # no larger than the side: as taken
        big = got[hashlib.sha256(phone_photo).hexdigest()]  # the device's id of the photo, whatever was sent
        if side:
            assert big == reduced(phone_photo, side, keep_exif=True)[0]  # send_place: reduced, its position kept
            assert read_capture(big, time.time()).place is not None
        else:
            assert big == phone_photo  # photo_side = 0 (and send_place): byte for byte


def test_a_photo_larger_than_a_hand_off_frame_is_set_aside_once_not_resent_for_ever(tmp_path):
    """The trainer drops a frame over ``max_payload_mb`` unread: such a label would sit in flight for ever, holding a
    slot of the window, and such an unlabelled photo would stop every other from going."""
    pytest.importorskip("zmq")
    from edge_agent.ledger_rows import QueueEntry
    from edge_agent.spool import SpoolItem

    from .daemon_helpers import wait_until
    from .test_handoff import make_sender
    from .test_unlabelled import _review_photos, _trainer

    endpoints = (f"ipc://{tmp_path}/run/handoff.sock", f"ipc://{tmp_path}/run/engines.sock")
    sender, db, spool, _ = make_sender(tmp_path, endpoints, photo_side=0, max_payload_mb=1, unlabelled_per_day=4 * 24)
    noise = np.random.default_rng(1)
    big, huge = (cv2.imencode(".jpg", noise.integers(0, 255, (1100, 1100, 3), dtype=np.uint8))[1].tobytes() for _ in "ab")
    assert len(big) > 1 << 20 and len(huge) > 1 << 20
    small = _jpeg(_scene(300, 400, seed=7))
    entries = []
    for kind, data in (("expert", big), ("expert", small), ("review", huge)):
        sha = hashlib.sha256(data).hexdigest()
        [f] = spool.put_many([SpoolItem(kind, sha, data)])
        entries.append(QueueEntry(sha, sha[:16], kind, "Apple___Apple_scab", 0.6, "v0001", str(f), len(data)))
    db.commit([], entries)
    [later] = _review_photos(db, spool, 1)
    with _trainer(tmp_path, endpoints) as (store, pool, receiver):
        sender.start()
        try:
            wait_until(lambda: [p.id for p in pool.photos()] == [later], 20, "the next unlabelled photo, past the large one")
            assert [s.id for s in store.all()] == [hashlib.sha256(small).hexdigest()]
            assert db.queued_for_delivery(10) == [] and receiver.counters["malformed"] == 0  # nothing sent in vain
        finally:
            sender.stop()
    [(reason, moved)] = db._db.execute("SELECT reason, moved_to FROM quarantine").fetchall()
    assert "refused the expert label" in reason and "max_payload_mb = 1" in reason and "photo_side" in reason
    assert open(moved, "rb").read() == big  # kept aside, as the trainer's refusals are
    assert db.queue_entry(hashlib.sha256(huge).hexdigest()).kind == "review"  # still there for the expert
