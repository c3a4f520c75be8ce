"""Where the farm's trees stand stays on the farm: photos handed to the trainer have their GPS position (and the names
and serial numbers of who took them, with what) blanked out of their EXIF and XMP, every other byte kept (pixels,
orientation, time), unless ``[handoff] send_place`` says otherwise."""

from __future__ import annotations

import hashlib
import io
import random
import struct
import time

import numpy as np
import pytest
from PIL import Image

from edge_agent.capture import read_capture
from edge_agent.handoff import _no_place
from edge_agent.handoff._no_place import without_place
from edge_agent.imageheader import ifd_entries, read_header
from edge_agent.preprocess import decode_bgr

from .test_capture_place import ORCHARD, _gps

TAKEN = "2026:06:14 09:30:00"


def _exif(orientation: int = 1) -> bytes:
    """An EXIF block with a position, when the photo was taken and ``orientation``."""
    exif = Image.Exif()
    exif.load(_gps(*ORCHARD))
    exif[0x0112] = orientation
    exif.get_ifd(0x8769)[0x9003] = TAKEN
    return exif.tobytes()


def _photo(fmt: str, orientation: int = 1, **kw) -> bytes:
    out = io.BytesIO()
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(out, fmt, exif=_exif(orientation), **kw)
    return out.getvalue()


def _when_where(data: bytes):
    got = read_capture(data, time.mktime(time.strptime(TAKEN, "%Y:%m:%d %H:%M:%S")) + 3600)
    return got.taken, got.place


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
def test_a_photo_handed_over_keeps_no_position_but_its_pixels_orientation_time_and_size(fmt):
    data = _photo(fmt, orientation=6, **({"lossless": True} if fmt == "WEBP" else {}))
    taken, place = _when_where(data)
    assert place is not None and taken is not None
    out, ext = without_place(data)
    assert ext is None and len(out) == len(data)  # blanked in place: no offset moved
    assert _when_where(out) == (taken, None)
    assert read_header(out).orientation == 6
    assert np.array_equal(decode_bgr(out), decode_bgr(data))
    assert Image.open(io.BytesIO(out)).getexif().get_ifd(0x8825) == {}  # another reader finds no position either
    Image.open(io.BytesIO(out)).load()  # a PNG's checksums hold


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "TIFF"])
def test_a_photo_handed_over_names_neither_its_camera_nor_who_took_it_and_keeps_the_rest(fmt):
    exif = Image.Exif()
    exif[0x0112], exif[0x013B], exif[0x8298], exif[0x010F] = 6, "Maria Rossi", "(c) Rossi farm", "Canon"  # artist, copyright, make
    sub = exif.get_ifd(0x8769)
    sub[0x9003], sub[0xA430], sub[0xA431], sub[0xA435] = TAKEN, "Maria", "0123456789", "ab"  # time, owner, body, lens (<= 4: inline)
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 160, 40)).save(out, fmt, exif=exif.tobytes())
    data = out.getvalue()
    blanked, ext = without_place(data)
    assert ext is None and len(blanked) == len(data)
    for secret in (b"Maria Rossi", b"Rossi farm", b"0123456789", b"Maria"):
        assert secret in data and secret not in blanked, secret
    got = Image.open(io.BytesIO(blanked)).getexif()
    assert (got[0x0112], got[0x010F], got.get_ifd(0x8769)[0x9003]) == (6, "Canon", TAKEN)  # orientation, make, time kept
    assert all(not str(got.get_ifd(0x8769).get(t, "")).strip("\x00") for t in (0xA430, 0xA431, 0xA435))
    assert _when_where(blanked)[0] is not None and np.array_equal(decode_bgr(blanked), decode_bgr(data))


def test_a_heic_photos_position_is_blanked_too():
    pillow_heif = pytest.importorskip("pillow_heif")
    buf = io.BytesIO()
    pillow_heif.from_pillow(Image.new("RGB", (64, 48), (30, 150, 40))).save(buf, exif=_exif())
    data = buf.getvalue()
    assert _when_where(data)[1] is not None
    out, ext = without_place(data)
    assert ext is None and _when_where(out)[1] is None and _when_where(out)[0] is not None


def test_a_photo_without_a_position_is_handed_over_byte_for_byte():
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 150, 40)).save(out, "JPEG")
    data = out.getvalue()
    assert without_place(data) == (data, None)
    assert without_place(b"not a photo") == (b"not a photo", None)


def test_a_position_in_the_xmp_is_blanked_and_the_rest_of_the_xmp_kept():
    xmp = (
        b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
        b'<rdf:Description xmlns:exif="http://ns.adobe.com/exif/1.0/" xmlns:xmp="http://ns.adobe.com/xap/1.0/" '
        b'xmlns:aux="http://ns.adobe.com/exif/1.0/aux/" aux:SerialNumber="SN-778812" '
        b'exif:GPSLatitude="47,23.8687N" exif:GPSLongitude="8,32.8339E" xmp:CreatorTool="Camera">'
        b"<exif:GPSAltitude>4200/10</exif:GPSAltitude><exifEX:BodySerialNumber>B-99</exifEX:BodySerialNumber>"
        b"</rdf:Description></rdf:RDF></x:xmpmeta>"
    )
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 150, 40)).save(out, "JPEG", xmp=xmp)
    data = out.getvalue()
    assert b"47,23.8687N" in data
    blanked, _ = without_place(data)
    assert b"47,23.8687N" not in blanked and b"8,32.8339E" not in blanked and b"4200/10" not in blanked
    assert b"SN-778812" not in blanked and b"B-99" not in blanked and b"SN-778812" in data  # the camera's serials too
    assert b'xmp:CreatorTool="Camera"' in blanked and len(blanked) == len(data)
    assert np.array_equal(decode_bgr(blanked), decode_bgr(data))


def test_a_position_that_cannot_be_blanked_in_place_goes_as_the_upright_pixels_alone(monkeypatch):
    data = _photo("PNG", orientation=6)
    monkeypatch.setattr(_no_place, "_empty_gps", lambda buf, start, length: [(0, 0)])  # as a HEIC keeping EXIF in pieces
    out, ext = without_place(data)
    assert ext == ".png" and _when_where(out) == (None, None)
    assert read_header(out).orientation == 1 and np.array_equal(decode_bgr(out), decode_bgr(data))


def test_a_garbled_gps_block_never_raises_and_never_blanks_the_orientation():
    good = _photo("JPEG", orientation=6)
    start = good.find(b"Exif\x00\x00") + 6
    (length,) = struct.unpack(">H", good[start - 8 : start - 6])  # the APP1 segment's, from its marker on
    rng = random.Random(5)
    for _ in range(300):
        bad = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            bad[start + rng.randrange(length - 8)] = rng.randrange(256)  # within the EXIF block
        orientation = read_header(bytes(bad)).orientation
        out, _ = without_place(bytes(bad))  # no exception, whatever the bytes
        if orientation == 6:
            assert read_header(out).orientation == 6
    tiff = good[start:]
    gps = next(struct.unpack(e + "I", v)[0] for e, tag, _t, _c, v in ifd_entries(tiff) if tag == 0x8825)
    assert gps > 8


def test_the_trainer_gets_photos_without_their_position_unless_the_farm_sends_it(tmp_path):
    pytest.importorskip("zmq")
    from edge_agent.ledger_rows import QueueEntry
    from edge_agent.spool import SpoolItem

    from .daemon_helpers import wait_until
    from .test_handoff import delivering, make_sender

    for send_place in (False, True):
        root = tmp_path / str(send_place)
        endpoints = (f"ipc://{root}/run/handoff.sock", f"ipc://{root}/run/engines.sock")
        sender, db, spool, _ = make_sender(root, endpoints, send_place=send_place)
        data = _photo("JPEG")
        sha = hashlib.sha256(data).hexdigest()
        [f] = spool.put_many([SpoolItem("expert", sha, data)])
        db.commit([], [QueueEntry(sha, sha[:16], "expert", "Apple___Apple_scab", 1.0, "v0001", str(f), len(data))])
        with delivering(sender, root, endpoints) as store:
            wait_until(lambda db=db: not db.queued_for_delivery(10), 20, "acknowledged")
            [sample] = store.all()
        got = open(sample.file, "rb").read()
        assert sample.id == sha  # the device's id of the photo, whatever was blanked
        assert (_when_where(got)[1] is not None) is send_place
        assert np.array_equal(decode_bgr(got), decode_bgr(data))


def test_the_makers_own_note_where_it_keeps_the_cameras_serial_number_is_zeroed():
    exif = Image.Exif()
    exif[0x0112] = 6
    sub = exif.get_ifd(0x8769)
    sub[0x9003], sub[0x927C] = TAKEN, b"Nikon\x00\x02\x10\x00\x00MM\x00*SERIAL-4471902 and the maker's own data"
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 160, 40)).save(out, "JPEG", exif=exif.tobytes())
    data = out.getvalue()
    blanked, ext = without_place(data)
    assert b"SERIAL-4471902" in data and b"SERIAL-4471902" not in blanked and b"Nikon" not in blanked
    assert ext is None and len(blanked) == len(data) and read_header(blanked).orientation == 6
    assert _when_where(blanked)[0] is not None and np.array_equal(decode_bgr(blanked), decode_bgr(data))


def _png_with(add) -> bytes:
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    add(info)
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(out, "PNG", pnginfo=info)
    return out.getvalue()


GPS_XMP = '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description exif:GPSLatitude="47,23.8687N" exif:GPSLongitude="8,32.8339E"/></x:xmpmeta>'


@pytest.mark.parametrize(
    "what, add",
    [
        ("compressed XMP", lambda info: info.add_itxt("XML:com.adobe.xmp", GPS_XMP, zip=True)),
        ("ImageMagick's EXIF profile", lambda info: info.add_text("Raw profile type exif", "\nexif\n  120\n4578696600004d4d", zip=True)),
        ("ImageMagick's profile uncompressed", lambda info: info.add_text("Raw profile type xmp", "\nxmp\n 40\n3c783a786d706d657461")),
    ],
)
def test_a_png_whose_metadata_is_compressed_or_hex_goes_as_its_pixels_alone(what, add):
    """The position inside a compressed or hex-encoded chunk cannot be blanked in place (nor is it decompressed here:
    it may be a bomb): the photo goes as its pixels, with no metadata at all."""
    data = _png_with(add)
    out, ext = without_place(data)
    assert ext == ".png" and np.array_equal(decode_bgr(out), decode_bgr(data))
    chunks = []
    pos = 8
    while pos < len(out):
        size, name = struct.unpack(">I4s", out[pos : pos + 8])
        chunks.append(name)
        pos += 12 + size
    assert not {b"iTXt", b"zTXt", b"tEXt"} & set(chunks), (what, chunks)


def test_a_png_with_compressed_text_that_is_not_metadata_is_handed_over_byte_for_byte():
    data = _png_with(lambda info: info.add_itxt("Description", "a leaf of tree 12, as the farmer wrote it", zip=True))
    assert without_place(data) == (data, None)
