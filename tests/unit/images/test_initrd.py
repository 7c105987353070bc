"""image/initrd.py: module load order from modules.dep, static ELF detection and the newc cpio archive, read back
here by a small newc reader (the integration test lists it with cpio(1))."""

from __future__ import annotations

import gzip
import struct

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.image.initrd import (
    Entry,
    InitrdError,
    build_initrd,
    is_static_elf,
    load_order,
    module_name,
    newc_archive,
)

DEP = """kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko: kernel/drivers/virtio/virtio.ko
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/jbd2/jbd2.ko
kernel/fs/jbd2/jbd2.ko:
kernel/lib/crc16.ko:
"""


def test_load_order_puts_dependencies_first_once_and_skips_builtins() -> None:
    order = load_order(DEP, "kernel/drivers/virtio/virtio_pci.ko\n", ["virtio_blk", "virtio-rng", "ext4", "virtio_pci"])
    assert order.index("kernel/drivers/virtio/virtio.ko") < order.index("kernel/drivers/virtio/virtio_ring.ko")
    assert order.index("kernel/drivers/virtio/virtio_ring.ko") < order.index("kernel/drivers/block/virtio_blk.ko")
    assert order.index("kernel/fs/jbd2/jbd2.ko") < order.index("kernel/fs/ext4/ext4.ko")
    assert len(order) == len(set(order)) == 7


def test_unknown_module_is_an_error_naming_it() -> None:
    with pytest.raises(InitrdError, match=r"modules\[0\]: 'virtio_nope'"):
        load_order(DEP, "", ["virtio_nope"])


def test_module_name_is_the_file_name_without_suffix_with_dashes_folded() -> None:
    assert module_name("kernel/drivers/char/hw_random/virtio-rng.ko") == "virtio_rng"
    assert module_name("kernel/drivers/block/virtio_blk.ko.zst") == "virtio_blk"


def _elf(program_types: list[int]) -> bytes:
    """A 64-bit little-endian ELF header with program headers of the given p_type values (56 bytes each)."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x20, 64)
    struct.pack_into("<HH", header, 0x36, 56, len(program_types))
    return bytes(header) + b"".join(struct.pack("<I", t) + b"\0" * 52 for t in program_types)


def test_static_elf_has_no_interpreter() -> None:
    assert is_static_elf(_elf([1, 1]))
    assert not is_static_elf(_elf([1, 3])), "PT_INTERP: dynamically linked"
    assert not is_static_elf(b"#!/bin/sh\n" + b"\0" * 64)
    assert not is_static_elf(_elf([1])[:64] + b"\0"), "program headers beyond the data"


def _read_newc(blob: bytes) -> list[tuple[str, int, bytes, tuple[int, int]]]:
    """(name, mode, data, (rdevmajor, rdevminor)) of each member of a newc archive, the trailer excluded."""
    out, pos = [], 0
    while True:
        assert blob[pos:pos + 6] == b"070701"
        fields = [int(blob[pos + 6 + 8 * i:pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, rdev, namesize = fields[1], fields[6], (fields[9], fields[10]), fields[11]
        name_end = pos + 110 + namesize
        name = blob[pos + 110:name_end - 1].decode()
        data_start = name_end + (-name_end % 4)
        data = blob[data_start:data_start + size]
        pos = data_start + size + (-(data_start + size) % 4)
        if name == "TRAILER!!!":
            assert pos == len(blob)
            return out
        out.append((name, mode, data, rdev))


def test_newc_archive_members_and_padding() -> None:
    blob = newc_archive([Entry("d", 0o040755), Entry("d/f", 0o100644, b"abcde"), Entry("d/l", 0o120777, target="f"),
                         Entry("dev/console", 0o020600, rdev=(5, 1))])
    assert len(blob) % 4 == 0
    assert _read_newc(blob) == [("d", 0o040755, b"", (0, 0)), ("d/f", 0o100644, b"abcde", (0, 0)),
                                ("d/l", 0o120777, b"f", (0, 0)), ("dev/console", 0o020600, b"", (5, 1))]


def test_initrd_is_a_reproducible_gzip_of_its_members() -> None:
    busybox = _elf([1])
    blob = build_initrd(busybox, "#!/bin/busybox sh\necho hi", [("kernel/x/a.ko", b"\0modA")])
    assert build_initrd(busybox, "#!/bin/busybox sh\necho hi", [("kernel/x/a.ko", b"\0modA")]) == blob
    members = {name: (mode, data) for name, mode, data, _ in _read_newc(gzip.decompress(blob))}
    assert {"init", "bin/busybox", "bin/sh", "lib/modules/a.ko", "etc/initrd-modules", "dev/console"} <= set(members)
    assert members["bin/busybox"] == (0o100755, busybox)
    assert members["bin/sh"] == (0o120777, b"busybox")
    assert members["init"][1] == b"#!/bin/busybox sh\necho hi\n"
    assert members["etc/initrd-modules"][1] == b"a.ko\n"
