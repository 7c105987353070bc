"""The image builder's decisions and file effects, without a guest: inputs hashing, initrd module order and
cpio format, bzImage unpacking, the manifest check, safe removal of a build tree with a mount below it and the
atomic publication of a set."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.image.fs import (
    FsError,
    mounts_below,
    remove_tree,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.image.guest_image_publish_module import publish
from ansible_collections.zjusct.cloud.plugins.module_utils.image.initrd import (
    DEFAULT_MODULES,
    InitrdError,
    build_initrd,
    is_static_elf,
    load_order,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.image.inputs import (
    ARTIFACTS,
    BuildInputs,
    InputError,
    check_manifest,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.image.vmlinux import VmlinuxError, extract_vmlinux

from tests.conftest import require

BASE = BuildInputs(name="debian-bookworm", distro="debian", suite="bookworm", mirror="http://deb.debian.org/debian",
                   packages=("systemd", "dbus", "openssh-server"))


def test_version_ignores_package_order_and_duplicates() -> None:
    same = BuildInputs(**{**BASE.__dict__, "packages": ("openssh-server", "dbus", "systemd", "dbus")})
    assert same.version == BASE.version
    assert len(BASE.version) == 12
    assert BASE.set_name == f"debian-bookworm-{BASE.version}"


@pytest.mark.parametrize("change", [{"mirror": "http://mirror.example/debian"}, {"size_mib": 4096},
                                    {"packages": ("systemd",)}, {"suite": "trixie"}, {"extra": {"init": "x"}}])
def test_every_input_changes_the_version(change: dict) -> None:
    assert BuildInputs(**{**BASE.__dict__, **change}).version != BASE.version


@pytest.mark.parametrize(("change", "field"), [({"size_mib": 100}, "size_mib: 100 is outside 512-65536"),
                                               ({"distro": "arch"}, "distro: 'arch'"),
                                               ({"packages": ("Bad Name",)}, "packages[0]"),
                                               ({"mirror": "ftp:/x"}, "mirror:")])
def test_bad_inputs_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        BuildInputs(**{**BASE.__dict__, **change}).validate()


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


def test_initrd_is_a_newc_archive_cpio_can_list(tmp_path: Path) -> None:
    busybox = Path("/bin/busybox").read_bytes()
    assert is_static_elf(busybox)
    blob = build_initrd(busybox, "#!/bin/busybox sh\necho hi", [("kernel/x/a.ko", b"\0modA")])
    assert build_initrd(busybox, "#!/bin/busybox sh\necho hi", [("kernel/x/a.ko", b"\0modA")]) == blob
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


def test_non_bzimage_is_rejected() -> None:
    with pytest.raises(VmlinuxError, match="HdrS"):
        extract_vmlinux(b"\0" * 4096)


def _staging(tmp_path: Path) -> Path:
    out = tmp_path / ".build" / "out"
    out.mkdir(parents=True)
    for name in ARTIFACTS:
        (out / name).write_bytes(name.encode() * 10)
    return out


def test_publish_writes_manifest_last_and_set_is_complete(tmp_path: Path) -> None:
    out = _staging(tmp_path)
    final = tmp_path / BASE.set_name
    assert not check_manifest(str(out), BASE.sha256()).complete  # no manifest yet: not a set
    changed, manifest = publish(str(out), str(final), BASE.canonical(), BASE.sha256(), "6.1.0-x", "root=/dev/vda",
                                force=False)
    assert changed and not out.exists()
    check = check_manifest(str(final), BASE.sha256(), verify_sha256=True)
    assert check.complete, check.reason
    assert json.loads((final / "manifest.json").read_text()) == manifest
    assert all(not os.access(final / n, os.W_OK) or os.geteuid() == 0 for n in ARTIFACTS)
    assert (os.stat(final / "rootfs.raw").st_mode & 0o222) == 0
    # Same inputs again: nothing changes.
    assert publish(str(_staging(tmp_path / "again")), str(final), BASE.canonical(), BASE.sha256(), "6.1.0-x",
                   "root=/dev/vda", force=False)[0] is False


def test_truncated_artefact_makes_the_set_incomplete(tmp_path: Path) -> None:
    final = tmp_path / BASE.set_name
    publish(str(_staging(tmp_path)), str(final), BASE.canonical(), BASE.sha256(), "6.1.0-x", "x", force=False)
    os.chmod(final / "vmlinux", 0o644)
    (final / "vmlinux").write_bytes(b"short")
    assert "size" in check_manifest(str(final), BASE.sha256()).reason


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


def test_mountinfo_escapes_are_decoded() -> None:
    info = "36 25 0:32 / /tmp/a\\040b/root/proc rw - proc proc rw\n"
    assert mounts_below("/tmp/a b", info) == ["/tmp/a b/root/proc"]


def test_remove_tree_refuses_another_filesystem_it_cannot_unmount(tmp_path: Path, monkeypatch) -> None:
    # Simulate an entry on another device that unmounting did not clear.
    from ansible_collections.zjusct.cloud.plugins.module_utils.image import fs as _image_fs

    (tmp_path / "t" / "dev").mkdir(parents=True)
    real_lstat = os.lstat

    def fake_lstat(p, *a, **k):  # type: ignore[no-untyped-def]
        st = real_lstat(p, *a, **k)
        if str(p).endswith("/dev"):
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev + 1, *tuple(st)[3:]))
        return st

    monkeypatch.setattr(_image_fs.os, "lstat", fake_lstat)
    monkeypatch.setattr(_image_fs, "unmount_below", lambda path, timeout=60.0: [])
    with pytest.raises(FsError, match="another filesystem"):
        remove_tree(str(tmp_path / "t"))
