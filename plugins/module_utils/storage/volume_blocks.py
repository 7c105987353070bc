# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guest-visible 4 MiB blocks of a file-backed volume (``file``: raw, ``qcow2``), read and written for backups.

Reading (:func:`open_source`): a source yields every block of the disk the guest sees, in order, as its bytes or
None when it is known to read as zero without reading it:

* raw (:class:`RawSource`): the file itself; ``SEEK_DATA``/``SEEK_HOLE`` find the holes of a sparse file, so
  unallocated space is neither read nor checksummed (lseek(2)).
* qcow2 (:class:`Qcow2Source`): ``qemu-img map --output=json`` lists, for every range of the guest disk, which
  file of the backing chain holds it (``depth``) and where (``offset``), or that it reads as zero; the data is
  read straight from those files (qemu-img(1), "map": an offset is given when the data is stored at a fixed
  offset of that file, i.e. uncompressed and unencrypted). A chain with data at no fixed offset (compressed
  clusters) is converted to a temporary raw file first (``qemu-img convert``) and read from there.

Holding off writers (:func:`hold_off_writers`): QEMU's image locking (docs/devel "image locking"; the
``file-posix`` driver) takes byte-range locks on the image file: byte 100 + *i* while it holds permission bit
*i*, byte 200 + *i* while it refuses to share it (bit 1 = write). A process-associated POSIX read lock on byte 201
conflicts with QEMU's OFD locks, so while a backup holds it no QEMU (and no ``qemu-img`` writer) can open the volume
for writing: a VM started meanwhile fails with QEMU's ``Failed to get "write" lock``; and a lock held on byte 101
shows a live writer.

Writing (:class:`RawTarget`): applies ``rbd diff v1`` records to a new sparse raw file; runs of zeros of at least
64 KiB in a region never written are skipped (they stay holes, as ``cp --sparse=always`` leaves them, at a coarser
grain), and a ``z`` record over written data punches a hole (fallocate(2) ``FALLOC_FL_PUNCH_HOLE``) or writes zeros
where that is not supported.

Runs on the managed node's Python (standard library; ``qemu-img`` for qcow2).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shutil
import struct
import subprocess
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_diff import BLOCK_SIZE, block_count, is_zero

QEMU_WRITE_PERM_BYTE = 101
"""QEMU's ``file-posix`` lock byte held (shared) while it has write permission (RAW_LOCK_PERM_BASE + 1)."""
QEMU_NO_SHARE_WRITE_BYTE = 201
"""The byte locked (shared) by whoever refuses to share write permission (RAW_LOCK_SHARED_BASE + 1)."""
FORMATS = ("raw", "qcow2")
QEMU_IMG_TIMEOUT = 3600


class VolumeBusy(CloudError):
    """A volume has a writer (a running VM); the message names it and what to do."""


class VolumeReadError(CloudError):
    """A volume cannot be read as a backup source (the message names the path and why)."""


def _qemu_img(argv: List[str], what: str, timeout: float = QEMU_IMG_TIMEOUT) -> str:
    try:
        proc = subprocess.run(["qemu-img", *argv], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VolumeReadError(f"{what}: qemu-img {argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        raise VolumeReadError(f"{what}: qemu-img {' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _lock_test(fd: int, byte: int) -> Optional[int]:
    """The pid holding a lock on ``byte`` that conflicts with a write lock, 0 for an OFD lock (no pid), or None.
    (``F_OFD_GETLK`` with ``struct flock``: short type, short whence, off_t start, off_t len, pid_t pid.)"""
    layout = "hhqqi4x"
    query = struct.pack(layout, fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0)
    getlk = getattr(fcntl, "F_OFD_GETLK", 36)  # Python < 3.9 lacks the name (linux/fcntl.h: 36)
    kind, _whence, _start, _len, pid = struct.unpack(layout, fcntl.fcntl(fd, getlk, query))
    return None if kind == fcntl.F_UNLCK else max(pid, 0)


@contextlib.contextmanager
def hold_off_writers(path: str, what: str = "path") -> Iterator[None]:
    """Keep every QEMU writer off ``path`` for the block (module docstring), after checking there is none.

    Raises:
        VolumeBusy: a process holds QEMU's write lock on the file (a running VM), named.
        VolumeReadError: the file cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise VolumeReadError(f"{what}: {path}: {exc.strerror}") from exc
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, QEMU_NO_SHARE_WRITE_BYTE, os.SEEK_SET)
        except OSError as exc:  # a writer holds an exclusive lock there (not QEMU's way; refuse anyway)
            raise VolumeBusy(f"{what}: {path} is locked by another writer ({exc.strerror}); stop the VM first") \
                from exc
        holder = _lock_test(fd, QEMU_WRITE_PERM_BYTE)
        if holder is not None:
            raise VolumeBusy(f"{what}: {path} is open for writing (QEMU's write lock is held"
                             f"{f' by pid {holder}' if holder else ''}): the VM is running; stop it first")
        yield
    finally:
        os.close(fd)  # releases the lock


class RawSource:
    """The blocks of a raw (possibly sparse) file. ``size``: bytes."""

    format = "raw"

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self.fd).st_size
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

    def data_ranges(self) -> List[Tuple[int, int]]:
        """(start, end) byte ranges that may hold data (lseek ``SEEK_DATA``/``SEEK_HOLE``); the whole file when the
        file system cannot tell."""
        out: List[Tuple[int, int]] = []
        pos = 0
        try:
            while pos < self.size:
                try:
                    start = os.lseek(self.fd, pos, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no data after pos
                        break
                    raise
                end = os.lseek(self.fd, start, os.SEEK_HOLE)
                out.append((start, end))
                pos = end
        except (OSError, AttributeError):
            return [(0, self.size)]
        return out

    def blocks(self, only: Optional[Set[int]] = None) -> Iterator[Tuple[int, Optional[bytes]]]:
        """(index, bytes or None = reads as zero) for every block (or those in ``only``), in order."""
        ranges = self.data_ranges()
        r = 0
        for idx in range(block_count(self.size)):
            if only is not None and idx not in only:
                continue
            start = idx * BLOCK_SIZE
            end = min(start + BLOCK_SIZE, self.size)
            while r < len(ranges) and ranges[r][1] <= start:
                r += 1
            if r >= len(ranges) or ranges[r][0] >= end:
                yield idx, None
                continue
            data = os.pread(self.fd, end - start, start)
            if len(data) != end - start:
                raise VolumeReadError(f"path: {self.path}: short read at byte {start} (file changed?)")
            yield idx, data

    def close(self) -> None:
        os.close(self.fd)


class Qcow2Source:
    """The guest-visible blocks of a qcow2 volume (its whole backing chain), from ``qemu-img map``."""

    format = "qcow2"

    def __init__(self, path: str) -> None:
        self.path = path
        self._tmpdir: Optional[str] = None
        self._raw: Optional[RawSource] = None
        chain = json.loads(_qemu_img(["info", "--backing-chain", "--output=json", path], "path"))
        self.size = int(chain[0]["virtual-size"])
        self.files: List[str] = []
        here = os.path.dirname(os.path.abspath(path))
        for layer in chain:
            name = layer["filename"]
            self.files.append(name if os.path.isabs(name) else os.path.join(here, name))
            if layer.get("format") not in FORMATS:
                raise VolumeReadError(f"path: {path}: backing chain holds a {layer.get('format')} file ({name})")
        self.extents: List[Dict[str, Any]] = json.loads(_qemu_img(["map", "--output=json", path], "path"))
        if any(e.get("data") and "offset" not in e for e in self.extents):
            # compressed or encrypted clusters: no fixed offset to read; read a raw conversion instead
            self._tmpdir = tempfile.mkdtemp(prefix="zjusct-backup-")
            raw = os.path.join(self._tmpdir, "volume.raw")
            _qemu_img(["convert", "-f", "qcow2", "-O", "raw", path, raw], "path")
            self._raw = RawSource(raw)
        self._fds: Dict[int, int] = {}

    def _fd(self, depth: int) -> int:
        if depth not in self._fds:
            self._fds[depth] = os.open(self.files[depth], os.O_RDONLY | os.O_CLOEXEC)
        return self._fds[depth]

    def blocks(self, only: Optional[Set[int]] = None) -> Iterator[Tuple[int, Optional[bytes]]]:
        """(index, bytes or None = reads as zero) for every block (or those in ``only``), in order."""
        if self._raw is not None:
            yield from self._raw.blocks(only)
            return
        ext = iter(self.extents)
        cur = next(ext, None)
        for idx in range(block_count(self.size)):
            start = idx * BLOCK_SIZE
            end = min(start + BLOCK_SIZE, self.size)
            if only is not None and idx not in only:
                while cur is not None and cur["start"] + cur["length"] <= end:
                    cur = next(ext, None)
                continue
            pieces: List[Tuple[int, int, Dict[str, Any]]] = []  # (from, to, extent) within [start, end)
            while cur is not None and cur["start"] < end:
                lo, hi = max(cur["start"], start), min(cur["start"] + cur["length"], end)
                if hi > lo:
                    pieces.append((lo, hi, cur))
                if cur["start"] + cur["length"] <= end:
                    cur = next(ext, None)
                else:
                    break
            data_pieces = [p for p in pieces if p[2].get("data")]
            if not data_pieces:
                yield idx, None
                continue
            if len(pieces) == 1 and pieces[0][0] == start and pieces[0][1] == end:
                e = pieces[0][2]
                yield idx, self._read(e, start, end - start)
                continue
            buf = bytearray(end - start)
            for lo, hi, e in data_pieces:
                buf[lo - start:hi - start] = self._read(e, lo, hi - lo)
            yield idx, bytes(buf)

    def _read(self, extent: Dict[str, Any], at: int, length: int) -> bytes:
        offset = int(extent["offset"]) + (at - int(extent["start"]))
        data = os.pread(self._fd(int(extent.get("depth", 0))), length, offset)
        if len(data) != length:
            raise VolumeReadError(f"path: {self.path}: short read of {self.files[int(extent.get('depth', 0))]} at "
                                  f"byte {offset}")
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        if self._raw is not None:
            self._raw.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


def detect_format(path: str) -> str:
    """``qcow2`` when the file starts with the qcow2 magic (``QFI\\xfb``), else ``raw``."""
    with open(path, "rb") as f:
        return "qcow2" if f.read(4) == b"QFI\xfb" else "raw"


def open_source(path: str, fmt: str) -> Any:
    """A block source for ``path`` of format ``fmt`` (``raw`` or ``qcow2``). The caller closes it.

    Raises:
        VolumeReadError: the file cannot be read, is not a qcow2 file (``qcow2``), or its chain is unreadable.
    """
    if fmt not in FORMATS:
        raise VolumeReadError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")
    try:  # a raw disk may hold anything (a guest can write a qcow2 header to it): only qcow2 is checked
        if fmt == "qcow2" and detect_format(path) != "qcow2":
            raise VolumeReadError(f"path: {path} is not a qcow2 file")
    except OSError as exc:
        raise VolumeReadError(f"path: {path}: {exc.strerror}") from exc
    try:
        return RawSource(path) if fmt == "raw" else Qcow2Source(path)
    except OSError as exc:
        raise VolumeReadError(f"path: {path}: {exc.strerror}") from exc


_FALLOC_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (linux/falloc.h)
_libc: Any = None


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Deallocate ``length`` bytes at ``offset`` (they read as zero); False when the file system cannot."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    return _libc.fallocate(fd, _FALLOC_PUNCH, offset, length) == 0


HOLE_GRAIN = 64 * 1024
"""Zero runs this long (aligned within a block) stay holes in a restored file; 64 KiB keeps the scan cheap (64
in-place compares per 4 MiB block)."""
_ZERO_GRAIN = bytes(HOLE_GRAIN)


class RawTarget:
    """A new sparse raw file that ``rbd diff v1`` records are applied to (the ``DiffReader`` state: ``resize``,
    ``write``, ``zero``). ``size`` bytes to start with; ``written_bytes``: data bytes actually written."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        os.ftruncate(fd, size)
        self._written: set = set()  # block indices that hold written data
        self.written_bytes = 0

    def resize(self, new_size: int) -> None:
        if new_size != self.size:
            os.ftruncate(self.fd, new_size)
            self.size = new_size

    def write(self, offset: int, data: Any) -> None:
        if not data:
            return
        first, last = offset // BLOCK_SIZE, (offset + len(data) - 1) // BLOCK_SIZE
        fresh = all(i not in self._written for i in range(first, last + 1))
        if fresh and is_zero(data):  # zeros on a hole: leave the hole
            return
        self._written.update(range(first, last + 1))
        # write the runs of non-zero HOLE_GRAIN pieces (bytes.startswith compares in place); the zero runs stay
        # holes (fresh) or become holes again (written before)
        grain, n = HOLE_GRAIN, len(data)
        mv = memoryview(data)
        run, zeros = -1, -1
        for at in range(0, n + grain, grain):
            if at >= n:
                zero = None  # the end: flush both kinds of run
            else:
                zero = data.startswith(_ZERO_GRAIN, at) if at + grain <= n else is_zero(bytes(mv[at:]))
            if zero is not True and zeros >= 0:
                if not fresh:
                    self.zero(offset + zeros, min(at, n) - zeros)
                zeros = -1
            if zero is not False and run >= 0:
                self._pwrite(offset + run, mv[run:min(at, n)])
                run = -1
            if zero is False and run < 0:
                run = at
            elif zero is True and zeros < 0:
                zeros = at

    def _pwrite(self, offset: int, mv: memoryview) -> None:
        pos = 0
        while pos < len(mv):
            pos += os.pwrite(self.fd, mv[pos:], offset + pos)
        self.written_bytes += len(mv)

    def zero(self, offset: int, length: int) -> None:
        first, last = offset // BLOCK_SIZE, (offset + max(length, 1) - 1) // BLOCK_SIZE
        if not any(i in self._written for i in range(first, last + 1)):
            return
        if not punch_hole(self.fd, offset, length):
            zeros = bytes(min(length, BLOCK_SIZE))
            pos = 0
            while pos < length:
                n = min(len(zeros), length - pos)
                os.pwrite(self.fd, zeros[:n], offset + pos)
                pos += n
