"""image/vmlinux.py: finding and unpacking the payload of a bzImage (a real Debian kernel is unpacked by the
guest_image integration test)."""

from __future__ import annotations

import gzip
import struct

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.image.vmlinux import (
    VmlinuxError,
    decompress,
    extract_vmlinux,
    payload,
)


def _bzimage(data: bytes, proto: int = 0x020F, setup_sects: int = 1, length: int | None = None) -> bytes:
    """A bzImage header (boot protocol ``proto``) whose payload fields point at ``data`` after the setup sectors."""
    head = bytearray((setup_sects + 1) * 512)
    head[0x1F1] = setup_sects
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x206, proto)
    struct.pack_into("<II", head, 0x248, 0, len(data) if length is None else length)
    return bytes(head) + data


def test_non_bzimage_is_rejected() -> None:
    with pytest.raises(VmlinuxError, match="HdrS"):
        extract_vmlinux(b"\0" * 4096)


def test_a_gzip_payload_unpacks_to_the_elf() -> None:
    elf = b"\x7fELF\x02\x01" + b"\0" * 100
    packed = gzip.compress(elf) + b"\x01\x02\x03\x04"  # the appended size word is ignored
    assert payload(_bzimage(packed)) == ("gzip", packed)
    assert extract_vmlinux(_bzimage(packed)) == elf


@pytest.mark.parametrize(("image", "message"), [
    (_bzimage(gzip.compress(b"x"), proto=0x0207), "boot protocol 2.07 has no payload fields"),
    (_bzimage(gzip.compress(b"x"), length=1 << 20), "lies outside the"),
    (_bzimage(b"\0" * 16), "unknown payload compression"),
    (_bzimage(gzip.compress(b"not an elf")), "did not decompress to an ELF file"),
])
def test_bad_bzimages_say_what_is_wrong(image: bytes, message: str) -> None:
    with pytest.raises(VmlinuxError, match=message):
        extract_vmlinux(image)


def test_unknown_compression_is_named() -> None:
    with pytest.raises(VmlinuxError, match="lz4 is not supported"):
        decompress("lz4", b"")
