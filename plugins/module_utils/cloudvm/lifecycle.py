# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one CloudVM lifecycle of the ``cloudvm`` and ``cloudvm_info`` modules, written once over the CloudVM API
port (:mod:`cloudvm.port`) for both backends (docs/architecture.md, "One lifecycle, two adapters").

What a module run does is decided here: owner authorization (:func:`model.lifecycle.authorize`), the desired object
(:func:`model.lifecycle.params_to_spec` and :func:`model.lifecycle.plan_power` over the stored object, labels merged),
whether to write at all, the restart (stop, wait, start with bootID + 1), the waits and their targets, and the
result. Every write is a compare-and-swap on the ``resourceVersion`` of the object the plan was computed from; a
:class:`cloudvm.port.Conflict` means someone wrote in between and the plan is recomputed from a fresh read, which is
what makes ``power_state: running`` bump ``bootID`` exactly once when two runs race or a task is retried.

Shapes: ``params`` is the module's parameter dict (``cloudvm_module.cloudvm_argument_spec``); objects are CloudVM
dicts in the API's shape; times in seconds. The result: ``changed``, ``cloudvm`` (absent after a delete), ``phase``,
``boot_id``, ``ssh_authorized_keys_boot_id`` when the task changed an existing VM's keys, ``diff`` {before, after}
(the spec) when asked, ``warnings``.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm.port import Access, CloudVMApi, Conflict, RootVolume
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import (
    BOOT_FIXED_FIELDS,
    CloudVMError,
    authorize,
    current_boot_live,
    keys_change,
    node_lost,
    off_but_failed,
    params_to_spec,
    plan_power,
    size_change,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import parse_message
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import API_VERSION, KIND

CONFLICT_RETRIES = 10  # re-plans after a 409 before giving up
POLL_INTERVAL = 1.0  # seconds, the longest pause between two reads of a wait
OFF_PHASES = ("Stopped", "Failed")  # no launcher remains
# A wait for Running ends at once on these (phase, reason): they need someone to act, whatever reconciles next.
NEEDS_ACTION = {("Blocked", "VolumeOwnerMismatch"), ("Blocked", "VolumeNotSupported"),
                ("Pending", "QuotaExceeded"), ("Blocked", "QuotaExceeded")}
# ... and on these too where nothing reconciles in the background (the host): the module's next run tries again.
RETRIED_ONLY_BY_A_RUN = {("Pending", "Unschedulable"), ("Blocked", "VolumeInUse")}
# status reasons of a refusal the controller met (docs/controller.md, Refusals): the quota or the API server said no
REFUSAL_REASONS = ("QuotaExceeded", "Refused")


# --------------------------------------------------------------------------- pure helpers


def _str_labels(labels: Optional[dict]) -> dict:
    return {str(k): str(v) for k, v in (labels or {}).items()}


def desired_object(params: dict, existing: Optional[dict], power_state: Optional[str],
                   node_off: bool = False) -> dict:
    """The CloudVM body to write for the module's options over ``existing`` (None when absent).

    Options left unset keep the existing values; labels are merged; the power plan is
    :func:`model.lifecycle.plan_power` over the existing spec and status (``node_off``: the node of the boot the
    status describes is out of service, :meth:`cloudvm.port.CloudVMApi.boot_node_out_of_service`). Pure.
    """
    spec = params_to_spec(params, (existing or {}).get("spec"))
    spec = plan_power(spec, (existing or {}).get("status"), power_state, node_off)
    if existing is None:
        metadata: dict = {"name": params["name"], "namespace": params["namespace"]}
        if params.get("labels"):
            metadata["labels"] = _str_labels(params["labels"])
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
    body = copy.deepcopy(existing)
    body.pop("status", None)  # status is the reconciler's; a write ignores it
    labels = dict(body["metadata"].get("labels") or {})
    labels.update(_str_labels(params.get("labels")))
    if labels:
        body["metadata"]["labels"] = labels
    body["spec"] = spec
    return body


def view(obj: Optional[dict]) -> dict:
    """The part of a CloudVM the module writes: labels and spec."""
    if not obj:
        return {}
    labels = dict((obj.get("metadata") or {}).get("labels") or {})
    return {"labels": labels, "spec": copy.deepcopy(obj.get("spec") or {})}


def needs_write(existing: Optional[dict], desired: dict) -> bool:
    """True when ``desired`` differs from ``existing`` in labels or spec (the only fields the module sets)."""
    return existing is None or view(existing) != view(desired)


def target_reached(obj: Optional[dict], target: str) -> bool:
    """True when ``obj`` shows the target phase for its current spec.

    ``target``: ``Running`` (status.bootID == spec.bootID and phase Running: the SSH banner answered), ``Stopped``
    (phase Stopped or Failed: no launcher remains) or ``absent`` (``obj`` is None). Running and Stopped also require
    ``status.observedGeneration`` to have caught up with ``metadata.generation``, so a status written before the
    request never counts.
    """
    if target == "absent":
        return obj is None
    if obj is None:
        return False
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    if generation is not None and int(status.get("observedGeneration", -1)) < int(generation):
        return False
    if target == "Running":
        return status.get("phase") == "Running" and status.get("bootID") == obj["spec"].get("bootID")
    return status.get("phase") in OFF_PHASES


def wait_failure(obj: Optional[dict], reconciles_in_background: bool) -> Optional[str]:
    """Why a wait for Running cannot succeed any more, or None: the boot it waits for ended (Stopped or Failed for
    ``spec.bootID``), or the status names a refusal that needs someone to act (:data:`NEEDS_ACTION`; without
    background reconciling also :data:`RETRIED_ONLY_BY_A_RUN`). Pure."""
    if not obj:
        return None
    status, spec = obj.get("status") or {}, obj.get("spec") or {}
    current = status.get("bootID") == spec.get("bootID")
    phase, reason = status.get("phase"), status.get("reason")
    # bootID names one boot, so a status for spec.bootID that says Stopped/Failed is final for it.
    if current and phase in OFF_PHASES:
        return (f"boot {spec.get('bootID')} ended in phase {phase} (reason {reason or '-'}): "
                f"{status.get('message', '')}").rstrip(": ")
    final = NEEDS_ACTION | (set() if reconciles_in_background else RETRIED_ONLY_BY_A_RUN)
    if current and (phase, reason) in final:
        return f"boot {spec.get('bootID')} is {phase} ({reason}): {status.get('message', '')}".rstrip(": ")
    return None


def refusal(obj: Optional[dict], target: str) -> Optional[tuple]:
    """``(reason, message)`` when the status reports that what a wait for ``target`` (``Running`` or ``Stopped``)
    awaits was refused - the owner's CloudQuota, a namespace ResourceQuota or LimitRange, an admission policy
    (status reason in :data:`REFUSAL_REASONS`, for the current ``metadata.generation`` and, for Running,
    ``spec.bootID``) - else None. Pure."""
    if not obj or target not in ("Running", "Stopped"):
        return None
    status, spec = obj.get("status") or {}, obj.get("spec") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    if status.get("reason") not in REFUSAL_REASONS:
        return None
    if generation is not None and int(status.get("observedGeneration", -1)) < int(generation):
        return None
    if target == "Running" and status.get("bootID") != spec.get("bootID"):
        return None
    return str(status["reason"]), str(status.get("message") or "")


def refused_error(ns: str, name: str, target: str, refused: tuple, obj: dict, changed: bool,
                  reconciles_in_background: bool) -> CloudVMError:
    """The wait's failure for :func:`refusal`: the status message, ``reason`` (``QuotaExceeded`` or ``Refused``)
    and, for an owner quota, the fields ``quota``, ``owner``, ``limit``, ``in_use``, ``requested``
    (:func:`model.quota.parse_message`), the same fields as a refusal at write time on the host."""
    reason, message = refused
    what = {"Running": f"boot {(obj.get('spec') or {}).get('bootID')}", "Stopped": "the stop"}[target]
    if not reconciles_in_background:
        still = "the next run of the module tries again"
    elif target == "Running":
        still = ("the VM stays asked to run: the controller retries it and starts it once allowed "
                 "(power_state: stopped withdraws the request)")
    else:
        still = "the controller retries the stop"
    details: dict = {"reason": reason, "changed": changed, "cloudvm": obj,
                     "phase": (obj.get("status") or {}).get("phase")}
    details.update(parse_message(message) or {})
    return CloudVMError(f"CloudVM {ns}/{name}: {what} refused ({reason}): {message}; {still}", **details)


def timeout_message(namespace: str, name: str, target: str, timeout: float, obj: Optional[dict],
                    doubt: Optional[str] = None) -> str:
    """The wait timeout message: what was awaited and the last phase and reason seen; ``doubt`` (a wait for Running
    whose last status said Running but was not trusted, :meth:`cloudvm.port.CloudVMApi.running_doubt`) says why."""
    want = {"Running": "Running (SSH ready)", "Stopped": "Stopped", "absent": "deleted"}[target]
    if target == "Running" and obj:
        want += f" with bootID {obj['spec'].get('bootID')}"
    status = (obj or {}).get("status") or {}
    last = f"phase {status.get('phase') or '(none yet)'}, reason {status.get('reason') or '-'}"
    if status.get("bootID") is not None:
        last += f", status.bootID {status['bootID']}"
    if status.get("message"):
        last += f": {status['message']}"
    finalizers = ((obj or {}).get("metadata") or {}).get("finalizers")
    if target == "absent" and finalizers:
        last += f"; deletion waits for finalizers {', '.join(finalizers)}"
    if (status.get("phase"), status.get("reason")) == ("Unknown", "NodeLost") and target in ("Stopped", "absent"):
        last += "; " + lost_node_advice(status.get("node"))
    elif (status.get("phase"), status.get("reason")) == ("Unknown", "NodeLost") and target == "Running":
        # the wait does not ask for a new boot by itself: a node that is NotReady for a moment would cost a reboot
        where = f"node {status['node']}" if status.get("node") else "its node"
        last += (f"; the launcher of this boot runs on {where}, which is lost: once the node is off, taint it "
                 "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute and start the VM again (power_state "
                 "running, playbook vm_start): a start of a VM whose node is lost asks for a new boot, which the "
                 "controller starts elsewhere once it has fenced the old launcher (docs/controller.md, Fencing)")
    if doubt:
        last += f"; {doubt}"
    return f"CloudVM {namespace}/{name}: timed out after {timeout:g} s waiting until {want}; last {last}"


def lost_node_advice(node: Optional[str]) -> str:
    """What an operator can do about a stop or delete that waits on a launcher whose node is lost (docs/controller.md
    "Fencing": the old launcher may still write the root disk, so nothing removes it while its node may still run;
    once the operator states that the node is off, the controller fences an RBD root disk's launcher and the stop
    or delete completes)."""
    where = f"node {node}" if node else "its node"
    return (f"the launcher runs on {where}, which is lost: the stop completes once the node is back (its kubelet "
            "stops the launcher); if the node is off for good, taint it node.kubernetes.io/out-of-service="
            "nodeshutdown:NoExecute: the controller then fences the old launcher (an RBD root disk) and the stop "
            "or delete completes (docs/controller.md, Fencing)")


def result(obj: Optional[dict], changed: bool, before: Optional[dict], diff: bool, warnings: list,
           keys: Optional[tuple] = None) -> dict:
    """The module result (see the module docstring); ``diff`` is the spec before and after; ``keys`` the
    :func:`model.lifecycle.keys_change` of the task (its boot in ``ssh_authorized_keys_boot_id``, its warning
    appended)."""
    out: dict[str, Any] = {"changed": changed}
    if obj is not None:
        out["cloudvm"] = obj
        out["phase"] = (obj.get("status") or {}).get("phase")
        out["boot_id"] = (obj.get("spec") or {}).get("bootID")
    if keys is not None:
        out["ssh_authorized_keys_boot_id"] = keys[0]
        warnings = warnings + ([keys[1]] if keys[1] else [])
    if diff:
        out["diff"] = {"before": view(before).get("spec", {}), "after": view(obj).get("spec", {})}
    if warnings:
        out["warnings"] = warnings
    return out


# --------------------------------------------------------------------------- the state machine


class Lifecycle:
    """ensure / info / authorize_found over a :class:`cloudvm.port.CloudVMApi`; ``monotonic`` is injectable for
    tests (the pauses between reads are the port's)."""

    def __init__(self, api: CloudVMApi, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.monotonic = monotonic

    # ------------------------------------------------------------- writes

    def launched(self, before: Optional[dict], after: Optional[dict]) -> Optional[int]:
        """:meth:`cloudvm.port.CloudVMApi.launched_boot` of ``before`` (the object a write replaced), asked only
        when the write changed one of :data:`model.lifecycle.BOOT_FIXED_FIELDS` (the fields a boot's launcher
        fixes; None otherwise, and for a create)."""
        if before is None or after is None:
            return None
        old, new = before.get("spec") or {}, after.get("spec") or {}
        if all(old.get(f) == new.get(f) for f in BOOT_FIXED_FIELDS):
            return None
        return self.api.launched_boot(before)

    def keys_notice(self, before: Optional[dict], after: Optional[dict], launched: Optional[int]) -> Optional[tuple]:
        """:func:`model.lifecycle.keys_change` of a task that turned ``before`` into ``after`` (objects; ``after``
        with the status after the task's waits), ``launched`` from :meth:`launched` at the write."""
        if before is None or after is None:
            return None
        return keys_change(before.get("spec"), after.get("spec") or {}, launched, after.get("status"),
                           self.api.ssh_gateway)

    @staticmethod
    def size_notice(before: Optional[dict], after: Optional[dict], launched: Optional[int]) -> list:
        """:func:`model.lifecycle.size_change` of the task as a list of warnings (empty or one)."""
        if before is None or after is None:
            return []
        warning = size_change(before.get("spec"), after.get("spec") or {}, launched, after.get("status"))
        return [warning] if warning else []

    def apply(self, params: dict, power_state: Optional[str], check_mode: bool) -> tuple:
        """Create or update the CloudVM; returns ``(before, after, changed)``.

        Re-plans from a fresh read after every conflict (at most :data:`CONFLICT_RETRIES`).

        Raises:
            CloudVMError: refused (owner, admission: the message names the field), or the object kept changing.
        """
        ns, name = params["namespace"], params["name"]
        for _unused in range(CONFLICT_RETRIES):
            existing = self.api.get(ns, name)
            authorize(existing, params)
            if existing is None and not params.get("owner"):
                raise CloudVMError(f"name: there is no CloudVM {ns}/{name}; owner is required to create one")
            desired = desired_object(params, existing, power_state, self.boot_node_off(existing, power_state))
            if not needs_write(existing, desired):
                if existing is None:
                    raise AssertionError("existing unexpectedly missing")
                return existing, existing, False
            try:
                if existing is None:
                    after = self.api.create(desired, check_mode, RootVolume(params.get("image"),
                                                                            params.get("volume_size_mib")))
                else:
                    after = self.api.replace(desired, check_mode)
            except Conflict:
                continue
            return existing, after, view(existing) != view(after)
        raise CloudVMError(f"CloudVM {ns}/{name}: gave up after {CONFLICT_RETRIES} conflicting concurrent writes")

    def boot_node_off(self, existing: Optional[dict], power_state: Optional[str]) -> bool:
        """Whether a start must take the boot the status describes as lost because its node is out of service
        (:func:`model.lifecycle.current_boot_live`'s ``node_off``): asked of the backend
        (:meth:`cloudvm.port.CloudVMApi.boot_node_out_of_service`, one GET of the Node on Kubernetes) only for a
        start of a VM whose boot is live by its status and runs on a named node."""
        if power_state != "running" or existing is None:
            return False
        status = existing.get("status") or {}
        if not status.get("node") or not current_boot_live(existing.get("spec") or {}, status):
            return False
        return self.api.boot_node_out_of_service(existing)

    def wait_for(self, ns: str, name: str, target: str, timeout: float, changed: bool) -> Optional[dict]:
        """Read until :func:`target_reached`; returns the last object (None once deleted).

        A status that says Running is taken only when the backend has no doubt about it
        (:meth:`cloudvm.port.CloudVMApi.running_doubt`: on Kubernetes its launcher Pod is there and Ready, one GET
        asked only once the status says Running); otherwise the wait goes on, and its timeout says why.

        Raises:
            CloudVMError: timeout (:func:`timeout_message`, with the doubt in ``running_doubt``), or (Running) the
                boot cannot get there any more (:func:`wait_failure`); ``changed``, ``cloudvm`` and ``phase`` in the
                details.
        """
        deadline = self.monotonic() + timeout
        while True:
            obj = self.api.get(ns, name)
            doubt = None
            if target_reached(obj, target):
                doubt = self.api.running_doubt(obj or {}) if target == "Running" else None
                if doubt is None:
                    return obj
            phase = ((obj or {}).get("status") or {}).get("phase")
            refused = refusal(obj, target)
            if refused is not None:
                raise refused_error(ns, name, target, refused, obj or {}, changed, self.api.reconciles_in_background)
            if target == "Running":
                failure = wait_failure(obj, self.api.reconciles_in_background)
                if failure:
                    status = (obj or {}).get("status") or {}
                    raise CloudVMError(f"CloudVM {ns}/{name}: {failure}", changed=changed, cloudvm=obj,
                                       phase=phase, reason=status.get("reason"), status=status)
            if target != "absent" and obj is None:
                raise CloudVMError(f"CloudVM {ns}/{name} was deleted while waiting", changed=changed)
            remaining = deadline - self.monotonic()
            if remaining <= 0:
                extra = {"running_doubt": doubt} if doubt else {}
                raise CloudVMError(timeout_message(ns, name, target, timeout, obj, doubt), changed=changed,
                                   cloudvm=obj or {}, phase=phase, status=(obj or {}).get("status") or {}, **extra)
            self.api.pause(ns, name, min(POLL_INTERVAL, remaining))

    def ensure(self, params: dict, check_mode: bool, diff: bool) -> dict:
        """The cloudvm module's result for ``params`` (see the module documentation)."""
        warnings = [f"{opt} is ignored by the {self.api.backend} backend ({why})"
                    for opt, why in self.api.ignored_options.items() if params.get(opt) is not None]
        if params.get("state") == "absent":
            return self.absent(params, check_mode, diff, warnings)
        if params.get("restart"):
            return self.restart(params, check_mode, diff, warnings)
        ns, name = params["namespace"], params["name"]
        power = params.get("power_state")
        before, after, changed = self.apply(params, power, check_mode)
        launched = self.launched(before, after)
        if check_mode:
            warnings += self.size_notice(before, after, launched)
            return result(after, changed, before, diff, warnings, self.keys_notice(before, after, launched))
        if params.get("wait", True) and power is not None:
            target = "Running" if power == "running" else "Stopped"
            after = self.wait_for(ns, name, target, float(params.get("wait_timeout") or 0), changed) or after
            off = off_but_failed(ns, name, after.get("status")) if target == "Stopped" else None
            warnings += [off] if off else []
        elif changed:
            after = self.api.get(ns, name) or after  # the status after the write (the host: one pass acts on it)
        warnings += self.size_notice(before, after, launched)
        return result(after, changed, before, diff, warnings, self.keys_notice(before, after, launched))

    def restart(self, params: dict, check_mode: bool, diff: bool, warnings: list) -> dict:
        """Stop, wait Stopped (always, bounded by wait_timeout), start with bootID + 1, wait Running if asked.

        A VM whose launcher's node is lost (``Unknown/NodeLost``) cannot be seen Stopped while the node is lost:
        its restart is the start of a new boot (:func:`model.lifecycle.current_boot_live`), which the controller
        holds until the old launcher is fenced or gone."""
        ns, name = params["namespace"], params["name"]
        timeout = float(params.get("wait_timeout") or 0)
        existing = self.api.get(ns, name)
        if existing is not None and node_lost(existing.get("status")):
            # the stop cannot be seen while the launcher's node is lost: the new boot is the restart, and the
            # controller starts it only once the old launcher is fenced or gone
            return self.ensure(dict(params, restart=False, power_state="running"), check_mode, diff)
        before, stopped, _changed = self.apply(params, "stopped", check_mode)
        launched = self.launched(before, stopped)
        if check_mode:  # predict the start on top of the predicted stop; nothing is written
            predicted = desired_object(params, {**stopped, "status": {}}, "running")
            predicted["status"] = (before or {}).get("status", {})
            keys = self.keys_notice(before, predicted, launched)
            # the restart ends the boot that keeps the old keys: nothing to warn of
            return result(predicted, True, before, diff, warnings, (keys[0], None) if keys else None)
        off = off_but_failed(ns, name, (self.wait_for(ns, name, "Stopped", timeout, changed=True) or {}).get("status"))
        warnings += [off] if off else []
        _before, after, _changed = self.apply(params, "running", check_mode=False)
        if params.get("wait", True):
            after = self.wait_for(ns, name, "Running", timeout, changed=True) or after
        else:
            after = self.api.get(ns, name) or after
        return result(after, True, before, diff, warnings, self.keys_notice(before, after, launched))

    def absent(self, params: dict, check_mode: bool, diff: bool, warnings: list) -> dict:
        """Delete the CloudVM and wait until it is gone (its root volume kept unless ``delete_volume``).

        Where nothing reconciles in the background (the host) the VM is first stopped (a write, so its intent is
        recorded), waited for until it is off (always, bounded by ``wait_timeout``), and then removed.
        """
        ns, name = params["namespace"], params["name"]
        timeout = float(params.get("wait_timeout") or 0)
        existing = self.api.get(ns, name)
        if existing is None:
            return self.absent_kept_volume(params, check_mode, diff, warnings)
        authorize(existing, params)
        background = self.api.reconciles_in_background
        if not check_mode and not background:
            self.apply(params, "stopped", check_mode=False)
            off = off_but_failed(ns, name, (self.wait_for(ns, name, "Stopped", timeout, True) or {}).get("status"))
            warnings += [off] if off else []
        self.api.delete(ns, name, check_mode, bool(params.get("delete_volume")))
        if not check_mode and (params.get("wait", True) or not background):
            self.wait_for(ns, name, "absent", timeout, changed=True)
        return result(None, True, existing, diff, warnings)

    def absent_kept_volume(self, params: dict, check_mode: bool, diff: bool, warnings: list) -> dict:
        """``state: absent`` of a CloudVM that does not exist: nothing, or with ``delete_volume`` the root volume an
        earlier delete kept (:meth:`cloudvm.port.CloudVMApi.delete_kept_volume`); ``volume_deleted`` names it.

        Raises:
            CloudVMError: no owner given (and no operator switch), or the backend refused the volume's deletion.
        """
        if not params.get("delete_volume"):
            return result(None, False, None, diff, warnings)
        owner = params.get("owner") or ""
        if not owner and not params.get("operator"):
            raise CloudVMError(f"owner: required with delete_volume to delete the volume CloudVM "
                               f"{params['namespace']}/{params['name']} kept")
        deleted = self.api.delete_kept_volume(params["namespace"], params["name"], owner,
                                              bool(params.get("operator")), check_mode)
        out = result(None, deleted is not None, None, diff, warnings)
        if deleted is not None:
            out["volume_deleted"] = deleted
        return out

    # ------------------------------------------------------------- reads

    def info(self, params: dict) -> list:
        """CloudVMs matching name / namespace / owner / label_selectors, ordered by namespace and name."""
        items = self.api.list(params.get("namespace"), params.get("name"), params.get("owner"),
                              ",".join(params.get("label_selectors") or []))
        return sorted(items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def authorize_found(self, params: dict, vms: list) -> None:
        """cloudvm_info's ``authorize``: every CloudVM found may be acted on by ``authorize.owner`` (or the
        operator switch) for ``authorize.action``; the backend's own authority is asked first
        (:meth:`cloudvm.port.CloudVMApi.ask_access`), the owner rule (:func:`model.lifecycle.authorize`) then, and a
        refusal is recorded by the backend (:meth:`cloudvm.port.CloudVMApi.record_refusal`).

        Raises:
            CloudVMError: ``reason: Forbidden``, naming both owners.
        """
        auth = params["authorize"]
        access = Access(auth["owner"], bool(auth.get("operator")), auth["action"])
        for vm in vms:
            try:
                self.api.ask_access(vm, access)
                authorize(vm, auth)
            except CloudVMError as exc:
                self.api.record_refusal(vm, access, exc)
                raise
