"""Reading a launcher Pod: which boot it runs (:func:`boot_of`), what its launcher is doing
(:func:`observe`, a :class:`model.phase.BootObservation`), whether the scheduler cannot place it
(:func:`unschedulable`), whether it is being evicted (:func:`moved_away`), which RBD image its launcher opens
(:func:`pod_rbd`) and whether its finalizer may go (:func:`releasable`). Pure: the Pods are read by :mod:`.reconcile`.
"""

from __future__ import annotations

import json
from typing import Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model.phase import BootObservation

from .pod import CONFIG_ANNOTATION, CONTAINER, LABEL_BOOT

# A launcher Pod deleted so that its VM runs elsewhere: the API server's DisruptionTarget condition reasons
# (k8s.io/api core/v1 PodReasonEvictionByEvictionAPI - kubectl drain, kubernetes.core.k8s_drain, any Eviction -
# and PodReasonDeletionByTaintManager - a NoExecute taint the launcher does not tolerate). The VM keeps its bootID:
# once the old Pod is gone the controller creates the boot's Pod again, and the scheduler places it on another node
# (docs/controller.md, Drain).
MOVE_REASONS = ("EvictionByEvictionAPI", "DeletionByTaintManager")


def boot_of(pod: dict) -> Optional[int]:
    """The bootID a launcher Pod runs (its label), or None when the label is missing or not an integer."""
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {})[LABEL_BOOT])
    except (KeyError, TypeError, ValueError):
        return None


def _container_state(pod: dict) -> dict:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == CONTAINER:
            return cs.get("state") or {}
    return {}


def _condition(obj: dict, kind: str) -> Optional[dict]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def unschedulable(pod: dict) -> Optional[str]:
    """The scheduler's message when the Pod is not bound and its ``PodScheduled`` condition is False with reason
    ``Unschedulable`` (e.g. "0/3 nodes are available: 1 Insufficient cloud.zjusct.io/bandwidth-mbps, ..."), else
    None."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    cond = _condition(pod, "PodScheduled")
    if cond is None or cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
        return None
    return str(cond.get("message") or "no node fits")


def moved_away(pod: dict) -> Optional[str]:
    """The DisruptionTarget reason (one of :data:`MOVE_REASONS`) when ``pod`` is being deleted so that it runs
    elsewhere (an eviction, the taint manager), else None. The API server sets the condition before it marks the
    Pod deleted (KEP-3329, GA in Kubernetes 1.31)."""
    if not (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    cond = _condition(pod, "DisruptionTarget")
    if cond is None or cond.get("status") != "True" or cond.get("reason") not in MOVE_REASONS:
        return None
    return str(cond["reason"])


def pod_rbd(pod: dict) -> Optional[dict]:
    """The ``rootDisk.rbd`` of the LauncherConfig a launcher Pod carries (annotation :data:`.pod.CONFIG_ANNOTATION`):
    the image that Pod's launcher opens, or None (not RBD, or no readable config)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(CONFIG_ANNOTATION)
    try:
        rbd = ((json.loads(raw or "") or {}).get("rootDisk") or {}).get("rbd")
    except (ValueError, AttributeError):
        return None
    return rbd if isinstance(rbd, dict) and rbd.get("pool") and rbd.get("image") else None


def parse_result(message: Optional[str]) -> Optional[dict]:
    """The LauncherResult in a termination message, or None when it is missing or not one."""
    try:
        doc = json.loads(message or "")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == "LauncherResult" else None


def observe(pod: dict, ready_node: Optional[bool]) -> BootObservation:
    """Reduce one launcher Pod (and its Node's readiness) to a :class:`model.phase.BootObservation`.

    * container terminated (or Pod Succeeded/Failed on a Ready node, or never bound): ``exited`` with the
      LauncherResult of the termination message; without a result (SIGKILL, OOM, the container was killed) ``lost``;
    * Pod bound to a Node that is not Ready (or whose Node is gone): ``unknown`` (the launcher may still run);
    * container running: ``alive``; ``ready_at`` = when the Pod's Ready condition (the launcher's ready marker,
      i.e. the guest's SSH banner answered) became True;
    * otherwise (not yet scheduled, image or volume being set up): ``starting``.
    """
    md, st, spec = pod.get("metadata") or {}, pod.get("status") or {}, pod.get("spec") or {}
    boot = boot_of(pod) or 0
    node = spec.get("nodeName")
    state = _container_state(pod)
    started_at = (state.get("running") or {}).get("startedAt") or (state.get("terminated") or {}).get("startedAt")
    term = state.get("terminated")
    # a terminal phase without a terminated container, on a node that does not answer, is the pod GC's mark before
    # its force-delete (gcTerminating, gcOrphaned), not the kubelet's report: the launcher may still run
    kubelet_terminal = st.get("phase") in ("Succeeded", "Failed") and not (node and ready_node is not True)
    if term is not None or kubelet_terminal:
        term = term or {}
        result = parse_result(term.get("message"))
        if result is not None:
            return BootObservation(boot, "exited", ready_at=result.get("readyAt"), started_at=started_at,
                                   result=result, node=node)
        detail = (f"launcher Pod {md.get('name')} ended without a LauncherResult (container exit code "
                  f"{term.get('exitCode', '-')}, reason {term.get('reason') or st.get('reason') or '-'})")
        return BootObservation(boot, "lost", started_at=started_at, node=node, detail=detail)
    if node and ready_node is not True:
        return BootObservation(boot, "unknown", started_at=started_at, node=node,
                               detail=f"node {node} is {'missing' if ready_node is None else 'not Ready'};"
                                      f" the launcher of boot {boot} cannot be observed")
    if state.get("running") is not None:
        ready = _condition(pod, "Ready")
        ready_at = ready.get("lastTransitionTime") if ready and ready.get("status") == "True" else None
        return BootObservation(boot, "alive", ready_at=ready_at, started_at=started_at, node=node)
    return BootObservation(boot, "starting", node=node)


def releasable(pod: dict, ready_node: Optional[bool]) -> bool:
    """True when a terminating launcher Pod's finalizer :data:`.pod.POD_FINALIZER` may go: its launcher is known to
    have ended, so the Pod is no longer the record of an RBD client that may write.

    Known ended: the kubelet reported the container terminated; or the Pod was never bound to a node; or its node
    is Ready and the kubelet has finished with the Pod (phase Succeeded/Failed, or a deletion with grace period 0,
    which the kubelet on a Ready node carries out by killing what still runs). A Pod bound to a node that is not
    Ready, whose container the kubelet last reported running or starting, is kept: only a fence
    (:func:`.decide.fence_targets`) or the node's return releases it.

    Args:
        pod: the launcher Pod (with ``metadata.deletionTimestamp`` for a True answer).
        ready_node: :func:`model.lifecycle.node_ready` of its node (None: no such Node).
    """
    md, st = pod.get("metadata") or {}, pod.get("status") or {}
    if not md.get("deletionTimestamp"):
        return False
    if _container_state(pod).get("terminated") is not None or not (pod.get("spec") or {}).get("nodeName"):
        return True
    return ready_node is True and (st.get("phase") in ("Succeeded", "Failed")
                                   or md.get("deletionGracePeriodSeconds") == 0)
