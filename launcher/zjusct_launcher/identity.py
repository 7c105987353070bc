"""The per-VM config disk: a POSIX ustar archive used raw as the guest's second virtio-blk disk.

Members (notes/CONTRACT-guest.md): ``instance-id``, ``hostname``, ``authorized_keys``, ``network``. Built with
:mod:`tarfile` in memory (no loop device); the size is a multiple of 512 bytes (tarfile pads to 10240-byte
records), which a block device needs.
"""

from __future__ import annotations

import io
import tarfile

from zjusct_launcher.config import LauncherConfig

# QEMU user-mode networking (slirp) fixed addresses (docs.qemu.org "Network emulation", user mode defaults).
SLIRP_IPV4, SLIRP_GATEWAY, SLIRP_DNS = "10.0.2.15/24", "10.0.2.2", "10.0.2.3"


def network_lines(cfg: LauncherConfig) -> str:
    """The ``network`` member: KEY=VALUE lines (MAC, IPV4, GATEWAY, DNS); empty IPV4 = no static config."""
    net = cfg.network
    if net.mode == "user":
        values = {"MAC": net.mac or "", "IPV4": SLIRP_IPV4, "GATEWAY": SLIRP_GATEWAY, "DNS": SLIRP_DNS}
    elif net.mode == "tap":
        values = {"MAC": net.mac or "", "IPV4": net.ipv4 or "", "GATEWAY": net.gateway or "",
                  "DNS": " ".join(net.dns)}
    else:
        values = {"MAC": "", "IPV4": "", "GATEWAY": "", "DNS": ""}
    return "".join(f"{k}={v}\n" for k, v in values.items())


def members(cfg: LauncherConfig) -> dict[str, bytes]:
    """Name -> content of every archive member, in archive order."""
    keys = "".join(k + "\n" for k in cfg.identity.ssh_authorized_keys)
    return {
        "instance-id": (cfg.identity.instance_id + "\n").encode(),
        "hostname": (cfg.identity.hostname + "\n").encode(),
        "authorized_keys": keys.encode(),
        "network": network_lines(cfg).encode(),
    }


def build(cfg: LauncherConfig, mtime: int = 0) -> bytes:
    """Return the ustar archive bytes (deterministic for a given config and mtime)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members(cfg).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600 if name == "authorized_keys" else 0o644
            info.mtime = mtime
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
