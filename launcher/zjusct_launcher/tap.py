"""Create and remove a persistent TAP device (ioctl on /dev/net/tun, then ``ip link`` argument lists).

Kernel facts (drivers/net/tun.c, include/uapi/linux/if_tun.h): TUNSETIFF on an existing persistent TAP that no
one has attached re-attaches it (idempotent); if another process holds it the call fails with EBUSY.
TUNSETPERSIST keeps the device after our fd closes so QEMU/Firecracker can open it by name. TUNSETOWNER /
TUNSETGROUP record the uid/gid allowed to attach without CAP_NET_ADMIN (tun_not_capable()): the VMM's runAs
pair, so that a VMM that opens its TAP after dropping privileges (Firecracker under its jailer) can.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import subprocess

TUNSETIFF = 0x400454CA
TUNSETPERSIST = 0x400454CB
TUNSETOWNER = 0x400454CC
TUNSETGROUP = 0x400454CE
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IP_TIMEOUT_SECONDS = 10


class TapError(Exception):
    pass


def exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def create(name: str, bridge: str | None = None, owner: tuple[int, int] | None = None) -> None:
    """Create (or re-attach an unused leftover) persistent TAP ``name``, bring it up, attach to ``bridge``.

    ``owner``: (uid, gid) that may attach to the TAP (the VMM's hypervisor.runAs); None leaves it root-only.

    Raises TapError with a precise message; on error after creation the device is removed again.
    """
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise TapError(f"/dev/net/tun: {exc.strerror}") from exc
    try:
        ifr = struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI)
        try:
            fcntl.ioctl(fd, TUNSETIFF, ifr)
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                raise TapError(f"network.tap: {name} is busy (attached to another process)") from exc
            raise TapError(f"network.tap: TUNSETIFF {name}: {exc.strerror}") from exc
        try:
            if owner is not None:
                fcntl.ioctl(fd, TUNSETOWNER, owner[0])
                fcntl.ioctl(fd, TUNSETGROUP, owner[1])
            fcntl.ioctl(fd, TUNSETPERSIST, 1)
        except OSError as exc:
            raise TapError(f"network.tap: TUNSETOWNER/TUNSETGROUP/TUNSETPERSIST {name}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    try:
        args = ["ip", "link", "set", "dev", name]
        if bridge:
            args += ["master", bridge]
        _ip([*args, "up"])
    except TapError:
        remove(name)
        raise


def remove(name: str) -> bool:
    """Delete the TAP if it exists. Returns True when it existed. Raises TapError if it stays."""
    if not exists(name):
        return False
    try:
        _ip(["ip", "link", "del", "dev", name])
    except TapError:
        if exists(name):
            raise
    return True


def _ip(args: list[str]) -> None:
    try:
        proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, timeout=IP_TIMEOUT_SECONDS,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TapError(f"{' '.join(args)}: {exc}") from exc
    if proc.returncode != 0:
        raise TapError(f"{' '.join(args)}: {proc.stderr.decode(errors='replace').strip()}")
