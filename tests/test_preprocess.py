"""The one preprocessing path: what it produces, and every way a photo is refused."""

from __future__ import annotations

import os
import struct
import zlib

import cv2
import numpy as np
import pytest

from edge_agent import preprocess as pp
from edge_agent.imageheader import read_header
from edge_agent.preprocess import DEFAULT_SPEC, ImageRejected, PreprocessSpec, decode_rgb, preprocess_bytes, preprocess_file

from .conftest import encode, leaf_image, with_exif_orientation


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bomb(side: int = 30000) -> bytes:
    """A complete, valid 1-bit greyscale PNG of side x side pixels (a few hundred KB on disk)."""
    row = b"\x00" + b"\x00" * ((side + 7) // 8)
    comp = zlib.compressobj(9)
    body = b"".join(comp.compress(row) for _ in range(side)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", body) + png_chunk(b"IEND", b"")


def test_output_tensor_shape_dtype_and_normalisation():
    img = np.zeros((300, 400, 3), np.uint8)
    img[:] = (0, 0, 255)  # pure red in BGR
    x = preprocess_bytes(encode(img, ".png"))
    assert x.shape == (3, 128, 128) and x.dtype == np.float32 and x.flags["C_CONTIGUOUS"]
    red = (1.0 - DEFAULT_SPEC.mean[0]) / DEFAULT_SPEC.std[0]
    green = (0.0 - DEFAULT_SPEC.mean[1]) / DEFAULT_SPEC.std[1]
    np.testing.assert_allclose(x[0], red, atol=1e-5)  # channel 0 is R: BGR was converted
    np.testing.assert_allclose(x[1], green, atol=1e-5)


@pytest.mark.parametrize("spec", [DEFAULT_SPEC, PreprocessSpec(mean=(0.5, 0.25, 0.125), std=(0.5, 0.1, 0.9))])
def test_normalize_is_bit_for_bit_the_formula(spec):
    """The lookup-table normalisation equals (v / 255 - mean) / std in float32, exactly, per channel."""
    rgb = np.random.default_rng(7).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    rgb[0, :3] = [[0, 0, 0], [255, 255, 255], [1, 128, 254]]
    x = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
    x -= np.asarray(spec.mean, np.float32)
    x /= np.asarray(spec.std, np.float32)
    got = pp.normalize(rgb, spec)
    assert got.dtype == np.float32 and got.shape == (3, 37, 53) and got.flags["C_CONTIGUOUS"]
    assert np.array_equal(got, x.transpose(2, 0, 1))


def _reference_tensor(data: bytes) -> np.ndarray:
    """The preprocessing as written in the module docstring, step by step, in RGB from the start."""
    rgb = decode_rgb(data)
    x = pp.resize(rgb).astype(np.float32) * np.float32(1.0 / 255.0)
    x -= np.asarray(DEFAULT_SPEC.mean, np.float32)
    x /= np.asarray(DEFAULT_SPEC.std, np.float32)
    return x.transpose(2, 0, 1)


@pytest.mark.parametrize("kind", ["real", "wide", "small", "rotated"])
def test_preprocess_bytes_is_bit_for_bit_the_rgb_reference(kind, real_photo):
    """Folding BGR -> RGB into the last step changes nothing: shrinking, upscaling, EXIF rotation."""
    data = {
        "real": lambda: real_photo.read_bytes(),
        "wide": lambda: encode(leaf_image(11, (333, 517)), ".png"),
        "small": lambda: encode(leaf_image(12, (40, 90)), ".png"),
        "rotated": lambda: with_exif_orientation(encode(leaf_image(13, (200, 300))), 6),
    }[kind]()
    assert np.array_equal(preprocess_bytes(data), _reference_tensor(data))


def test_normalize_takes_bgr_too():
    rgb = np.random.default_rng(8).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    assert np.array_equal(pp.normalize(rgb[:, :, ::-1].copy(), order="BGR"), pp.normalize(rgb))
    assert not np.array_equal(pp.normalize(rgb[:, :, ::-1].copy()), pp.normalize(rgb))


def test_resize_uses_area_interpolation_when_shrinking():
    rgb = np.random.default_rng(1).integers(0, 256, (301, 333, 3), dtype=np.uint8)
    expected = cv2.resize(rgb, (128, 128), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(pp.resize(rgb), expected)
    # a bilinear resize differs on this image: the choice matters and is pinned
    assert not np.array_equal(pp.resize(rgb), cv2.resize(rgb, (128, 128), interpolation=cv2.INTER_LINEAR))


def test_small_images_are_upscaled():
    x = preprocess_bytes(encode(leaf_image(2, (64, 90)), ".png"))
    assert x.shape == (3, 128, 128)


@pytest.mark.parametrize("orientation,expected_shape", [(1, (40, 80)), (3, (40, 80)), (6, (80, 40)), (8, (80, 40))])
def test_exif_orientation_is_applied(orientation, expected_shape):
    img = np.zeros((40, 80, 3), np.uint8)
    img[:, :40] = 255  # left half white
    data = with_exif_orientation(encode(img), orientation)
    assert read_header(data).orientation == orientation
    rgb = decode_rgb(data)
    assert rgb.shape[:2] == expected_shape
    if orientation == 6:  # rotate 90 clockwise: the white left half ends up on top
        assert rgb[:20].mean() > 200 and rgb[-20:].mean() < 50
    if orientation == 3:  # 180: white on the right
        assert rgb[:, -20:].mean() > 200 and rgb[:, :20].mean() < 50


def test_decompression_bomb_rejected_before_decoding(tmp_path, monkeypatch):
    bomb = png_bomb(30000)
    assert len(bomb) < 5_000_000
    assert read_header(bomb).pixels == 900_000_000

    def no_decode(*a, **k):
        raise AssertionError("the bomb reached the decoder")

    monkeypatch.setattr(pp.cv2, "imdecode", no_decode)
    path = tmp_path / "bomb.png"
    path.write_bytes(bomb)
    with pytest.raises(ImageRejected, match="decompression bomb"):
        preprocess_file(path)


def test_jpeg_header_claiming_huge_size_rejected():
    data = bytearray(encode(leaf_image(3)))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 30000, 30000)
    with pytest.raises(ImageRejected, match="30000x30000"):
        preprocess_bytes(bytes(data))


def test_file_size_cap(tmp_path):
    spec = PreprocessSpec(max_file_bytes=2048)
    path = tmp_path / "big.jpg"
    path.write_bytes(encode(leaf_image(4, (400, 400))))
    assert path.stat().st_size > 2048
    with pytest.raises(ImageRejected, match="file too large"):
        preprocess_file(path, spec)


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "photo.jpg"
    os.mkfifo(fifo)  # nobody ever writes: a blocking open would hang the decode worker
    with pytest.raises(ImageRejected, match="not a regular file"):
        pp.read_limited(fifo)


def test_a_file_that_grew_after_its_size_was_read_is_read_whole_up_to_the_cap(tmp_path, monkeypatch):
    """A photo still being written is read to its current end; past the cap the extra byte gets it refused."""
    data = encode(leaf_image(3, (300, 300)))
    path = tmp_path / "growing.jpg"
    path.write_bytes(data)
    real_fstat = os.fstat

    def stale_fstat(fd):  # the size as it was when the writer had written 10 bytes
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, 10, *st[7:10]))

    monkeypatch.setattr(pp.os, "fstat", stale_fstat)
    assert pp.read_limited(path) == data
    small = PreprocessSpec(max_file_bytes=len(data) - 100)
    assert len(pp.read_limited(path, small)) == len(data) - 99
    with pytest.raises(ImageRejected, match="file too large"):
        preprocess_file(path, small)


def test_truncated_real_jpeg(real_photo):
    data = real_photo.read_bytes()
    for cut in (len(data) // 2, len(data) - 10, 600):
        with pytest.raises(ImageRejected, match="truncated"):
            preprocess_bytes(data[:cut])


def test_truncated_png():
    data = encode(leaf_image(5), ".png")
    with pytest.raises(ImageRejected, match="truncated PNG"):
        preprocess_bytes(data[: len(data) // 2])


def test_zero_byte_file(tmp_path):
    path = tmp_path / "empty.jpg"
    path.write_bytes(b"")
    with pytest.raises(ImageRejected, match="empty file"):
        preprocess_file(path)


@pytest.mark.parametrize("content", [b"hello, not an image\n", b"%PDF-1.4\n" + b"x" * 100, b"\xff\xd8\xff" + b"\x00" * 20])
def test_non_image_named_jpg(tmp_path, content):
    path = tmp_path / "photo.jpg"
    path.write_bytes(content)
    with pytest.raises(ImageRejected):
        preprocess_file(path)


def test_corrupt_jpeg_scan_data_is_rejected_or_decodes_to_right_size():
    data = bytearray(encode(leaf_image(6)))
    sos = data.find(b"\xff\xda")
    data[sos + 20 : len(data) - 2] = b"\xff" * (len(data) - 2 - sos - 20)  # garbage, end marker kept
    try:
        x = preprocess_bytes(bytes(data))
    except ImageRejected as exc:
        assert "corrupt" in str(exc) or "undecodable" in str(exc)
    else:
        assert x.shape == (3, 128, 128)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ImageRejected, match="no such file"):
        preprocess_file(tmp_path / "nope.jpg")
    with pytest.raises(ImageRejected, match="directory"):
        preprocess_file(tmp_path)


@pytest.mark.parametrize("ext", [".png", ".bmp", ".webp", ".jpg"])
def test_header_dimensions_match_decoder(ext):
    img = leaf_image(7, (77, 131))
    h = read_header(encode(img, ext))
    assert (h.width, h.height) == (131, 77)


def test_spec_roundtrips_through_manifest():
    spec = PreprocessSpec()
    assert PreprocessSpec.from_manifest(spec.to_manifest()) == spec
    bad = spec.to_manifest() | {"interpolation": "nearest"}
    with pytest.raises(ValueError, match="unsupported preprocessing"):
        PreprocessSpec.from_manifest(bad)


def _tiff(img_bgr: np.ndarray, **save) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(img_bgr[:, :, ::-1]).save(out, "TIFF", **save)
    return out.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_tiff_gives_the_tensor_of_a_png_of_the_same_upright_pixels(orientation):
    """A scanner's TIFF (any EXIF orientation, plain or LZW) is read as the same upright pixels as a PNG of them."""
    img = np.random.default_rng(orientation).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    upright = pp._apply_orientation(img, orientation)
    png = encode(upright, ".png")
    for tiff in (_tiff(img, tiffinfo={274: orientation}), _tiff(img, tiffinfo={274: orientation}, compression="tiff_lzw")):
        header = read_header(tiff)
        assert (header.format, header.width, header.height, header.orientation) == ("tiff", 120, 90, orientation)
        np.testing.assert_array_equal(preprocess_bytes(tiff), preprocess_bytes(png))


def _with_exif(img_bgr: np.ndarray, fmt: str, orientation: int, prefixed: bool = True) -> bytes:
    """``img_bgr`` as a lossless PNG or WebP whose EXIF (PNG's eXIf chunk, WebP's EXIF chunk) says ``orientation``;
    ``prefixed``: the block keeps JPEG's "Exif" header, as some writers leave it."""
    import io

    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    block = exif.tobytes()
    block = block if prefixed else block[6:]
    out = io.BytesIO()
    Image.fromarray(img_bgr[:, :, ::-1]).save(out, fmt, exif=block, **({"lossless": True} if fmt == "WEBP" else {}))
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_png_or_webp_with_an_exif_orientation_is_read_upright_as_a_jpeg_is(fmt, orientation):
    """A phone or an editor that writes PNG or WebP with EXIF: the pixels are turned upright here, as the page's
    thumbnail (Pillow's exif_transpose) and a browser show them; before, the model saw them as stored."""
    img = np.random.default_rng(orientation).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    upright = encode(pp._apply_orientation(img, orientation), ".png")
    for prefixed in (True, False):
        data = _with_exif(img, fmt, orientation, prefixed)
        header = read_header(data)
        assert (header.format, header.orientation, header.exif[:2] in (b"II", b"MM")) == (fmt.lower(), orientation, True)
        np.testing.assert_array_equal(preprocess_bytes(data), preprocess_bytes(upright))


def test_a_png_or_webp_whose_exif_is_cut_or_garbled_is_read_as_stored():
    img = np.random.default_rng(0).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    png = _with_exif(img, "PNG", 6)
    at = png.index(b"eXIf")
    cut = png[: at + 4] + b"garbage!" + png[at + 12 :]  # the block's TIFF header overwritten: no EXIF, no rotation
    assert read_header(cut).orientation == 1 and read_header(cut).exif == b""
    webp = bytearray(_with_exif(img, "WEBP", 6))
    at = webp.index(b"EXIF")
    webp[at + 4 : at + 8] = struct.pack("<I", 1 << 30)  # a chunk that claims to run past the file's end
    assert read_header(bytes(webp)).exif == b""
    plain = encode(img, ".png")
    assert read_header(plain).orientation == 1 and read_header(plain).exif == b""


def test_a_truncated_or_huge_or_bigtiff_is_refused_with_the_reason():
    tiff = _tiff(np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(ImageRejected, match="truncated TIFF"):
        preprocess_bytes(tiff[: len(tiff) - 100])
    with pytest.raises(ImageRejected, match="BigTIFF"):
        preprocess_bytes(b"II+\x00" + b"\x00" * 64)
    # a header claiming 30000 x 30000 pixels is refused before any decoding
    big = bytearray(tiff)
    endian = "<" if big[:2] == b"II" else ">"
    (ifd,) = struct.unpack(endian + "I", big[4:8])
    (count,) = struct.unpack(endian + "H", big[ifd : ifd + 2])
    for i in range(count):
        at = ifd + 2 + 12 * i
        tag, typ = struct.unpack(endian + "HH", big[at : at + 4])
        if tag in (256, 257):
            big[at + 8 : at + 12] = struct.pack(endian + ("HH" if typ == 3 else "I"), *((30000, 0) if typ == 3 else (30000,)))
    with pytest.raises(ImageRejected, match="decompression bomb"):
        preprocess_bytes(bytes(big))


def _heic(rgb: np.ndarray) -> bytes:
    import io

    pillow_heif = pytest.importorskip("pillow_heif", reason="pillow-heif is not installed")
    from PIL import Image

    out = io.BytesIO()
    pillow_heif.from_pillow(Image.fromarray(rgb)).save(out, quality=-1, chroma=444)
    return out.getvalue()


def test_a_heic_gives_the_tensor_of_a_png_of_the_same_pixels_up_to_its_colour_conversion():
    rgb = np.random.default_rng(5).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    heic = _heic(rgb)
    header = read_header(heic)
    assert (header.format, header.width, header.height) == ("heif", 120, 90)
    png = encode(rgb[:, :, ::-1].copy(), ".png")
    diff = np.abs(preprocess_bytes(heic) - preprocess_bytes(png))
    assert diff.max() < 0.1 and diff.mean() < 0.02  # lossless HEVC, but RGB -> YCbCr -> RGB rounds by a level or two


def test_a_truncated_or_huge_heic_or_another_iso_media_file_is_refused_with_the_reason():
    heic = _heic(np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(ImageRejected, match="truncated HEIF"):
        preprocess_bytes(heic[: len(heic) - 50])
    mp4 = struct.pack(">I4s4sI4s", 20, b"ftyp", b"isom", 0, b"mp42") + struct.pack(">I4s", 8, b"mdat")
    with pytest.raises(ImageRejected, match="not a HEIC/HEIF still image"):
        preprocess_bytes(mp4)
    at = heic.index(b"ispe")  # claim 30000 x 30000 pixels: refused before decoding
    bomb = heic[: at + 8] + struct.pack(">II", 30000, 30000) + heic[at + 16 :]
    with pytest.raises(ImageRejected, match="decompression bomb"):
        preprocess_bytes(bomb)


def _phone_photo(w: int = 4032, h: int = 3024) -> bytes:
    """A 12 MP JPEG with real texture (leaf-like noise, blurred), as a phone writes it."""
    rng = np.random.default_rng(3)
    small = (rng.random((h // 16, w // 16, 3)) * 255).astype(np.uint8)
    img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    return encode(img)


def test_a_12_mp_jpeg_is_decoded_at_reduced_scale_and_gives_what_a_reduced_decode_then_resize_gives():
    data = _phone_photo()
    header = read_header(data)
    lite = PreprocessSpec(size=192, mean=(127 / 255,) * 3, std=(128 / 255,) * 3)
    assert pp.reduction(header, 192) == 4 and pp.reduction(header, 128) == 8  # shorter side stays >= 2x the input
    assert pp.reduction(header, 1600) == 1
    quarter = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_REDUCED_COLOR_4 | cv2.IMREAD_IGNORE_ORIENTATION)
    assert quarter.shape == (756, 1008, 3)
    expected = pp.normalize(cv2.resize(quarter, (192, 192), interpolation=cv2.INTER_AREA), lite, order="BGR")
    assert np.array_equal(preprocess_bytes(data, lite), expected)
    # close to the full decode: the DCT scaling is an averaging filter too
    full = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    exact = pp.normalize(cv2.resize(full, (192, 192), interpolation=cv2.INTER_AREA), lite, order="BGR")
    assert float(np.abs(preprocess_bytes(data, lite) - exact).mean()) < 0.02


def test_only_jpegs_are_decoded_reduced_and_a_rotated_one_comes_out_upright():
    png = read_header(encode(np.zeros((1600, 1200, 3), np.uint8), ".png"))
    assert pp.reduction(png, 128) == 1
    rotated = with_exif_orientation(_phone_photo(2000, 1000), 6)
    rgb = decode_rgb(rotated, PreprocessSpec(size=128))  # 1/2 scale (shorter side 1000 // 2 >= 256), then turned upright
    assert rgb.shape == (1000, 500, 3)


def test_a_12_mp_photo_gives_the_same_tensor_in_the_trainer_and_in_the_daemon(tmp_path):
    """The daemon's classifier takes its preprocessing from the engine's manifest; every trainer path (the labelled
    photos, the samples it receives, a release's lab photos) preprocesses with the same manifest and the same code."""
    torch = pytest.importorskip("torch")
    from trainer import photos
    from trainer.data import Sample, TensorDataset
    from trainer.fieldaug import load_lab_photos
    from trainer.labelled import LabelledSources, load_labelled
    from trainer.models import data_config

    lite = data_config("efficientnet-lite0")
    spec = PreprocessSpec.from_manifest(lite.to_manifest())  # what a Lite0 version's manifest records
    path = tmp_path / "c" / "phone.jpg"
    path.parent.mkdir()
    path.write_bytes(_phone_photo())
    daemon = preprocess_file(path, spec)
    assert daemon.shape == (3, 192, 192)
    assert np.array_equal(TensorDataset([Sample(path, 0)], spec).x[0].numpy(), daemon)
    assert np.array_equal(load_lab_photos([Sample(path, 0)], spec).tensors(spec)[0][0].numpy(), daemon)
    labelled = load_labelled(LabelledSources([Sample(path, 0)], [Sample(path, 0)], "test"), spec=spec)
    # a retrain holds the daemon's tensor in half precision (trainer.photos): exactly that rounding, nothing else
    assert torch.equal(labelled.train.x[0], photos.photo(daemon)) and torch.equal(labelled.train.x, labelled.val.x)
    # and not what the v1000-era default would have given
    assert preprocess_file(path).shape == (3, 128, 128)


def test_a_manifest_asking_for_preprocessing_the_daemon_does_not_do_is_refused_by_name():
    lite = PreprocessSpec(size=192, mean=(127 / 255,) * 3, std=(128 / 255,) * 3).to_manifest()
    with pytest.raises(ValueError, match="unsupported preprocessing in manifest"):
        PreprocessSpec.from_manifest({**lite, "interpolation": "bicubic"})
    with pytest.raises(ValueError, match="unsupported preprocessing in manifest"):
        PreprocessSpec.from_manifest({**lite, "color": "BGR"})
