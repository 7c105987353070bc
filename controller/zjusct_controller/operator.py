"""The kopf handlers: every watch event of a CloudVM, Pod, PersistentVolumeClaim, Node or CloudQuota is first put
into the reconciler's caches (:mod:`.cache`); then every event of a CloudVM or of a launcher Pod, every change of a
Node's readiness, a claim's change and a non-launcher Pod letting go of a claim lead to
:meth:`Reconciler.reconcile` of the CloudVMs concerned; a resync thread relists the caches and reconciles every
CloudVM each ``resync`` seconds as a safety net.

VMs whose last reconcile was refused (a quota, an admission, :attr:`.decide.Plan.refused`) or failed are retried
by a retry thread with backoff (:meth:`Reconciler.due`), and at once when what refused them may have changed
(:meth:`Reconciler.waiting`): a CloudQuota of their owner changed, another CloudVM of their owner changed or went, a
Pod of their namespace ended or went, a ResourceQuota or LimitRange of their namespace changed.

The handlers are stateless ``on.event`` handlers: kopf writes no annotations or finalizers of its own; the
controller's finalizer (:data:`.decide.FINALIZER`) is managed by the reconcile itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Optional

import kopf
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import node_ready, out_of_service
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import CRD_PLURAL as QUOTA_PLURAL
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION

from .cache import plain, pod_claims
from .pod import LABEL_VM
from .reconcile import Reconciler

log = logging.getLogger("zjusct_controller")
_state: dict[str, Any] = {}
MAX_WORKERS = 32  # kopf's handler threads: reconciles wait on the API server (5 round trips each), not on CPU
RETRY_TICK_S = 1.0  # how often the retry thread looks for due retries


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff-base that keeps nothing: these handlers are all ``on.event`` (no create/update/field handlers), so
    kopf's per-event "essence" of the body is never used. Its default storage deep-copies every watched body on
    every event before any handler runs - a fifth of the controller's CPU at 1,000 VMs (docs/benchmarks.md,
    Profiles), all on the one asyncio thread that dispatches the events."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """An empty essence (no deep copy)."""
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> Optional[kopf.BodyEssence]:
        """No essence was ever stored."""
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Nothing is stored (no annotation is written)."""


def install(reconciler: Reconciler, resync_s: float) -> None:
    """Register the handlers for ``reconciler`` (call once, before ``kopf.run``)."""
    _state["reconciler"] = reconciler
    _state["resync_s"] = resync_s
    _state["stop"] = threading.Event()

    @kopf.on.startup()
    def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # our own Events (per transition), not kopf's per-handler ones
        settings.watching.server_timeout = 300
        settings.execution.max_workers = MAX_WORKERS
        settings.persistence.diffbase_storage = NoDiffBase()
        _state["executor"] = settings.execution.executor
        reconciler.relist()  # the caches are complete before the first event's reconcile
        threading.Thread(target=_resync_loop, name="resync", daemon=True).start()
        threading.Thread(target=_retry_loop, name="retry", daemon=True).start()

    @kopf.on.cleanup()
    def _cleanup(**_: Any) -> None:
        _state["stop"].set()

    # The handlers are coroutines: the cache update and the own-write check (memory only) run on kopf's event
    # loop, and only a reconcile goes to a handler thread - most events (the echoes of our own writes, Pods that
    # are not launchers) cost no thread hand-off.
    @kopf.on.event(GROUP, VERSION, PLURAL)
    async def _cloudvm(namespace: Optional[str], name: Optional[str], event: Any, **_: Any) -> None:
        obj = plain(event["object"])
        reconciler.observe("cloudvm", event.get("type"), obj)
        if namespace and name and not reconciler.own_write("cloudvm", namespace, name,
                                                           obj["metadata"].get("resourceVersion")):
            await _in_thread(reconciler.reconcile, namespace, name)
            # a stop, a shrink or a delete of one of the owner's VMs may free what another's boot waits for
            owner = (obj.get("spec") or {}).get("owner")
            waiting = [k for k in reconciler.waiting(owner=owner) if k != (namespace, name)] if owner else []
            if waiting:
                await _in_thread(_reconcile_all, reconciler, waiting)

    # every Pod (not only launcher Pods): the cache's claim index needs the Pods that mount a claim
    @kopf.on.event("", "v1", "pods")
    async def _pod(namespace: Optional[str], name: Optional[str], event: Any, **_: Any) -> None:
        obj = plain(event["object"])
        if not reconciler.observe("pod", event.get("type"), obj) or not namespace:
            return
        vm = (obj["metadata"].get("labels") or {}).get(LABEL_VM)
        if vm:
            if not reconciler.own_write("pod", namespace, name or "", obj["metadata"].get("resourceVersion")):
                await _in_thread(reconciler.reconcile, namespace, vm)
            if event.get("type") == "DELETED":  # its requests no longer count against the namespace's quota
                await _in_thread(_reconcile_all, reconciler, reconciler.waiting(namespace=namespace))
            return
        ended = event.get("type") == "DELETED" or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if ended:  # a Pod that held a root volume claim let go of it: the VMs blocked on it may start
            await _in_thread(_reconcile_claim_users, reconciler, namespace, pod_claims(obj))
            await _in_thread(_reconcile_all, reconciler, reconciler.waiting(namespace=namespace))

    @kopf.on.event("", "v1", "persistentvolumeclaims")
    async def _claim(namespace: Optional[str], name: Optional[str], event: Any, **_: Any) -> None:
        obj = plain(event["object"])
        if (reconciler.observe("claim", event.get("type"), obj) and namespace and name
                and not reconciler.own_write("claim", namespace, name, obj["metadata"].get("resourceVersion"))):
            await _in_thread(_reconcile_claim_users, reconciler, namespace, (name,))

    @kopf.on.event(GROUP, VERSION, QUOTA_PLURAL)
    async def _quota(name: Optional[str], event: Any, **_: Any) -> None:
        # an owner's limits changed (raised, lowered, removed): the boots waiting on them are admitted or not now
        if reconciler.observe("quota", event.get("type"), plain(event["object"])) and name:
            await _in_thread(_reconcile_all, reconciler, reconciler.waiting(owner=name))

    # a namespace's ResourceQuota or LimitRange changed: the launcher Pods it refused may be created now
    @kopf.on.event("", "v1", "resourcequotas")
    async def _resource_quota(namespace: Optional[str], **_: Any) -> None:
        if namespace:
            await _in_thread(_reconcile_all, reconciler, reconciler.waiting(namespace=namespace))

    @kopf.on.event("", "v1", "limitranges")
    async def _limit_range(namespace: Optional[str], **_: Any) -> None:
        if namespace:
            await _in_thread(_reconcile_all, reconciler, reconciler.waiting(namespace=namespace))

    ready_seen: dict[str, tuple[Optional[bool], bool]] = {}

    @kopf.on.event("", "v1", "nodes")
    async def _node(name: Optional[str], type: Optional[str], event: Any, **_: Any) -> None:
        # Node status heartbeats are frequent; only a change of readiness or of the out-of-service taint (the
        # operator's statement that the node is off: fencing) or a deleted Node concerns the VMs.
        if not name:
            return
        body = plain(event["object"])
        reconciler.observe("node", type, body)
        ready = (None, False) if type == "DELETED" else (node_ready(body), out_of_service(body))
        if name in ready_seen and ready_seen[name] == ready:
            return
        first = name not in ready_seen
        ready_seen[name] = ready
        if first and ready == (True, False):
            return  # a Ready node seen for the first time changes nothing
        await _in_thread(lambda: _reconcile_all(reconciler, reconciler.vms_on_node(name)))


async def _in_thread(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in kopf's handler thread pool (the reconciles block on the API server)."""
    return await asyncio.get_running_loop().run_in_executor(_state.get("executor"), fn, *args)


def _reconcile_all(reconciler: Reconciler, vms: list[tuple[str, str]]) -> None:
    """Reconcile each ``(namespace, name)`` in turn."""
    for ns, vm in vms:
        reconciler.reconcile(ns, vm)


def _reconcile_claim_users(reconciler: Reconciler, namespace: str, claims: Any) -> None:
    """Reconcile the CloudVMs of ``namespace`` whose root volume claim is one of ``claims``."""
    for claim in claims:
        _reconcile_all(reconciler, reconciler.vms_using_claim(namespace, claim))


def _retry_loop() -> None:
    """Reconcile each VM whose retry is due (:meth:`Reconciler.due`) every :data:`RETRY_TICK_S`."""
    reconciler: Reconciler = _state["reconciler"]
    while not _state["stop"].wait(RETRY_TICK_S):
        for ns, name in reconciler.due():
            try:
                reconciler.reconcile(ns, name)
            except Exception as exc:  # booked by reconcile for its next retry
                log.warning("retry of %s/%s failed: %s", ns, name, exc)


def _resync_loop() -> None:
    reconciler: Reconciler = _state["reconciler"]
    while not _state["stop"].wait(_state["resync_s"]):
        try:
            reconciler.relist()  # repairs the caches (a missed DELETED event), as an informer's relist
            for ns, name in reconciler.all_vms():
                reconciler.reconcile(ns, name)
        except Exception as exc:  # the next round retries; kopf's watch keeps running
            log.warning("resync failed: %s", exc)
