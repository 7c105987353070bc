# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""File-backed root volumes of the single-host backend, and image-set lookup.

A volume is a sparse raw file ``<volumes_dir>/<name>.raw``: a copy (reflink where the file system
can, else ``cp --sparse=always``) of an image set's ``rootfs.raw``, never the image itself. Its
ownership marks (owner, claimed-by = CloudVM uid) live in the host store (docs/host-backend.md "How a start works"): a
volume belongs to one owner and is claimed by at most one CloudVM; deleting a CloudVM keeps the
volume and its claim. The claim rules (who may use a volume, when a stale claim is released) are in
:mod:`host.volume_claim`.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError


class VolumeError(CloudError):
    """A volume or image request is invalid or failed (the message names the field)."""


def list_images(images_dir: str) -> list[dict]:
    """Complete image sets under ``images_dir`` (those with a manifest), each manifest + ``dir``."""
    out: list[dict] = []
    try:
        names = sorted(os.listdir(images_dir))
    except FileNotFoundError:
        return out
    for name in names:
        manifest = os.path.join(images_dir, name, "manifest.json")
        try:
            with open(manifest, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        data["dir"] = os.path.join(images_dir, name)
        out.append(data)
    return out


def resolve_image(images_dir: str, image: str) -> dict:
    """Find an image set by name (newest build wins), full ``name-version`` directory name, or path.

    Returns:
        The image set's manifest with ``dir`` added.

    Raises:
        VolumeError: no complete image set matches, naming the ones available.
    """
    if os.path.isabs(image):
        found = [m for m in list_images(os.path.dirname(image.rstrip("/")))
                 if m["dir"] == image.rstrip("/")]
    else:
        sets = list_images(images_dir)
        found = [m for m in sets if os.path.basename(m["dir"]) == image] or \
            sorted((m for m in sets if m.get("name") == image), key=lambda m: m.get("builtAt", ""))
    if not found:
        available = ", ".join(os.path.basename(m["dir"]) for m in list_images(images_dir)) or "none"
        raise VolumeError(f"image: {image!r} is not a built image set in {images_dir} (available: {available};"
                          " build one with playbooks/guest_image.yml)")
    return found[-1]


def volume_path(volumes_dir: str, name: str) -> str:
    """Path of volume ``name``'s file."""
    return os.path.join(volumes_dir, f"{name}.raw")


def create_from_image(volumes_dir: str, name: str, image: dict, size_mib: Optional[int]) -> dict:
    """Copy an image set's rootfs into a new volume file, grown to ``size_mib`` MiB if given.

    The copy is made under a temporary name and renamed at the end, so an interrupted create
    leaves no volume behind.

    Returns:
        ``{"location": path, "size_mib": int}``.

    Raises:
        VolumeError: the file exists, the size is smaller than the image, or a tool failed.
    """
    os.makedirs(volumes_dir, mode=0o700, exist_ok=True)
    target = volume_path(volumes_dir, name)
    if os.path.exists(target):
        raise VolumeError(f"root_volume_claim: a volume file {target} already exists but is not in the host store")
    source = os.path.join(image["dir"], "rootfs.raw")
    image_mib = os.path.getsize(source) // (1024 * 1024)
    if size_mib is not None and size_mib < image_mib:
        raise VolumeError(f"volume_size_mib: {size_mib} is below the image's size {image_mib}")
    tmp = target + ".creating"
    try:
        _run(["cp", "--sparse=always", "--reflink=auto", source, tmp])
        os.chmod(tmp, 0o600)
        if size_mib is not None and size_mib > image_mib:
            os.truncate(tmp, size_mib * 1024 * 1024)
            _run(["e2fsck", "-f", "-y", "-p", tmp], ok=(0, 1))
            _run(["resize2fs", tmp])
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {"location": target, "size_mib": os.path.getsize(target) // (1024 * 1024)}


def _run(argv: list[str], ok: tuple = (0,)) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VolumeError(f"{' '.join(argv)}: {exc}") from exc
    if proc.returncode not in ok:
        raise VolumeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")


def file_writers(path: str, proc: str = "/proc") -> list[str]:
    """Processes that have ``path`` open, as ``"pid 123 (qemu-system-x86)"`` (from ``/proc/<pid>/fd``).

    Processes whose fds cannot be read (gone meanwhile, or not permitted) are skipped; the host backend
    runs as root, where every process can be read.
    """
    target = os.path.realpath(path)
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        fd_dir = os.path.join(proc, entry, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) == target:
                    break
            except OSError:
                continue
        else:
            continue
        try:
            with open(os.path.join(proc, entry, "comm"), encoding="utf-8", errors="replace") as fh:
                comm = fh.read().strip()
        except OSError:
            comm = "?"
        found.append(f"pid {entry} ({comm})")
    return found
