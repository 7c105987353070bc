# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Persistent dirty bitmaps of qcow2 volumes: QEMU's own record of which parts of a disk were written, used so that
an incremental backup of a qcow2 volume reads only the blocks written since the previous backup.

A persistent bitmap lives in the qcow2 file. While a bitmap is enabled ("auto"), every QEMU that opens the image
read-write (the VM, ``qemu-img``, ``qemu-io``) loads it, sets its bits for every write, and stores it back when it
closes the image; while the image is open the bitmap carries the ``in_use`` flag, so a QEMU killed without closing
the image leaves it ``in_use``: inconsistent, never to be trusted again (QEMU itself refuses to use it). Source:
QEMU's qcow2 specification (docs/interop/qcow2.txt, "Bitmaps extension", "Bitmap directory", "Bitmap table") and
bitmaps documentation (docs/interop/bitmaps.rst), QEMU 7.2.

Reading (:func:`dirty_blocks`) parses the file (big-endian): the header's ``cluster_bits`` and, for version 3,
``autoclear_features`` (bit 0 says the bitmaps extension is valid: a QEMU that did not know bitmaps and opened the
image read-write clears it) and ``header_length``; the header extension ``0x23852875`` (bitmap directory offset and
size); the directory entry of the bitmap (its table, flags and granularity); the table's entries (a data cluster's
offset in bits 9-55, or none: then bit 0 says all bits are 1 or 0); each data cluster's bits, least significant bit
first, bit *j* covering guest bytes [*j* x granularity, (*j* + 1) x granularity). Anything unexpected makes the bitmap
unusable (None), never an error: the caller then compares every block's checksum instead.

Changes (:func:`add`, :func:`remove`) go through ``qemu-img bitmap`` (which opens the image read-write, so it fails
while a VM runs, with QEMU's ``Failed to get "write" lock``).
"""

from __future__ import annotations

import struct
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Set

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

BITMAPS_EXTENSION = 0x23852875
FLAG_IN_USE = 1
FLAG_AUTO = 2
TYPE_DIRTY_TRACKING = 1
QEMU_IMG_TIMEOUT = 600


class BitmapError(CloudError):
    """``qemu-img bitmap`` failed; ``in_use`` when the image is open for writing by another process (a VM)."""

    def __init__(self, message: str, in_use: bool = False) -> None:
        super().__init__(message)
        self.in_use = in_use


@dataclass(frozen=True)
class Bitmap:
    """One bitmap directory entry. ``granularity`` in bytes; ``table_offset`` in bytes; ``table_size`` entries."""

    name: str
    flags: int
    granularity: int
    table_offset: int
    table_size: int

    @property
    def usable(self) -> bool:
        """Enabled (auto) and consistent (not in_use)."""
        return bool(self.flags & FLAG_AUTO) and not self.flags & FLAG_IN_USE


def _read(f, offset: int, length: int) -> bytes:
    f.seek(offset)
    data = f.read(length)
    if len(data) != length:
        raise ValueError(f"short read at {offset}")
    return data


def read_bitmaps(path: str) -> Optional[Dict[str, Bitmap]]:
    """The persistent bitmaps of the qcow2 file ``path`` by name; None when the file has no valid bitmaps
    extension (not qcow2 version 3, the extension missing, or invalidated through ``autoclear_features``)."""
    try:
        with open(path, "rb") as f:
            head = _read(f, 0, 104)
            magic, version = struct.unpack(">4sI", head[:8])
            if magic != b"QFI\xfb" or version < 3:
                return None
            cluster_bits = struct.unpack(">I", head[20:24])[0]
            autoclear = struct.unpack(">Q", head[88:96])[0]
            header_length = struct.unpack(">I", head[100:104])[0]
            if not autoclear & 1 or not 9 <= cluster_bits <= 21:
                return None
            pos = header_length
            for _extension in range(64):  # header extensions: type, length, data padded to 8 bytes; type 0 ends them
                kind, length = struct.unpack(">II", _read(f, pos, 8))
                if kind == 0:
                    return {}
                if kind == BITMAPS_EXTENSION:
                    nb, _reserved, dir_size, dir_offset = struct.unpack(">IIQQ", _read(f, pos + 8, 24))
                    return _directory(_read(f, dir_offset, dir_size), nb)
                pos += 8 + ((length + 7) & ~7)
    except (OSError, ValueError, struct.error):
        return None
    return None


def _directory(raw: bytes, count: int) -> Optional[Dict[str, Bitmap]]:
    out: Dict[str, Bitmap] = {}
    pos = 0
    for _entry in range(count):
        table_offset, table_size, flags, kind, gran_bits, name_size, extra = struct.unpack(
            ">QIIBBHI", raw[pos:pos + 24])
        name = raw[pos + 24 + extra:pos + 24 + extra + name_size].decode("utf-8", "replace")
        if kind == TYPE_DIRTY_TRACKING and 9 <= gran_bits <= 31:
            out[name] = Bitmap(name, flags, 1 << gran_bits, table_offset, table_size)
        pos += (24 + extra + name_size + 7) & ~7
    return out


def dirty_blocks(path: str, name: str, size: int, block_size: int) -> Optional[Set[int]]:
    """The indices of the ``block_size`` blocks of a ``size``-byte disk that bitmap ``name`` of ``path`` marks as
    written, or None when the bitmap is missing or unusable (disabled, ``in_use``, or unreadable)."""
    found = (read_bitmaps(path) or {}).get(name)
    if found is None or not found.usable:
        return None
    try:
        with open(path, "rb") as f:
            cluster_bits = struct.unpack(">I", _read(f, 20, 4))[0]
            cluster = 1 << cluster_bits
            table = struct.unpack(f">{found.table_size}Q", _read(f, found.table_offset, 8 * found.table_size))
            bits_per_cluster = cluster * 8
            dirty: Set[int] = set()
            for i, entry in enumerate(table):
                first_bit = i * bits_per_cluster
                data_offset = entry & 0x00FFFFFFFFFFFE00
                if not data_offset:
                    if entry & 1:  # the whole cluster's bits are set
                        _mark(dirty, first_bit * found.granularity, bits_per_cluster * found.granularity, size,
                              block_size)
                    continue
                data = _read(f, data_offset, cluster)
                for byte_index, byte in enumerate(data):
                    if not byte:
                        continue
                    for bit in range(8):
                        if byte >> bit & 1:
                            start = (first_bit + byte_index * 8 + bit) * found.granularity
                            _mark(dirty, start, found.granularity, size, block_size)
    except (OSError, ValueError, struct.error):
        return None
    return dirty


def _mark(dirty: Set[int], start: int, length: int, size: int, block_size: int) -> None:
    end = min(start + length, size)
    if start < end:
        dirty.update(range(start // block_size, (end - 1) // block_size + 1))


def _qemu_img_bitmap(path: str, name: str, *flags: str) -> None:
    argv = ["qemu-img", "bitmap", *flags, "-f", "qcow2", path, name]  # qemu-img(1): ... filename bitmap
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=QEMU_IMG_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BitmapError(f"qemu-img bitmap {' '.join(flags)} {name}: {exc}") from exc
    if proc.returncode != 0:
        text = proc.stderr.strip() or proc.stdout.strip()
        raise BitmapError(f"qemu-img bitmap {' '.join(flags)} {path} {name}: {text}", in_use='"write" lock' in text)


def add(path: str, name: str) -> None:
    """Add the enabled persistent bitmap ``name`` (from now on QEMU records every write).

    Raises:
        BitmapError: ``in_use`` when a VM has the image open; otherwise qemu-img's message (e.g. a qcow2 version 2
            image, which cannot hold bitmaps).
    """
    _qemu_img_bitmap(path, name, "--add", "--enable")


def remove(path: str, names: List[str]) -> List[str]:
    """Remove bitmaps ``names`` (best effort); returns those removed."""
    gone = []
    for name in names:
        try:
            _qemu_img_bitmap(path, name, "--remove")
            gone.append(name)
        except BitmapError:
            continue
    return gone
