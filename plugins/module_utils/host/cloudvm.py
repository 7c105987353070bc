# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The single-host backend of the cloudvm modules: store, volumes, network, launchers.

Every module run reconciles (one pass is :meth:`host.backend.HostBackend.reconcile`, over the ports of
:mod:`host.ports`): it observes the VM's launcher (:mod:`host.supervisor`), derives the
status with the same pure function the controller uses (:func:`model.phase.derive_status`), acts
(start the requested boot, stop a boot no longer wanted, clean up after an ended one) and writes
the status to the host store. Runs for the same VM are serialised by a per-VM flock; the spec is
planned and written inside the store's write transaction, so two concurrent ``vm_start`` runs
request exactly one boot (case L5, docs/architecture.md "Failure cases") and a new boot never starts while an older
launcher still holds the VM's lock (case L3).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from typing import Callable, Iterator, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common import flock as _flock
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.backend import HostBackend
from ansible_collections.zjusct.cloud.plugins.module_utils.host.backend import (
    observed_status as host_backend_observed_status,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig, load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.host_network_module import sync_gateway, sync_isolation
from ansible_collections.zjusct.cloud.plugins.module_utils.host.ports import HostSupervisor, volume_driver
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import AuditTrail, HostStore, StoreError, audited
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_claim import settle as settle_claim
from ansible_collections.zjusct.cloud.plugins.module_utils.host.watch import ChangeWatch
from ansible_collections.zjusct.cloud.plugins.module_utils.model import quota
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import (
    CloudVMError,
    authorize,
    off_but_failed,
    params_to_spec,
    plan_power,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    is_dns_label,
    validate_spec,
    validate_update,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import VolumeError, resolve_image

POLL_SECONDS = 1.0  # the longest wait between two passes of _wait; the launcher's events end it sooner


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


# --- reconcile (the pass is host.backend.HostBackend's over the real ports of host.ports) --------------
def reconcile(cfg: HostConfig, store: HostStore, vm: dict) -> dict:
    """One pass: act on the difference between spec and what runs, then return the new status
    (:meth:`host.backend.HostBackend.reconcile` over the real ports; the caller holds the VM's lock).

    Raises:
        CloudVMError: a requested boot cannot start (capacity, volume claim, launcher check).
    """
    return HostBackend.from_config(cfg, store).reconcile(vm)


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
    """Reconcile until the VM reaches ``target`` (Running for its current boot, Stopped) or fail.

    Between passes it waits for the launcher's files to change or the launcher to exit
    (:class:`host.watch.ChangeWatch`), at most :data:`POLL_SECONDS`.
    """
    paths = _paths(cfg, ns, name)
    with ChangeWatch(paths.state_dir) as watch:
        return _wait_passes(cfg, store, ns, name, target, timeout, paths, watch)


def _wait_passes(cfg: HostConfig, store: HostStore, ns: str, name: str, target: str, timeout: int,
                 paths: sup.LauncherPaths, watch: ChangeWatch) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        with _vm_lock(cfg, ns, name):
            vm = store.get_vm(ns, name)
            if vm is None:
                raise AssertionError("vm unexpectedly missing")
            status = reconcile(cfg, store, vm)
        launcher = sup.running_boot(paths)  # (bootID, pid) of the live launcher, read once per pass
        boot = int(vm["spec"]["bootID"])
        same_boot = int(status.get("bootID", -1)) == boot
        if target == "Running" and status["phase"] == "Running" and same_boot:
            return store.get_vm(ns, name) or vm
        if target == "Stopped" and status["phase"] in ("Stopped", "Failed") and launcher is None:
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
        watch.wait(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.0)), pid=launcher[1] if launcher else None)


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
        trail = _trail(store, params, existing)

        def body() -> dict:
            authorize(existing, params)  # spec.owner is immutable: no lock needed
            if params["state"] == "absent":
                return _absent(cfg, store, params, check_mode, diff, trail)
            return _present(cfg, store, params, check_mode, diff, trail)

        return audited(body, lambda **outcome: _finish(trail, **outcome), check_mode, trail)
    finally:
        store.close()


def _trail(store: HostStore, params: dict, existing: Optional[dict]) -> AuditTrail:
    """The audit record of one cloudvm run (docs/security.md, "Audit"): its intent is recorded in the store
    transaction that writes the spec change (``_present``, ``_absent``), its outcome by :func:`_finish`."""
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
    return AuditTrail(store, params.get("owner") or "operator", action, f"{ns}/{name}", owner=owner,
                      operator=bool(params.get("operator")), data=data)


def _intent(trail: AuditTrail, spec: Optional[dict], what: str) -> None:
    """Record the run's intent in the caller's write transaction: what it is about to change, and the spec."""
    boot = f", bootID {spec.get('bootID')}" if spec else ""
    trail.intend(f"{trail.action} {trail.subject} requested: {what}{boot}",
                 {"boot_id": spec.get("bootID")} if spec else None)


def _finish(trail: AuditTrail, result: Optional[dict] = None, error: Optional[BaseException] = None) -> None:
    """Record one cloudvm run's outcome: it changed something, was refused or failed (docs/security.md, "Audit")."""
    if error is None:
        vm = (result or {}).get("cloudvm")
        message = f"{trail.action} {trail.subject}" + (
            f": phase {vm['status'].get('phase')}, bootID {vm['spec'].get('bootID')}" if vm else "")
        trail.finish("succeeded", message, data={"boot_id": (result or {}).get("boot_id")})
        return
    details = getattr(error, "details", {}) or {}
    reason = str(details.get("reason") or ("Unschedulable" if "dimension" in details else "")
                 or (details.get("status") or {}).get("reason") or type(error).__name__)
    trail.finish("refused" if reason in ("Forbidden", "QuotaExceeded") else "failed", str(error), reason)


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


def _present(cfg: HostConfig, store: HostStore, params: dict, check_mode: bool, diff: bool,
             trail: AuditTrail) -> dict:
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
                created = volume_driver(cfg.volume_driver, "host_config: volume_driver").create(
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
                    _intent(trail, planned, f"CloudVM created, powerState {planned['powerState']}")
                elif changed:
                    store.update_vm(ns, name, spec=planned if planned != existing["spec"] else None, labels=labels)
                    _intent(trail, planned, f"spec written, powerState {planned['powerState']}")
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
                _intent(trail, again, "started again after the stop")
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
        volume_driver(volume["driver"]).delete(cfg.volume_settings(), volume)
    except VolumeError as exc:
        raise CloudVMError(str(exc)) from exc


def _absent(cfg: HostConfig, store: HostStore, params: dict, check_mode: bool, diff: bool,
            trail: AuditTrail) -> dict:
    ns, name = params["namespace"], params["name"]
    existing = store.get_vm(ns, name)
    if existing is None:
        return _result(None, False, None, diff)
    if check_mode:
        return _result(None, True, existing["spec"], diff)
    with _vm_lock(cfg, ns, name), store.transaction():
        stopping = dict(existing["spec"], powerState="Stopped")
        store.update_vm(ns, name, spec=stopping)
        _intent(trail, stopping, "stopping the VM, then deleting its record")
    off = off_but_failed(ns, name, _wait(cfg, store, ns, name, "Stopped",
                                         int(params.get("wait_timeout") or 600)).get("status"))
    paths = _paths(cfg, ns, name)
    with _vm_lock(cfg, ns, name):
        HostBackend.from_config(cfg, store).cleanup_ended(existing)
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
    """The status derived from what runs now, without acting (for reads: info, inventory); see
    :func:`host.backend.observed_status`. ``locks`` is a :func:`host.supervisor.lock_table` read for many VMs at
    once; without it the lock is read now."""
    meta = vm["metadata"]
    return host_backend_observed_status(HostSupervisor(cfg), vm, _paths(cfg, meta["namespace"], meta["name"]), locks)


def observed_vms(cfg: HostConfig, namespace: Optional[str] = None, owner: Optional[str] = None,
                 where: Optional[Callable[[dict], bool]] = None, busy_timeout: float = 30.0) -> list[dict]:
    """The CloudVMs of the store (optionally one namespace's / one owner's / those ``where`` accepts),
    ordered by namespace and name, each with its status re-derived from what runs now
    (:func:`observed_status`): the one read path of cloudvm_info and of the inventory plugin's host
    source, so both always show the same phase.

    The store is opened read-only (no migration, no write lock); a store that does not exist yet
    means no VM. The kernel's lock table is read once for all VMs (:func:`host.supervisor.lock_table`),
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


def authorize_found(params: dict, vms: list[dict]) -> None:
    """``cloudvm_info``'s ``authorize`` on the host backend: refuse a CloudVM of another owner and record the
    refusal in the host store's audit trail (docs/security.md, "Audit"), as a refusal by the ``cloudvm`` module
    itself is recorded.

    Args:
        params: the module's parameters; ``authorize`` is ``{owner, operator, action}``.
        vms: the CloudVMs the module found.

    Raises:
        CloudVMError: ``reason: Forbidden`` (:func:`model.lifecycle.authorize`), after the record is written.
    """
    auth = params["authorize"]
    for vm in vms:
        try:
            authorize(vm, auth)
        except CloudVMError as exc:
            meta = vm["metadata"]
            with HostStore(_config(params).store_path) as store:
                AuditTrail(store, auth["owner"], auth["action"], f"{meta['namespace']}/{meta['name']}",
                           owner=vm["spec"]["owner"], operator=bool(auth.get("operator")),
                           data={"checked_by": "cloudvm_info authorize"}).finish("refused", str(exc), "Forbidden")
            raise


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
