"""Fencing the RBD client of a launcher Pod on an out-of-service node (docs/controller.md, Fencing).

The controller does it with its own cephx identity (``ceph.fenceUser`` / ``ceph.fenceKeyring`` in its config;
caps ``mon 'profile rbd' osd 'profile rbd pool=<pool>'``: ``profile rbd`` on the monitors allows ``osd blocklist
add`` of one client address, as librbd's own dead-client blocklisting and ceph-csi use it) through the ``rbd`` and
``ceph`` commands of ceph-common (:mod:`storage.rbd`: argv lists, no shell):

1. the image's watchers (``rbd status``) and lock owners (``rbd lock ls``, the exclusive lock's owner included)
   whose IP is the old Pod's IP (:func:`addresses_to_fence`);
2. ``ceph osd blocklist add <address>`` for each; when none is found (the client's watch has already timed out)
   the whole Pod IP (``<ip>:0/0``, which the OSDs match against every client of that IP) is blocklisted, since a
   client cut off by a partition would otherwise reconnect and write; a Pod that never reported an IP has its
   every watcher and lock owner blocklisted (no Pod of the new boot exists yet, so each is an old client).

An OSD refuses every request of a blocklisted client from then on (its writes fail with EBLOCKLISTED), and
librbd breaks a dead owner's exclusive lock for the next client. A blocklist entry expires after the
monitors' default (one hour), by then the old QEMU has long given up or been killed with its Pod.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import tempfile
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import Connection, ImageRef, Rbd, RbdError

from .config import CephConfig

log = logging.getLogger("zjusct_controller")
TIMEOUT = 60  # seconds per ceph/rbd command


class FenceError(Exception):
    """Fencing failed (a ceph/rbd command failed or timed out); the old Pod is kept, the new boot stays blocked."""


def address_ip(address: str) -> Optional[str]:
    """The IP of a Ceph entity address (``10.0.0.5:0/123``, ``v1:10.0.0.5:0/123``, ``[::1]:0/7``), or None
    when it is not one."""
    addr = address.strip()
    for prefix in ("v1:", "v2:", "any:"):
        addr = addr.removeprefix(prefix)
    host = addr.split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def addresses_to_fence(watchers: list, locks: list, pod_ip: Optional[str]) -> list[str]:
    """The client addresses to blocklist, from ``rbd status`` watchers (``{"address", ...}``) and ``rbd lock ls``
    lockers (``{"address", ...}``): those whose IP is ``pod_ip``; every one when ``pod_ip`` is None; when none
    matches a known ``pod_ip``, the whole IP as ``<ip>:0/0``. Sorted, without duplicates."""
    found = {str(e.get("address")) for e in [*watchers, *locks] if e.get("address")}
    if pod_ip is None:
        return sorted(found)
    ip = str(ipaddress.ip_address(pod_ip))
    mine = sorted(a for a in found if address_ip(a) == ip)
    if mine:
        return mine
    return [f"[{ip}]:0/0" if ":" in ip else f"{ip}:0/0"]


class Fencer:
    """Blocklists the RBD client of an old launcher with the controller's cephx identity."""

    def __init__(self, ceph: CephConfig) -> None:
        """Raises: ValueError when ``ceph`` has no fence identity."""
        if not ceph.fence_user or not ceph.fence_keyring:
            raise ValueError("controller config: ceph.fenceUser and ceph.fenceKeyring are needed to fence")
        fd, self.conf_path = tempfile.mkstemp(prefix="zjusct-fence-", suffix=".conf")
        with os.fdopen(fd, "w") as f:  # monitors only; the key stays in the keyring file
            f.write(ceph.conf_text())
        atexit.register(self.close)
        common = {"conf": self.conf_path, "user": ceph.fence_user, "keyring": ceph.fence_keyring,
                  "timeout": TIMEOUT}
        self.rbd = Rbd(Connection(**common))
        self.ceph = Rbd(Connection(binary="ceph", **common))

    def close(self) -> None:
        """Remove the ceph.conf file (at exit)."""
        with contextlib.suppress(OSError):
            os.unlink(self.conf_path)

    def fence(self, target: dict[str, Any]) -> list[str]:
        """Blocklist the old client of ``target`` (``{"pod", "uid", "node", "podIP", "pool", "image"}``, from
        :func:`.decide.fence_targets`).

        Returns:
            the addresses blocklisted.

        Raises:
            FenceError: a command failed; nothing is to be deleted then.
        """
        ref = ImageRef(target["pool"], target["image"])
        try:
            watchers = self.rbd.status(ref)
            locks = self.rbd.locks(ref)
            addresses = addresses_to_fence(watchers, locks, target.get("podIP"))
            for addr in addresses:
                self.ceph.run(["osd", "blocklist", "add", addr], json_out=False)
        except RbdError as exc:
            raise FenceError(f"fencing launcher Pod {target['pod']} (image {ref.spec}): {exc}") from exc
        log.info("fenced launcher Pod %s on node %s: blocklisted %s (image %s)", target["pod"], target["node"],
                 ", ".join(addresses) or "nothing", ref.spec)
        return addresses
