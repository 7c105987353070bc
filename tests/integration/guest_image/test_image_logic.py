"""The image builder against this host's tools and kernel, without a guest: cpio(1) lists the initrd, a dynamic
binary of the host is refused as busybox, the default modules resolve on the host kernel, a real Debian bzImage is
unpacked, and a mount below a build tree is unmounted before removal. The pure decisions and file effects of
plugins/module_utils/image/ are unit-tested in tests/unit/images (one file per module)."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.image.fs import mounts_below, remove_tree
from ansible_collections.zjusct.cloud.plugins.module_utils.image.initrd import (
    DEFAULT_MODULES,
    build_initrd,
    is_static_elf,
    load_order,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.image.vmlinux import extract_vmlinux

from tests.conftest import require


def test_initrd_is_a_newc_archive_cpio_can_list(tmp_path: Path) -> None:
    busybox = Path("/bin/busybox").read_bytes()
    assert is_static_elf(busybox)
    blob = build_initrd(busybox, "#!/bin/busybox sh\necho hi", [("kernel/x/a.ko", b"\0modA")])
    (tmp_path / "i.cpio").write_bytes(gzip.decompress(blob))
    listing = subprocess.run(["cpio", "-it", "--quiet", "-F", str(tmp_path / "i.cpio")], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
    assert {"init", "bin/busybox", "bin/sh", "lib/modules/a.ko", "etc/initrd-modules", "dev/console"} <= set(listing)


def test_dynamic_binary_is_not_accepted_as_static_busybox() -> None:
    assert not is_static_elf(Path("/bin/ls").read_bytes())


def test_default_modules_resolve_on_the_host_kernel() -> None:
    release = os.uname().release
    moddir = Path("/lib/modules") / release
    if not (moddir / "modules.dep").exists():
        moddir = next(Path("/lib/modules").glob("*/modules.dep")).parent
    order = load_order((moddir / "modules.dep").read_text(), (moddir / "modules.builtin").read_text(),
                       DEFAULT_MODULES)
    names = [Path(p).name for p in order]
    assert names.index("virtio.ko") < names.index("virtio_blk.ko")
    assert "virtio_mmio.ko" in names and "crc32c_generic.ko" in names


def test_vmlinux_extracted_from_a_debian_bzimage_is_elf() -> None:
    kernels = sorted(Path("/boot").glob("vmlinuz-*"))
    require("guest", bool(kernels), "no /boot/vmlinuz-* on this host (linux-image-amd64, hack/install-deps.sh)")
    elf = extract_vmlinux(kernels[-1].read_bytes())
    assert elf[:4] == b"\x7fELF" and elf[4] == 2


@pytest.mark.guest
def test_remove_tree_unmounts_what_a_killed_build_left(tmp_path: Path) -> None:
    # as building the guest image itself (tests/guest_image_fixture.py), this needs root: the gate fails it under CI
    require("guest", os.geteuid() == 0 and shutil.which("mount") is not None,
            "mounting a tmpfs needs root and mount(8), as the guest image build does")
    build = tmp_path / ".build-x"
    (build / "root" / "proc").mkdir(parents=True)
    (build / "root" / "proc" / "placeholder").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(build / "root" / "proc" / "placeholder")], check=True,
                   timeout=30)
    (build / "root" / "proc" / "placeholder" / "file").write_text("x")
    try:
        assert mounts_below(str(build)) == [str(build / "root" / "proc" / "placeholder")]
        assert remove_tree(str(build)) is True
        assert not build.exists()
    finally:
        subprocess.run(["umount", str(build / "root" / "proc" / "placeholder")], capture_output=True, timeout=30,
                       check=False)
