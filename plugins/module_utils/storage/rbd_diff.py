# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``rbd diff v1`` stream format and per-block checksums of the image it describes. Pure: no I/O of its own.

Format (Ceph ``doc/dev/rbd-diff.rst``; all integers little-endian): the header ``b"rbd diff v1\\n"``, then
records, each one tag byte:

* ``f`` from-snapshot: u32 length + name;  ``t`` to-snapshot: u32 length + name;  ``s`` image size: u64
* ``w`` updated data: u64 offset, u64 length, then ``length`` bytes
* ``z`` zeroed data: u64 offset, u64 length
* ``e`` end of stream (nothing may follow)

``BlockState`` keeps one checksum (``crc32c`` or ``sha256``, see ``CHECKSUMS``) per ``BLOCK_SIZE`` (4 MiB)
block of an image and applies a diff to it. Blocks
the diff rewrites completely get their new checksum from the stream; blocks it leaves alone keep their base
checksum; a block only partly rewritten on top of a non-zero base cannot be computed from the stream and is
reported as *unknown* (the caller reads it from the image). ``rbd export-diff --whole-object`` rewrites whole
objects, so with the default 4 MiB object size no block is ever unknown.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

_crc32c: Any
try:  # the C extension (hardware CRC32C); its pure-Python fallback is far too slow to use for GiBs
    import google_crc32c as _crc32c

    HAS_CRC32C = getattr(_crc32c, "implementation", "") == "c"
except ImportError:
    _crc32c = None
    HAS_CRC32C = False

HEADER_V1 = b"rbd diff v1\n"
HEADER_V2 = b"rbd diff v2\n"
BLOCK_SIZE = 4 * 1024 * 1024
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U64x2 = struct.Struct("<QQ")
_ZERO_BLOCK = bytes(BLOCK_SIZE)


#: checksum kinds a manifest may name: ``sha256`` (64 hex digits; backups made before crc32c, and new ones on a
#: host without the google-crc32c C extension) and ``crc32c`` (Castagnoli CRC as ``google_crc32c.value``, 8 hex
#: digits, big-endian: the same number ``gsutil hash -c`` prints in base64)
CHECKSUMS = ("sha256", "crc32c")
HEX_LEN = {"sha256": 64, "crc32c": 8}


class DiffFormatError(CloudError, ValueError):
    """The stream is not a well-formed ``rbd diff v1`` stream; the message names the byte offset."""


def default_checksum() -> str:
    """The checksum new full backups use: ``crc32c`` when the google-crc32c C extension is importable (about
    5x faster than sha256 here, see docs/benchmarks.md), else ``sha256``."""
    return "crc32c" if HAS_CRC32C else "sha256"


def check_checksum(kind: str) -> None:
    """Raise ValueError when ``kind`` is not in CHECKSUMS or crc32c is wanted without the C extension."""
    if kind not in CHECKSUMS:
        raise ValueError(f"checksum: {kind!r} is not one of {', '.join(CHECKSUMS)}")
    if kind == "crc32c" and not HAS_CRC32C:
        raise ValueError("checksum: crc32c needs the google-crc32c package with its C extension on the host "
                         "running the module (pip install 'google-crc32c>=1.5,<2')")


def digest_fn(kind: str) -> Callable[[Any], str]:
    """A function bytes-like -> hex checksum of kind ``kind`` (see CHECKSUMS). Raises ValueError (check_checksum)."""
    check_checksum(kind)
    if kind == "sha256":
        return lambda data: hashlib.sha256(data).hexdigest()
    value = _crc32c.value

    def crc(data: Any) -> str:  # the extension takes bytes only (PyArg "y#"): other buffers are copied once
        return "%08x" % value(data if isinstance(data, bytes) else bytes(data))

    return crc


class StreamDigest:
    """Incremental checksum of kind ``kind`` over a byte stream: ``update(bytes-like)``, ``hexdigest()``."""

    def __init__(self, kind: str) -> None:
        check_checksum(kind)
        self.kind = kind
        self._sha = hashlib.sha256() if kind == "sha256" else None
        self._crc = 0

    def update(self, data: Any) -> None:
        if self._sha is not None:
            self._sha.update(data)
        else:
            self._crc = _crc32c.extend(self._crc, data if isinstance(data, bytes) else bytes(data))

    def hexdigest(self) -> str:
        return self._sha.hexdigest() if self._sha is not None else "%08x" % self._crc


_ZERO_DIGESTS: Dict[Tuple[str, int], str] = {}


def zero_digest(length: int, kind: str = "sha256") -> str:
    """Checksum (hex, kind ``kind``) of ``length`` zero bytes (``length`` <= BLOCK_SIZE); cached."""
    key = (kind, length)
    if key not in _ZERO_DIGESTS:
        _ZERO_DIGESTS[key] = digest_fn(kind)(_ZERO_BLOCK[:length])
    return _ZERO_DIGESTS[key]


def is_zero(data: bytes) -> bool:
    """True when every byte of ``data`` (at most BLOCK_SIZE bytes) is zero (a memcmp with a zero block)."""
    return data == _ZERO_BLOCK if len(data) == BLOCK_SIZE else data == bytes(len(data))


def block_count(size: int, block_size: int = BLOCK_SIZE) -> int:
    """Number of blocks covering ``size`` bytes (the last one may be short)."""
    return (size + block_size - 1) // block_size


def zero_blocks(size: int, kind: str = "sha256") -> List[Optional[str]]:
    """Checksums (kind ``kind``) of an all-zero image of ``size`` bytes."""
    n = block_count(size)
    out: List[Optional[str]] = [zero_digest(BLOCK_SIZE, kind)] * n
    if n and size % BLOCK_SIZE:
        out[-1] = zero_digest(size % BLOCK_SIZE, kind)
    return out


class _Open:
    __slots__ = ("buf", "intervals")

    def __init__(self, length: int) -> None:
        self.buf = bytearray(length)
        self.intervals: List[Tuple[int, int]] = []

    def cover(self, start: int, end: int) -> None:
        self.intervals.append((start, end))

    def complete(self) -> bool:
        pos = 0
        for s, e in sorted(self.intervals):
            if s > pos:
                return False
            pos = max(pos, e)
        return pos >= len(self.buf)


class BlockState:
    """Per-block checksums of an image, updated by applying diff records in stream order.

    Args:
        size: image size in bytes before the diff.
        base: checksums before the diff (hex or None = unknown), or None for an all-zero image (a full export
            from nothing: every block the stream does not write is zero).
        checksum: the kind of every checksum, ``base``'s included (CHECKSUMS).
    Raises:
        ValueError: ``base`` does not cover ``size``; unknown ``checksum`` (check_checksum).
    """

    def __init__(self, size: int, base: Optional[List[Optional[str]]] = None, checksum: str = "sha256") -> None:
        self.checksum = checksum
        self._digest = digest_fn(checksum)
        self.zero_base = base is None
        self.size = size
        self.blocks: List[Optional[str]] = zero_blocks(size, checksum) if base is None else list(base)
        if len(self.blocks) != block_count(size):
            raise ValueError(f"base: {len(self.blocks)} checksums for {size} bytes, expected {block_count(size)}")
        self._open: Dict[int, _Open] = {}
        self._closed_upto = 0  # blocks below this index were finalised by this diff
        self._touched: set = set()
        self.unknown: set = set()

    def _len(self, idx: int) -> int:
        return min(BLOCK_SIZE, self.size - idx * BLOCK_SIZE)

    def resize(self, new_size: int) -> None:
        """Apply an ``s`` record: new blocks read as zero; a last block whose length changes becomes unknown
        unless the diff rewrites it."""
        old_n, new_n = block_count(self.size), block_count(new_size)
        old_size = self.size
        if new_size == old_size:
            return
        self.size = new_size
        if new_n < old_n:
            del self.blocks[new_n:]
            for i in [i for i in self._open if i >= new_n]:
                del self._open[i]
        else:
            self.blocks.extend(zero_blocks(new_size, self.checksum)[old_n:])
        # the block holding the old end and the block holding the new end change length
        for size in (old_size, new_size):
            idx = size // BLOCK_SIZE
            if size % BLOCK_SIZE and idx < new_n and not self.zero_base:
                self.unknown.add(idx)
                self.blocks[idx] = None
        if new_size % BLOCK_SIZE and new_n and self.zero_base:
            self.blocks[new_n - 1] = zero_digest(self._len(new_n - 1), self.checksum)

    def _advance(self, idx: int) -> None:
        for i in sorted(i for i in self._open if i < idx):
            self._close(i)
        self._closed_upto = max(self._closed_upto, idx)

    def _get(self, idx: int) -> Optional[_Open]:
        if idx >= block_count(self.size):
            raise DiffFormatError(f"data for block {idx} lies beyond the image size {self.size}")
        if idx not in self._open and idx in self._touched:
            # stream came back to a block already finalised: cannot combine, read it from the image
            self.unknown.add(idx)
            self.blocks[idx] = None
            return None
        op = self._open.get(idx)
        if op is None:
            op = self._open[idx] = _Open(self._len(idx))
            self._touched.add(idx)
        return op

    def write(self, offset: int, data: Any) -> None:
        """Apply (part of) a ``w`` record: ``data`` (bytes-like) written at byte ``offset``."""
        mv = memoryview(data)
        pos = 0
        while pos < len(mv):
            idx, within = divmod(offset + pos, BLOCK_SIZE)
            self._advance(idx)
            n = min(len(mv) - pos, BLOCK_SIZE - within)
            if within == 0 and idx not in self._touched and n == self._len(idx):
                # the piece is the whole block: hash it in place, no copy (DiffReader hands whole blocks as the
                # bytes object it read, which crc32c takes as is)
                self.blocks[idx] = self._digest(data if n == len(mv) else mv[pos:pos + n])
                self.unknown.discard(idx)
                self._touched.add(idx)
                pos += n
                continue
            op = self._get(idx)
            if op is not None:
                if within + n > len(op.buf):
                    raise DiffFormatError(f"data at {offset + pos} runs past the image size {self.size}")
                op.buf[within:within + n] = mv[pos:pos + n]
                op.cover(within, within + n)
            pos += n

    def zero(self, offset: int, length: int) -> None:
        """Apply a ``z`` record: ``length`` bytes at ``offset`` now read as zero."""
        end = offset + length
        pos = offset
        while pos < end:
            idx, within = divmod(pos, BLOCK_SIZE)
            self._advance(idx)
            blen = self._len(idx) if idx < block_count(self.size) else 0
            n = min(end - pos, BLOCK_SIZE - within)
            if within == 0 and n >= blen and idx not in self._touched and blen:
                if idx < block_count(self.size):
                    self.blocks[idx] = zero_digest(blen, self.checksum)
                    self.unknown.discard(idx)
                    self._touched.add(idx)
            else:
                op = self._get(idx)
                if op is not None:
                    stop = min(within + n, len(op.buf))
                    op.buf[within:stop] = bytes(stop - within)
                    op.cover(within, stop)
            pos += n

    def _close(self, idx: int) -> None:
        op = self._open.pop(idx)
        if op.complete() or self.zero_base:
            self.blocks[idx] = self._digest(op.buf)
            self.unknown.discard(idx)
        else:
            self.blocks[idx] = None
            self.unknown.add(idx)

    def finish(self) -> Tuple[List[Optional[str]], List[int]]:
        """Close every open block; return (checksums, sorted indices of unknown blocks)."""
        for i in sorted(self._open):
            self._close(i)
        return self.blocks, sorted(self.unknown)


def encode_header(from_snap: Optional[str], to_snap: Optional[str], size: int) -> bytes:
    """The start of an ``rbd diff v1`` stream: the header, the ``f`` / ``t`` records (when named) and the ``s``
    record (``size`` in bytes), as ``rbd export-diff`` writes them. ``rbd import-diff`` of the stream requires the
    ``f`` snapshot to exist on the target image and creates the ``t`` snapshot after the import."""
    out = bytearray(HEADER_V1)
    for tag, name in ((b"f", from_snap), (b"t", to_snap)):
        if name:
            raw = name.encode("utf-8")
            out += tag + _U32.pack(len(raw)) + raw
    out += b"s" + _U64.pack(size)
    return bytes(out)


def encode_write(offset: int, length: int) -> bytes:
    """The head of a ``w`` record (``length`` data bytes at byte ``offset`` follow it)."""
    return b"w" + _U64x2.pack(offset, length)


def encode_zero(offset: int, length: int) -> bytes:
    """A ``z`` record: ``length`` bytes at byte ``offset`` read as zero."""
    return b"z" + _U64x2.pack(offset, length)


END_RECORD = b"e"
"""The last byte of every stream."""


class DiffReader:
    """Parse an ``rbd diff v1`` stream pulled through ``read(n)`` and apply it to a BlockState.

    ``read`` must return exactly ``n`` bytes except at end of stream. Data of ``w`` records is pulled in pieces
    of at most ``piece`` bytes so memory stays bounded. Attributes after ``run``: ``from_snap``, ``to_snap``,
    ``end_size`` (bytes, from the ``s`` record), ``data_bytes`` (sum of ``w`` lengths), ``records`` (count).
    """

    def __init__(self, read: Callable[[int], bytes], state_factory: Callable[[int], BlockState],
                 start_size: Optional[int] = None, piece: int = BLOCK_SIZE) -> None:
        self._read = read
        self._factory = state_factory
        self.pos = 0
        self.piece = piece
        self.from_snap: Optional[str] = None
        self.to_snap: Optional[str] = None
        self.end_size: Optional[int] = None
        self.data_bytes = 0
        self.records = 0
        self.state: Optional[BlockState] = None
        self._start_size = start_size

    def _exact(self, n: int) -> bytes:
        data = self._read(n)
        if len(data) != n:
            raise DiffFormatError(f"stream truncated at byte {self.pos + len(data)}: expected {n} more bytes")
        self.pos += n
        return data

    def _need_state(self) -> BlockState:
        if self.state is None:
            if self._start_size is None:
                raise DiffFormatError(f"data record before the size record at byte {self.pos}")
            self.state = self._factory(self._start_size)
        return self.state

    def run(self) -> BlockState:
        """Consume the whole stream; return the updated BlockState. Raises DiffFormatError."""
        head = self._read(len(HEADER_V1))
        self.pos = len(head)
        if head == HEADER_V2:
            raise DiffFormatError("rbd diff v2 streams (export-format 2) are not supported; use export-diff")
        if head != HEADER_V1:
            raise DiffFormatError(f"not an rbd diff v1 stream (header {head[:12]!r})")
        while True:
            tag = self._read(1)
            if not tag:
                raise DiffFormatError(f"stream ends at byte {self.pos} without the end record 'e'")
            self.pos += 1
            self.records += 1
            if tag == b"e":
                if self._read(1):
                    raise DiffFormatError(f"data after the end record at byte {self.pos}")
                return self._need_state() if self.state or self._start_size is not None else self._empty()
            if tag in (b"f", b"t"):
                (n,) = _U32.unpack(self._exact(4))
                if n > 4096:
                    raise DiffFormatError(f"snapshot name of {n} bytes at byte {self.pos}")
                name = self._exact(n).decode("utf-8", errors="replace")
                if tag == b"f":
                    self.from_snap = name
                else:
                    self.to_snap = name
            elif tag == b"s":
                (size,) = _U64.unpack(self._exact(8))
                self.end_size = size
                if self.state is None:
                    self.state = self._factory(self._start_size if self._start_size is not None else size)
                self.state.resize(size)
            elif tag == b"w":
                off, length = _U64x2.unpack(self._exact(16))
                st = self._need_state()
                self.data_bytes += length
                done = 0
                while done < length:
                    # align pieces to block boundaries so each piece lands in one block buffer
                    n = min(self.piece, length - done, BLOCK_SIZE - (off + done) % BLOCK_SIZE)
                    st.write(off + done, self._exact(n))
                    done += n
            elif tag == b"z":
                off, length = _U64x2.unpack(self._exact(16))
                self._need_state().zero(off, length)
            else:
                raise DiffFormatError(f"unknown record tag {tag!r} at byte {self.pos - 1}")

    def _empty(self) -> BlockState:
        raise DiffFormatError("stream has no size record and no start size was given")
