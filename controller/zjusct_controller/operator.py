"""The kopf handlers: every event of a CloudVM or of a launcher Pod, and every change of a Node's readiness, leads to
:meth:`Reconciler.reconcile` of the CloudVMs concerned; a resync thread reconciles every CloudVM each ``resync``
seconds as a safety net.

The handlers are stateless ``on.event`` handlers: kopf writes no annotations or finalizers of its own; the
controller's finalizer (:data:`.decide.FINALIZER`) is managed by the reconcile itself.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

import kopf

from .decide import GROUP, LABEL_VM, PLURAL, VERSION, node_ready
from .reconcile import Reconciler

log = logging.getLogger("zjusct_controller")
_state: dict[str, Any] = {}


def install(reconciler: Reconciler, resync_s: float) -> None:
    """Register the handlers for ``reconciler`` (call once, before ``kopf.run``)."""
    _state["reconciler"] = reconciler
    _state["resync_s"] = resync_s
    _state["stop"] = threading.Event()

    @kopf.on.startup()
    def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # our own Events (per transition), not kopf's per-handler ones
        settings.watching.server_timeout = 300
        threading.Thread(target=_resync_loop, name="resync", daemon=True).start()

    @kopf.on.cleanup()
    def _cleanup(**_: Any) -> None:
        _state["stop"].set()

    @kopf.on.event(GROUP, VERSION, PLURAL)
    def _cloudvm(namespace: Optional[str], name: Optional[str], type: Optional[str], meta: Any, **_: Any) -> None:
        if namespace and name and not reconciler.own_write("cloudvm", namespace, name,
                                                           (meta or {}).get("resourceVersion")):
            reconciler.reconcile(namespace, name)

    @kopf.on.event("", "v1", "pods", labels={LABEL_VM: kopf.PRESENT})
    def _pod(namespace: Optional[str], name: Optional[str], labels: Any, meta: Any, **_: Any) -> None:
        vm = (labels or {}).get(LABEL_VM)
        version = (meta or {}).get("resourceVersion")
        if namespace and vm and not reconciler.own_write("pod", namespace, name or "", version):
            reconciler.reconcile(namespace, vm)

    ready_seen: dict[str, Optional[bool]] = {}

    @kopf.on.event("", "v1", "nodes")
    def _node(name: Optional[str], type: Optional[str], body: Any, **_: Any) -> None:
        # Node status heartbeats are frequent; only a change of readiness (or a deleted Node) concerns the VMs.
        if not name:
            return
        ready = None if type == "DELETED" else node_ready(dict(body))
        if name in ready_seen and ready_seen[name] == ready:
            return
        first = name not in ready_seen
        ready_seen[name] = ready
        if first and ready:
            return  # a Ready node seen for the first time changes nothing (each reconcile reads Nodes itself)
        for ns, vm in reconciler.vms_on_node(name):
            reconciler.reconcile(ns, vm)


def _resync_loop() -> None:
    reconciler: Reconciler = _state["reconciler"]
    while not _state["stop"].wait(_state["resync_s"]):
        try:
            for ns, name in reconciler.all_vms():
                reconciler.reconcile(ns, name)
        except Exception as exc:  # the next round retries; kopf's watch keeps running
            log.warning("resync failed: %s", exc)
