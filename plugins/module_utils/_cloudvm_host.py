# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The single-host backend of the cloudvm modules: store, volumes, network, launchers.

Every module run reconciles: it observes the VM's launcher (:mod:`._supervisor`), derives the
status with the same pure function the controller uses (:func:`._phase.derive_status`), acts
(start the requested boot, stop a boot no longer wanted, clean up after an ended one) and writes
the status to the host store. Runs for the same VM are serialised by a per-VM flock; the spec is
planned and written inside the store's write transaction, so two concurrent ``vm_start`` runs
request exactly one boot (case L5, docs/architecture.md "Failure cases") and a new boot never starts while an older
launcher still holds the VM's lock (case L3).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from typing import Callable, Iterator, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils import _bandwidth as bw
from ansible_collections.zjusct.cloud.plugins.module_utils import _flock
from ansible_collections.zjusct.cloud.plugins.module_utils import _gateway as gw
from ansible_collections.zjusct.cloud.plugins.module_utils import _hostnet as net
from ansible_collections.zjusct.cloud.plugins.module_utils import _quota as quota
from ansible_collections.zjusct.cloud.plugins.module_utils import _supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils._host_network_module import (
    ensure_network,
    sync_gateway,
    sync_isolation,
)
from ansible_collections.zjusct.cloud.plugins.module_utils._hostconfig import HostConfig, load
from ansible_collections.zjusct.cloud.plugins.module_utils._lifecycle import (
    CloudVMError,
    authorize,
    off_but_failed,
    params_to_spec,
    plan_power,
)
from ansible_collections.zjusct.cloud.plugins.module_utils._phase import BootObservation, derive_status
from ansible_collections.zjusct.cloud.plugins.module_utils._placement import Node, check, used
from ansible_collections.zjusct.cloud.plugins.module_utils._spec import (
    is_dns_label,
    validate_spec,
    validate_update,
)
from ansible_collections.zjusct.cloud.plugins.module_utils._store import HostStore, StoreError, audited, now
from ansible_collections.zjusct.cloud.plugins.module_utils._voldriver import UnknownDriver, VolumeDriver, driver
from ansible_collections.zjusct.cloud.plugins.module_utils._volume import VolumeError, resolve_image
from ansible_collections.zjusct.cloud.plugins.module_utils._volume_claim import settle as settle_claim

LAUNCHER_API = "launcher.cloud.zjusct.io/v1"
POLL_SECONDS = 1.0


def _config(params: dict) -> HostConfig:
    try:
        return load(params.get("host_config"))
    except (OSError, ValueError) as exc:
        raise CloudVMError(str(exc)) from exc


def _paths(cfg: HostConfig, namespace: str, name: str) -> sup.LauncherPaths:
    return cfg.launcher_paths(namespace, name)


@contextlib.contextmanager
def _vm_lock(cfg: HostConfig, namespace: str, name: str) -> Iterator[None]:
    """Serialise module runs acting on one VM (a flock next to the store)."""
    directory = os.path.join(cfg.state_dir, "locks")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with _flock.exclusive(os.path.join(directory, f"{namespace}_{name}.lock")):
        yield


def _host_node(cfg: HostConfig) -> Node:
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


def _volume_driver(name: Optional[str], what: str = "volume driver") -> VolumeDriver:
    """The registered driver ``name`` (a volume record's or the host config's), as :mod:`._voldriver`."""
    try:
        return driver(name, what)
    except UnknownDriver as exc:
        raise CloudVMError(str(exc)) from exc


# --- reconcile ------------------------------------------------------------------------------------
def _launcher_config(cfg: HostConfig, vm: dict, volume: dict, lease: dict) -> dict:
    meta, spec = vm["metadata"], vm["spec"]
    ns, name, boot = meta["namespace"], meta["name"], int(spec["bootID"])
    paths = _paths(cfg, ns, name)
    with open(os.path.join(volume["image"], "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    prefix = net.prefix_length(cfg.subnet)
    return {
        "apiVersion": LAUNCHER_API,
        "kind": "LauncherConfig",
        "vm": {"namespace": ns, "name": name, "uid": meta["uid"], "bootID": boot},
        "machine": {"vcpus": spec["vcpus"], "memoryMiB": spec["memoryMiB"]},
        "boot": {"kernel": os.path.join(volume["image"], "vmlinuz"),
                 "initrd": os.path.join(volume["image"], "initrd.img"),
                 "cmdline": manifest["defaultCmdline"]},
        "rootDisk": _volume_driver(volume["driver"]).root_disk(cfg.volume_settings(), volume),
        "identity": {"hostname": name, "instanceID": meta["uid"],
                     "sshAuthorizedKeys": list(spec.get("sshAuthorizedKeys") or [])},
        "network": {"mode": "tap", "tap": lease["tap"], "createTap": False, "mac": lease["mac"],
                    "ipv4": f"{lease['ipv4']}/{prefix}", "gateway": net.gateway(cfg.subnet),
                    "dns": list(cfg.dns) or net.host_resolvers()},
        "hypervisor": {"type": cfg.hypervisor, "accel": cfg.accel, "allowTCG": cfg.allow_tcg,
                       "kvmProbeTimeoutSeconds": 5, "tcgTranslationCacheMiB": cfg.tcg_translation_cache_mib,
                       **cfg.hypervisor_sandbox(lease["ipv4"])},
        "readiness": {"host": lease["ipv4"], "port": 22, "timeoutSeconds": cfg.readiness_timeout_seconds},
        "stopTimeoutSeconds": cfg.stop_timeout_seconds,
        "runtimeDir": paths.runtime_dir,
        "serialLogPath": paths.serial_log,
        "result": {"path": paths.result(boot)},
        "readyMarkerPath": paths.ready(boot),
    }


def _start_boot(cfg: HostConfig, store: HostStore, vm: dict) -> None:
    """Place, network, validate and spawn the launcher of ``spec.bootID`` (all or nothing)."""
    meta, spec = vm["metadata"], vm["spec"]
    uid, subject = meta["uid"], f"{meta['namespace']}/{meta['name']}"
    volume = store.get_volume(spec["rootVolumeClaim"])
    if volume is None:
        raise CloudVMError(f"spec.rootVolumeClaim: volume {spec['rootVolumeClaim']!r} does not exist")
    volume = settle_claim(store, volume, spec["owner"], uid, creating=False, rbd=cfg.rbd, subject=subject)
    bandwidth = ((spec.get("network") or {}).get("bandwidth") or {}).get("guaranteedMbps", 0)
    # bandwidth is admitted by the QoS arbitration alone (_apply_bandwidth: node limit and pool), not placement
    request = {"cpu": spec["vcpus"], "memory": spec["memoryMiB"], "disk": volume["size_mib"]}
    node = _host_node(cfg)
    with store.transaction():
        others = [a for a in store.allocations(cfg.node) if a["vm_uid"] != uid]
        verdict = check(node, used(others, cfg.node), request)
        if verdict.fits:
            store.put_allocation({"vm_uid": uid, "node": cfg.node, "vcpus": spec["vcpus"],
                                  "memory_mib": spec["memoryMiB"], "disk_mib": volume["size_mib"],
                                  "bandwidth_mbps": bandwidth})
            lease = store.lease_for(uid)
            if lease is None:
                lease = {"ipv4": net.allocate_ipv4(cfg.subnet, [x["ipv4"] for x in store.leases()]),
                         "vm_uid": uid, "mac": net.mac_address(uid), "tap": net.tap_name(uid)}
                store.put_lease(lease)
            if volume.get("claimed_by") != uid:
                volume["claimed_by"] = uid
                store.put_volume(volume)
    if not verdict.fits:  # recorded after the transaction, which wrote nothing (a raise inside would roll it back)
        store.record_event("Warning", subject, "InsufficientCapacity", verdict.message)
        raise CloudVMError(verdict.message, dimension=verdict.dimension)
    # the storage's own mark (rbd: the image-meta, for other hosts and the backup tools; none for files)
    _volume_driver(volume["driver"]).claim(cfg.volume_settings(), volume, uid)
    for alert in verdict.alerts:
        store.record_event("Warning", cfg.node, "WaterLevelHigh",
                           f"{alert} at {verdict.levels[alert]:.0%} of capacity after placing {subject}")
    paths = _paths(cfg, meta["namespace"], meta["name"])
    config = _launcher_config(cfg, vm, volume, lease)
    boot = int(spec["bootID"])
    ensure_network(cfg)
    net.ensure_tap(cfg.netns, cfg.bridge, lease["tap"], cfg.vmm_run_as(lease["ipv4"]))
    sync_isolation(cfg, store)
    sync_gateway(cfg, store)
    try:
        _apply_bandwidth(cfg, store, vm, lease)
    except Exception:
        net.remove_tap(cfg.netns, lease["tap"])
        _release_allocation(store, uid)
        raise
    try:
        pid = sup.start(paths, config, list(cfg.launcher_command), sup.launcher_env(cfg.launcher_pythonpath),
                        cfg.netns)
    except Exception:
        bw.release_vm_bandwidth(store, uid)
        net.remove_tap(cfg.netns, lease["tap"])
        _release_allocation(store, uid)
        raise
    store.record_event("Normal", subject, "Started", f"boot {boot} launcher started (pid {pid}) on {cfg.node}",
                       {"bootID": boot, "pid": pid})


def _apply_bandwidth(cfg: HostConfig, store: HostStore, vm: dict, lease: dict) -> None:
    """Shape the VM's TAP per ``spec.network.bandwidth`` (tc HTB; guarantee, borrow, preemption).

    Raises:
        CloudVMError: the guarantee does not fit the node or the pool (reason from the arbitration).
    """
    band = (vm["spec"].get("network") or {}).get("bandwidth")
    if not band or not band.get("guaranteedMbps"):
        return
    pools = dict(cfg.bandwidth_pools) or {"default": cfg.nic_mbps}
    bw.configure(store, cfg.nic_mbps, float(cfg.ratios.get("bandwidth", 1.0)), pools)
    decision = bw.apply_vm_bandwidth(
        store, netns=cfg.netns, device=lease["tap"], vm_id=vm["metadata"]["uid"], mac=lease["mac"],
        guaranteed_mbps=int(band["guaranteedMbps"]), ceil_mbps=int(band.get("ceilMbps") or band["guaranteedMbps"]),
        pool=band.get("pool") or "default", priority=int(band.get("priority") or 0))
    if not decision.admitted:
        raise CloudVMError(f"spec.network.bandwidth: {decision.reason}", dimension="bandwidth")


def _cleanup_ended(cfg: HostConfig, store: HostStore, vm: dict) -> None:
    """After the last launcher exited: release bandwidth, remove the TAP, release the allocation.

    The address lease and the volume claim stay with the VM.
    """
    uid = vm["metadata"]["uid"]
    bw.release_vm_bandwidth(store, uid)
    lease = store.lease_for(uid)
    if lease is not None:
        net.remove_tap(cfg.netns, lease["tap"])
    _release_allocation(store, uid)


def _release_allocation(store: HostStore, uid: str) -> None:
    """Forget the VM's placement (after its boot ended, or when a start failed after placing it)."""
    with store.transaction() as conn:
        conn.execute("DELETE FROM allocations WHERE vm_uid = ?", (uid,))


def reconcile(cfg: HostConfig, store: HostStore, vm: dict) -> dict:
    """One pass: act on the difference between spec and what runs, then return the new status.

    Raises:
        CloudVMError: a requested boot cannot start (capacity, volume claim, launcher check).
    """
    meta, spec = vm["metadata"], vm["spec"]
    ns, name = meta["namespace"], meta["name"]
    paths = _paths(cfg, ns, name)
    want, boot = spec["powerState"] == "Running", int(spec["bootID"])
    live = sup.running_boot(paths)
    known = sup.boots(paths)
    latest: Optional[int] = known[-1] if known else None
    start_error: Optional[CloudVMError] = None
    volume_writer: Optional[str] = None
    if live is not None and (not want or live[0] != boot):
        marker = os.path.join(paths.state_dir, f"stop-{live[0]}")
        if not os.path.exists(marker):
            sup.request_stop(paths)
            with open(marker, "w", encoding="utf-8") as fh:
                fh.write(now())
            store.record_event("Normal", f"{ns}/{name}", "StopRequested", f"stopping boot {live[0]}")
    elif live is None and want and (latest is None or latest < boot):
        try:
            # Case V2: no launcher of this VM is alive, so any watcher of an RBD root volume is another writer.
            claimed = store.get_volume(spec["rootVolumeClaim"])
            volume_writer = None if claimed is None else \
                _volume_driver(claimed["driver"]).boot_blocker(cfg.volume_settings(), claimed)
            if volume_writer is None:
                _start_boot(cfg, store, vm)
                latest = boot
        except (CloudVMError, VolumeError, net.NetworkError, sup.LauncherError, StoreError, gw.GatewayError) as exc:
            start_error = exc if isinstance(exc, CloudVMError) else CloudVMError(str(exc))
    current = sup.observe(paths, latest, cfg.node) if latest is not None else None
    others: tuple[BootObservation, ...] = ()
    if current is not None and want and current.boot_id < boot and current.state in ("alive", "starting"):
        others, current = (current,), None
    if current is not None and current.state in ("exited", "lost") and sup.running_boot(paths) is None:
        _cleanup_ended(cfg, store, vm)
    status = derive_status(spec, current, others, volume_writer=volume_writer).as_dict()
    if start_error is not None:
        status.update(phase="Failed" if "dimension" not in start_error.details else "Pending",
                      reason="Unschedulable" if "dimension" in start_error.details else "StartFailed",
                      message=str(start_error), bootID=boot)
    lease = store.lease_for(meta["uid"])
    if lease is not None:
        status["sshEndpoint"] = {"host": lease["ipv4"], "port": 22}
        if cfg.netns:
            status["sshProxyCommand"] = f"ip netns exec {cfg.netns} nc %h %p"
        jump = cfg.gateway_jump(gw.account_name(spec["owner"]))
        if jump:
            status["sshJumpHost"] = jump
    status["observedGeneration"] = meta["generation"]
    status["conditions"] = [{
        "type": "Ready", "status": "True" if status["phase"] == "Running" else "False",
        "reason": status["reason"], "message": status.get("message", ""),
        "lastTransitionTime": (vm.get("status") or {}).get("conditions", [{}])[0].get("lastTransitionTime")
        if (vm.get("status") or {}).get("phase") == status["phase"] else now(),
        "observedGeneration": meta["generation"]}]
    store.update_vm(ns, name, status=status)
    if start_error is not None:
        raise start_error
    return status


# --- module entry points -------------------------------------------------------------------------
def _result(vm: Optional[dict], changed: bool, before: Optional[dict], diff: bool,
            warnings: Optional[list[str]] = None) -> dict:
    out: dict = {"changed": changed}
    if warnings:
        out["warnings"] = warnings
    if vm is not None:
        out.update(cloudvm=vm, phase=vm["status"].get("phase"), boot_id=vm["spec"].get("bootID"))
    if diff:
        out["diff"] = {"before": before or {}, "after": vm["spec"] if vm else {}}
    return out


def _wait(cfg: HostConfig, store: HostStore, ns: str, name: str, target: str, timeout: int) -> dict:
    """Reconcile until the VM reaches ``target`` (Running for its current boot, Stopped) or fail."""
    deadline = time.monotonic() + timeout
    while True:
        with _vm_lock(cfg, ns, name):
            vm = store.get_vm(ns, name)
            if vm is None:
                raise AssertionError("vm unexpectedly missing")
            status = reconcile(cfg, store, vm)
        boot = int(vm["spec"]["bootID"])
        same_boot = int(status.get("bootID", -1)) == boot
        if target == "Running" and status["phase"] == "Running" and same_boot:
            return store.get_vm(ns, name) or vm
        if target == "Stopped" and status["phase"] in ("Stopped", "Failed") and \
                sup.running_boot(_paths(cfg, ns, name)) is None:
            # Stopped means no launcher (nor VMM) of the VM remains; a boot that failed is off too.
            return store.get_vm(ns, name) or vm
        if target == "Running" and status["phase"] == "Blocked" and status["reason"] == "VolumeInUse":
            raise CloudVMError(f"{ns}/{name} is Blocked (VolumeInUse): {status.get('message', '')}; stop that"
                               " writer or fence it (docs/backup-restore.md, stale watchers)", status=status)
        if target == "Running" and same_boot and status["phase"] in ("Failed", "Stopped"):
            raise CloudVMError(f"boot {boot} of {ns}/{name} ended: phase {status['phase']}, reason"
                               f" {status['reason']}: {status.get('message', '')}", status=status)
        if time.monotonic() > deadline:
            raise CloudVMError(f"timed out after {timeout} s waiting for {ns}/{name} to be {target}: last phase"
                               f" {status['phase']}, reason {status['reason']}: {status.get('message', '')}",
                               status=status)
        time.sleep(POLL_SECONDS)


def ensure(params: dict, check_mode: bool = False, diff: bool = False) -> dict:
    """The cloudvm module on the host backend (see the module's documentation)."""
    cfg = _config(params)
    ns, name = params["namespace"], params["name"]
    for field, value in (("name", name), ("namespace", ns)):
        if not is_dns_label(value):
            raise CloudVMError(f"metadata.{field}: {value!r} is not a DNS label")
    store = HostStore(cfg.store_path)
    try:
        existing = store.get_vm(ns, name)

        def body() -> dict:
            authorize(existing, params)  # spec.owner is immutable: no lock needed
            if params["state"] == "absent":
                return _absent(cfg, store, params, check_mode, diff)
            return _present(cfg, store, params, check_mode, diff)

        return audited(body, lambda **outcome: _audit(store, params, existing, **outcome), check_mode)
    finally:
        store.close()


def _audit(store: HostStore, params: dict, existing: Optional[dict], result: Optional[dict] = None,
           error: Optional[BaseException] = None) -> None:
    """Record one cloudvm run that changed something, was refused or failed (docs/security.md, "Audit")."""
    ns, name = params["namespace"], params["name"]
    if params["state"] == "absent":
        action = "delete"
    elif existing is None:
        action = "create"
    elif params.get("restart"):
        action = "restart"
    else:
        action = {"running": "start", "stopped": "stop"}.get(params.get("power_state") or "", "update")
    owner = ((existing or {}).get("spec") or {}).get("owner") or params.get("owner") or ""
    data = {k: params[k] for k in ("power_state", "vcpus", "memory_mib", "image", "volume_size_mib",
                                   "root_volume_claim", "bandwidth") if params.get(k) is not None}
    if params.get("ssh_authorized_keys") is not None:
        data["ssh_authorized_keys"] = len(params["ssh_authorized_keys"])
    if params["state"] == "absent":
        data["delete_volume"] = bool(params.get("delete_volume"))
    if error is None:
        outcome, reason = "succeeded", ""
        vm = (result or {}).get("cloudvm")
        message = f"{action} {ns}/{name}" + (f": phase {vm['status'].get('phase')}, bootID {vm['spec'].get('bootID')}"
                                             if vm else "")
        data["boot_id"] = (result or {}).get("boot_id")
    else:
        details = getattr(error, "details", {}) or {}
        reason = str(details.get("reason") or ("Unschedulable" if "dimension" in details else "")
                     or (details.get("status") or {}).get("reason") or type(error).__name__)
        outcome = "refused" if reason in ("Forbidden", "QuotaExceeded") else "failed"
        message = str(error)
    store.record_audit(params.get("owner") or "operator", action, f"{ns}/{name}", outcome, message, owner=owner,
                       operator=bool(params.get("operator")), reason=reason, data=data)


def _new_volume_mib(image: Optional[dict], size_mib: Optional[int]) -> int:
    """The size (MiB) a new root volume will have: ``volume_size_mib``, else the image's root file system."""
    if size_mib:
        return int(size_mib)
    source = os.path.join((image or {}).get("dir", ""), "rootfs.raw")
    return os.path.getsize(source) // (1024 * 1024) if os.path.exists(source) else 0


def _within_quota(store: HostStore, existing: Optional[dict], planned: dict, new_volume_mib: int = 0) -> None:
    """Refuse a spec change that would take its owner over a quota (docs/security.md, "Quotas").

    Called inside the store transaction that writes ``planned`` (and the new volume's record), so two
    concurrent runs for two VMs of one owner cannot together exceed a quota: the second waits for the
    first's write lock and then counts its VM.

    Args:
        store: the host store (its ``quotas``, ``cloudvms`` and ``volumes`` are read).
        existing: the CloudVM as stored now, or None when ``planned`` creates it.
        planned: the spec about to be written.
        new_volume_mib: the size of the root volume this change creates (0 if none).

    Raises:
        CloudVMError: ``reason: QuotaExceeded`` naming the quota, the owner, in use + requested vs limit.
    """
    owner = planned["owner"]
    before = quota.vm_footprint((existing or {}).get("spec"))
    after = quota.vm_footprint(planned)
    after["disk_mib"] += new_volume_mib
    refusal = quota.check(owner, store.get_quota(owner), store.owner_usage(owner), before, after)
    if refusal is not None:
        raise CloudVMError(refusal.message, **refusal.details())


def _present(cfg: HostConfig, store: HostStore, params: dict, check_mode: bool, diff: bool) -> dict:
    ns, name = params["namespace"], params["name"]
    restart = bool(params.get("restart"))
    power = "running" if restart else params.get("power_state")
    with _vm_lock(cfg, ns, name):
        existing = store.get_vm(ns, name)
        if existing is None and not params.get("owner"):
            raise CloudVMError(f"name: there is no CloudVM {ns}/{name}; owner is required to create one")
        before = existing["spec"] if existing else None
        desired = params_to_spec(params, before)
        errors = validate_spec(desired) + (validate_update(before, desired) if before else [])
        if errors:
            raise CloudVMError("; ".join(errors), errors=errors)
        volume = store.get_volume(desired["rootVolumeClaim"])
        image = None
        if volume is None:
            try:
                image = resolve_image(cfg.images_dir, params.get("image") or cfg.default_image)
            except VolumeError as exc:
                raise CloudVMError(str(exc)) from exc
        else:
            # checked at create too, so that a refused create writes no record (docs/runbooks.md, Volume claims)
            live = sup.running_boot(_paths(cfg, ns, name)) if existing is None else None
            volume = settle_claim(store, volume, desired["owner"], existing["metadata"]["uid"] if existing else None,
                                  creating=existing is None, rbd=cfg.rbd, subject=f"{ns}/{name}",
                                  launcher_alive=f"a launcher of {ns}/{name} (pid {live[1]})" if live else None,
                                  check_mode=check_mode)
        status = (existing or {}).get("status") or {}
        # restart of a VM that runs: stop it first, wait Stopped, then start (below); one that is off just starts
        stop_first = restart and existing is not None and status.get("phase") not in ("Stopped", "Failed", None)
        if stop_first:
            planned = dict(desired, powerState="Stopped")
        else:
            planned = plan_power(desired, status, power)
        labels = dict((existing or {}).get("metadata", {}).get("labels") or {})
        labels.update(params.get("labels") or {})
        changed = existing is None or planned != existing["spec"] or \
            labels != existing["metadata"].get("labels") or restart or volume is None
        new_volume_mib = _new_volume_mib(image, params.get("volume_size_mib")) if volume is None else 0
        _within_quota(store, existing, planned, new_volume_mib)  # before creating anything; again when writing
        if check_mode:
            preview = existing or {"metadata": {"namespace": ns, "name": name}, "status": {}}
            return _result(dict(preview, spec=planned), changed, before, diff)
        new_volume: Optional[dict] = None
        if volume is None:
            if image is None:
                raise AssertionError("image unexpectedly missing")
            try:
                created = _volume_driver(cfg.volume_driver, "host_config: volume_driver").create(
                    cfg.volume_settings(), desired["rootVolumeClaim"], image, desired["owner"],
                    params.get("volume_size_mib"))
            except VolumeError as exc:
                raise CloudVMError(str(exc)) from exc
            new_volume = {"name": desired["rootVolumeClaim"], "driver": cfg.volume_driver, "owner": desired["owner"],
                          "image": image["dir"], **created}
        try:
            with store.transaction():  # the quota check and the writes it admits: one transaction
                _within_quota(store, existing, planned, int(new_volume["size_mib"]) if new_volume else 0)
                if new_volume is not None:
                    store.put_volume(new_volume)
                    store.record_event("Normal", f"{ns}/{name}", "VolumeCreated", f"volume {new_volume['name']}"
                                       f" from image {os.path.basename(new_volume['image'])}")
                if existing is None:
                    store.create_vm(ns, name, planned, labels)
                    store.record_event("Normal", f"{ns}/{name}", "Created",
                                       f"CloudVM created for owner {planned['owner']}")
                elif changed:
                    store.update_vm(ns, name, spec=planned if planned != existing["spec"] else None, labels=labels)
        except (CloudVMError, StoreError):
            if new_volume is not None:  # refused after the copy (a concurrent run took the quota): leave nothing
                _remove_volume(cfg, new_volume)
            raise
        if existing is not None and changed \
                and planned.get("sshAuthorizedKeys") != existing["spec"].get("sshAuthorizedKeys"):
            sync_gateway(cfg, store)  # the gateway's keys follow the spec at once, not at the next boot
    wait, timeout = params.get("wait", True), int(params.get("wait_timeout") or 600)
    warnings: list[str] = []
    if stop_first:
        off = off_but_failed(ns, name, _wait(cfg, store, ns, name, "Stopped", timeout).get("status"))
        warnings += [off] if off else []
        with _vm_lock(cfg, ns, name):
            with store.transaction():  # the restarted VM counts again: another VM may have taken the quota meanwhile
                vm = store.get_vm(ns, name)
                if vm is None:
                    raise AssertionError("vm unexpectedly missing")
                again = plan_power(vm["spec"], vm["status"], "running")
                _within_quota(store, vm, again)
                store.update_vm(ns, name, spec=again)
    vm = store.get_vm(ns, name)
    if vm is None:
        raise AssertionError("vm unexpectedly missing")
    target = {"Running": "Running", "Stopped": "Stopped"}[vm["spec"]["powerState"]]
    if wait and (power is not None or restart):
        vm = _wait(cfg, store, ns, name, target, timeout)
        off = off_but_failed(ns, name, vm.get("status")) if target == "Stopped" else None
        warnings += [off] if off else []
    else:
        with _vm_lock(cfg, ns, name):
            reconcile(cfg, store, vm)
        vm = store.get_vm(ns, name)
    return _result(vm, changed, before, diff, warnings)


def _remove_volume(cfg: HostConfig, volume: dict) -> None:
    """Delete a root volume's data through its driver (file, RBD image, qcow2 overlay); its record is the caller's."""
    try:
        _volume_driver(volume["driver"]).delete(cfg.volume_settings(), volume)
    except VolumeError as exc:
        raise CloudVMError(str(exc)) from exc


def _absent(cfg: HostConfig, store: HostStore, params: dict, check_mode: bool, diff: bool) -> dict:
    ns, name = params["namespace"], params["name"]
    existing = store.get_vm(ns, name)
    if existing is None:
        return _result(None, False, None, diff)
    if check_mode:
        return _result(None, True, existing["spec"], diff)
    with _vm_lock(cfg, ns, name):
        store.update_vm(ns, name, spec=dict(existing["spec"], powerState="Stopped"))
    off = off_but_failed(ns, name, _wait(cfg, store, ns, name, "Stopped",
                                         int(params.get("wait_timeout") or 600)).get("status"))
    paths = _paths(cfg, ns, name)
    with _vm_lock(cfg, ns, name):
        _cleanup_ended(cfg, store, existing)
        store.delete_vm(ns, name)
        if net.netns_exists(cfg.netns):
            sync_isolation(cfg, store)
        sync_gateway(cfg, store)  # the address is released: no key may open it any more
        for directory in (paths.state_dir, paths.runtime_dir):
            shutil.rmtree(directory, ignore_errors=True)
        claim = existing["spec"]["rootVolumeClaim"]
        volume = store.get_volume(claim)
        if params.get("delete_volume") and volume is not None:
            _remove_volume(cfg, volume)
            store.delete_volume(claim)
            kept = "deleted"
        else:
            kept = "kept"
        store.record_event("Normal", f"{ns}/{name}", "Deleted", f"CloudVM deleted; volume {claim} {kept}")
    return _result(None, True, existing["spec"], diff, [off] if off else None)


def observed_status(cfg: HostConfig, vm: dict, locks: Optional[sup.LockTable] = None) -> dict:
    """The status derived from what runs now, without acting (for reads: info, inventory).

    A stored status is never returned as is: a launcher killed since the last reconcile shows as
    Failed/LauncherLost here, not Running (case L2). ``locks`` is a :func:`_supervisor.lock_table`
    read for many VMs at once (see :func:`_supervisor.observe`); without it the lock is read now.
    """
    meta, spec = vm["metadata"], vm["spec"]
    paths = _paths(cfg, meta["namespace"], meta["name"])
    known = sup.boots(paths)
    if not known and (vm.get("status") or {}).get("phase") not in ("Running", "Stopping"):
        # a refused start (Unschedulable, StartFailed, VolumeInUse) is recorded before any boot exists
        return vm.get("status") or {}
    # a stored Running/Stopping without any boot on disk has no launcher: derived from nothing below
    latest = sup.observe(paths, known[-1], cfg.node, locks) if known else None
    current: Optional[BootObservation] = latest
    others: tuple[BootObservation, ...] = ()
    if latest is not None and spec["powerState"] == "Running" and latest.boot_id < int(spec["bootID"]) and \
            latest.state in ("alive", "starting"):
        others, current = (latest,), None
    kept = ("sshEndpoint", "sshProxyCommand", "sshJumpHost", "observedGeneration")
    stored = vm.get("status") or {}
    status = {k: v for k, v in stored.items() if k in kept}
    status.update(derive_status(spec, current, others).as_dict())
    if status["reason"] == "Starting" and stored.get("reason") == "VolumeInUse" and \
            stored.get("bootID") == status["bootID"]:
        # the requested boot was refused for another writer (case V2); only reconcile re-checks the volume
        status.update({k: stored[k] for k in ("phase", "reason", "message")})
    return status


def observed_vms(cfg: HostConfig, namespace: Optional[str] = None, owner: Optional[str] = None,
                 where: Optional[Callable[[dict], bool]] = None, busy_timeout: float = 30.0) -> list[dict]:
    """The CloudVMs of the store (optionally one namespace's / one owner's / those ``where`` accepts),
    ordered by namespace and name, each with its status re-derived from what runs now
    (:func:`observed_status`): the one read path of cloudvm_info and of the inventory plugin's host
    source, so both always show the same phase.

    The store is opened read-only (no migration, no write lock); a store that does not exist yet
    means no VM. The kernel's lock table is read once for all VMs (:func:`_supervisor.lock_table`),
    not once per VM: it has a line per running launcher, so per-VM reads grew with the square of
    the fleet.

    Raises:
        StoreError: the store cannot be read or its schema is older or newer than this code.
    """
    if not os.path.exists(cfg.store_path):
        return []
    with HostStore(cfg.store_path, busy_timeout=busy_timeout, read_only=True) as store:
        items = store.list_vms(namespace, owner)
    items = [vm for vm in items if where is None or where(vm)]
    locks = sup.lock_table() if items else None
    return [dict(vm, status=observed_status(cfg, vm, locks)) for vm in items]


def info(params: dict) -> list[dict]:
    """The cloudvm_info module on the host backend: records filtered by name/namespace/owner/labels.

    Each status is re-derived from what runs now (:func:`observed_vms`).
    """
    cfg = _config(params)
    selectors = []
    for selector in params.get("label_selectors") or []:
        negate = "!=" in selector
        key, _unused, value = selector.partition("!=" if negate else "=")
        selectors.append((key.strip(), value.strip(), negate))

    def wanted(vm: dict) -> bool:
        if params.get("name") and vm["metadata"]["name"] != params["name"]:
            return False
        return all((vm["metadata"]["labels"].get(key) == value) != negate for key, value, negate in selectors)

    try:
        return observed_vms(cfg, params.get("namespace"), params.get("owner"), where=wanted)
    except StoreError as exc:
        raise CloudVMError(str(exc)) from exc
