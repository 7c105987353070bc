# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host backend's ports: what :class:`host.reconciler.HostReconciler` needs from the world, and the real adapters.

Each port is a small :class:`typing.Protocol` holding only the methods the backend calls; the backend gets one
object per port in its constructor (:meth:`host.reconciler.HostReconciler.from_config` wires the real ones below,
unit tests pass in-memory fakes). The ports and their real adapters:

* :class:`Store`: the host store's records (VMs, volumes, allocations, leases, events);
  real: :class:`host.store.HostStore` itself.
* :class:`Network`: a VM's address lease and its TAP on the bridge, isolation and gateway;
  real: :class:`HostNetwork` (:mod:`network.hostnet`, :mod:`host.network`).
* :class:`Supervisor`: the VM's launcher processes (boots on disk, the live one, observe, stop, start);
  real: :class:`HostSupervisor` (:mod:`host.supervisor`).
* :class:`Bandwidth`: the VM's guaranteed bandwidth (admission and the tc HTB classes);
  real: :class:`HostBandwidth` (:mod:`host.bandwidth`).
* :class:`Volumes`: the root volume drivers (:class:`storage.driver.VolumeDriver`, the volume port itself);
  real: :class:`HostVolumes` (the :mod:`storage.driver` registry).

Errors: every real adapter raises what the module underneath raises (:class:`network.hostnet.NetworkError`,
:class:`host.supervisor.LauncherError`, :class:`host.store.StoreError`, :class:`network.gateway.GatewayError`,
:class:`storage.volume.VolumeError`, :class:`storage.driver.UnknownDriver`, :class:`model.lifecycle.CloudVMError`);
the backend turns them into a failed start (``host.reconciler.START_ERRORS``).
"""

from __future__ import annotations

import os
from typing import Any, ContextManager, Optional

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8 has no typing.Protocol; only the annotations use it
    Protocol = object  # type: ignore[assignment]

from ansible_collections.zjusct.cloud.plugins.module_utils.host import bandwidth as bw
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.network import (
    ensure_network,
    serial_console,
    sync_gateway,
    sync_isolation,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore, now
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.phase import BootObservation
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net
from ansible_collections.zjusct.cloud.plugins.module_utils.network.gateway import GatewayError
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import (
    VolumeDriver,
    VolumeSettings,
    driver,
)


# --- the ports ------------------------------------------------------------------------------------
class Store(Protocol):
    """The host store records the backend reads and writes (:class:`host.store.HostStore` has the real ones).

    Records are the store's dicts: volumes ``{"name", "driver", "location", "size_mib", "owner", "claimed_by",
    "image"}``, allocations ``{"vm_uid", "node", "vcpus", "memory_mib", "disk_mib", "bandwidth_mbps"}``, leases
    ``{"ipv4", "vm_uid", "mac", "tap"}``. Raises :class:`host.store.StoreError` on failure.
    """

    def transaction(self) -> ContextManager[Any]:
        """One write transaction (nested use joins the outer one); everything in it is undone on an exception."""

    def list_vms(self, namespace: Optional[str] = None, owner: Optional[str] = None) -> list[dict]:
        """Every CloudVM record (the volume claim rules read who holds a volume)."""

    def update_vm(self, namespace: str, name: str, spec: Optional[dict] = None,
                  status: Optional[dict] = None, labels: Optional[dict] = None) -> None:
        """Write a CloudVM's spec, status or labels (the backend writes the status)."""

    def get_volume(self, name: str) -> Optional[dict]:
        """A volume record, or None."""

    def put_volume(self, volume: dict) -> None:
        """Insert or replace a volume record."""

    def allocations(self, node: Optional[str] = None) -> list[dict]:
        """The placements (of one node)."""

    def put_allocation(self, alloc: dict) -> None:
        """Insert or replace the placement of ``alloc['vm_uid']``."""

    def delete_allocation(self, vm_uid: str) -> None:
        """Forget the placement of ``vm_uid`` (none is no error)."""

    def leases(self) -> list[dict]:
        """Every address lease."""

    def lease_for(self, vm_uid: str) -> Optional[dict]:
        """The lease of one VM, or None."""

    def put_lease(self, lease: dict) -> None:
        """Record a new lease (StoreError if the address or the VM has one)."""

    def record_event(self, kind: str, subject: str, reason: str, message: str,
                     data: Optional[dict] = None) -> None:
        """Append an event (``kind`` Normal or Warning)."""


class Network(Protocol):
    """A VM's place on the host network: its lease (address, MAC, TAP name) and its TAP on the bridge."""

    def new_lease(self, vm_uid: str, taken: list[str]) -> dict:
        """A lease for ``vm_uid``: a free IPv4 of the subnet (not in ``taken``), its MAC and TAP name (not stored).

        Raises:
            NetworkError: the subnet has no free address.
        """

    def attach(self, lease: dict) -> None:
        """The lease's TAP on the bridge, isolation and gateway synced to the store; the cloud's network (namespace,
        bridge, uplink, guard table) made first when its bridge is missing."""

    def detach(self, lease: dict) -> None:
        """Remove the lease's TAP (a missing one is no error) and sync the gateway (the boot that ended no longer
        holds the VM's keys there: its spec's apply, which its next boot gets); the lease itself stays."""

    def serial_console(self, vm: dict) -> Optional[dict]:
        """The LauncherConfig ``serialConsole`` of the VM's next boot (its socket ready to be owned by whoever
        may attach), None when its VMM has no console socket.

        Raises:
            GatewayError: naming the account or directory that failed.
        """


class Supervisor(Protocol):
    """The launcher processes of a VM (one per boot), found through its :class:`host.supervisor.LauncherPaths`."""

    def boots(self, paths: sup.LauncherPaths) -> list[int]:
        """The bootIDs that have a config on disk, ascending."""

    def running_boot(self, paths: sup.LauncherPaths) -> Optional[tuple[int, int]]:
        """``(bootID, pid)`` of the launcher holding the VM's lock now, or None."""

    def observe(self, paths: sup.LauncherPaths, boot_id: int,
                locks: Optional[sup.LockTable] = None) -> BootObservation:
        """What is there of boot ``boot_id`` (:func:`host.supervisor.observe`, on this node)."""

    def request_stop(self, paths: sup.LauncherPaths, boot_id: int) -> bool:
        """Ask the live launcher of ``boot_id`` to stop, once per boot; True when asked now (first time)."""

    def start(self, paths: sup.LauncherPaths, config: dict) -> int:
        """Write the boot's LauncherConfig, have the launcher check it and spawn it; the pid (0 under systemd).

        Raises:
            LauncherError: the launcher rejected the config (nothing of the boot is left on disk).
        """


class Bandwidth(Protocol):
    """The VM's bandwidth guarantee on its TAP (``spec.network.bandwidth``)."""

    def apply(self, vm: dict, lease: dict) -> None:
        """Admit and shape the guarantee (no-op without one).

        Raises:
            CloudVMError: ``spec.network.bandwidth: <reason>`` with ``dimension="bandwidth"``: not admitted.
        """

    def release(self, vm_uid: str) -> None:
        """Remove the VM's classes and give its guarantee back (idempotent)."""


class Volumes(Protocol):
    """The root volume drivers: each volume record's ``driver`` names its :class:`storage.driver.VolumeDriver`."""

    def settings(self) -> VolumeSettings:
        """What the drivers read from the host config."""

    def driver(self, name: Optional[str]) -> VolumeDriver:
        """The driver registered as ``name``.

        Raises:
            UnknownDriver: ``volume driver: <name> is not one of ...`` (:class:`storage.driver.UnknownDriver`).
        """


# --- the real adapters ----------------------------------------------------------------------------
class HostNetwork:
    """:class:`Network` on this host: the netns bridge of ``cfg`` (:mod:`network.hostnet`), isolation and gateway from
    ``store`` (:mod:`host.network`)."""

    def __init__(self, cfg: HostConfig, store: HostStore) -> None:
        self.cfg = cfg
        self.store = store

    def new_lease(self, vm_uid: str, taken: list[str]) -> dict:
        return {"ipv4": net.allocate_ipv4(self.cfg.subnet, taken), "vm_uid": vm_uid, "mac": net.mac_address(vm_uid),
                "tap": net.tap_name(vm_uid)}

    def attach(self, lease: dict) -> None:
        # site.yml's host_network task made (and repairs) the namespace, bridge, uplink and guard table; a start
        # makes them again only when the bridge is missing (a host restart removed the namespace): one `ip link
        # show` instead of the full check's ~20 commands (docs/host-backend.md "How a start works").
        if not net.link_exists(self.cfg.netns, self.cfg.bridge):
            ensure_network(self.cfg)
        net.ensure_tap(self.cfg.netns, self.cfg.bridge, lease["tap"], self.cfg.vmm_run_as(lease["ipv4"]))
        sync_isolation(self.cfg, self.store)
        sync_gateway(self.cfg, self.store)

    def detach(self, lease: dict) -> None:
        net.remove_tap(self.cfg.netns, lease["tap"])
        sync_gateway(self.cfg, self.store)  # keys changed during the boot that ended take effect now

    def serial_console(self, vm: dict) -> Optional[dict]:
        # QEMU's socket (launcher capability serialConsole); Firecracker's console is its stdio
        if self.cfg.hypervisor != "qemu":
            return None
        meta = vm["metadata"]
        try:
            return serial_console(self.cfg, vm["spec"]["owner"], meta["namespace"], meta["name"])
        except OSError as exc:  # a failed start's status, as every port's failure (reconciler.START_ERRORS)
            raise GatewayError(f"the serial console's directory {self.cfg.console_dir}: {exc}") from exc


class HostSupervisor:
    """:class:`Supervisor` on this host: launcher processes spawned from ``cfg.launcher_command`` in ``cfg.netns``."""

    def __init__(self, cfg: HostConfig) -> None:
        self.cfg = cfg

    def boots(self, paths: sup.LauncherPaths) -> list[int]:
        return sup.boots(paths)

    def running_boot(self, paths: sup.LauncherPaths) -> Optional[tuple[int, int]]:
        return sup.running_boot(paths)

    def observe(self, paths: sup.LauncherPaths, boot_id: int,
                locks: Optional[sup.LockTable] = None) -> BootObservation:
        return sup.observe(paths, boot_id, self.cfg.node, locks)

    def request_stop(self, paths: sup.LauncherPaths, boot_id: int) -> bool:
        # the marker stop-<bootID> makes the request once per boot (the launcher's stop timeout then applies)
        marker = os.path.join(paths.state_dir, f"stop-{boot_id}")
        if os.path.exists(marker):
            return False
        sup.request_stop(paths)
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(now())
        return True

    def start(self, paths: sup.LauncherPaths, config: dict) -> int:
        return sup.start(paths, config, list(self.cfg.launcher_command), sup.launcher_env(self.cfg.launcher_pythonpath),
                         self.cfg.netns)


class HostBandwidth:
    """:class:`Bandwidth` on this host: :mod:`host.bandwidth` over the QoS tables of ``store``, the NIC and pools of
    ``cfg``."""

    def __init__(self, cfg: HostConfig, store: HostStore) -> None:
        self.cfg = cfg
        self.store = store

    def apply(self, vm: dict, lease: dict) -> None:
        band = (vm["spec"].get("network") or {}).get("bandwidth")
        if not band or not band.get("guaranteedMbps"):
            return
        cfg = self.cfg
        pools = dict(cfg.bandwidth_pools) or {"default": cfg.nic_mbps}
        bw.configure(self.store, cfg.nic_mbps, float(cfg.ratios.get("bandwidth", 1.0)), pools)
        decision = bw.apply_vm_bandwidth(
            self.store, netns=cfg.netns, device=lease["tap"], vm_id=vm["metadata"]["uid"], mac=lease["mac"],
            guaranteed_mbps=int(band["guaranteedMbps"]),
            ceil_mbps=int(band.get("ceilMbps") or band["guaranteedMbps"]),
            pool=band.get("pool") or "default", priority=int(band.get("priority") or 0))
        if not decision.admitted:
            raise CloudVMError(f"spec.network.bandwidth: {decision.reason}", dimension="bandwidth")

    def release(self, vm_uid: str) -> None:
        bw.release_vm_bandwidth(self.store, vm_uid)


class HostVolumes:
    """:class:`Volumes` on this host: the :mod:`storage.driver` registry with ``cfg``'s volume settings."""

    def __init__(self, cfg: HostConfig) -> None:
        self.cfg = cfg

    def settings(self) -> VolumeSettings:
        return self.cfg.volume_settings()

    def driver(self, name: Optional[str]) -> VolumeDriver:
        return driver(name, "volume driver")
