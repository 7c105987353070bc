# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The audit record of one ``cloudvm`` run on the host (docs/security.md, "Audit"): which action it is, its intent
(written by :class:`host.cloudvm.HostCloudVMApi` in the store transaction that writes the spec change) and its outcome
(succeeded, refused or failed). The record itself is :class:`host.store.AuditTrail`.
"""

from __future__ import annotations

from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import AuditTrail, HostStore


def trail(store: HostStore, params: dict, existing: Optional[dict]) -> AuditTrail:
    """The audit record of one cloudvm run with module parameters ``params`` on the CloudVM ``existing`` (None: it
    does not exist yet): its action (create, delete, restart, start, stop, update), subject ``<ns>/<name>``, the VM's
    owner and the options given (the number of SSH keys, not the keys)."""
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


def intent(record: AuditTrail, spec: Optional[dict], what: str) -> None:
    """Record the run's intent in the caller's write transaction: what it is about to change, and the spec's
    ``bootID``."""
    boot = f", bootID {spec.get('bootID')}" if spec else ""
    record.intend(f"{record.action} {record.subject} requested: {what}{boot}",
                  {"boot_id": spec.get("bootID")} if spec else None)


def finish(record: AuditTrail, result: Optional[dict] = None, error: Optional[BaseException] = None) -> None:
    """Record one cloudvm run's outcome: it changed something (``result``, the module result), was refused
    (``Forbidden``, ``QuotaExceeded``) or failed (``error``, its reason from its ``details`` or its type)."""
    if error is None:
        vm = (result or {}).get("cloudvm")
        kept = (result or {}).get("volume_deleted")
        message = f"{record.action} {record.subject}" + (
            f": phase {vm['status'].get('phase')}, bootID {vm['spec'].get('bootID')}" if vm else "") + (
            f": the root volume {kept} it kept deleted" if kept else "")
        record.finish("succeeded", message, data={"boot_id": (result or {}).get("boot_id")})
        return
    details = getattr(error, "details", {}) or {}
    reason = str(details.get("reason") or ("Unschedulable" if "dimension" in details else "")
                 or (details.get("status") or {}).get("reason") or type(error).__name__)
    record.finish("refused" if reason in ("Forbidden", "QuotaExceeded") else "failed", str(error), reason)
