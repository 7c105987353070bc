"""The kopf handlers: every event of a CloudVM, of a launcher Pod or of a Node leads to :meth:`Reconciler.reconcile`
of the CloudVMs concerned; a resync thread reconciles every CloudVM each ``resync`` seconds as a safety net.

The handlers are stateless ``on.event`` handlers: kopf writes no annotations or finalizers of its own; the
controller's finalizer (:data:`.decide.FINALIZER`) is managed by the reconcile itself.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

import kopf

from .decide import GROUP, LABEL_VM, PLURAL, VERSION
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
    def _cloudvm(namespace: Optional[str], name: Optional[str], type: Optional[str], **_: Any) -> None:
        if namespace and name:
            reconciler.reconcile(namespace, name)

    @kopf.on.event("", "v1", "pods", labels={LABEL_VM: kopf.PRESENT})
    def _pod(namespace: Optional[str], labels: Any, **_: Any) -> None:
        vm = (labels or {}).get(LABEL_VM)
        if namespace and vm:
            reconciler.reconcile(namespace, vm)

    @kopf.on.event("", "v1", "nodes")
    def _node(name: Optional[str], type: Optional[str], **_: Any) -> None:
        if name:
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
