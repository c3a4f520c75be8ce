"""A disk of its own for a test: an ext4 file system on a loop device, shut down under what runs on it as a card that
dies, is pulled out or loses its power is (EXT4_IOC_SHUTDOWN), mounted again as after an ``fsck``, or with some of its
files rotted (their inodes damaged: :meth:`Card.rot`)."""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

__all__ = ["Card", "make_card"]

_EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32): every later read and write gives EIO
_NOLOGFLUSH = 2  # the journal's last transactions are not written either: a power cut


class Card:
    """The mounted file system (``path``), to shut down and mount again."""

    def __init__(self, image: Path, path: Path) -> None:
        self.image, self.path = image, path

    def mount(self) -> bool:
        return subprocess.run(["mount", "-o", "loop", str(self.image), str(self.path)], capture_output=True).returncode == 0

    def pull_out(self) -> None:
        """Every read and write from now on fails (EIO); what was not yet on the disk is lost."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, _EXT4_IOC_SHUTDOWN, struct.pack("I", _NOLOGFLUSH))
        finally:
            os.close(fd)

    def plug_in(self) -> None:
        """Unmounted, checked and repaired (``e2fsck -y``), mounted again: what the disk kept."""
        subprocess.run(["umount", str(self.path)], check=True, capture_output=True)
        subprocess.run(["e2fsck", "-f", "-y", str(self.image)], capture_output=True)  # (exit 1: it repaired)
        assert self.mount(), f"{self.image} does not mount again"

    def rot(self, *paths: Path) -> None:
        """The inodes of ``paths`` (files or folders on the card) rotted, as a card's worn-out blocks do: unmounted,
        their extents pointed past the card's end (``debugfs``), mounted again; reading one then fails (EUCLEAN,
        "Structure needs cleaning"), the rest of the card reads and writes as before."""
        if not shutil.which("debugfs"):
            pytest.skip("needs debugfs (e2fsprogs) to rot a file on the card")
        subprocess.run(["umount", str(self.path)], check=True, capture_output=True)
        for p in paths:
            inside = "/" + Path(p).relative_to(self.path).as_posix()
            subprocess.run(["debugfs", "-w", "-R", f"sif {inside} block[5] 4000000000", str(self.image)], check=True, capture_output=True)
        assert self.mount(), f"{self.image} does not mount again"

    def commit_journal(self) -> None:
        """The file system's journal committed now, as ext4 does every 5 s (files whose data is not written yet are
        committed as they are)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def make_card(tmp_path: Path) -> Card:
    """A 512 MiB ext4 card (a sparse file) under ``tmp_path``, mounted (root, mkfs.ext4 and loop devices: else the test is skipped)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not Path("/dev/loop-control").exists():
        pytest.skip("needs root, mkfs.ext4 and loop devices to make a disk that fails")
    image, mount = tmp_path / "card.img", tmp_path / "card"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(512 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    made = Card(image, mount)
    if not made.mount():
        pytest.skip("this machine does not mount loop devices")
    return made
