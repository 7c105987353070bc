# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.guest_image_kernel``: kernel artefacts of an image set from the kernel installed in
the guest root tree: vmlinuz (bzImage, QEMU), vmlinux (ELF, Firecracker) and the busybox initrd. Taking the kernel
from the tree keeps vmlinuz and the modules udev loads later (pvpanic, virtio-balloon...) from the same package
build.
"""

from __future__ import annotations

import gzip
import lzma
import os
from dataclasses import asdict, dataclass, field

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.image.fs import write_atomic
from ansible_collections.zjusct.cloud.plugins.module_utils.image.initrd import (
    InitrdError,
    build_initrd,
    is_static_elf,
    load_order,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.image.vmlinux import (
    VmlinuxError,
    decompress,
    extract_vmlinux,
    payload,
)


class KernelError(CloudError, ValueError):
    """The root tree, busybox or the kernel image does not allow building the artefacts."""


@dataclass
class KernelArtifacts:
    kernel_version: str
    compression: str
    initrd_modules: list[str]
    written: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def find_kernel(root: str) -> str:
    """The one kernel release that has both /boot/vmlinuz-<r> and /lib/modules/<r>/modules.dep in ``root``.

    Raises:
        KernelError: none or several.
    """
    boot = os.path.join(root, "boot")
    try:
        images = sorted(n[len("vmlinuz-"):] for n in os.listdir(boot) if n.startswith("vmlinuz-"))
    except FileNotFoundError:
        images = []
    found = [r for r in images if os.path.isfile(os.path.join(root, "lib", "modules", r, "modules.dep"))]
    if len(found) != 1:
        raise KernelError(
            f"root: {root} must hold exactly one kernel with /boot/vmlinuz-<r> and /lib/modules/<r>/modules.dep; "
            f"found {found or 'none'} (is the kernel package in the package list?)"
        )
    return found[0]


def plain_module_name(rel: str) -> str:
    """``x.ko.zst`` -> ``x.ko`` (busybox insmod in the initrd loads only uncompressed modules)."""
    for suffix in (".xz", ".zst", ".gz"):
        if rel.endswith(".ko" + suffix):
            return rel[: -len(suffix)]
    return rel


def plain_module(rel: str, data: bytes) -> bytes:
    """Decompress a .ko.xz/.ko.gz (Python) or .ko.zst (``zstd`` command, Ubuntu) module; .ko passes through.

    Raises:
        KernelError: the module cannot be decompressed.
    """
    try:
        if rel.endswith(".ko.xz"):
            return lzma.decompress(data)
        if rel.endswith(".ko.gz"):
            return gzip.decompress(data)
        if rel.endswith(".ko.zst"):
            return decompress("zstd", data)
    except (lzma.LZMAError, OSError, VmlinuxError) as exc:
        raise KernelError(f"modules: cannot decompress {rel}: {exc}") from exc
    return data


def make_kernel_artifacts(root: str, dest: str, busybox: str, init_script: str, modules: list[str]) -> KernelArtifacts:
    """Write vmlinuz, vmlinux and initrd.img into ``dest`` (only files whose content differs)."""
    release = find_kernel(root)
    moddir = os.path.join(root, "lib", "modules", release)
    try:
        with open(busybox, "rb") as fh:
            bb = fh.read()
    except OSError as exc:
        raise KernelError(f"busybox: cannot read {busybox}: {exc} (install busybox-static)") from exc
    if not is_static_elf(bb):
        raise KernelError(f"busybox: {busybox} is not a statically linked x86-64 ELF (install busybox-static)")
    with open(os.path.join(moddir, "modules.dep"), encoding="utf-8") as fh:
        dep = fh.read()
    try:
        with open(os.path.join(moddir, "modules.builtin"), encoding="utf-8") as fh:
            builtin = fh.read()
    except FileNotFoundError:
        builtin = ""
    try:
        order = load_order(dep, builtin, modules)
    except InitrdError as exc:
        raise KernelError(f"{exc} (kernel {release})") from exc
    mods = []
    for rel in order:
        with open(os.path.join(moddir, rel), "rb") as fh:
            mods.append((plain_module_name(rel), plain_module(rel, fh.read())))
    with open(os.path.join(root, "boot", f"vmlinuz-{release}"), "rb") as fh:
        bzimage = fh.read()
    try:
        compression, _unused = payload(bzimage)
        vmlinux = extract_vmlinux(bzimage)
    except VmlinuxError as exc:
        raise KernelError(f"vmlinuz-{release}: {exc}") from exc
    result = KernelArtifacts(release, compression, order)
    os.makedirs(dest, exist_ok=True)
    for name, data in (("vmlinuz", bzimage), ("vmlinux", vmlinux), ("initrd.img", build_initrd(bb, init_script, mods))):
        if write_atomic(os.path.join(dest, name), data, 0o644):
            result.written.append(name)
    return result


def run_guest_image_kernel(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.guest_image_kernel`` module (no check mode): :func:`make_kernel_artifacts` of the
    options ``root``, ``dest``, ``busybox``, ``init_script``, ``modules``; ``changed`` when a file was written.

    Raises:
        KernelError: as :func:`make_kernel_artifacts`.
    """
    result = make_kernel_artifacts(params["root"], params["dest"], params["busybox"], params["init_script"],
                                   params["modules"])
    return dict(result.as_dict(), changed=bool(result.written))
