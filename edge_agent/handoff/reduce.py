"""A photo as the trainer needs it: no larger than any training looks at, so a season of phone photos does not fill the
trainer's disk, its backups and the farm's link.

The trainer reads a photo only through the one preprocessing path, which squashes it to the model's input (192-256
px today). A 12 MP phone photo is 3-5 MB; at a shorter side of 1024 px (four times the largest input, and what
preprocessing's own reduced decode would keep for an input of up to 512 px) it is about a tenth of that. A photo
whose shorter side is larger than ``side`` goes as its upright pixels reduced to that side (aspect kept within a
JPEG block, each side a whole number of them; ``cv2.INTER_AREA``, decoded at libjpeg's reduced scale where that
keeps the side), as a JPEG of quality :data:`QUALITY` with no metadata at all (so no position either; with ``send_place`` its EXIF
block, set upright); a photo no larger, one this module cannot decode or reduce, and one whose reduced copy would be no smaller go as they are. The
same bytes give the same copy, so a resend is the same photo.
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace

import cv2

from edge_agent.capture import exif_block
from edge_agent.imageheader import ifd_entries
from edge_agent.preprocess import DEFAULT_SPEC, ImageRejected, check_header, decode_bgr

__all__ = ["QUALITY", "reduced"]

#: The JPEG block (4:2:0 chroma) each side of a copy is a whole number of: a part block at its edge came back from
#: preprocessing's reduced decode up to 40 pixel levels off the original's tensor, against 10 at most in whole blocks.
_MCU = 16

#: JPEG quality of a reduced copy: preprocessing's tensor of it is within about one pixel level of the original's.
QUALITY = 95


def reduced(data: bytes, side: int, keep_exif: bool = False) -> tuple[bytes, str] | None:
    """``data`` reduced to a shorter side of ``side`` pixels (see the module) and its extension, ``".jpg"``; None
    where the photo goes as it is (``side`` 0, no larger than that, not decodable here, or no smaller reduced).
    ``keep_exif`` (``[handoff] send_place``): the copy keeps the photo's EXIF block (its position, time, camera),
    its orientation set upright and its thumbnail left out; None where that cannot be done (the photo goes as taken)."""
    if side <= 0:
        return None
    try:
        header = check_header(data)
        if min(header.width, header.height) <= side:
            return None
        # decode_bgr's reduced scale leaves the shorter side at least twice the spec's size: at least ``side`` here
        img = decode_bgr(data, replace(DEFAULT_SPEC, size=math.ceil(side / 2)))
        h, w = img.shape[:2]
        if min(h, w) < side:  # decoded smaller than its header said (a HEIC's thumbnail): nothing to reduce
            return None
        scale = max(_MCU, side // _MCU * _MCU) / min(h, w)
        img = cv2.resize(img, (_whole_blocks(w * scale), _whole_blocks(h * scale)), interpolation=cv2.INTER_AREA)
        ok, out = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, QUALITY])
    except (ImageRejected, cv2.error, MemoryError):  # what cannot be reduced here goes as it is
        return None
    if not ok:
        return None
    copy = out.tobytes()
    if keep_exif and (block := exif_block(data, header)):
        exif = _upright(block)
        if exif is None or len(exif) + 8 > 0xFFFF:  # no upright block that fits one segment: the photo as taken
            return None
        app0 = 4 + struct.unpack(">H", copy[4:6])[0] if copy[2:4] == b"\xff\xe0" else 2  # after JFIF's segment
        copy = copy[:app0] + b"\xff\xe1" + struct.pack(">H", len(exif) + 8) + b"Exif\x00\x00" + exif + copy[app0:]
    if len(copy) >= len(data):
        return None
    return copy, ".jpg"


def _upright(tiff: bytes) -> bytes | None:
    """The TIFF-structured EXIF block ``tiff`` with its orientation 1 and no second directory (the thumbnail, stored
    the photo's old way up); None where its first directory cannot be read."""
    endian = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if endian is None or len(tiff) < 8:
        return None
    out = bytearray(tiff)
    (first,) = struct.unpack(endian + "I", tiff[4:8])
    entries = list(ifd_entries(tiff))
    end = first + 2 + 12 * len(entries)
    if not 8 <= first or end + 4 > len(tiff) or len(entries) != struct.unpack(endian + "H", tiff[first : first + 2])[0]:
        return None
    for i, (_e, tag, typ, _n, _v) in enumerate(entries):
        if tag == 0x0112:
            if typ != 3:
                return None
            at = first + 2 + 12 * i + 8
            out[at : at + 2] = struct.pack(endian + "H", 1)
    out[end : end + 4] = bytes(4)  # no next directory
    return bytes(out)


def _whole_blocks(length: float) -> int:
    """``length`` rounded to a whole number of :data:`_MCU` blocks (one at least)."""
    return max(_MCU, round(length / _MCU) * _MCU)
