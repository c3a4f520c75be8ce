"""Photos as the page shows them: found by sha256 (never by a path from the request), shrunk once, cached.

A photo lives in the label queue (``<state>/queue/...``), in ``<state>/processed/<day>/`` after the daemon
moved it, or still where it arrived. Only files under the state directory or the inbox are served, and only
when their bytes hash to the sha256 asked for.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import OrderedDict
from pathlib import Path

from edge_agent.imageheader import ImageRejected, check_image
from edge_agent.inbox_files import places
from edge_agent.web._heap import trim_heap
from edge_agent.web.queries import Reader
from engines.durable import file_now

__all__ = ["PhotoFiles", "SIZES", "is_sha256"]

#: Longest side in pixels of each size the page asks for.
SIZES = {"thumb": 240, "large": 1024}


def is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


class PhotoFiles:
    def __init__(self, state_root: Path, inbox: Path, reader: Reader, max_file_bytes: int, max_pixels: int) -> None:
        self.roots = [state_root.resolve(), inbox.resolve()]
        self.state_root = state_root
        self.reader = reader
        self.max_file_bytes = max_file_bytes
        self.max_pixels = max_pixels
        self.cache = state_root / "web" / "thumbs"
        self._found: OrderedDict[str, Path] = OrderedDict()

    def _allowed(self, path: Path) -> Path | None:
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        if not real.is_file() or not any(real.is_relative_to(root) for root in self.roots):
            return None
        return real

    def _matches(self, path: Path, sha256: str) -> bool:
        try:
            if path.stat().st_size > self.max_file_bytes:
                return False
            return hashlib.sha256(path.read_bytes()).hexdigest() == sha256
        except OSError:
            return False

    def candidates(self, sha256: str):
        queued = self.reader.queue_file(sha256)
        if queued:
            yield file_now(queued[1], self.state_root / "queue")  # restored elsewhere, no daemon started on it yet
        photo = self.reader.photo(sha256)
        if photo is None or not photo.path:
            return
        yield from places(self.state_root, photo.path, photo.created)

    def locate(self, sha256: str) -> Path | None:
        """The photo's file, or None when the daemon kept none (``after = "delete"``, a camera frame)."""
        if not is_sha256(sha256):
            return None
        hit = self._found.get(sha256)
        if hit is not None and self._allowed(hit):
            return hit
        for cand in self.candidates(sha256):
            real = self._allowed(cand)
            if real is not None and self._matches(real, sha256):
                self._found[sha256] = real
                if len(self._found) > 4096:
                    self._found.popitem(last=False)
                return real
        return None

    def image(self, sha256: str, size: str) -> bytes | None:
        """The photo as a JPEG of at most ``SIZES[size]`` pixels a side (cached on disk); None if not found."""
        longest = SIZES[size]
        cached = self.cache / size / f"{sha256}.jpg"
        try:
            return cached.read_bytes()
        except OSError:
            pass
        path = self.locate(sha256)
        if path is None:
            return None
        data = shrink(path.read_bytes(), longest, self.max_file_bytes, self.max_pixels)
        trim_heap()  # a decoded photo's memory back to the system (edge_agent.web._heap)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, cached)
        except OSError:  # a full disk costs the cache, not the page
            pass
        return data


def shrink(data: bytes, longest: int, max_file_bytes: int, max_pixels: int) -> bytes:
    """A JPEG of ``data`` upright (EXIF) and at most ``longest`` pixels a side, after the same caps as classifying."""
    from PIL import Image, ImageOps  # only when a picture is first asked for

    if check_image(data, max_file_bytes, max_pixels).format == "heif":
        import pillow_heif

        pillow_heif.register_heif_opener()
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.draft("RGB", (longest, longest))  # JPEG: decode at 1/2..1/8 scale
            im = ImageOps.exif_transpose(im).convert("RGB")
            im.thumbnail((longest, longest))
            out = io.BytesIO()
            im.save(out, "JPEG", quality=82)
            return out.getvalue()
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageRejected(f"cannot show this photo: {exc}") from None
