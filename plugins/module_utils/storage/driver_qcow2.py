# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host backend's ``qcow2`` volume driver: per-VM qcow2 overlays on a read-only base shared per image set.

With ``volume_driver: qcow2`` in the host config (:mod:`host.config`), a new root volume is made in two steps:

1. The image set's ``rootfs.raw`` is converted once to ``<volumes_dir>/bases/<image-set-dir-name>.qcow2``
   (``qemu-img convert -O qcow2``), mode 0444 (:func:`ensure_base`). The conversion writes a private temporary
   name and renames it at the end, under a flock per base, so a base is never visible half-written and two runs
   convert it once. The base is a copy, not the image set's file: rebuilding or removing an image set never
   changes what existing overlays read.
2. The volume is ``qemu-img create -f qcow2 -F qcow2 -b <base> <volumes_dir>/<name>.qcow2 [<size>M]``: an
   empty overlay whose reads fall through to the base (copy-on-write, instant, a few hundred KiB on disk).

QEMU opens the overlay read-write and its backing base read-only (``rootDisk.format: qcow2``); its image
locking lets any number of VMs share the base for reading and refuses every writer of it, and refuses a second
writer of an overlay. A volume's writers are the processes holding the overlay open (as the ``file`` driver).

Deleting a volume removes its overlay only, never the base: a base is shared by the volumes of every owner made
from the image set, and removing it while a create is between :func:`ensure_base` and ``qemu-img create`` would
break that create; bases are therefore **never removed automatically**. An operator removes a base of an image
set no longer in use once no ``*.qcow2`` under ``volumes_dir`` names it as backing file (docs/host-backend.md).

Sizes: ``size_mib`` is the disk's virtual size (what placement and quotas count, as for ``file``); a size above
the image's grows the virtual disk only, not the guest's file system (as ``rbd``). Source of the CLI behaviour:
qemu-img(1) (QEMU 7.2); runs on the managed node's Python (standard library + ``qemu-img``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common import flock as _flock
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import VolumeSettings
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver_file import FileDriver
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError

BASES_DIR = "bases"
CONVERT_TIMEOUT_SECONDS = 1800
MiB = 1024 * 1024


def overlay_path(volumes_dir: str, name: str) -> str:
    """``<volumes_dir>/<name>.qcow2``: volume ``name``'s overlay."""
    return os.path.join(volumes_dir, f"{name}.qcow2")


def base_path(volumes_dir: str, image_set_dir: str) -> str:
    """``<volumes_dir>/bases/<image set directory name>.qcow2``: the image set's shared read-only base."""
    return os.path.join(volumes_dir, BASES_DIR, os.path.basename(image_set_dir.rstrip("/")) + ".qcow2")


def _qemu_img(argv: list, field: str, timeout: int = 600) -> str:
    try:
        proc = subprocess.run(["qemu-img", *argv], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VolumeError(f"{field}: qemu-img {argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        raise VolumeError(f"{field}: qemu-img {' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _make_file(argv: list, tmp: str, target: str, mode: int, field: str, timeout: int = 600) -> None:
    """Run ``qemu-img argv`` (which writes ``tmp``), then chmod ``tmp`` to ``mode`` and rename it to ``target``,
    so ``target`` appears only complete; on any failure ``tmp`` is removed.

    Raises:
        VolumeError: qemu-img failed (message starts with ``field``).
    """
    try:
        _qemu_img(argv, field, timeout)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def image_info(path: str, field: str = "root_volume_claim") -> dict:
    """``qemu-img info --output=json`` of ``path`` (``-U``: readable while a VM has it open).

    Returns:
        The JSON object: ``format``, ``virtual-size`` (bytes), ``backing-filename``, ``backing-filename-format``...

    Raises:
        VolumeError: qemu-img failed (the message starts with ``field``).
    """
    try:
        return json.loads(_qemu_img(["info", "-U", "--output=json", path], field))
    except ValueError as exc:
        raise VolumeError(f"{field}: qemu-img info {path}: not JSON: {exc}") from exc


def ensure_base(volumes_dir: str, image_set_dir: str) -> tuple[str, bool]:
    """Convert ``<image_set_dir>/rootfs.raw`` once into the image set's read-only qcow2 base.

    Idempotent; runs on one host are serialised by a flock next to the base.

    Returns:
        (the base's path, whether this call converted it).

    Raises:
        VolumeError: the image set has no rootfs.raw or ``qemu-img convert`` failed (nothing is left behind).
    """
    target = base_path(volumes_dir, image_set_dir)
    directory = os.path.dirname(target)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with _flock.exclusive(target + ".lock"):
        if os.path.exists(target):
            return target, False
        source = os.path.join(image_set_dir, "rootfs.raw")
        if not os.path.isfile(source):
            raise VolumeError(f"image: {image_set_dir} has no rootfs.raw")
        tmp = f"{target}.converting-{uuid.uuid4().hex[:8]}"
        _make_file(["convert", "-f", "raw", "-O", "qcow2", source, tmp], tmp, target, 0o444, "image",
                   CONVERT_TIMEOUT_SECONDS)
        return target, True


class Qcow2Driver(FileDriver):
    """:class:`storage.driver.VolumeDriver` ``qcow2`` (module docstring). A local file like ``file``: claim, release,
    mark, writers (processes holding the overlay open; the base is only read), boot blocker (QEMU's image locking)
    and delete (the overlay only; the base stays) are :class:`storage.driver_file.FileDriver`'s."""

    name = "qcow2"

    def check_config(self, data: dict) -> None:
        """Nothing beyond ``volumes_dir`` (which has a default); Firecracker cannot open qcow2.

        Raises:
            ValueError: ``hypervisor: firecracker`` with ``volume_driver: qcow2``.
        """
        if data.get("hypervisor", "qemu") == "firecracker":
            raise ValueError("host_config: volume_driver: 'qcow2' needs hypervisor qemu (Firecracker opens raw"
                             " files only); use volume_driver file with hypervisor firecracker")

    def create(self, settings: VolumeSettings, name: str, image: dict, owner: str,
               size_mib: Optional[int]) -> dict:
        """An overlay on the image set's base (made first if missing), of ``size_mib`` MiB virtual size.

        Raises:
            VolumeError: ``root_volume_claim:`` the overlay file exists; ``volume_size_mib:`` below the base's
                virtual size; ``image:``/``root_volume_claim:`` qemu-img failed. Nothing is left behind (a base
                converted by this call stays: it is shared and valid).
        """
        os.makedirs(settings.volumes_dir, mode=0o700, exist_ok=True)
        target = overlay_path(settings.volumes_dir, name)
        if os.path.exists(target):
            raise VolumeError(f"root_volume_claim: a volume file {target} already exists but is not in the host"
                              " store")
        base, _converted = ensure_base(settings.volumes_dir, image["dir"])
        base_mib = int(image_info(base, "image")["virtual-size"]) // MiB
        if size_mib is not None and size_mib < base_mib:
            raise VolumeError(f"volume_size_mib: {size_mib} is below the image's size {base_mib}")
        tmp = f"{target}.creating"
        argv = ["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, tmp]
        if size_mib is not None and size_mib > base_mib:
            argv.append(f"{size_mib}M")
        _make_file(argv, tmp, target, 0o600, "root_volume_claim")
        return {"location": target, "size_mib": max(size_mib or 0, base_mib)}

    def root_disk(self, settings: VolumeSettings, volume: dict) -> dict:
        """``{"path": overlay, "format": "qcow2", "cache": "Writeback"}`` (QEMU opens the backing base itself)."""
        return {"path": volume["location"], "format": "qcow2", "cache": "Writeback"}

    def describe(self, settings: VolumeSettings, volume: dict) -> dict:
        """``{"base": path}``: the base the overlay reads through (from the image set, as :func:`base_path`)."""
        return {"base": base_path(os.path.dirname(volume["location"]), volume.get("image") or "")}

    def backup_source(self, settings: VolumeSettings, volume: dict) -> dict:
        """``{"format": "qcow2", "path": overlay}``: the backup reads the guest's view of the overlay and its base."""
        return {"format": "qcow2", "path": volume["location"]}

    def restore_target(self, settings: VolumeSettings, name: str) -> dict:
        """``{"format": "qcow2", "path": <volumes_dir>/<name>.qcow2}``: a standalone qcow2 (no backing file: the
        backup holds the whole disk)."""
        return {"format": "qcow2", "path": overlay_path(settings.volumes_dir, name)}
