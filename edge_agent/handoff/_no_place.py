"""A photo as the trainer gets it: where it was taken, and who took it, blanked out of its EXIF and XMP, every other byte
as it was.

The trainer learns from pixels and needs no position; a cooperative's trainer, serving many farms, should not learn
where each farm's trees stand, nor whose camera took each photo. The GPS directory of the EXIF block is emptied in
place (its entry count 0, its entries and the values they point at zeroed), the text of the tags that name a person or
a camera (:data:`_WHO`: the artist, the copyright holder, the camera's owner, its body's and lens's serial numbers,
and the maker's own note, where makers keep the serial number) is zeroed, and the XMP's ``exif:GPS...`` values and serial numbers are overwritten with spaces, so no offset moves: orientation, time
and pixels read as before (a PNG's changed chunks get their checksums again). A PNG whose XMP or EXIF is compressed
or hex-encoded in a text chunk goes as its pixels alone, as below. A photo with neither comes back as it
was, byte for byte. Where a position is still read after that (an EXIF block a HEIC keeps
in pieces), the photo goes as a PNG of its upright pixels, with no metadata at all; where it cannot be decoded here
either (no pillow-heif), as blanked as this module could.
"""

from __future__ import annotations

import re
import struct
import time
import zlib

import cv2

from edge_agent.capture import exif_block, read_capture
from edge_agent.capture_place import GPS_IFD
from edge_agent.imageheader import HeaderError, ImageRejected, ifd_entries, png_chunks, read_header
from edge_agent.preprocess import decode_bgr

__all__ = ["without_place"]

_EXIF_IFD = 0x8769  # the pointer to the directory that holds when the photo was taken
#: Tags whose text names who took a photo or with which camera: Artist and Copyright (first directory),
#: CameraOwnerName, BodySerialNumber and LensSerialNumber (EXIF directory), and the MakerNote (EXIF directory: each
#: maker's own format, where Canon, Nikon and others keep the camera's serial number; zeroed whole).
_WHO = {0x013B, 0x8298, 0xA430, 0xA431, 0xA435, 0x927C}
#: Bytes per value of each TIFF type (BYTE, ASCII, SHORT, LONG, RATIONAL, SBYTE, UNDEFINED, SSHORT, SLONG, SRATIONAL,
#: FLOAT, DOUBLE).
_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8}
#: The XMP properties blanked: the position (``exif:GPSLatitude="48,30.5N"`` or
#: ``<exif:GPSLatitude>48,30.5N</exif:GPSLatitude>``) and the camera's serial numbers and owner's name.
_XMP_NAMES = rb"exif:GPS[A-Za-z]+|(?:aux|exifEX):(?:SerialNumber|BodySerialNumber|LensSerialNumber|CameraOwnerName|OwnerName)"
_XMP_GPS = re.compile(rb"(?:" + _XMP_NAMES + rb")\s*=\s*[\"']([^\"'<>]*)|<(?:" + _XMP_NAMES + rb")>([^<]*)")


def without_place(data: bytes) -> tuple[bytes, str | None]:
    """``data`` with its position blanked (see the module), and the file extension it now needs: None where it is still
    the same format (every photo but a HEIC keeping its EXIF in pieces), ``".png"`` where it was re-encoded."""
    try:
        header = read_header(data)
    except HeaderError:  # not a photo the daemon could have classified: the trainer refuses it as it is
        return data, None
    out = bytearray(data)
    changed: list[tuple[int, int]] = []
    tiff = exif_block(data, header)
    start = data.find(tiff) if tiff else -1
    if start >= 0:
        changed += _empty_gps(out, start, len(tiff))
        changed += _blank_who(out, start, len(tiff))
    for match in _XMP_GPS.finditer(data) if b"exif:GPS" in data or b"aux:" in data or b"exifEX:" in data else ():
        a, b = match.span(1) if match.group(1) is not None else match.span(2)
        out[a:b] = b" " * (b - a)
        changed.append((a, b))
    packed = header.format == "png" and _png_packed_metadata(data)
    if not changed and not packed:
        return data, None
    if header.format == "png":
        _png_checksums(out, changed)
    blanked = bytes(out)
    if not packed and read_capture(blanked, time.time()).place is None:
        return blanked, None
    try:  # the position is kept somewhere this module cannot reach: the pixels alone
        ok, png = cv2.imencode(".png", decode_bgr(data))
    except (ImageRejected, cv2.error):  # not decodable here (no pillow-heif): what could be blanked is
        return blanked, None
    return (png.tobytes(), ".png") if ok else (blanked, None)


def _empty_gps(buf: bytearray, start: int, length: int) -> list[tuple[int, int]]:
    """Empty the GPS directory of the TIFF-structured block at ``buf[start:start + length]`` in place; the byte
    ranges (of ``buf``) changed, none where the block has no GPS directory."""
    tiff = bytes(buf[start : start + length])
    sub = next((struct.unpack(e + "I", v)[0] for e, tag, typ, _c, v in ifd_entries(tiff) if tag == GPS_IFD and typ in (4, 13)), None)
    if sub is None or sub < 8 or sub + 2 > length:
        return []
    endian = "<" if tiff[:2] == b"II" else ">"
    kept = [_directory(tiff, endian, d) for d in _kept_directories(tiff, endian)]
    changed = [_directory(tiff, endian, sub)]  # its count, entries and next pointer
    for e, _tag, typ, n, value in ifd_entries(tiff, sub):
        size = _SIZES.get(typ, 0) * n
        if size > 4:  # the value lives elsewhere in the block
            (off,) = struct.unpack(e + "I", value)
            changed.append((off, off + size))
    # a garbled block may point anywhere: never zero the directories that say the orientation and the time
    changed = [
        (start + a, start + min(b, length)) for a, b in changed if 8 <= a < min(b, length) and not any(a < k1 and b > k0 for k0, k1 in kept)
    ]
    for a, b in changed:
        buf[a:b] = bytes(b - a)
    return changed


def _blank_who(buf: bytearray, start: int, length: int) -> list[tuple[int, int]]:
    """Zero the values of the :data:`_WHO` tags of the TIFF-structured block at ``buf[start:start + length]`` (in its
    first and EXIF directories) in place; the byte ranges (of ``buf``) changed."""
    tiff = bytes(buf[start : start + length])
    endian = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if endian is None or length < 8:
        return []
    directories = _kept_directories(tiff, endian)
    kept = [_directory(tiff, endian, d) for d in directories]
    changed = []
    for offset in directories:
        for i, (e, tag, typ, n, value) in enumerate(ifd_entries(tiff, offset)):
            if tag not in _WHO or typ not in (1, 2, 7) or n == 0:  # BYTE, ASCII, UNDEFINED: text
                continue
            if n <= 4:  # the text is in the entry itself
                at = offset + 2 + 12 * i + 8
            else:  # where it points, which a garbled block may aim at a directory: never zeroed
                at = struct.unpack(e + "I", value)[0]
                if any(at < k1 and at + n > k0 for k0, k1 in kept):
                    continue
            if 8 <= at < length:
                changed.append((start + at, start + min(at + n, length)))
    for a, b in changed:
        buf[a:b] = bytes(b - a)
    return changed


def _kept_directories(tiff: bytes, endian: str) -> list[int]:
    """The offsets of the first directory (the orientation) and the EXIF directories (the time) of a TIFF block."""
    first = struct.unpack(endian + "I", tiff[4:8])[0]
    return [first] + [struct.unpack(e + "I", v)[0] for e, tag, typ, _c, v in ifd_entries(tiff) if tag == _EXIF_IFD and typ in (4, 13)]


def _directory(tiff: bytes, endian: str, offset: int) -> tuple[int, int]:
    """The byte range of the TIFF directory at ``offset``: its count, entries (at most 512, as they are read) and next
    pointer."""
    count = struct.unpack(endian + "H", tiff[offset : offset + 2])[0] if offset + 2 <= len(tiff) else 0
    return offset, offset + 6 + 12 * min(count, 512)


def _png_packed_metadata(data: bytes) -> bool:
    """Whether the PNG ``data`` holds metadata this module cannot blank in place: its XMP compressed (``iTXt`` with its
    flag set, ``zTXt``), or ImageMagick's hex-encoded raw profiles (``Raw profile type exif``, ``... xmp``, ``... APP1``);
    such a photo goes as its pixels alone (nothing is decompressed here: a compressed chunk may be a bomb)."""
    for pos, name, size in png_chunks(data):
        if name not in (b"tEXt", b"zTXt", b"iTXt"):
            continue
        keyword, _, rest = data[pos + 8 : pos + 8 + min(size, 80)].partition(b"\x00")
        if keyword.startswith(b"Raw profile type"):  # hex, compressed or not
            return True
        if keyword == b"XML:com.adobe.xmp" and (name == b"zTXt" or (name == b"iTXt" and rest[:1] != b"\x00")):  # compressed
            return True
    return False


def _png_checksums(buf: bytearray, changed: list[tuple[int, int]]) -> None:
    """Write again the CRC of each PNG chunk whose data holds a changed range (a reader checks them)."""
    for pos, _name, size in png_chunks(buf):
        end = pos + 8 + size
        if end + 4 > len(buf):
            return
        if any(a < end and b > pos + 8 for a, b in changed):
            buf[end : end + 4] = struct.pack(">I", zlib.crc32(bytes(buf[pos + 4 : end])))
