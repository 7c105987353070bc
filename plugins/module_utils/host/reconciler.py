# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host's reconciler: one VM's launchers brought to what its spec asks, over injected ports - the host's
counterpart of the Kubernetes controller (controller/zjusct_controller: one launcher Pod per boot).

:class:`HostReconciler` is written against small ports (:mod:`host.ports`: store, network, launcher supervisor,
bandwidth, volumes) given to its constructor; :meth:`HostReconciler.from_config` wires the real ones from a
:class:`host.config.HostConfig` and the host store, unit tests give in-memory fakes
(tests/unit/cloudvm/test_host_reconciler_ports.py). The decisions are the pure modules': whether to stop or start
(:func:`model.lifecycle.host_action`), which observed boot is the current one (:func:`model.phase.current_and_older`),
the status (:func:`model.phase.derive_status`), placement (:func:`model.placement.check`) and the volume claim rules
(:mod:`host.volume_claim`).

Where a controller runs in the background on Kubernetes, the host's passes run when the module reads a VM: the host
adapter of the CloudVM API port (:class:`host.cloudvm.HostCloudVMApi`) runs one pass under the VM's flock on every
read of the one lifecycle (:mod:`cloudvm.lifecycle`).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.ports import (
    Bandwidth,
    HostBandwidth,
    HostNetwork,
    HostSupervisor,
    HostVolumes,
    Network,
    Store,
    Supervisor,
    Volumes,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore, StoreError, now
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_claim import settle as settle_claim
from ansible_collections.zjusct.cloud.plugins.module_utils.model.launcher_config import Placement
from ansible_collections.zjusct.cloud.plugins.module_utils.model.launcher_config import (
    launcher_config as build_launcher_config,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError, host_action
from ansible_collections.zjusct.cloud.plugins.module_utils.model.phase import (
    BootObservation,
    current_and_older,
    derive_status,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.placement import Node, check, used
from ansible_collections.zjusct.cloud.plugins.module_utils.network import gateway as gw
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import UnknownDriver
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError

START_ERRORS = (CloudVMError, VolumeError, UnknownDriver, net.NetworkError, sup.LauncherError, StoreError,
                gw.GatewayError)
"""What a failed start raises through the ports; reconcile records it as the status and raises it as CloudVMError:
that type is how the reads of ``host.cloudvm`` tell a refused start (its status says why) from a failed pass."""


def host_node(cfg: HostConfig) -> Node:
    """This host as a placement node: ``physical`` from the config, else measured (CPUs, MemTotal, the volumes
    directory's file system in MiB); the overcommit ratios default to cpu 4.0, memory 1.5, disk 2.0."""
    physical = dict(cfg.physical)
    if not physical.get("cpu"):
        physical["cpu"] = os.cpu_count() or 1
    if not physical.get("memory"):
        with open("/proc/meminfo", encoding="ascii") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
        physical["memory"] = kib // 1024
    if not physical.get("disk"):
        os.makedirs(cfg.volumes_dir, exist_ok=True)
        st = os.statvfs(cfg.volumes_dir)
        physical["disk"] = st.f_blocks * st.f_frsize // (1024 * 1024)
    ratios = {"cpu": 4.0, "memory": 1.5, "disk": 2.0, "bandwidth": 1.0}
    ratios.update(cfg.ratios)
    return Node(cfg.node, physical, ratios)


def launcher_config(cfg: HostConfig, vm: dict, volume: dict, lease: dict, root_disk: dict,
                    serial_console: Optional[dict] = None) -> dict:
    """The LauncherConfig of ``spec.bootID`` (docs/launcher-protocol.md) for ``vm`` on this host.

    Args:
        volume: the root volume's store record (its ``image`` directory holds vmlinuz, initrd.img, manifest.json).
        lease: the VM's lease (``ipv4``, ``mac``, ``tap``).
        root_disk: the volume driver's ``rootDisk`` object (:meth:`storage.driver.VolumeDriver.root_disk`).
        serial_console: ``serialConsole`` (:meth:`host.ports.Network.serial_console`), None for none.

    Raises:
        OSError: the image set's manifest cannot be read.
    """
    meta, spec = vm["metadata"], vm["spec"]
    boot = int(spec["bootID"])
    paths = cfg.launcher_paths(meta["namespace"], meta["name"])
    with open(os.path.join(volume["image"], "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    return build_launcher_config(vm, Placement(
        boot={"kernel": os.path.join(volume["image"], "vmlinuz"), "initrd": os.path.join(volume["image"], "initrd.img"),
              "cmdline": manifest["defaultCmdline"]},
        root_disk=root_disk,
        network={"mode": "tap", "tap": lease["tap"], "createTap": False, "mac": lease["mac"],
                 "ipv4": f"{lease['ipv4']}/{net.prefix_length(cfg.subnet)}", "gateway": net.gateway(cfg.subnet),
                 "dns": list(cfg.dns) or net.host_resolvers()},
        hypervisor={"type": cfg.hypervisor, "accel": cfg.accel, "allowTCG": cfg.allow_tcg,
                    "kvmProbeTimeoutSeconds": 5, "tcgTranslationCacheMiB": cfg.tcg_translation_cache_mib,
                    "tcgCPUModel": cfg.tcg_cpu_model, **cfg.hypervisor_sandbox(lease["ipv4"])},
        readiness={"host": lease["ipv4"], "port": 22, "timeoutSeconds": cfg.readiness_timeout_seconds},
        stop_timeout_seconds=cfg.stop_timeout_seconds,
        runtime_dir=paths.runtime_dir,
        serial_log_path=paths.serial_log,
        result={"path": paths.result(boot)},
        ready_marker_path=paths.ready(boot),
        boot_slots=cfg.boot_slots(),
        disk_io_limits=cfg.disk_io_limits,
        serial_console=serial_console,
    ))


def group_peers(store: Store, spec: dict, placed: set) -> list[str]:
    """``namespace/name`` of the VMs among ``placed`` (uids of VMs holding an allocation on this node, i.e. with a
    launcher) that have the owner and ``spec.antiAffinityGroup`` of ``spec``; empty when it names no group.
    The rule (docs/api/cloudvm.md): running VMs of one owner's group never share a node."""
    group = spec.get("antiAffinityGroup")
    if not group:
        return []
    return sorted(f"{v['metadata']['namespace']}/{v['metadata']['name']}" for v in store.list_vms(owner=spec["owner"])
                  if v["metadata"]["uid"] in placed and (v.get("spec") or {}).get("antiAffinityGroup") == group)


def ssh_routes(cfg: HostConfig, owner: str) -> dict:
    """How a VM of ``owner`` with an SSH endpoint is reached, as the host configuration says now:
    ``sshProxyCommand`` (from this host, into the guests' network namespace) and, while the SSH gateway is on,
    ``sshJumpHost`` (``zc-<owner>@<gateway>:<port>``, docs/security.md). Status fields; either may be absent."""
    routes = {}
    if cfg.netns:
        routes["sshProxyCommand"] = f"ip netns exec {cfg.netns} nc %h %p"
    jump = cfg.gateway_jump(gw.account_name(owner))
    if jump:
        routes["sshJumpHost"] = jump
    return routes


def observed_status(cfg: HostConfig, supervisor: Supervisor, vm: dict, paths: sup.LauncherPaths,
                    locks: Optional[sup.LockTable] = None) -> dict:
    """The status derived from what runs now, without acting (for reads: info, inventory).

    A stored status is never returned as is: a launcher killed since the last reconcile shows as
    Failed/LauncherLost here, not Running (case L2 in docs/architecture.md), and the routes to its SSH endpoint are
    those of the configuration now (:func:`ssh_routes`: no jump host once the SSH gateway is turned off). ``locks``
    is a :func:`host.supervisor.lock_table` read for many VMs at once; without it the lock is read now.
    """
    spec = vm["spec"]
    known = supervisor.boots(paths)
    if not known and (vm.get("status") or {}).get("phase") not in ("Running", "Stopping"):
        # a refused start (Unschedulable, StartFailed, VolumeInUse) is recorded before any boot exists
        return vm.get("status") or {}
    # a stored Running/Stopping without any boot on disk has no launcher: derived from nothing below
    current, others = current_and_older(spec, supervisor.observe(paths, known[-1], locks) if known else None)
    kept = ("sshEndpoint", "observedGeneration")
    stored = vm.get("status") or {}
    status = {k: v for k, v in stored.items() if k in kept}
    if "sshEndpoint" in status:
        status.update(ssh_routes(cfg, spec["owner"]))
    status.update(derive_status(spec, current, others).as_dict())
    if status["reason"] == "Starting" and stored.get("reason") == "VolumeInUse" and \
            stored.get("bootID") == status["bootID"]:
        # the requested boot was refused for another writer (case V2); only reconcile re-checks the volume
        status.update({k: stored[k] for k in ("phase", "reason", "message")})
    return status


class HostReconciler:
    """One host's reconcile of a CloudVM over its ports (see the module docstring).

    Callers serialise passes for one VM (:func:`host.cloudvm._vm_lock`); the backend itself holds no state
    between calls beyond its ports.
    """

    def __init__(self, cfg: HostConfig, store: Store, network: Network, supervisor: Supervisor,
                 bandwidth: Bandwidth, volumes: Volumes) -> None:
        self.cfg = cfg
        self.store = store
        self.network = network
        self.supervisor = supervisor
        self.bandwidth = bandwidth
        self.volumes = volumes

    @classmethod
    def from_config(cls, cfg: HostConfig, store: HostStore) -> "HostReconciler":
        """The backend with the real adapters (:mod:`host.ports`) of ``cfg`` over the open host ``store``."""
        return cls(cfg, store, HostNetwork(cfg, store), HostSupervisor(cfg), HostBandwidth(cfg, store),
                   HostVolumes(cfg))

    def paths(self, vm: dict) -> sup.LauncherPaths:
        """Where the VM's launcher files live."""
        return self.cfg.launcher_paths(vm["metadata"]["namespace"], vm["metadata"]["name"])

    # --- the pass ---------------------------------------------------------------------------------
    def reconcile(self, vm: dict) -> dict:
        """One pass: observe the launchers, decide, act (stop, start, clean up), write and return the status.

        Args:
            vm: the CloudVM record as stored (``metadata`` with uid and generation, ``spec``, ``status``).

        Returns:
            The new status (also written to the store).

        Raises:
            CloudVMError: a requested boot cannot start (capacity: ``dimension`` in its details, volume claim,
                network, bandwidth, launcher check); the status written says Pending/Unschedulable or
                Failed/StartFailed first.
        """
        spec, paths = vm["spec"], self.paths(vm)
        # 1. observe: the launcher alive now and the newest boot on disk
        live = self.supervisor.running_boot(paths)
        known = self.supervisor.boots(paths)
        latest: Optional[int] = known[-1] if known else None
        # 2. decide (pure) and act
        action = host_action(spec, live[0] if live else None, latest)
        start_error: Optional[CloudVMError] = None
        volume_writer: Optional[str] = None
        if action == "stop" and live is not None:
            self._request_stop(vm, paths, live[0])
        elif action == "start":
            try:
                volume_writer = self._boot_blocker(spec)  # another writer blocks the start (case V2)
                if volume_writer is None:
                    self.start_boot(vm)
                    latest = int(spec["bootID"])
            except START_ERRORS as exc:
                start_error = exc if isinstance(exc, CloudVMError) else CloudVMError(str(exc))
        # 3. observe again: the newest boot, and clean up after it once no launcher is left
        current, others = current_and_older(spec, self.supervisor.observe(paths, latest)
                                            if latest is not None else None)
        if current is not None and current.state in ("exited", "lost") and self.supervisor.running_boot(paths) is None:
            self.cleanup_ended(vm)
        # 4. the status
        status = self._status(vm, current, others, volume_writer, start_error)
        self.store.update_vm(vm["metadata"]["namespace"], vm["metadata"]["name"], status=status)
        if start_error is not None:
            raise start_error
        return status

    # --- the steps --------------------------------------------------------------------------------
    def _request_stop(self, vm: dict, paths: sup.LauncherPaths, boot: int) -> None:
        """Ask the live launcher of ``boot`` to stop (once per boot) and record it."""
        if self.supervisor.request_stop(paths, boot):
            meta = vm["metadata"]
            self.store.record_event("Normal", f"{meta['namespace']}/{meta['name']}", "StopRequested",
                                    f"stopping boot {boot}")

    def _boot_blocker(self, spec: dict) -> Optional[str]:
        """Another writer of the root volume, checked while no launcher of this VM is alive (so any RBD watcher
        is another writer, case V2), or None."""
        claimed = self.store.get_volume(spec["rootVolumeClaim"])
        if claimed is None:
            return None
        return self.volumes.driver(claimed["driver"]).boot_blocker(self.volumes.settings(), claimed)

    def start_boot(self, vm: dict) -> None:
        """Place, network, shape and spawn the launcher of ``spec.bootID``.

        In order: the volume's claim is settled (:func:`host.volume_claim.settle`); placement is checked and the
        allocation, the lease (kept for the VM's life) and the store's claim are written in one transaction
        (nothing when it does not fit); the driver's storage claim; the launcher config; the TAP attached;
        bandwidth applied; the launcher started. A failure to attach the TAP or a bandwidth refusal detaches
        the TAP and releases the allocation; a launcher failure also releases the bandwidth.

        Raises:
            CloudVMError: the volume is missing or claimed, it does not fit (``dimension``: a
                ``InsufficientCapacity`` Warning event is recorded), another running VM of its owner's
                ``spec.antiAffinityGroup`` is on this node (``reason: Unschedulable``, ``rule: antiAffinityGroup``;
                an ``AntiAffinity`` Warning event), the bandwidth is not admitted; or what a port raises
                (:data:`START_ERRORS`).
        """
        cfg, store = self.cfg, self.store
        meta, spec = vm["metadata"], vm["spec"]
        uid, subject = meta["uid"], f"{meta['namespace']}/{meta['name']}"
        volume = store.get_volume(spec["rootVolumeClaim"])
        if volume is None:
            raise CloudVMError(f"spec.rootVolumeClaim: volume {spec['rootVolumeClaim']!r} does not exist")
        volume = settle_claim(store, volume, spec["owner"], uid, creating=False, rbd=cfg.rbd, subject=subject)
        # before anything is taken: its directory and the owner's gateway account are kept whether the start goes on
        serial_console = self.network.serial_console(vm)
        bandwidth = ((spec.get("network") or {}).get("bandwidth") or {}).get("guaranteedMbps", 0)
        # bandwidth is admitted by the QoS arbitration alone (Bandwidth.apply: node limit and pool), not placement
        request = {"cpu": spec["vcpus"], "memory": spec["memoryMiB"], "disk": volume["size_mib"]}
        node = host_node(cfg)
        with store.transaction():
            others = [a for a in store.allocations(cfg.node) if a["vm_uid"] != uid]
            taken = group_peers(store, spec, {a["vm_uid"] for a in others})
            verdict = check(node, used(others, cfg.node), request)
            if verdict.fits and not taken:
                store.put_allocation({"vm_uid": uid, "node": cfg.node, "vcpus": spec["vcpus"],
                                      "memory_mib": spec["memoryMiB"], "disk_mib": volume["size_mib"],
                                      "bandwidth_mbps": bandwidth})
                lease = store.lease_for(uid)
                if lease is None:
                    lease = self.network.new_lease(uid, [x["ipv4"] for x in store.leases()])
                    store.put_lease(lease)
                if volume.get("claimed_by") != uid:
                    volume["claimed_by"] = uid
                    store.put_volume(volume)
        if taken:  # recorded after the transaction, which wrote nothing (a raise inside would roll it back)
            message = (f"spec.antiAffinityGroup: {spec['antiAffinityGroup']!r}: {', '.join(taken)} of owner "
                       f"{spec['owner']} in this group already runs on {cfg.node}, and running VMs of one group never"
                       " share a node (the host backend has one); stop it, or start this VM without the group")
            store.record_event("Warning", subject, "AntiAffinity", message)
            raise CloudVMError(message, reason="Unschedulable", rule="antiAffinityGroup")
        if not verdict.fits:
            store.record_event("Warning", subject, "InsufficientCapacity", verdict.message)
            raise CloudVMError(verdict.message, dimension=verdict.dimension)
        # the storage's own mark (rbd: the image-meta, for other hosts and the backup tools; none for files)
        volume_driver = self.volumes.driver(volume["driver"])
        volume_driver.claim(self.volumes.settings(), volume, uid)
        for alert in verdict.alerts:
            store.record_event("Warning", cfg.node, "WaterLevelHigh",
                               f"{alert} at {verdict.levels[alert]:.0%} of capacity after placing {subject}")
        paths = self.paths(vm)
        config = launcher_config(cfg, vm, volume, lease, volume_driver.root_disk(self.volumes.settings(), volume),
                                 serial_console)
        boot = int(spec["bootID"])
        # what this start takes from here on, undone newest first when a later step fails
        undo: list[Callable[[], None]] = [lambda: store.delete_allocation(uid), lambda: self.network.detach(lease)]
        try:
            self.network.attach(lease)
            self.bandwidth.apply(vm, lease)
            undo.append(lambda: self.bandwidth.release(uid))
            pid = self.supervisor.start(paths, config)
        except Exception:
            for step in reversed(undo):
                step()
            raise
        store.record_event("Normal", subject, "Started", f"boot {boot} launcher started (pid {pid}) on {cfg.node}",
                           {"bootID": boot, "pid": pid})

    def cleanup_ended(self, vm: dict) -> None:
        """After the last launcher exited: release bandwidth, detach the TAP, release the allocation.

        The address lease and the volume claim stay with the VM.
        """
        uid = vm["metadata"]["uid"]
        self.bandwidth.release(uid)
        lease = self.store.lease_for(uid)
        if lease is not None:
            self.network.detach(lease)
        self.store.delete_allocation(uid)

    def _status(self, vm: dict, current: Optional[BootObservation], others: tuple[BootObservation, ...],
                volume_writer: Optional[str], start_error: Optional[CloudVMError]) -> dict:
        """The status to write: :func:`model.phase.derive_status`, a failed start over it, the SSH endpoint of the
        lease, the Ready condition (its transition time kept while the phase stays)."""
        meta, spec = vm["metadata"], vm["spec"]
        boot = int(spec["bootID"])
        status = derive_status(spec, current, others, volume_writer=volume_writer).as_dict()
        if start_error is not None:
            unschedulable = "dimension" in start_error.details or start_error.details.get("reason") == "Unschedulable"
            status.update(phase="Pending" if unschedulable else "Failed",
                          reason="Unschedulable" if unschedulable else "StartFailed",
                          message=str(start_error), bootID=boot)
        lease = self.store.lease_for(meta["uid"])
        if lease is not None:
            status["sshEndpoint"] = {"host": lease["ipv4"], "port": 22}
            status.update(ssh_routes(self.cfg, spec["owner"]))
        status["observedGeneration"] = meta["generation"]
        stored = vm.get("status") or {}
        status["conditions"] = [{
            "type": "Ready", "status": "True" if status["phase"] == "Running" else "False",
            "reason": status["reason"], "message": status.get("message", ""),
            "lastTransitionTime": stored.get("conditions", [{}])[0].get("lastTransitionTime")
            if stored.get("phase") == status["phase"] else now(),
            "observedGeneration": meta["generation"]}]
        return status
