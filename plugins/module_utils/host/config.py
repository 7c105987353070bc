# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The single-host backend's configuration (``/etc/zjusct-cloud/host.json``).

Written by the ``zjusct.cloud.hypervisor`` role (site.yml); read by the cloudvm modules, the
fc_launcher module and the inventory plugin's host source. Every key has a default, so a partial
file (or none, for tests) works. Paths are absolute; units are stated per key.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
from dataclasses import dataclass, field, fields
from typing import Optional, Tuple

from ansible_collections.zjusct.cloud.plugins.module_utils.host.supervisor import LauncherPaths
from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import validate_disk_io
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import UnknownDriver, VolumeSettings, driver

DEFAULT_PATH = "/etc/zjusct-cloud/host.json"
PATH_ENV = "ZJUSCT_CLOUD_CONFIG"  # the host configuration file when no host_config option names one
# 0x60000000: far above the login.defs user/system ranges (<= 60000), the subordinate ids useradd hands out
# (100000 + 65536 per user) and systemd's dynamic users (61184-65519), below 2^31 (signedness trouble above).
VMM_UID_BASE = 1610612736
VMM_UID_MIN_BASE = 65536
VMM_UID_MAX = 2**31 - 1
# the launcher's hypervisor.tcgCPUModel rule (launcher/zjusct_launcher/config.py CPU_MODEL_RE)
# the guests' serial console sockets: <runtime_dir>/consoles/<namespace>_<name>.sock (HostConfig.console_socket),
# within sockaddr_un.sun_path's 107 bytes (unix(7)); a runtime_dir of at most 80 characters leaves the name >= 11
# (names.fit keeps a prefix and 8 hash digits)
SOCKET_PATH_MAX = 107
CONSOLE_SUBDIR = "consoles"
CONSOLE_SUFFIX = ".sock"
RUNTIME_DIR_MAX = 80
RUNTIME_DIR_RE = re.compile(r"^/[A-Za-z0-9_./-]*$")
CPU_MODEL_RE = re.compile(r"^[A-Za-z0-9_.-]+(,[+-]?[A-Za-z0-9_.-]+(=[A-Za-z0-9_.-]+)?)*$")
BOOT_SLOTS_MAX = 1024  # the launcher's bootSlots.count range (docs/launcher-protocol.md)


@dataclass(frozen=True)
class HostConfig:
    """Host backend settings.

    Attributes:
        node: this hypervisor's name (default: the host name).
        store_path: SQLite host store.
        images_dir: where image sets live (``<images_dir>/<name>-<version>/manifest.json``).
        default_image: image set name used for new root volumes (newest version wins).
        volumes_dir: file-backed root volumes (``<volumes_dir>/<volume>.raw``).
        state_dir: per-VM launcher configs and results (``<state_dir>/vms/<ns>_<name>/``).
        runtime_dir: per-VM runtime directories (locks, sockets).
        log_dir: serial console logs.
        netns: network namespace holding the guests' bridge and TAPs ("" = the host's own).
        bridge: bridge device for guest TAPs.
        subnet: guests' IPv4 subnet (CIDR); the first host address is the gateway on the bridge.
        dns: name servers given to guests (default: the host's non-loopback resolvers).
        nat: give guests a way out: a veth uplink from ``netns`` with masquerading (network.hostnet.ensure_uplink).
        uplink_cidr: the uplink veth pair's /30 (RFC 6598 shared address space by default).
        uplink_netns: where the uplink's outer end lives ("" = the host's namespace; tests use their own).
        uplink_ip_forward: the operator's opt-in to set ``net.ipv4.ip_forward=1`` in ``uplink_netns``
            (the host's namespace by default), which routing guests' traffic beyond the host needs;
            false: never written (docs/network.md).
        launcher_command: argv prefix that runs the launcher (``... run --config F`` is appended).
        hypervisor: ``qemu`` or ``firecracker``.
        accel: ``auto``, ``kvm`` or ``tcg``.
        allow_tcg: whether QEMU may fall back to TCG when KVM is unusable.
        stop_timeout_seconds: graceful stop budget before the VMM is killed.
        readiness_timeout_seconds: how long a boot may take to answer SSH.
        tcg_translation_cache_mib: QEMU TCG translation cache size (MiB).
        tcg_cpu_model: QEMU ``-cpu`` under TCG (launcher ``hypervisor.tcgCPUModel``). The default,
            ``qemu64,+rdrand``, is the x86-64 baseline (v1) and boots a Debian guest fastest; guests built for
            x86-64-v2 or later (the RHEL 9 family) need e.g. ``Nehalem,+rdrand`` or ``max``.
        max_concurrent_boots: at most this many guests of the host boot at once (launcher ``bootSlots``,
            docs/launcher-protocol.md); a start beyond it waits for a slot before its VMM starts. 0 = no limit.
        boot_slot_dir: the slot files' directory, shared by every launcher of the host.
        physical: node capacity for placement: cpu (vCPUs), memory (MiB), disk (MiB); 0 means "measure
            this host". Not bandwidth: that is ``nic_mbps``, admitted by the QoS arbitration alone.
        ratios: overcommit ratios per dimension (defaults in model.placement); ``bandwidth`` is the QoS
            arbitration's: guarantees on the node total at most floor(nic_mbps x ratio).
        nic_mbps: capacity of the guests' uplink (Mbit/s) used by QoS.
        bandwidth_pools: shared bandwidth pools, name -> capacity (Mbit/s); VMs borrow from them
            (docs/qos.md). Default: one pool ``default`` of ``nic_mbps``.
        volume_driver: how new root volumes are made (:mod:`storage.driver`): ``file`` (a sparse copy under
            ``volumes_dir``), ``rbd`` (a Ceph RBD clone of the image set's template, :mod:`storage.rbd_clone`) or
            ``qcow2`` (a qcow2 overlay under ``volumes_dir`` on a read-only base, :mod:`storage.driver_qcow2`).
        rbd: Ceph settings of the ``rbd`` driver: ``pool`` (required for the driver), ``conf``
            (ceph.conf path), ``user`` (cephx id without ``client.``), ``keyring_path``, optional
            ``cluster``. Used by the host backend, the launcher (QEMU/librbd) and the backup playbooks.
        vmm_uid_base: first uid/gid of the per-VM VMM identities (docs/security.md): the VMM of the VM leased
            address N of ``subnet`` runs as uid = gid = ``vmm_uid_base`` + N (no passwd entry is needed).
            0 turns the privilege drop off (the VMM then runs as the launcher's user, root).
        vmm_seccomp: QEMU ``-sandbox`` (seccomp) for every VMM; Firecracker's own filter otherwise.
        jailer_binary: Firecracker's jailer ("" = ``jailer`` from PATH), used when ``vmm_uid_base`` is set.
        jailer_chroot_base_dir: where the jailer builds its chroots; must be on the volumes' filesystem
            (the root disk is hard-linked into the chroot).
        gateway_dir: the SSH gateway's directory (sshd_config, host key, ``keys/<account>``; :mod:`network.gateway`);
            "" = no gateway. Its path up to / must be root-owned and not group/world-writable (sshd's
            StrictModes). Needs ``nat`` and a ``netns`` of its own (the gateway reaches guests over the uplink).
        gateway_port: the gateway sshd's TCP port (1-65535) in ``uplink_netns``.
        gateway_host: the name or address clients outside the host use for the gateway ("" = ``node``).
        disk_io_limits: the operator's disk I/O limits of every VM's root disk (:data:`model.spec.DISK_IO` keys:
            ``readBytesPerSecond``, ``writeBytesPerSecond`` in bytes/s, ``readIOPS``, ``writeIOPS``): the default and
            the most a VM gets; a VM's ``spec.diskIO`` can only lower them ({} = none).
    """

    node: str = field(default_factory=socket.gethostname)
    store_path: str = "/var/lib/zjusct-cloud/cloud.db"
    images_dir: str = "/var/lib/zjusct-cloud/images"
    default_image: str = "debian-bookworm"
    volumes_dir: str = "/var/lib/zjusct-cloud/volumes"
    state_dir: str = "/var/lib/zjusct-cloud"
    runtime_dir: str = "/run/zjusct-cloud"
    log_dir: str = "/var/log/zjusct-cloud"
    netns: str = "zjusct-cloud"
    bridge: str = "zjbr0"
    subnet: str = "10.200.0.0/24"
    dns: tuple = ()
    nat: bool = True
    uplink_cidr: str = "100.64.255.0/30"
    uplink_netns: str = ""
    uplink_ip_forward: bool = False
    launcher_command: tuple = ("python3", "-m", "zjusct_launcher")
    launcher_pythonpath: str = "/usr/local/lib/zjusct-cloud/launcher"
    hypervisor: str = "qemu"
    accel: str = "auto"
    allow_tcg: bool = True
    stop_timeout_seconds: int = 60
    readiness_timeout_seconds: int = 600
    tcg_translation_cache_mib: int = 256
    tcg_cpu_model: str = "qemu64,+rdrand"
    max_concurrent_boots: int = 0
    boot_slot_dir: str = "/run/lock/zjusct-cloud/boot-slots"
    physical: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)
    nic_mbps: int = 1000
    bandwidth_pools: dict = field(default_factory=dict)
    volume_driver: str = "file"
    rbd: dict = field(default_factory=dict)
    vmm_uid_base: int = VMM_UID_BASE
    vmm_seccomp: bool = True
    jailer_binary: str = ""
    jailer_chroot_base_dir: str = "/var/lib/zjusct-cloud/jail"
    gateway_dir: str = ""
    gateway_port: int = 2222
    gateway_host: str = ""
    disk_io_limits: dict = field(default_factory=dict)

    def gateway_source(self) -> Optional[str]:
        """The address the gateway's connections to guests come from (the uplink's outer address), or None
        when there is no gateway (``gateway_dir`` empty, or no uplink: ``nat`` false or no ``netns``)."""
        if not (self.gateway_dir and self.nat and self.netns):
            return None
        net = ipaddress.IPv4Network(self.uplink_cidr, strict=False)
        return str(net.network_address + 1)

    def gateway_jump(self, account: str) -> Optional[str]:
        """``<account>@<gateway_host or node>:<gateway_port>`` (an ssh ProxyJump), None without a gateway."""
        if self.gateway_source() is None:
            return None
        return f"{account}@{self.gateway_host or self.node}:{self.gateway_port}"

    @property
    def console_dir(self) -> str:
        """Where the guests' serial console sockets are (``<runtime_dir>/consoles``)."""
        return os.path.join(self.runtime_dir, CONSOLE_SUBDIR)

    def console_socket(self, namespace: str, name: str) -> str:
        """The serial console socket of VM ``namespace/name`` (LauncherConfig ``serialConsole.socketPath``):
        ``<console_dir>/<namespace>_<name>.sock``, the name fitted (:func:`model.names.fit`) so that the path stays
        within a unix socket's 107 bytes (:func:`load` refuses a ``runtime_dir`` longer than :data:`RUNTIME_DIR_MAX`,
        which would leave no room)."""
        room = SOCKET_PATH_MAX - len(self.console_dir) - 1 - len(CONSOLE_SUFFIX)
        return os.path.join(self.console_dir, _names.fit(f"{namespace}_{name}", room) + CONSOLE_SUFFIX)

    def vmm_run_as(self, ipv4: str) -> Optional[dict]:
        """The launcher's ``hypervisor.runAs`` for the VM leased ``ipv4`` (an address inside ``subnet``).

        Returns ``{"uid": vmm_uid_base + N, "gid": the same}`` with N the address's offset in ``subnet``
        (unique among the leases of this host, stable for the VM's life), or None when ``vmm_uid_base`` is 0.
        """
        if not self.vmm_uid_base:
            return None
        net = ipaddress.IPv4Network(self.subnet, strict=False)
        ident = self.vmm_uid_base + int(ipaddress.IPv4Address(ipv4)) - int(net.network_address)
        return {"uid": ident, "gid": ident}

    def hypervisor_sandbox(self, ipv4: str) -> dict:
        """The sandbox fields of the launcher's ``hypervisor`` object for the VM leased ``ipv4``."""
        out: dict = {"runAs": self.vmm_run_as(ipv4), "seccomp": self.vmm_seccomp}
        if self.hypervisor == "firecracker" and out["runAs"] is not None:
            out["jailer"] = {"binary": self.jailer_binary or None, "chrootBaseDir": self.jailer_chroot_base_dir}
        return out

    def boot_slots(self) -> Optional[dict]:
        """The launcher's ``bootSlots`` (``{"directory", "count"}``), or None when ``max_concurrent_boots`` is 0."""
        if not self.max_concurrent_boots:
            return None
        return {"directory": self.boot_slot_dir, "count": self.max_concurrent_boots}

    def volume_settings(self) -> VolumeSettings:
        """What the volume drivers read (:class:`storage.driver.VolumeSettings`): ``volumes_dir`` and ``rbd``."""
        return VolumeSettings(volumes_dir=self.volumes_dir, rbd=dict(self.rbd))

    def vm_state_dir(self, namespace: str, name: str) -> str:
        """Persistent per-VM directory (launcher configs, results)."""
        return os.path.join(self.state_dir, "vms", f"{namespace}_{name}")

    def vm_runtime_dir(self, namespace: str, name: str) -> str:
        """Per-VM runtime directory (launcher lock, QMP socket, config disk)."""
        return os.path.join(self.runtime_dir, "vms", f"{namespace}_{name}")

    def launcher_paths(self, namespace: str, name: str) -> LauncherPaths:
        """Where the VM's launcher files live (the one place that builds them from this configuration)."""
        return LauncherPaths(self.vm_state_dir(namespace, name), self.vm_runtime_dir(namespace, name), self.log_dir,
                             f"{namespace}_{name}")


def resolve_path(path: Optional[str] = None) -> Tuple[str, bool]:
    """Which host configuration file a ``host_config`` option of ``path`` means: the one rule of the modules, the
    inventory plugin's host source and :func:`load`.

    Args:
        path: the ``host_config`` option (None or empty when not given).

    Returns:
        ``(file, named)``: ``path``, else ``$ZJUSCT_CLOUD_CONFIG``, else :data:`DEFAULT_PATH` (as given, not made
        absolute); ``named`` is True when the option or the environment named it (then a missing file is an error,
        while a missing default file means the defaults).
    """
    named = path or os.environ.get(PATH_ENV)
    return (named or DEFAULT_PATH), bool(named)


def load(path: Optional[str] = None) -> HostConfig:
    """Read the host configuration.

    Args:
        path: file to read; else ``ZJUSCT_CLOUD_CONFIG``, else :data:`DEFAULT_PATH`. A missing
            default file yields the defaults; a missing explicit file is an error.

    Raises:
        ValueError: the file is not JSON or has unknown keys (named in the message).
        FileNotFoundError: an explicitly named file does not exist.
    """
    target, explicit = resolve_path(path)
    if not os.path.exists(target):
        if explicit:
            raise FileNotFoundError(f"host_config: {target} does not exist (run site.yml to create it)")
        return HostConfig()
    with open(target, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except ValueError as exc:
            raise ValueError(f"host_config: {target} is not valid JSON: {exc}") from exc
    known = {f.name for f in fields(HostConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"host_config: {target} has unknown keys {', '.join(unknown)};"
                         f" known: {', '.join(sorted(known))}")
    for key in ("dns", "launcher_command"):
        if key in data:
            data[key] = tuple(data[key])
    try:  # a registered driver (hypervisor_volume_driver), with the keys it needs
        driver(data.get("volume_driver", "file"), "host_config: volume_driver").check_config(data)
    except UnknownDriver as exc:
        raise ValueError(f"{exc} (hypervisor_volume_driver)") from exc
    if (data.get("physical") or {}).get("bandwidth"):
        raise ValueError(f"host_config: physical.bandwidth: {data['physical']['bandwidth']!r} is not used: the node's"
                         " bandwidth is nic_mbps (hypervisor_nic_mbps), admitted by the QoS arbitration with"
                         " ratios.bandwidth and the pools (docs/qos.md); remove bandwidth from hypervisor_physical")
    base = data.get("vmm_uid_base", VMM_UID_BASE)
    if isinstance(base, bool) or not isinstance(base, int) or (base != 0 and base < VMM_UID_MIN_BASE):
        raise ValueError(f"host_config: vmm_uid_base: {base!r} is not 0 (no privilege drop) or an integer"
                         f" >= {VMM_UID_MIN_BASE} (above the 16-bit user and system ids)")
    if base:
        size = ipaddress.IPv4Network(data.get("subnet", HostConfig.subnet), strict=False).num_addresses
        if base + size - 1 > VMM_UID_MAX:
            raise ValueError(f"host_config: vmm_uid_base: {base} + the {size} addresses of the subnet exceed"
                             f" {VMM_UID_MAX} (uids above 2^31-1 are avoided)")
    runtime = data.get("runtime_dir", HostConfig.runtime_dir)
    if not isinstance(runtime, str) or not RUNTIME_DIR_RE.match(runtime) or len(runtime) > RUNTIME_DIR_MAX:
        raise ValueError(f"host_config: runtime_dir: {runtime!r} is not an absolute path of at most {RUNTIME_DIR_MAX}"
                         " characters among letters, digits and _ . / - (hypervisor_runtime_dir; the guests' console"
                         " sockets are below it, and a unix socket path is at most 107 bytes)")
    port = data.get("gateway_port", HostConfig.gateway_port)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"host_config: gateway_port: {port!r} is not a TCP port (an integer 1-65535)"
                         " (hypervisor_ssh_gateway_port)")
    if data.get("gateway_dir") and (not data.get("nat", True) or not data.get("netns", HostConfig.netns)):
        raise ValueError(f"host_config: gateway_dir: {data['gateway_dir']!r} needs nat: true and a netns of its"
                         " own (the gateway reaches guests over the uplink); hypervisor_ssh_gateway needs"
                         " hypervisor_nat and hypervisor_netns")
    model = data.get("tcg_cpu_model", HostConfig.tcg_cpu_model)
    if not isinstance(model, str) or not CPU_MODEL_RE.match(model):
        raise ValueError(f"host_config: tcg_cpu_model: {model!r} is not a QEMU CPU model with optional ,+feature,"
                         " ,-feature or ,prop=value (hypervisor_tcg_cpu_model; launcher hypervisor.tcgCPUModel)")
    boots = data.get("max_concurrent_boots", HostConfig.max_concurrent_boots)
    if isinstance(boots, bool) or not isinstance(boots, int) or not 0 <= boots <= BOOT_SLOTS_MAX:
        raise ValueError(f"host_config: max_concurrent_boots: {boots!r} is not 0 (no limit) or an integer"
                         f" 1-{BOOT_SLOTS_MAX} (hypervisor_max_concurrent_boots; launcher bootSlots.count)")
    slot_dir = data.get("boot_slot_dir", HostConfig.boot_slot_dir)
    if not isinstance(slot_dir, str) or not os.path.isabs(slot_dir) or os.path.normpath(slot_dir) != slot_dir \
            or slot_dir == "/":
        raise ValueError(f"host_config: boot_slot_dir: {slot_dir!r} is not a normalised absolute path other than /"
                         " (hypervisor_boot_slot_dir; launcher bootSlots.directory)")
    io_problems = validate_disk_io(data.get("disk_io_limits", {}), "disk_io_limits")
    if io_problems:
        raise ValueError(f"host_config: {'; '.join(io_problems)} (hypervisor_disk_io_limits)")
    if data.get("gateway_dir") and not os.path.isabs(data["gateway_dir"]):
        raise ValueError(f"host_config: gateway_dir: {data['gateway_dir']!r} is not an absolute path")
    return HostConfig(**data)
