"""Read-only checks of the files a LauncherConfig names, run by ``run`` and ``check`` after :func:`config.parse`.

Every problem names its field like the parser's (``boot.kernel: '/x' does not exist or is not a regular file``);
any problem ends the run as ``ConfigInvalid`` before anything is created. What a VMM type's kernel must look like
is its profile's (:attr:`capability.Profile.kernel_magic`).
"""

from __future__ import annotations

import os
import stat

from zjusct_launcher import capability
from zjusct_launcher.config import LauncherConfig


def environment_problems(cfg: LauncherConfig) -> list[str]:
    """Read-only checks of the files a config names (exist, right kind; stat, access and a read of the kernel's
    first bytes only).

    Returns:
        Problems in the same ``path: message`` form as :func:`config.parse`, in field order (an empty list when
        every file is usable).
    """
    problems: list[str] = []

    def need_file(path: str, label: str) -> bool:
        if not os.path.isfile(path):
            problems.append(f"{label}: {path!r} does not exist or is not a regular file")
            return False
        if not os.access(path, os.R_OK):
            problems.append(f"{label}: {path!r} is not readable")
            return False
        return True

    vmm = capability.profile(cfg.hypervisor.type)
    if need_file(cfg.boot.kernel, "boot.kernel") and vmm.kernel_magic is not None:
        with open(cfg.boot.kernel, "rb") as fh:
            if fh.read(len(vmm.kernel_magic)) != vmm.kernel_magic:
                problems.append(f"boot.kernel: {cfg.boot.kernel!r} {vmm.kernel_refusal}")
    if cfg.boot.initrd:
        need_file(cfg.boot.initrd, "boot.initrd")
    if cfg.root_disk.path is not None:
        p = cfg.root_disk.path
        if not (os.path.isfile(p) or (os.path.exists(p) and _is_block(p))):
            problems.append(f"rootDisk.path: {p!r} does not exist or is neither a file nor a block device")
        elif not os.access(p, os.R_OK | os.W_OK):
            problems.append(f"rootDisk.path: {p!r} is not readable and writable")
    if cfg.root_disk.rbd is not None:
        need_file(cfg.root_disk.rbd.conf, "rootDisk.rbd.conf")
        if cfg.root_disk.rbd.keyring_path:
            need_file(cfg.root_disk.rbd.keyring_path, "rootDisk.rbd.keyringPath")
    if cfg.network.mode == "tap" and not cfg.network.create_tap and not os.path.exists(
            f"/sys/class/net/{cfg.network.tap}"):
        problems.append(f"network.tap: {cfg.network.tap!r} does not exist (createTap is false)")
    if cfg.network.bridge and not os.path.isdir(f"/sys/class/net/{cfg.network.bridge}/bridge"):
        problems.append(f"network.bridge: {cfg.network.bridge!r} is not an existing bridge")
    return problems


def _is_block(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False
