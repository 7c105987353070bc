# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Extract the uncompressed ELF ``vmlinux`` from an x86 ``bzImage`` (Firecracker boots only the ELF form).

Source: the x86 boot protocol (kernel Documentation/arch/x86/boot.rst): the real-mode header carries
``setup_sects`` at 0x1f1, the magic ``HdrS`` at 0x202, the protocol version at 0x206 and, from protocol 2.08,
``payload_offset`` (0x248) and ``payload_length`` (0x24c) locating the compressed kernel relative to the start of
the protected-mode code, which begins at ``(setup_sects or 4) + 1`` 512-byte sectors into the file.
"""

from __future__ import annotations

import bz2
import lzma
import shutil
import struct
import subprocess
import zlib

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

_MAGICS: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"BZh", "bzip2"),
    (b"\x5d\x00\x00", "lzma"),
    (b"\x02\x21\x4c\x18", "lz4"),
    (b"\x89LZO", "lzo"),
)


class VmlinuxError(CloudError, ValueError):
    """The file is not a bzImage this code can unpack; the message says which check failed."""


def payload(bzimage: bytes) -> tuple[str, bytes]:
    """Return ``(compression, compressed payload)`` of a bzImage.

    Raises:
        VmlinuxError: no ``HdrS`` magic, boot protocol older than 2.08, payload out of the file, unknown format.
    """
    if len(bzimage) < 0x250 or bzimage[0x202:0x206] != b"HdrS":
        raise VmlinuxError("not a bzImage: no 'HdrS' magic at offset 0x202")
    (proto,) = struct.unpack_from("<H", bzimage, 0x206)
    if proto < 0x0208:
        raise VmlinuxError(f"boot protocol {proto >> 8}.{proto & 0xff:02d} has no payload fields (needs >= 2.08)")
    setup_sects = bzimage[0x1F1] or 4
    offset, length = struct.unpack_from("<II", bzimage, 0x248)
    start = (setup_sects + 1) * 512 + offset
    if start + length > len(bzimage) or length == 0:
        raise VmlinuxError(f"payload {start}+{length} lies outside the {len(bzimage)}-byte file")
    data = bzimage[start : start + length]
    for magic, name in _MAGICS:
        if data.startswith(magic):
            return name, data
    raise VmlinuxError(f"unknown payload compression (first bytes {data[:6].hex()})")


def _zstd_cli(data: bytes, timeout: float) -> bytes:
    exe = shutil.which("zstd")
    if exe is None:
        raise VmlinuxError("the kernel payload is zstd-compressed and the 'zstd' command is not installed")
    proc = subprocess.run([exe, "-d", "-c", "-q"], input=data, capture_output=True, timeout=timeout, check=False)
    if proc.returncode != 0 and not proc.stdout:
        raise VmlinuxError(f"zstd -d failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def decompress(kind: str, data: bytes, timeout: float = 120.0) -> bytes:
    """Decompress a kernel payload; trailing bytes after the stream (the appended size word) are ignored.

    ``timeout`` (seconds) bounds the external ``zstd`` call used for zstd payloads (Ubuntu kernels).
    """
    if kind == "gzip":
        return zlib.decompressobj(wbits=31).decompress(data)
    if kind == "xz":
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)
    if kind == "lzma":
        return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(data)
    if kind == "bzip2":
        return bz2.BZ2Decompressor().decompress(data)
    if kind == "zstd":
        return _zstd_cli(data, timeout)
    raise VmlinuxError(f"payload compression {kind} is not supported (gzip, xz, lzma, bzip2, zstd are)")


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The ELF kernel inside ``bzimage``.

    Raises:
        VmlinuxError: see :func:`payload`, or the result is not an ELF file.
    """
    kind, data = payload(bzimage)
    elf = decompress(kind, data)
    if not elf.startswith(b"\x7fELF"):
        raise VmlinuxError(f"the {kind} payload did not decompress to an ELF file")
    return elf
