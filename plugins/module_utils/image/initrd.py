# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guest initrd: a gzip-compressed newc cpio archive with busybox-static, an /init script and the kernel
modules needed to reach a virtio-blk ext4 root on virtio-pci (QEMU q35) and virtio-mmio (Firecracker).

Formats and rules used here:
* newc cpio: header magic ``070701`` and 13 eight-digit hex fields, name NUL-terminated, header+name and data each
  padded to 4 bytes, ``TRAILER!!!`` entry last (kernel Documentation/driver-api/early-userspace/buffer-format.rst).
* ``modules.dep``: ``path.ko: dep.ko dep.ko ...`` per line, paths relative to ``/lib/modules/<ver>``; module names
  compare with ``-`` and ``_`` equal (kmod); ``modules.builtin`` lists modules compiled into the kernel.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
from dataclasses import dataclass

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

# Root modules whose dependency closure goes into the initrd. Built-in ones (Ubuntu builds virtio in) are skipped.
DEFAULT_MODULES = (
    "virtio_pci",
    "virtio_mmio",
    "virtio_blk",
    "virtio_net",
    "virtio_rng",
    "crc32c_generic",
    "ext4",
    "button",
    "evdev",
)


class InitrdError(CloudError, ValueError):
    """The kernel module tree or an input does not allow building the initrd."""


def module_name(path: str) -> str:
    """``kernel/drivers/block/virtio_blk.ko(.xz)`` -> ``virtio_blk`` (``-`` folded to ``_`` as kmod does)."""
    base = os.path.basename(path)
    for suffix in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


def parse_modules_dep(text: str) -> dict[str, tuple[str, list[str]]]:
    """Parse modules.dep into ``{name: (path, [dependency paths])}``."""
    table: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        path, _unused, deps = line.partition(":")
        table[module_name(path.strip())] = (path.strip(), deps.split())
    return table


def load_order(dep_text: str, builtin_text: str, wanted: list[str] | tuple[str, ...]) -> list[str]:
    """Module file paths to insmod, dependencies first, each once.

    Args:
        dep_text: content of ``modules.dep``.
        builtin_text: content of ``modules.builtin`` (may be empty).
        wanted: root module names (``-`` or ``_`` spelling).

    Raises:
        InitrdError: a wanted module is neither a loadable module nor built in.
    """
    table = parse_modules_dep(dep_text)
    builtin = {module_name(line.strip()) for line in builtin_text.splitlines() if line.strip()}
    by_path = {path: name for name, (path, _unused) in table.items()}
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in seen:
            return
        if name in stack:
            raise InitrdError(f"modules.dep: dependency cycle {' -> '.join((*stack, name))}")
        path, deps = table[name]
        for dep in deps:
            dep_name = by_path.get(dep, module_name(dep))
            if dep_name in table:
                visit(dep_name, (*stack, name))
        seen.add(name)
        order.append(path)

    for i, raw in enumerate(wanted):
        name = module_name(raw if raw.endswith(".ko") else raw + ".ko")
        if name in table:
            visit(name, ())
        elif name not in builtin:
            raise InitrdError(f"modules[{i}]: {raw!r} is neither in modules.dep nor in modules.builtin")
    return order


def is_static_elf(data: bytes) -> bool:
    """True if ``data`` is a 64-bit little-endian ELF without a PT_INTERP program header (statically linked).

    Source: ELF-64 Object File Format (e_phoff at 0x20, e_phentsize at 0x36, e_phnum at 0x38; PT_INTERP = 3).
    """
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        off = phoff + i * phentsize
        if off + 4 > len(data):
            return False
        (p_type,) = struct.unpack_from("<I", data, off)
        if p_type == 3:
            return False
    return True


@dataclass(frozen=True)
class Entry:
    """One cpio member: ``mode`` includes the file type bits (0o040000 dir, 0o100000 file, 0o020000 char dev)."""

    name: str
    mode: int
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)
    target: str = ""


def _pad4(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


def newc_archive(entries: list[Entry]) -> bytes:
    """Serialize entries as a newc cpio archive (uid/gid 0, mtime 0: byte-identical for identical input)."""
    out = io.BytesIO()
    ino = 1
    for entry in [*entries, Entry("TRAILER!!!", 0)]:
        data = entry.target.encode() if entry.target else entry.data
        name = entry.name.encode() + b"\0"
        nlink = 2 if entry.mode & 0o170000 == 0o040000 else 1
        fields = (ino, entry.mode, 0, 0, nlink, 0, len(data), 0, 0, entry.rdev[0], entry.rdev[1], len(name), 0)
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        out.write(header + name + _pad4(len(header) + len(name)))
        out.write(data + _pad4(len(data)))
        ino += 1
    return out.getvalue()


def initrd_entries(busybox: bytes, init_script: str, modules: list[tuple[str, bytes]]) -> list[Entry]:
    """The members of the initrd.

    Args:
        busybox: the static busybox binary (installed as /bin/busybox, which /init calls by absolute path).
        init_script: the text of /init.
        modules: ``(relative path under /lib/modules, content)`` in load order; /etc/initrd-modules lists them.
    """
    dirs = ["bin", "dev", "etc", "lib", "lib/modules", "newroot", "proc", "sys"]
    entries = [Entry(d, 0o040755) for d in dirs]
    entries.append(Entry("dev/console", 0o020600, rdev=(5, 1)))
    entries.append(Entry("dev/kmsg", 0o020644, rdev=(1, 11)))
    entries.append(Entry("bin/busybox", 0o100755, busybox))
    entries.append(Entry("bin/sh", 0o120777, target="busybox"))
    entries.append(Entry("init", 0o100755, init_script.rstrip("\n").encode() + b"\n"))
    flat: list[str] = []
    for rel, content in modules:
        base = os.path.basename(rel)
        flat.append(base)
        entries.append(Entry("lib/modules/" + base, 0o100644, content))
    entries.append(Entry("etc/initrd-modules", 0o100644, "".join(m + "\n" for m in flat).encode()))
    return entries


def build_initrd(busybox: bytes, init_script: str, modules: list[tuple[str, bytes]]) -> bytes:
    """gzip (mtime 0, level 9) of the newc archive of :func:`initrd_entries`."""
    return gzip.compress(newc_archive(initrd_entries(busybox, init_script, modules)), compresslevel=9, mtime=0)
