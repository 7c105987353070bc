# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a CloudVM status that says Running is backed by its launcher Pod (Kubernetes backend; pure).

On Kubernetes the status is written by the controller alone. When the controller cannot write (its only replica
was on a node that was lost together with the VM's launcher Pod) the last status stays, and a VM whose guest is
gone keeps saying Running. Kubernetes keeps a second, independent record: the launcher Pod named in ``status.pod``.
The controller derives Running from that Pod's ``Ready`` condition (the launcher's readiness probe passes once the
guest's SSH banner answered, docs/controller.md "Status"), kube-controller-manager's node lifecycle controller sets
``Ready`` to False on every Pod of a node that stops reporting (``MarkPodsNotReady``; it keeps the condition's old
reason, usually none), and a deleted Pod is gone (404). :func:`doubt` compares the two, for the ``cloudvm`` module's
waits, ``cloudvm_info`` and the inventory plugin.

Shapes: ``status`` is a CloudVM status dict (``phase``, ``bootID``, ``pod``); a Pod is a dict in the API's JSON
shape (``metadata.name``, ``metadata.deletionTimestamp``, ``spec.nodeName``, ``status.conditions``,
``status.reason``, ``status.message``), None when it does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

# the launcher Pods' label, as the controller sets it (controller/zjusct_controller/pod.py, launcher_pod)
LAUNCHER_SELECTOR = "app.kubernetes.io/name=zjusct-launcher"
NOT_RECORDED = "the controller has not recorded that (it may be down or unable to update the status)"


@dataclass(frozen=True)
class Doubt:
    """Why a status that says Running cannot be trusted.

    Attributes:
        reason: ``LauncherPodGone``, ``LauncherPodTerminating`` or ``LauncherPodNotReady`` (CamelCase, like the
            status reasons; the inventory reports it in place of the status reason).
        message: one sentence for a person, naming the Pod (and its node when it has one).
    """

    reason: str
    message: str


def claimed_pod(status: Optional[dict]) -> Optional[str]:
    """The launcher Pod a status that says Running names (``status.pod``), None when the status does not say Running
    or names no Pod (nothing to check: our controller names the Pod in every status of a boot it started)."""
    status = status or {}
    if status.get("phase") != "Running" or not status.get("pod"):
        return None
    return str(status["pod"])


def slim(pod: dict) -> dict:
    """The part of a Pod dict :func:`doubt` reads (a listing keeps only this, so a large list stays small)."""
    md, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return {"metadata": {k: md[k] for k in ("name", "namespace", "deletionTimestamp") if md.get(k)},
            "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
            "status": {"conditions": [c for c in st.get("conditions") or [] if c.get("type") == "Ready"],
                       **{k: st[k] for k in ("reason", "message") if st.get(k)}}}


def _ready(pod: dict) -> Optional[dict]:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return dict(cond)
    return None


def doubt(namespace: str, status: Optional[dict], pod: Optional[dict]) -> Optional[Doubt]:
    """Why ``status`` (a CloudVM's, in ``namespace``), which says Running, cannot be trusted given its launcher Pod
    ``pod`` as just read (None: the API server answered 404), or None when it can.

    The rule (the module docstring): a Running status is backed only by its launcher Pod :func:`claimed_pod` existing,
    not being deleted, and having the condition ``Ready=True``. None as well when the status does not say Running or
    names no Pod (:func:`claimed_pod`), so there is nothing to compare. Pure.
    """
    name = claimed_pod(status)
    if name is None:
        return None
    if pod is None:
        return Doubt("LauncherPodGone", f"status says Running but launcher Pod {namespace}/{name} is gone; "
                                        f"{NOT_RECORDED}")
    node = (pod.get("spec") or {}).get("nodeName")
    where = f"on node {node}" if node else "(bound to no node)"
    deleted = (pod.get("metadata") or {}).get("deletionTimestamp")
    if deleted:
        return Doubt("LauncherPodTerminating", f"status says Running but launcher Pod {name} {where} is being "
                                               f"deleted (since {deleted}); {NOT_RECORDED}")
    ready = _ready(pod)
    if ready is not None and ready.get("status") == "True":
        return None
    pod_status = pod.get("status") or {}
    if ready is None:
        why = "no Ready condition"
    else:
        why = ready.get("reason") or pod_status.get("reason") or f"Ready={ready.get('status') or 'Unknown'}"
        message = ready.get("message") or pod_status.get("message")
        why += f": {message}" if message else ""
        why += f", since {ready['lastTransitionTime']}" if ready.get("lastTransitionTime") else ""
    return Doubt("LauncherPodNotReady", f"status says Running but launcher Pod {name} is not Ready ({why}) {where}: "
                                        "its node may have stopped reporting (kube-controller-manager then marks "
                                        f"every Pod of the node not Ready) or the launcher's readiness probe fails; "
                                        f"{NOT_RECORDED}")


def doubts(vms: Iterable[dict], pods: Mapping[tuple[str, str], dict]) -> dict[tuple[str, str], Doubt]:
    """:func:`doubt` of each CloudVM dict of ``vms`` whose status says Running and names its launcher Pod, given the
    launcher Pods listed in its namespace, ``pods`` = ``{(namespace, name): Pod dict}`` (a Pod missing from it is
    gone: list only namespaces whose Pods could be read, and pass only their VMs). Returns ``{(namespace, vm name):
    Doubt}`` of the VMs with one. Pure."""
    out: dict[tuple[str, str], Doubt] = {}
    for vm in vms:
        status = vm.get("status") or {}
        pod = claimed_pod(status)
        if pod is None:
            continue
        md = vm.get("metadata") or {}
        ns = md.get("namespace", "")
        found = doubt(ns, status, pods.get((ns, pod)))
        if found is not None:
            out[(ns, md.get("name", ""))] = found
    return out
