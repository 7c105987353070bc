# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host adapter of the CloudVM API port (:mod:`cloudvm.port`): the host store, its volumes and launchers, for the
one lifecycle of the cloudvm modules (:mod:`cloudvm.lifecycle`).

Its writes do what admission does on Kubernetes: the spec's rules (:func:`model.spec.validate_spec`,
:func:`model.spec.validate_update`), the root volume (created by the host's driver when missing) and its claim rules
(:mod:`host.volume_claim`), the owner's quota checked in the very store transaction that writes the spec
(:func:`_within_quota`), and the audit record of the change in that transaction too (:class:`host.store.AuditTrail`).
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
from ansible_collections.zjusct.cloud.plugins.module_utils.host import supervisor as sup
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig, load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.network import sync_gateway, sync_isolation
from ansible_collections.zjusct.cloud.plugins.module_utils.host.ports import HostSupervisor
from ansible_collections.zjusct.cloud.plugins.module_utils.host.reconciler import HostReconciler
from ansible_collections.zjusct.cloud.plugins.module_utils.host.reconciler import (
    observed_status as reconciler_observed_status,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import AuditTrail, HostStore, StoreError, audited
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_claim import settle as settle_claim
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volume_claim import volume_writers
from ansible_collections.zjusct.cloud.plugins.module_utils.host.watch import ChangeWatch
from ansible_collections.zjusct.cloud.plugins.module_utils.model import quota
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.selectors import matches, parse_label_selector
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    default_root_volume_claim,
    validate_spec,
    validate_update,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver import driver
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import resolve_image

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
                                   "root_volume_claim", "bandwidth", "disk_io") if params.get(k) is not None}
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
        kept = (result or {}).get("volume_deleted")
        message = f"{trail.action} {trail.subject}" + (
            f": phase {vm['status'].get('phase')}, bootID {vm['spec'].get('bootID')}" if vm else "") + (
            f": the root volume {kept} it kept deleted" if kept else "")
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
        new_volume_mib: MiB of root volume this change creates or grows (0 if none).

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


def _volume_growth(volume: Optional[dict], desired: dict) -> int:
    """MiB that ``spec.rootVolumeSizeMiB`` adds to an existing root volume's record (0: unset, or not larger).

    The record holds the volume's allotted size, counted in the owner's ``disk_mib`` quota from the write on; the
    launcher grows the volume itself at the next boot (``rootDisk.sizeMiB``, docs/launcher-protocol.md).

    Raises:
        CloudVMError: the size asked is below the volume's (a root volume only grows), naming both sizes.
    """
    size = desired.get("rootVolumeSizeMiB")
    if size is None or volume is None:
        return 0
    current = int(volume.get("size_mib") or 0)
    if size < current:
        raise CloudVMError(f"spec.rootVolumeSizeMiB: {size} is below the size of the root volume {volume['name']}, "
                           f"{current} MiB; a root volume only grows")
    return size - current


def _grow_record(store: HostStore, volume: Optional[dict], desired: dict, growth: int) -> None:
    """Write the grown size of ``volume`` (:func:`_volume_growth`) into its record, inside the caller's transaction."""
    if volume is not None and growth > 0:
        store.put_volume(dict(volume, size_mib=desired["rootVolumeSizeMiB"]))


def _remove_volume(cfg: HostConfig, volume: dict) -> None:
    """Delete a root volume's data through its driver (file, RBD image, qcow2 overlay); its record is the caller's.

    Raises:
        VolumeError: the data could not be deleted. UnknownDriver: the record names no registered driver.
    """
    driver(volume["driver"], "volume driver").delete(cfg.volume_settings(), volume)


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
            volume = self.store.get_volume(desired["rootVolumeClaim"])
            image = None
            if volume is None:
                image = resolve_image(self.cfg.images_dir, root_volume.image or self.cfg.default_image)
            else:  # checked at create, so that a refused create writes no record (docs/runbooks.md, Volume claims)
                live = sup.running_boot(_paths(self.cfg, ns, name))
                settle_claim(self.store, volume, desired["owner"], None, creating=True, rbd=self.cfg.rbd,
                             subject=f"{ns}/{name}", check_mode=dry_run,
                             launcher_alive=f"a launcher of {ns}/{name} (pid {live[1]})" if live else None)
            if volume is None:
                new_mib = _new_volume_mib(image, root_volume.size_mib)
            else:  # an existing volume grows to spec.rootVolumeSizeMiB (0 MiB when it is not asked to)
                new_mib = _volume_growth(volume, desired)
            _within_quota(self.store, None, desired, new_mib)  # before creating anything; again when writing
            if dry_run:
                return {**body, "status": {}}
            new_volume = None
            if volume is None:
                if image is None:
                    raise AssertionError("image unexpectedly missing")
                created = driver(self.cfg.volume_driver, "host_config: volume_driver").create(
                    self.cfg.volume_settings(), desired["rootVolumeClaim"], image, desired["owner"],
                    root_volume.size_mib)
                new_volume = {"name": desired["rootVolumeClaim"], "driver": self.cfg.volume_driver,
                              "owner": desired["owner"], "image": image["dir"], **created}
            try:
                with self.store.transaction():  # the quota check and the writes it admits: one transaction
                    _within_quota(self.store, None, desired, int(new_volume["size_mib"]) if new_volume else new_mib)
                    _grow_record(self.store, volume, desired, new_mib)
                    if new_volume is not None:
                        self.store.put_volume(new_volume)
                        image_name = os.path.basename(new_volume["image"])
                        self.store.record_event("Normal", f"{ns}/{name}", "VolumeCreated",
                                                f"volume {new_volume['name']} from image {image_name}")
                    self.store.create_vm(ns, name, desired, labels)
                    self.store.record_event("Normal", f"{ns}/{name}", "Created",
                                            f"CloudVM created for owner {desired['owner']}")
                    self._intent(desired, f"CloudVM created, powerState {desired['powerState']}")
            except (CloudVMError, StoreError):
                if new_volume is not None:  # refused after the copy (a concurrent run took the quota): leave nothing
                    _remove_volume(self.cfg, new_volume)
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
            volume = self.store.get_volume(desired["rootVolumeClaim"])
            if volume is not None:
                settle_claim(self.store, volume, desired["owner"], existing["metadata"]["uid"], creating=False,
                             rbd=self.cfg.rbd, subject=f"{ns}/{name}", check_mode=dry_run)
            growth = _volume_growth(volume, desired)
            _within_quota(self.store, existing, desired, growth)
            if dry_run:
                return {**body, "status": existing.get("status") or {}}
            with self.store.transaction():  # the quota check and the write it admits: one transaction
                current = self.store.get_vm(ns, name)
                if current is None or resource_version(current) != meta.get("resourceVersion"):
                    raise Conflict(f"CloudVM {ns}/{name} changed since it was read")
                _within_quota(self.store, current, desired, growth)
                _grow_record(self.store, volume, desired, growth)
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
                _remove_volume(self.cfg, volume)
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
            if volume["owner"] != owner and not operator:
                raise CloudVMError(f"delete_volume: volume {claim!r} (kept by deleting CloudVM {namespace}/{name})"
                                   f" belongs to owner {volume['owner']!r}, not {owner!r}", reason="Forbidden")
            live = sup.running_boot(_paths(self.cfg, namespace, name))
            settle_claim(self.store, volume, volume["owner"], None, creating=True, rbd=self.cfg.rbd,
                         subject=f"{namespace}/{name}", check_mode=True,
                         launcher_alive=f"a launcher of {namespace}/{name} (pid {live[1]})" if live else None)
            # the claim rules look for writers only behind a stale claim; a delete needs none at all
            busy = volume_writers(volume, self.cfg.rbd)
            if busy:
                raise CloudVMError(f"delete_volume: volume {claim!r} is in use by {', '.join(busy)}; stop that"
                                   " writer first (docs/runbooks.md, 'Volume claims')")
            if dry_run:
                return claim
            _remove_volume(self.cfg, volume)
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
            _intent(self.trail, spec, what)

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
    with _lifecycle(params, lambda store: _trail(store, params, store.get_vm(ns, name))) as (lifecycle, trail):
        return audited(lambda: lifecycle.ensure(params, check_mode, diff), lambda **outcome: _finish(trail, **outcome),
                       check_mode, trail)


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
