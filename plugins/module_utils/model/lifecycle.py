# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Power-state requests and the desired spec (pure, shared by both backends and the modules).

Boot semantics (docs/api/cloudvm.md "Boot semantics"): each new ``bootID`` value while ``powerState: Running`` is one
explicit boot request, retrying the same value never boots twice, and a VM whose boot ended stays
stopped until ``bootID`` grows. So a start request bumps ``bootID`` only when no boot is requested
or live; it never bumps twice for one request, even when two runs race (each re-plans inside the
store's write transaction or against the object's resourceVersion).
"""

from __future__ import annotations

from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import (
    DISK_IO,
    default_root_volume_claim,
    with_defaults,
)


class CloudVMError(CloudError):
    """A CloudVM request cannot be carried out; ``details`` go into the module's failure result."""

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


def authorize(vm: Optional[dict], params: dict) -> None:
    """Refuse acting on an existing CloudVM that is not owned by the module's ``owner``.

    The rule (docs/security.md, "Owner authorization"): a task that names an ``owner`` acts only on
    that owner's VMs. ``operator: true`` is the operator's explicit switch that skips the comparison
    (``owner`` then only names the owner of a VM being created, :func:`params_to_spec`); a task
    without ``owner`` is an operator's own task (the playbooks always pass one). A VM that does not
    exist yet is not checked here: creating it makes ``owner`` its owner.

    Args:
        vm: the existing CloudVM (``spec.owner`` is read), or None.
        params: the module's parameters (``owner``, ``operator``, ``namespace``, ``name``).

    Raises:
        CloudVMError: the VM belongs to another owner (``reason: Forbidden``, both owners named).
    """
    acting = params.get("owner")
    if vm is None or not acting or params.get("operator"):
        return
    owner = (vm.get("spec") or {}).get("owner")
    if owner != acting:
        meta = vm.get("metadata") or {}
        raise CloudVMError(
            f"owner: {acting!r} may not act on CloudVM {meta.get('namespace', params.get('namespace'))}/"
            f"{meta.get('name', params.get('name'))}, which belongs to owner {owner!r} (spec.owner); only its "
            "owner may start, stop, restart, change or delete it, or an operator with operator=true",
            reason="Forbidden", vm_owner=owner)


# KEP-2268 non-graceful node shutdown: the taint by which an operator states that a NotReady node is off
# (docs/controller.md, Fencing). The controller fences an RBD root disk's old launcher there before anything starts
# elsewhere; a start of a VM whose boot runs there asks for a new boot (:func:`current_boot_live`).
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


def out_of_service(node: Optional[dict]) -> bool:
    """True when the Node dict ``node`` carries the taint :data:`OUT_OF_SERVICE_TAINT` (any value or effect): the
    operator has stated that the node is off. Pure."""
    return any(t.get("key") == OUT_OF_SERVICE_TAINT for t in ((node or {}).get("spec") or {}).get("taints") or [])


def node_ready(node: Optional[dict]) -> Optional[bool]:
    """True/False from the Node dict's ``Ready`` condition; None when the Node or the condition is missing. Pure."""
    if node is None:
        return None
    cond = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    return None if cond is None else cond.get("status") == "True"


def stated_off(node: Optional[dict]) -> bool:
    """True when the Node dict ``node`` is :func:`out_of_service` and not Ready (:func:`node_ready` not True): the
    node the controller fences on (docs/controller.md, Fencing). A Ready node that still carries the taint (back
    before the operator removed it) is not off. Pure."""
    return out_of_service(node) and node_ready(node) is not True


def node_lost(status: Optional[dict]) -> bool:
    """True when ``status`` says the current boot's launcher is on a lost node (``Unknown/NodeLost``, set only by
    the Kubernetes controller): neither its run nor its stop can be observed until the node is back, which may be
    never, or the launcher is fenced."""
    status = status or {}
    return (status.get("phase"), status.get("reason")) == ("Unknown", "NodeLost")


def current_boot_live(spec: dict, status: Optional[dict], node_off: bool = False) -> bool:
    """True when the spec's current boot is requested and not known to have ended.

    That is ``powerState: Running`` and either the status has not caught up with ``spec.bootID``
    yet (the request is still being carried out) or the status describes this boot in a phase
    other than Stopped/Failed, and other than Unknown/NodeLost (:func:`node_lost`): a boot whose launcher's
    node is lost cannot be seen Running until the node is back, which may be never, so a start asks for a new
    boot. The controller starts that boot only once the old launcher is fenced or gone (docs/controller.md,
    Fencing), so asking for it never makes a second writer; when the node comes back first, the old boot is
    stopped before the new one starts (the start then amounts to a restart).

    ``node_off``: the node the status names for this boot is out of service and not Ready (:func:`stated_off`, read
    by the caller). The operator's statement counts as the loss even before the status says so: the status is written by
    the controller, which may lag the node (restarting, or not yet past its own look at the node), and a start
    that took a stale Running for a live boot would wait for a guest that is gone.
    """
    if spec.get("powerState") != "Running":
        return False
    status = status or {}
    observed = status.get("bootID")
    if observed is None or int(observed) < int(spec.get("bootID", 0)):
        return True
    if node_lost(status) or node_off:
        return False
    return status.get("phase") not in ("Stopped", "Failed")


def off_but_failed(namespace: str, name: str, status: Optional[dict]) -> Optional[str]:
    """A warning when a wait for ``Stopped`` ended on phase ``Failed``, else None.

    A VM whose last boot failed (crash, panic, launcher lost) is off, so a stop wait accepts
    Failed; it must not do so silently, because "stopped" then hides how the boot ended. The
    text names the boot, the reason and the status message.
    """
    status = status or {}
    if status.get("phase") != "Failed":
        return None
    return (f"{namespace}/{name} is off, but boot {status.get('bootID')} ended in phase Failed (reason"
            f" {status.get('reason', '-')}): {status.get('message', '')}").rstrip(": ")


def first_boot_with_change(before: dict, launched_boot: Optional[int]) -> int:
    """The first bootID that boots with a spec change written over ``before`` (the spec the change replaced): the
    requested boot when its launcher was not made yet (``launched_boot`` older or None), else the next one. The rule
    of docs/api/cloudvm.md "Boot semantics": a boot's launcher config is fixed when it is made."""
    boot = int(before.get("bootID", 0))
    requested_not_launched = before.get("powerState") == "Running" and (launched_boot is None or launched_boot < boot)
    return boot if requested_not_launched else boot + 1


def older_boot_up(status: Optional[dict], first: int) -> Optional[int]:
    """The bootID of a boot older than ``first`` that ``status`` shows up (not Stopped or Failed), else None."""
    status = status or {}
    running = status.get("bootID")
    if running is None or status.get("phase") in (None, "Stopped", "Failed") or int(running) >= first:
        return None
    return int(running)


BOOT_FIXED_FIELDS = ("sshAuthorizedKeys", "vcpus", "memoryMiB", "diskIO", "antiAffinityGroup", "rootVolumeSizeMiB")
"""The spec fields a boot's launcher config fixes when the boot is made (docs/api/cloudvm.md "Boot semantics"): a
change reaches the guest at its next boot (:func:`keys_change`, :func:`size_change`)."""


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return "none" if value is None else str(value)


def size_change(before: Optional[dict], after: dict, launched_boot: Optional[int],
                status: Optional[dict]) -> Optional[str]:
    """A warning when a task changed ``spec.vcpus``, ``spec.memoryMiB``, ``spec.diskIO``, ``spec.antiAffinityGroup``
    or ``spec.rootVolumeSizeMiB`` while a boot launched with the old values is still up, else None. They are part of
    a boot's launcher config (the VMM's ``-smp``/``-m``, block I/O throttling and the root disk's growth before the
    guest runs; on Kubernetes the launcher Pod's requests and anti-affinity, docs/controller.md), so, as for keys
    (:func:`keys_change`), a change takes effect at the next boot, whose start checks the node's capacity for the
    new size and the group (placement).

    Args: as :func:`keys_change` (``before`` None: the VM was created).
    """
    if before is None:
        return None
    fields = [f for f in ("vcpus", "memoryMiB", "diskIO", "antiAffinityGroup", "rootVolumeSizeMiB")
              if before.get(f) != after.get(f)]
    if not fields:
        return None
    first = first_boot_with_change(before, launched_boot)
    running = older_boot_up(status, first)
    if running is None:
        return None
    changed = [f"{f} {_shown(before.get(f))} -> {_shown(after.get(f))}" for f in fields]
    kept = " and ".join(what for what, names in (("size", {"vcpus", "memoryMiB"}), ("disk I/O limits", {"diskIO"}),
                                                 ("node", {"antiAffinityGroup"}),
                                                 ("root disk size", {"rootVolumeSizeMiB"})) if names & set(fields))
    return (f"spec.{' and spec.'.join(changed)}: takes effect at the next boot (bootID {first}); boot {running} keeps"
            f" its {kept} until it ends; restart the VM (restart: true, playbook vm_restart) to apply it now")


def keys_change(before: Optional[dict], after: dict, launched_boot: Optional[int], status: Optional[dict],
                gateway: bool = False) -> Optional[tuple[int, Optional[str]]]:
    """When a task's change of ``spec.sshAuthorizedKeys`` takes effect, and a warning if a guest keeps the old keys.

    The rule (docs/api/cloudvm.md "Boot semantics", docs/security.md): a guest installs the keys of its boot's
    config at boot and keeps them until that boot ends, and the host's SSH gateway grants the keys of the boot
    that runs; so a change takes effect at the next boot, on both. A boot that is requested but not launched yet
    gets the new keys.

    Args:
        before: the spec before the task (None: the task created the VM, whose first boot gets its keys).
        after: the spec after the task.
        launched_boot: the newest bootID whose launcher was made, so whose keys are fixed
            (:meth:`cloudvm.port.CloudVMApi.launched_boot`), None when none was.
        status: the status after the task (``phase``, ``bootID``).
        gateway: the host runs the SSH gateway (the warning says so).

    Returns:
        None when the keys did not change (or the VM was created); else ``(boot, warning)``: ``boot`` is the first
        bootID whose guest has the new keys, ``warning`` a message when a boot older than that is still up after
        the task (None when nothing runs the old keys, e.g. after ``restart``).
    """
    if before is None or list(before.get("sshAuthorizedKeys") or []) == list(after.get("sshAuthorizedKeys") or []):
        return None
    first = first_boot_with_change(before, launched_boot)
    running = older_boot_up(status, first)
    if running is None:
        return first, None
    where = "in the guest and on the host's SSH gateway" if gateway else "in the guest"
    return first, (f"spec.sshAuthorizedKeys change takes effect at the next boot (bootID {first}): boot {running}"
                   f" keeps its keys {where} until it ends, so the new keys do not log in yet and the removed ones"
                   " still do; restart the VM (restart: true, playbook vm_restart) to apply the change now")


def plan_power(spec: dict, status: Optional[dict], power_state: Optional[str], node_off: bool = False) -> dict:
    """The spec after a power-state request (``running``, ``stopped`` or None for unchanged).

    Args:
        spec: the current spec (with defaults).
        status: the current status (may be empty).
        power_state: the module's ``power_state`` option.
        node_off: the status's node is out of service (:func:`current_boot_live`).

    Returns:
        A new spec dict; equal to ``spec`` when nothing needs to change.
    """
    out = dict(spec)
    if power_state == "running":
        if not current_boot_live(spec, status, node_off):
            out["powerState"] = "Running"
            out["bootID"] = int(spec.get("bootID", 0)) + 1
    elif power_state == "stopped":
        out["powerState"] = "Stopped"
    return out


def params_to_spec(params: dict, existing: Optional[dict]) -> dict:
    """Merge the module's options into a desired spec (powerState and bootID untouched).

    Options left unset keep the existing value (or the API default on create). ``bandwidth`` and
    ``ssh_authorized_keys`` replace the existing value when given. ``disk_io`` sets each limit given and keeps the
    others: a suboption 0 removes that limit, one left unset keeps it (``spec.diskIO`` is dropped when none is left).

    Args:
        params: module parameters (snake_case).
        existing: the current spec, or None on create.
    """
    spec = dict(existing) if existing else {}
    if params.get("owner") is not None and not (existing and params.get("operator")):
        # with the operator switch, owner names the owner of a VM being created only (see authorize)
        spec["owner"] = params["owner"]
    claim = params.get("root_volume_claim")
    if claim is None and not existing:
        claim = default_root_volume_claim(params["name"])
    if claim is not None:
        spec["rootVolumeClaim"] = claim
    for option, field in (("vcpus", "vcpus"), ("memory_mib", "memoryMiB"), ("volume_size_mib", "rootVolumeSizeMiB")):
        if params.get(option) is not None:
            spec[field] = params[option]
    if params.get("ssh_authorized_keys") is not None:
        spec["sshAuthorizedKeys"] = [k.strip() for k in params["ssh_authorized_keys"]]
    bw = params.get("bandwidth")
    if bw is not None:
        guaranteed = bw.get("guaranteed_mbps") or 0
        band = {"guaranteedMbps": guaranteed, "priority": bw.get("priority") or 0}
        ceil = bw.get("ceil_mbps") or guaranteed
        if ceil:  # an unset ceiling means "the guarantee"; none at all when nothing is guaranteed
            band["ceilMbps"] = ceil
        if bw.get("pool"):
            band["pool"] = bw["pool"]
        spec.setdefault("network", {})
        spec["network"] = dict(spec["network"], bandwidth=band)
    io = params.get("disk_io")
    if io is not None:
        limits = dict(spec.get("diskIO") or {})
        for key, (option, _bounds, _unit) in DISK_IO.items():
            value = io.get(option)
            if value is None:
                continue
            if value == 0 and not isinstance(value, bool):
                limits.pop(key, None)
            else:
                limits[key] = value  # validate_spec refuses a bool or a value out of range, naming the field
        if limits:
            spec["diskIO"] = {key: limits[key] for key in DISK_IO if key in limits}
        else:
            spec.pop("diskIO", None)
    if params.get("node_selector") is not None:
        spec["nodeSelector"] = params["node_selector"]
    group = params.get("anti_affinity_group")
    if group == "":
        spec.pop("antiAffinityGroup", None)
    elif group is not None:
        spec["antiAffinityGroup"] = group
    return with_defaults(spec)


def host_action(spec: dict, live_boot: Optional[int], latest_boot: Optional[int]) -> Optional[str]:
    """What one pass of the host backend does about a VM's launchers: ``"stop"``, ``"start"`` or None.

    Args:
        spec: the CloudVM spec (``powerState``, ``bootID``).
        live_boot: the bootID of the launcher alive now (holding the VM's lock), or None.
        latest_boot: the newest bootID with a launcher config on disk, or None when the VM never booted.

    Returns:
        ``"stop"`` when a launcher is alive but the spec wants the VM off or a newer boot (the old one goes first,
        case L3 in docs/architecture.md); ``"start"`` when no launcher is alive, Running is wanted and ``spec.bootID``
        was never started (one launcher per bootID, case L5); None otherwise.
    """
    want, boot = spec["powerState"] == "Running", int(spec["bootID"])
    if live_boot is not None and (not want or live_boot != boot):
        return "stop"
    if live_boot is None and want and (latest_boot is None or latest_boot < boot):
        return "start"
    return None
