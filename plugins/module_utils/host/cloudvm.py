# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host adapter of the CloudVM API port (:mod:`cloudvm.port`): the host store, its volumes and launchers, for the
one lifecycle of the cloudvm modules (:mod:`cloudvm.lifecycle`).

Its writes do what admission does on Kubernetes: the spec's rules (:func:`model.spec.validate_spec`,
:func:`model.spec.validate_update`), the root volume (created by the host's driver when missing) and its claim rules
(:mod:`host.volume_claim`), the owner's quota checked in the very store transaction that writes the spec
(:func:`host.admission.within_quota`; the quota and root volume steps are :mod:`host.admission`'s), and the audit
record of the change in that transaction too (:mod:`host.cloudvm_audit`).
A write is a compare-and-swap on ``metadata.resourceVersion`` (a digest of the stored spec and labels). Its reads run
one pass of the host's reconciler (:class:`host.reconciler.HostReconciler`, the controller's counterpart) under the
VM's flock, so the status a read returns is as current as the controller keeps it; nothing reconciles between
module runs, which is what ``reconciles_in_background = False`` tells the lifecycle. Runs for the same VM are
serialised by that flock, so two concurrent ``vm_start`` runs request exactly one boot (case L5, docs/architecture.md
"Failure cases") and a new boot never starts while an older launcher still holds the VM's lock (case L3).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
from typing import Callable, Iterator, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm.lifecycle import Lifecycle
from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm.port import Access, Conflict, RootVolume
from ansible_collections.zjusct.cloud.plugins.module_utils.common import flock as _flock
from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.host import cloudvm_audit as audit
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.admission import (
    admit_kept_volume_delete,
    admit_root_volume,
    admit_root_volume_update,
    create_root_volume,
    grow_record,
    record_new_volume,
    remove_volume,
    within_quota,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig, load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.network import sync_gateway, sync_isolation
from ansible_collections.zjusct.cloud.plugins.module_utils.host.ports import HostSupervisor
from ansible_collections.zjusct.cloud.plugins.module_utils.host.reconciler import HostReconciler
from ansible_collections.zjusct.cloud.plugins.module_utils.host.reconciler import (
    observed_status as reconciler_observed_status,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import AuditTrail, HostStore, StoreError, audited
from ansible_collections.zjusct.cloud.plugins.module_utils.host.watch import ChangeWatch
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.selectors import matches, parse_label_selector
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    default_root_volume_claim,
    validate_spec,
    validate_update,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net

OFF_PHASES = ("Stopped", "Failed")


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


def reconcile(cfg: HostConfig, store: HostStore, vm: dict) -> dict:
    """One pass: act on the difference between spec and what runs, then return the new status
    (:meth:`host.reconciler.HostReconciler.reconcile` over the real ports; the caller holds the VM's lock).

    Raises:
        CloudVMError: a requested boot cannot start (capacity, volume claim, launcher check); the status written
            says why.
    """
    return HostReconciler.from_config(cfg, store).reconcile(vm)


def resource_version(vm: dict) -> str:
    """The host's ``metadata.resourceVersion``: a digest of what a write replaces (spec and labels), so a write
    computed from an older read is refused (:class:`cloudvm.port.Conflict`) as kube-apiserver refuses one."""
    doc = json.dumps({"spec": vm["spec"], "labels": vm["metadata"].get("labels") or {}}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _with_version(vm: dict) -> dict:
    out = copy.deepcopy(vm)
    out["metadata"]["resourceVersion"] = resource_version(vm)
    return out


class HostCloudVMApi:
    """:class:`cloudvm.port.CloudVMApi` over the host store (see the module docstring).

    Args:
        cfg: the host configuration.
        store: the open host store; None for the reads that open their own, read-only (:meth:`list`) and the
            refusal record (:meth:`record_refusal`): every other method needs it.
        trail: the run's audit record (:class:`host.store.AuditTrail`): each write records its intent in its own
            transaction. None: nothing is recorded (a read-only module).
    """

    backend = "host"
    reconciles_in_background = False
    ignored_options: dict = {}

    def __init__(self, cfg: HostConfig, store: Optional[HostStore], trail: Optional[AuditTrail] = None) -> None:
        self.cfg, self.trail = cfg, trail
        self._store = store
        self._watches: dict[tuple[str, str], ChangeWatch] = {}

    @property
    def ssh_gateway(self) -> bool:
        """The host runs the SSH gateway (``gateway_dir`` set, with its uplink): it grants each VM the keys of the
        boot its guest runs (:func:`host.network.gateway_vms`)."""
        return self.cfg.gateway_source() is not None

    @property
    def store(self) -> HostStore:
        if self._store is None:
            raise AssertionError("HostCloudVMApi: this method needs an open host store")
        return self._store

    def close(self) -> None:
        """Close the change watches a wait opened."""
        for watch in self._watches.values():
            watch.close()
        self._watches.clear()

    # ------------------------------------------------------------- reads

    def get(self, namespace: str, name: str) -> Optional[dict]:
        """One reconcile pass under the VM's lock, then the VM as stored. A status that says Stopped or Failed while
        a launcher of the VM still runs (its result written, the process not yet gone) reads as Stopping: "off"
        means no launcher, nor VMM, of the VM remains."""
        key = (namespace, name)
        if key not in self._watches:  # opened before the pass, so no launcher event after it is missed
            self._watches[key] = ChangeWatch(_paths(self.cfg, namespace, name).state_dir).__enter__()
        with _vm_lock(self.cfg, namespace, name):
            vm = self.store.get_vm(namespace, name)
            if vm is None:
                return None
            with contextlib.suppress(CloudVMError):  # a refused start: the status written says why
                reconcile(self.cfg, self.store, vm)
            vm = self.store.get_vm(namespace, name) or vm
        status = vm.get("status") or {}
        if status.get("phase") in OFF_PHASES and sup.running_boot(_paths(self.cfg, namespace, name)) is not None:
            vm["status"] = dict(status, phase="Stopping", message=f"{status.get('message', '')} (the launcher is"
                                " still exiting)".lstrip())
        return _with_version(vm)

    def list(self, namespace: Optional[str], name: Optional[str], owner: Optional[str],
             label_selector: str) -> list:
        """:func:`observed_vms` (no pass runs), filtered by name and the label selector."""
        selector = parse_label_selector(label_selector, "label_selectors")
        found = observed_vms(self.cfg, namespace, owner, where=lambda vm: (
            (not name or vm["metadata"]["name"] == name) and matches(selector, vm["metadata"]["labels"])))
        return [_with_version(vm) for vm in found]

    def launched_boot(self, vm: dict) -> Optional[int]:
        """The newest boot whose LauncherConfig (with the guest's keys) is on disk, None when the VM never booted."""
        known = sup.boots(_paths(self.cfg, vm["metadata"]["namespace"], vm["metadata"]["name"]))
        return known[-1] if known else None

    def running_doubt(self, vm: dict) -> Optional[str]:
        """None, always: :meth:`get` derives the status from what runs now (a reconcile pass over the launcher's lock
        and boot files), so a Running it returns is not a record that may have gone stale."""
        return None

    def boot_node_out_of_service(self, vm: dict) -> bool:
        """False, always: the host is the one node; there is no other to start the VM on."""
        return False

    def pause(self, namespace: str, name: str, seconds: float) -> None:
        """Until the VM's launcher files change or its launcher exits (:class:`host.watch.ChangeWatch`)."""
        watch = self._watches.get((namespace, name))
        live = sup.running_boot(_paths(self.cfg, namespace, name))
        if watch is None:
            watch = self._watches[(namespace, name)] = ChangeWatch(
                _paths(self.cfg, namespace, name).state_dir).__enter__()
        watch.wait(seconds, pid=live[1] if live else None)

    # ------------------------------------------------------------- writes (what admission does)

    def create(self, body: dict, dry_run: bool, root_volume: RootVolume) -> dict:
        """Admit and store a new CloudVM: the spec's rules, its root volume (created from ``root_volume.image``,
        default the host's image, when missing; an existing one passes the claim rules), the quota, then in one
        transaction the quota again, the volume's record, the VM's and the audit intent. Nothing is left behind
        by a refusal.

        Raises:
            Conflict: the VM exists. CloudVMError: refused (the message names the field). VolumeError: the image is
            missing or the new root volume could not be made (UnknownDriver: the host config's ``volume_driver``).
        """
        meta, desired = body["metadata"], body["spec"]
        ns, name = meta["namespace"], meta["name"]
        labels = dict(meta.get("labels") or {})
        with _vm_lock(self.cfg, ns, name):
            if self.store.get_vm(ns, name) is not None:
                raise Conflict(f"CloudVM {ns}/{name} already exists")
            errors = validate_spec(desired)
            if errors:
                raise CloudVMError("; ".join(errors), errors=errors)
            root = admit_root_volume(self.cfg, self.store, ns, name, desired, root_volume, dry_run)
            within_quota(self.store, None, desired, root.mib)  # before creating anything; again when writing
            if dry_run:
                return {**body, "status": {}}
            new_volume = None
            if root.volume is None:
                if root.image is None:
                    raise AssertionError("image unexpectedly missing")
                new_volume = create_root_volume(self.cfg, desired, root.image, root_volume.size_mib)
            try:
                with self.store.transaction():  # the quota check and the writes it admits: one transaction
                    within_quota(self.store, None, desired, int(new_volume["size_mib"]) if new_volume else root.mib)
                    grow_record(self.store, root.volume, desired, root.mib)
                    if new_volume is not None:
                        record_new_volume(self.store, f"{ns}/{name}", new_volume)
                    self.store.create_vm(ns, name, desired, labels)
                    self.store.record_event("Normal", f"{ns}/{name}", "Created",
                                            f"CloudVM created for owner {desired['owner']}")
                    self._intent(desired, f"CloudVM created, powerState {desired['powerState']}")
            except (CloudVMError, StoreError):
                if new_volume is not None:  # refused after the copy (a concurrent run took the quota): leave nothing
                    remove_volume(self.cfg, new_volume)
                raise
            return _with_version(self.store.get_vm(ns, name) or body)

    def replace(self, body: dict, dry_run: bool) -> dict:
        """Admit and store ``body`` over the VM it was computed from: the spec's rules and immutable fields, the
        root volume's claim rules, the quota (in the write transaction, with the audit intent); a key change is
        handed to the SSH gateway (:func:`host.network.sync_gateway`), which grants the VM's keys in
        effect: the new ones at once when no boot runs, the running boot's own until its next boot starts.

        Raises:
            Conflict: the stored VM changed since ``body``'s read (``metadata.resourceVersion``) or is gone.
            CloudVMError: refused (the message names the field).
        """
        meta, desired = body["metadata"], body["spec"]
        ns, name = meta["namespace"], meta["name"]
        labels = dict(meta.get("labels") or {})
        with _vm_lock(self.cfg, ns, name):
            existing = self.store.get_vm(ns, name)
            if existing is None or resource_version(existing) != meta.get("resourceVersion"):
                raise Conflict(f"CloudVM {ns}/{name} changed since it was read")
            before = existing["spec"]
            errors = validate_spec(desired) + validate_update(before, desired)
            if errors:
                raise CloudVMError("; ".join(errors), errors=errors)
            root = admit_root_volume_update(self.cfg, self.store, existing, desired, dry_run)
            within_quota(self.store, existing, desired, root.mib)
            if dry_run:
                return {**body, "status": existing.get("status") or {}}
            with self.store.transaction():  # the quota check and the write it admits: one transaction
                current = self.store.get_vm(ns, name)
                if current is None or resource_version(current) != meta.get("resourceVersion"):
                    raise Conflict(f"CloudVM {ns}/{name} changed since it was read")
                within_quota(self.store, current, desired, root.mib)
                grow_record(self.store, root.volume, desired, root.mib)
                self.store.update_vm(ns, name, spec=desired if desired != before else None, labels=labels)
                self._intent(desired, f"spec written, powerState {desired['powerState']}")
            if desired.get("sshAuthorizedKeys") != before.get("sshAuthorizedKeys"):
                # a VM that is off gets its new keys on the gateway now; one whose boot runs keeps that boot's keys
                # until its next boot starts (network.gateway_vms), as its guest does
                sync_gateway(self.cfg, self.store)
            return _with_version(self.store.get_vm(ns, name) or body)

    def delete(self, namespace: str, name: str, dry_run: bool, delete_volume: bool) -> None:
        """Remove an off VM (the lifecycle stopped it and waited): its launcher's leftovers (bandwidth, TAP,
        allocation), its record and lease, its isolation and gateway entries, its state and runtime directories,
        and with ``delete_volume`` its root volume (else kept, with its claim, docs/runbooks.md).

        Raises:
            CloudVMError: a launcher of the VM still runs. VolumeError: the volume cannot be deleted.
        """
        with _vm_lock(self.cfg, namespace, name):
            existing = self.store.get_vm(namespace, name)
            if existing is None or dry_run:
                return
            paths = _paths(self.cfg, namespace, name)
            live = sup.running_boot(paths)
            if live is not None:
                raise CloudVMError(f"CloudVM {namespace}/{name}: its launcher of boot {live[0]} (pid {live[1]}) still"
                                   " runs; it is deleted once it is Stopped (run the delete again)")
            HostReconciler.from_config(self.cfg, self.store).cleanup_ended(existing)
            self.store.delete_vm(namespace, name)
            if net.netns_exists(self.cfg.netns):
                sync_isolation(self.cfg, self.store)
            sync_gateway(self.cfg, self.store)  # the address is released: no key may open it any more
            for directory in (paths.state_dir, paths.runtime_dir):
                shutil.rmtree(directory, ignore_errors=True)
            claim = existing["spec"]["rootVolumeClaim"]
            volume = self.store.get_volume(claim)
            kept = "kept"
            if delete_volume and volume is not None:
                remove_volume(self.cfg, volume)
                self.store.delete_volume(claim)
                kept = "deleted"
            self.store.record_event("Normal", f"{namespace}/{name}", "Deleted",
                                    f"CloudVM deleted; volume {claim} {kept}")

    def delete_kept_volume(self, namespace: str, name: str, owner: str, operator: bool, dry_run: bool) -> Optional[str]:
        """Delete the root volume ``<name>-root`` that deleting CloudVM ``namespace/name`` kept: its data through its
        driver, then its record (audit intent in that transaction, then an event). Under the VM's lock, so no create
        of the VM takes the volume meanwhile. ``dry_run``: the checks only.

        Returns:
            The volume's name, or None when there is no such volume.

        Raises:
            CloudVMError: the volume is another owner's (without ``operator``), a CloudVM holds it or names it as
                its root volume claim, or a process still writes it (the claim rules, :mod:`host.volume_claim`).
            VolumeError: its writers cannot be read, or its data cannot be deleted (its record is then kept, so a
                retry finds it).
        """
        claim = default_root_volume_claim(name)
        with _vm_lock(self.cfg, namespace, name):
            volume = self.store.get_volume(claim)
            if volume is None:
                return None
            admit_kept_volume_delete(self.cfg, self.store, namespace, name, volume, owner, operator)
            if dry_run:
                return claim
            remove_volume(self.cfg, volume)
            with self.store.transaction():
                if self.trail is not None:
                    self.trail.intend(f"{self.trail.action} {self.trail.subject} requested: delete the root volume"
                                      f" {claim} it kept ({volume['driver']} {volume['location']})")
                self.store.delete_volume(claim)
            self.store.record_event("Normal", f"{namespace}/{name}", "VolumeDeleted",
                                    f"root volume {claim} kept by the deleted CloudVM deleted")
        return claim

    def _intent(self, spec: dict, what: str) -> None:
        if self.trail is not None:
            audit.intent(self.trail, spec, what)

    # ------------------------------------------------------------- authorization

    def ask_access(self, vm: dict, access: Access) -> None:
        """Nothing to ask: on the host the owner rule (:func:`model.lifecycle.authorize`) is the authority."""

    def record_refusal(self, vm: dict, access: Access, error: CloudError) -> None:
        """Write the refusal to the host store's audit trail (docs/security.md, "Audit")."""
        meta = vm["metadata"]
        with HostStore(self.cfg.store_path) as store:
            AuditTrail(store, access.owner, access.action, f"{meta['namespace']}/{meta['name']}",
                       owner=vm["spec"]["owner"], operator=access.operator,
                       data={"checked_by": "cloudvm_info authorize"}).finish("refused", str(error), "Forbidden")


# --- module entry points -------------------------------------------------------------------------
@contextlib.contextmanager
def _lifecycle(params: dict, trail_for: Callable[[HostStore], AuditTrail]) -> Iterator[tuple]:
    """``(Lifecycle over a HostCloudVMApi, the run's AuditTrail)``; the store and the watches closed after."""
    cfg = _config(params)
    store = HostStore(cfg.store_path)
    trail = trail_for(store)
    api = HostCloudVMApi(cfg, store, trail)
    try:
        yield Lifecycle(api), trail
    finally:
        api.close()
        store.close()


def ensure(params: dict, check_mode: bool = False, diff: bool = False) -> dict:
    """The cloudvm module on the host backend: the one lifecycle over :class:`HostCloudVMApi`, its outcome audited
    (docs/security.md, "Audit")."""
    ns, name = params["namespace"], params["name"]
    with _lifecycle(params, lambda store: audit.trail(store, params, store.get_vm(ns, name))) as (lifecycle, trail):
        return audited(lambda: lifecycle.ensure(params, check_mode, diff),
                       lambda **outcome: audit.finish(trail, **outcome), check_mode, trail)


def observed_status(cfg: HostConfig, vm: dict, locks: Optional[sup.LockTable] = None) -> dict:
    """The status derived from what runs now, without acting (for reads: info, inventory); see
    :func:`host.reconciler.observed_status`. ``locks`` is a :func:`host.supervisor.lock_table` read for many VMs at
    once; without it the lock is read now."""
    meta = vm["metadata"]
    return reconciler_observed_status(cfg, HostSupervisor(cfg), vm, _paths(cfg, meta["namespace"], meta["name"]),
                                      locks)


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
    """``cloudvm_info``'s ``authorize`` on the host (:meth:`cloudvm.lifecycle.Lifecycle.authorize_found`): a refusal
    is written to the host store's audit trail, as a refusal by the ``cloudvm`` module itself is.

    Raises:
        CloudVMError: ``reason: Forbidden``, after the record is written.
    """
    cfg = _config(params)
    Lifecycle(HostCloudVMApi(cfg, None)).authorize_found(params, vms)


def info(params: dict) -> list[dict]:
    """The cloudvm_info module on the host backend: records filtered by name / namespace / owner / label selectors,
    each status re-derived from what runs now (:func:`observed_vms`; no pass acts).

    Raises:
        CloudVMError: ``host_config`` cannot be read. StoreError: the store cannot be read. SelectorError: a label
            selector cannot be parsed.
    """
    return Lifecycle(HostCloudVMApi(_config(params), None)).info(params)


def running_doubts(params: dict, vms: list[dict]) -> dict[str, str]:
    """cloudvm_info's ``running_doubts`` on the host: none (:meth:`HostCloudVMApi.running_doubt`: the statuses
    :func:`info` returns are derived from what runs now)."""
    return {}
