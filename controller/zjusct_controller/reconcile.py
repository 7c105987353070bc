"""The Kubernetes adapter: read what exists, call :func:`.decide.decide`, carry out the :class:`.decide.Plan`.

A reconcile reads the watch-fed caches of :mod:`.cache` (no API read per reconcile): the CloudVM, its launcher
Pods, their Nodes, its root volume claim, and - only when a Pod is about to be created - the claim index (Pods
that mount that claim). The caches are primed with one LIST per kind before the first reconcile and relisted at
each resync; every write's response goes back into them, so a reconcile never sees an object older than this
process's own last write of it. Why no fresh read is needed before a create is explained in docs/controller.md
(Reconciliation: stale caches): launcher Pods have deterministic names (:func:`.pod.pod_name`), so a second
controller process or a retry gets ``409 AlreadyExists`` and never makes a second Pod; the claim mark is written
with the claim's resourceVersion (a stale cache gets ``409 Conflict``). Concurrent reconciles of one VM in this
process are serialised by a per-VM lock.

Admission (docs/security.md, "Quotas on Kubernetes"): a boot's launcher Pod is created only within the owner's
CloudQuota (:func:`model.quota.check_boot`), counted over the owner's cached CloudVMs in every watched namespace
plus the boots this process admitted itself (a create whose answer was lost is still counted), under a per-owner
lock held from the count to the create's answer, so two boots of one owner are never admitted on the same count.

Refusals: a write the API server refuses for good (HTTP 400, 403, 422: a ResourceQuota or LimitRange, an admission
policy, Pod Security, RBAC, an invalid object; :func:`.refusal.api_refusal`) ends the reconcile in a status that
says so (:func:`.decide.refuse`: ``Blocked/QuotaExceeded`` or ``Blocked/Refused`` for the boot's own writes, the
reason alone for a stop's or a delete's) and a Warning Event, not in an exception; the VM is retried with backoff
(:meth:`Reconciler.due`) and at once when what refused it may have changed (:meth:`Reconciler.waiting`).
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import threading
import time
from collections import defaultdict
from typing import Any, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import CRD_PLURAL as QUOTA_PLURAL
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import (
    Counted,
    Refusal,
    admitted_boot,
    check_boot,
    claim_mib,
    limits_from_spec,
    root_volume_mib,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .cache import Store
from .config import Config
from .decide import FINALIZER, Plan, decide, needs_volume, refuse, status_patch, transition_event
from .fence import FenceError, Fencer
from .metrics import Metrics
from .observe import boot_of
from .pod import LABEL_BOOT, POD_FINALIZER
from .refusal import QUOTA_EXCEEDED, REFUSAL_REASONS, REFUSED, api_refusal, retry_delay
from .volume import CLAIMED_BY

log = logging.getLogger("zjusct_controller")
REQUEST_TIMEOUT = 30  # seconds, every API call; the modules' is k8s/client.py's REQUEST_TIMEOUT (same value)
CONFLICT_RETRIES = 3  # reconciles of one VM in a row after a 409 Conflict on a stale cached object
COMPONENT = "zjusct-controller"


def now_rfc3339() -> str:
    """The current UTC time, RFC 3339 with a ``Z`` and whole seconds (as the API server writes times)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    """Reconciles CloudVMs against launcher Pods through one ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: Any, cfg: Config, metrics: Optional[Metrics] = None,
                 namespaces: tuple[str, ...] = ()) -> None:
        """``namespaces``: the only namespaces acted on (empty: all), as the ``--namespace`` options."""
        self.api_client = api_client
        # Any: the typed models are turned into plain dicts (sanitize_for_serialization) at once
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.cfg = cfg
        self.namespaces = frozenset(namespaces)
        # resourceVersions our own writes produced (CloudVM finalizer/status patches, launcher Pod creates), per
        # object: their watch events echo what this process already knows
        self._own_rv: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        self._locks: dict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()
        self.metrics = metrics or Metrics()
        self.store = Store()
        self.fencer = Fencer(cfg.ceph) if cfg.ceph is not None and cfg.ceph.fence_user else None
        self._prime_lock = threading.Lock()
        # the boot this process admitted last per VM: (uid, bootID), counted until the caches show it
        self._admitted: dict[tuple[str, str], tuple[str, int]] = {}
        self._owner_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._counted_memo: dict[tuple[str, str], tuple[tuple, Counted]] = {}  # (ns, name) -> (key, counted)
        # VMs whose last reconcile was refused or failed: (ns, name) -> (owner, attempts, due on the monotonic clock)
        self._retry: dict[tuple[str, str], tuple[str, int, float]] = {}
        self._retry_lock = threading.Lock()
        self.monotonic = time.monotonic
        self._count_requests(api_client)

    def _count_requests(self, api_client: Any) -> None:
        """Count every request of this client in ``zjusct_controller_api_requests_total{method}``."""
        inner = api_client.call_api
        counter = self.metrics.api_requests

        def call_api(method: str, *args: Any, **kwargs: Any) -> Any:
            counter.labels(method=str(method).upper()).inc()
            return inner(method, *args, **kwargs)

        api_client.call_api = call_api

    def _lock(self, ns: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks[(ns, name)]

    def _owner_lock(self, owner: str) -> threading.Lock:
        with self._locks_guard:
            return self._owner_locks[owner]

    # ------------------------------------------------------------------ reads (the caches)

    def _raw(self, call: Any, *args: Any, **kwargs: Any) -> dict:
        """``call(*args, **kwargs)`` answered as a plain dict (JSON parsed, no typed-model deserialization)."""
        resp = call(*args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs)
        return json.loads(resp.data)

    def _send(self, call: Any, *args: Any, **kwargs: Any) -> None:
        """``call(*args, **kwargs)`` whose answer is not needed: read to the end, so that the connection goes back
        to the pool (an unread ``_preload_content=False`` response keeps it: the next request then opens a new
        connection and pays a TLS handshake)."""
        resp = call(*args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs)
        resp.data  # noqa: B018 - reading to the end releases the connection (urllib3)

    def relist(self) -> None:
        """LIST every kind the reconciles read (in the watched namespaces; Nodes and CloudQuotas cluster-wide)
        into the caches: at start-up, before the first reconcile, and at each resync (drops objects whose DELETED
        event was missed). Five to ``3 * namespaces + 2`` requests, not per VM. Without the CloudQuota CRD (404) no
        owner has a quota.

        Raises:
            ApiException: a LIST failed.
        """
        lists: list[tuple[str, Any, tuple]] = [("node", self.core.list_node, ()),
                                               ("quota", self.custom.list_cluster_custom_object,
                                                (GROUP, VERSION, QUOTA_PLURAL))]
        scopes: list[Optional[str]] = [*sorted(self.namespaces)] or [None]
        for ns in scopes:
            if ns is None:
                lists += [("cloudvm", self.custom.list_cluster_custom_object, (GROUP, VERSION, PLURAL)),
                          ("pod", self.core.list_pod_for_all_namespaces, ()),
                          ("claim", self.core.list_persistent_volume_claim_for_all_namespaces, ())]
            else:
                lists += [("cloudvm", self.custom.list_namespaced_custom_object, (GROUP, VERSION, ns, PLURAL)),
                          ("pod", self.core.list_namespaced_pod, (ns,)),
                          ("claim", self.core.list_namespaced_persistent_volume_claim, (ns,))]
        got: dict[str, list] = defaultdict(list)
        versions: dict[str, Optional[str]] = {}
        for kind, call, args in lists:
            try:
                doc = self._raw(call, *args)
            except ApiException as exc:
                if kind != "quota" or exc.status != 404:
                    raise
                doc = {"items": [], "metadata": {}}  # the CloudQuota CRD is not installed: no quota exists
            got[kind] += doc.get("items") or []
            versions[kind] = min((v for v in (versions.get(kind), (doc.get("metadata") or {}).get(
                "resourceVersion")) if v), key=lambda v: int(v) if v.isdigit() else 0, default=None)
        for kind, items in got.items():
            self.store.replace(kind, items, versions.get(kind),
                               None if kind in ("node", "quota") or not self.namespaces else self.namespaces)
        log.debug("caches listed: %s", self.store.sizes())

    def _ensure_primed(self) -> None:
        with self._prime_lock:
            if not all(self.store.primed(k) for k in ("cloudvm", "pod", "claim", "node", "quota")):
                self.relist()

    def observe(self, kind: str, event_type: Optional[str], obj: dict) -> bool:
        """Feed one watch event (``kind`` one of :data:`.cache.KINDS`) into the caches; True when it changed
        them. Objects of namespaces this controller does not watch are ignored."""
        ns = (obj.get("metadata") or {}).get("namespace")
        if kind not in ("node", "quota") and ns and not self._watched(ns):
            return False
        return self.store.apply(kind, event_type, obj)

    def _read(self, vm: dict) -> tuple[list, dict, Optional[dict]]:
        """The VM's launcher Pods, their Nodes and the one its status names, and its root volume claim, from the
        caches."""
        ns, name = vm["metadata"]["namespace"], vm["metadata"]["name"]
        claim_name = (vm.get("spec") or {}).get("rootVolumeClaim")
        pods = self.store.launcher_pods(ns, name)
        nodes: dict[str, Optional[dict]] = {}
        for node in [(p.get("spec") or {}).get("nodeName") for p in pods] + [(vm.get("status") or {}).get("node")]:
            if node and node not in nodes:
                nodes[node] = self.store.get("node", "", node)
        claim = self.store.get("claim", ns, claim_name) if claim_name else None
        return pods, nodes, claim

    def _root_volume(self, claim: Optional[dict]) -> Optional[dict]:
        """The PersistentVolume a Bound claim names (``spec.volumeName``), or None when it has none or is gone.
        Read only when :func:`.decide.needs_volume` says so (a Bound claim about to get a launcher Pod: its owner
        mark, and for a Block claim the RBD image)."""
        pv_name = ((claim or {}).get("spec") or {}).get("volumeName")
        if not pv_name:
            return None
        try:
            return self._raw(self.core.read_persistent_volume, pv_name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _claim_writers(self, vm: dict) -> list[str]:
        """Names of Pods in the VM's namespace, not its own launchers, that mount its root volume claim and have
        not ended: a lookup in the claim index kept from the Pod watch (a Pod uses a claim when it mounts it or
        names it in its ``cloud.zjusct.io/root-claim`` annotation, as launchers of RBD root disks do)."""
        claim_name = (vm.get("spec") or {}).get("rootVolumeClaim")
        if not claim_name:
            return []
        return self.store.claim_users(vm["metadata"]["namespace"], claim_name, except_vm=vm["metadata"]["name"])

    # ------------------------------------------------------------------ one reconcile

    def _remember(self, kind: str, ns: str, name: str, written: Any) -> None:
        rv = written["metadata"]["resourceVersion"]
        seen = self._own_rv[(kind, ns, name)]
        if len(seen) >= 8:
            seen.clear()
        seen.add(rv)

    def own_write(self, kind: str, ns: str, name: str, resource_version: Optional[str]) -> bool:
        """True when a watch event of a CloudVM (``kind`` ``cloudvm``), launcher Pod (``pod``) or claim
        (``claim``) shows exactly an object one of our own writes produced: nothing new to observe (any other
        change has its own event)."""
        return resource_version is not None and resource_version in self._own_rv.get((kind, ns, name), set())

    def reconcile(self, ns: str, name: str) -> Optional[Plan]:
        """Reconcile one CloudVM; returns the plan carried out (None when the CloudVM does not exist).

        A ``409 Conflict`` on a write made with a cached object's resourceVersion (the cache was behind) reads
        that object fresh into the cache and reconciles again, up to :data:`CONFLICT_RETRIES` times. A reconcile
        that met a refusal (``Plan.refused``) or raised is retried with backoff (:meth:`due`).

        Raises:
            ApiException: an API call failed (kopf logs it; the retry, the next event or the resync retries). A
                CloudVM deleted since the cache saw it (404 on its patch) is not an error: None is returned. A
                refused write is not an error either: the status says why.
        """
        self._ensure_primed()
        with self._lock(ns, name):
            self.metrics.reconciles.inc()
            try:
                for attempt in range(CONFLICT_RETRIES):
                    try:
                        plan = self._reconcile(ns, name)
                    except _Gone:
                        self.metrics.set_phase((ns, name), None)
                        self._settled(ns, name, None)
                        return None
                    except _Stale as stale:
                        if attempt == CONFLICT_RETRIES - 1:
                            raise stale.exc from None
                        self._refresh(stale.kind, ns, stale.name)
                        continue
                    self._settled(ns, name, plan)
                    return plan
                return None  # not reached
            except Exception:
                self.metrics.errors.inc()
                self._settled(ns, name, "failed")
                raise

    # ------------------------------------------------------------------ retries

    def _settled(self, ns: str, name: str, outcome: Any) -> None:
        """Book the outcome of one reconcile: a refusal (``Plan.refused``) or a failure (``"failed"``) schedules
        the VM's next retry after :func:`.refusal.retry_delay` of its attempts in a row; anything else clears it."""
        key = (ns, name)
        with self._retry_lock:
            if not (outcome == "failed" or (isinstance(outcome, Plan) and outcome.refused)):
                self._retry.pop(key, None)
                return
            vm = self.store.get("cloudvm", ns, name) or {}
            owner = str((vm.get("spec") or {}).get("owner") or "")
            attempts = self._retry.get(key, ("", 0, 0.0))[1] + 1
            self._retry[key] = (owner, attempts, self.monotonic() + retry_delay(attempts))

    def due(self) -> list[tuple[str, str]]:
        """``(namespace, name)`` of the VMs whose retry is due now (the operator's retry loop reconciles them)."""
        now = self.monotonic()
        with self._retry_lock:
            return sorted(k for k, (_owner, _n, at) in self._retry.items() if at <= now)

    def waiting(self, owner: Optional[str] = None, namespace: Optional[str] = None) -> list[tuple[str, str]]:
        """``(namespace, name)`` of the VMs waiting for a retry whose owner is ``owner`` or whose namespace is
        ``namespace`` (either matches): what a freed quota (a VM of that owner stopped, a Pod of that namespace
        gone, a CloudQuota, ResourceQuota or LimitRange changed) may let start now."""
        with self._retry_lock:
            return sorted(k for k, (o, _n, _at) in self._retry.items()
                          if (owner is not None and o == owner) or (namespace is not None and k[0] == namespace))

    def _refresh(self, kind: str, ns: str, name: str) -> None:
        """Read one CloudVM or claim fresh into the cache (after a Conflict)."""
        try:
            if kind == "cloudvm":
                obj = self._raw(self.custom.get_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name)
            else:
                obj = self._raw(self.core.read_namespaced_persistent_volume_claim, name, ns)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.store.forget(kind, ns, name)
            return
        self.store.apply(kind, None, obj)

    def _patch_vm(self, ns: str, name: str, body: dict) -> dict:
        try:
            vm = self._raw(self.custom.patch_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name, body)
        except ApiException as exc:
            if exc.status == 409:
                raise _Stale("cloudvm", name, exc) from exc
            if exc.status == 404:  # deleted since the cache saw it: its DELETED event follows
                self.store.forget("cloudvm", ns, name)
                raise _Gone(name) from exc
            raise
        self.store.apply("cloudvm", None, vm)
        self._remember("cloudvm", ns, name, vm)
        return vm

    def _reconcile(self, ns: str, name: str) -> Optional[Plan]:
        vm = self.store.get("cloudvm", ns, name)
        if vm is None:
            self.metrics.set_phase((ns, name), None)
            self._own_rv.pop(("cloudvm", ns, name), None)
            self._admitted.pop((ns, name), None)
            self._counted_memo.pop((ns, name), None)
            return None
        pods, nodes, claim = self._read(vm)
        volume = self._root_volume(claim) if needs_volume(vm, claim) else None
        # the claim's other users are looked up only when a launcher Pod would be created otherwise
        plan = decide(vm, pods, nodes, claim, functools.partial(self._claim_writers, vm), self.cfg, now_rfc3339(),
                      volume)
        if plan.add_finalizer:
            finalizers = [*(vm["metadata"].get("finalizers") or []), FINALIZER]
            try:
                vm = self._patch_vm(ns, name, {"metadata": {"finalizers": finalizers,
                                                            "resourceVersion": vm["metadata"]["resourceVersion"]}})
            except ApiException as exc:
                refusal = api_refusal(exc.status, exc.body, f"the finalizer {FINALIZER} of CloudVM {ns}/{name}")
                if refusal is None:
                    raise
                # no launcher Pod without the finalizer; a VM not starting keeps its phase
                plan = refuse(vm, plan, *refusal, now_rfc3339(), starting=plan.create_pod is not None)
        refused_delete: Optional[tuple[str, str]] = None
        for pod, grace in plan.delete_pods:
            log.info("deleting launcher Pod %s/%s (grace %d s)", ns, pod, grace)
            try:
                self._send(self.core.delete_namespaced_pod, pod, ns, grace_period_seconds=grace)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                refused_delete = refused_delete or api_refusal(exc.status, exc.body,
                                                               f"the deletion of launcher Pod {ns}/{pod}")
                if refused_delete is None:
                    raise
        for target in plan.fence:
            self._fence(vm, target)
        for pod, uid, finalizers in plan.release_pods:
            self._release(ns, pod, uid, finalizers)
        if plan.create_pod is not None:
            plan = self._start(vm, plan, plan.create_pod, claim)
        if refused_delete is not None:
            plan = refuse(vm, plan, *refused_delete, now_rfc3339(), starting=False)
        if plan.status is not None:
            self._write_status(vm, pods, plan, plan.status)
        if plan.remove_finalizer:
            finalizers = [f for f in vm["metadata"].get("finalizers") or [] if f != FINALIZER]
            try:
                self._patch_vm(ns, name, {"metadata": {"finalizers": finalizers,
                                                       "resourceVersion": vm["metadata"]["resourceVersion"]}})
            except ApiException as exc:
                refusal = api_refusal(exc.status, exc.body,
                                      f"the removal of the finalizer {FINALIZER} of CloudVM {ns}/{name}")
                if refusal is None:
                    raise
                plan = refuse(vm, plan, *refusal, now_rfc3339(), starting=False)
                if plan.status is not None:
                    self._write_status(vm, pods, plan, plan.status)
        return plan

    def _start(self, vm: dict, plan: Plan, pod: dict, claim: Optional[dict]) -> Plan:
        """Admit and start the boot of the launcher Pod ``pod`` (``plan.create_pod``): under the owner's lock, the
        owner's quota (:meth:`_quota_refusal`), the claim mark, the Pod create. Returns ``plan``, or the refused plan
        (:func:`.decide.refuse`) when the quota or the API server refused."""
        md = vm["metadata"]
        ns, name = md["namespace"], md["name"]
        owner = str((vm.get("spec") or {}).get("owner") or "")
        with self._owner_lock(owner):
            over = self._quota_refusal(vm)
            if over is not None:
                log.info("CloudVM %s/%s: boot refused: %s", ns, name, over.message)
                return refuse(vm, plan, QUOTA_EXCEEDED, over.message, now_rfc3339())
            if plan.mark_claim and claim is not None:
                claim_name = claim["metadata"]["name"]
                try:  # the claim's resourceVersion makes this a compare-and-swap: the lock among CloudVMs
                    marked = self._raw(self.core.patch_namespaced_persistent_volume_claim, claim_name, ns,
                                       {"metadata": {"annotations": {CLAIMED_BY: md["uid"]},
                                                     "resourceVersion": claim["metadata"]["resourceVersion"]}})
                except ApiException as exc:
                    if exc.status == 409:
                        raise _Stale("claim", claim_name, exc) from exc
                    refusal = api_refusal(exc.status, exc.body,
                                          f"the claim mark {CLAIMED_BY} on the root volume claim {ns}/{claim_name}")
                    if refusal is None:
                        raise
                    return refuse(vm, plan, *refusal, now_rfc3339())
                self.store.apply("claim", None, marked)
                self._remember("claim", ns, claim_name, marked)
            pod_name = pod["metadata"]["name"]
            before = self._admitted.get((ns, name))
            # counted from now on, also when the create's answer is lost (the Pod may exist)
            self._admitted[(ns, name)] = (md["uid"], int(pod["metadata"]["labels"][LABEL_BOOT]))
            try:
                created = self._raw(self.core.create_namespaced_pod, ns, pod)
            except ApiException as exc:
                if exc.status == 409:
                    log.info("launcher Pod %s/%s exists already", ns, pod_name)
                    return plan
                refusal = api_refusal(exc.status, exc.body, f"the launcher Pod {ns}/{pod_name}")
                if refusal is None:
                    raise
                if before is None:
                    self._admitted.pop((ns, name), None)
                else:
                    self._admitted[(ns, name)] = before
                log.info("CloudVM %s/%s: %s", ns, name, refusal[1])
                return refuse(vm, plan, *refusal, now_rfc3339())
            self.store.apply("pod", None, created)
            self._remember("pod", ns, pod_name, created)
            log.info("created launcher Pod %s/%s", ns, pod_name)
            self.metrics.pods_created.inc()
        return plan

    def _counted(self, vm: dict, booting: bool = False) -> Counted:
        """One CloudVM as its owner's quota counts it: the boot admitted last is the greatest of its status'
        (:func:`model.quota.admitted_boot`), its cached launcher Pods' and this process' own admission. Memoised
        per VM on its and its claim's resourceVersions and this process' admission (a boot's check counts every VM
        of the owner); the launcher Pods are looked at only when the status does not already show ``spec.bootID``
        admitted (no Pod of a later boot can exist). The claim's size is read for an admitted VM, and for the VM
        ``booting`` (what its boot would add)."""
        md, spec = vm["metadata"], vm.get("spec") or {}
        ns, name = md["namespace"], md["name"]
        claim_name = str(spec.get("rootVolumeClaim") or "")
        claim = self.store.get("claim", ns, claim_name) if claim_name else None
        own = self._admitted.get((ns, name))
        own_boot = own[1] if own is not None and own[0] == md.get("uid") else None
        status_boot = admitted_boot(vm.get("status"))
        boot = int(spec.get("bootID") or 0)
        conclusive = status_boot is not None and status_boot >= boot
        key = (md.get("resourceVersion"), (claim or {}).get("metadata", {}).get("resourceVersion"), own_boot)
        memo = self._counted_memo.get((ns, name))
        if conclusive and memo is not None and memo[0] == key:
            return memo[1]
        boots = [status_boot, own_boot]
        if not conclusive:
            boots += [boot_of(p) for p in self.store.launcher_pods(ns, name)]
        known = [b for b in boots if b is not None]
        admitted = max(known) if known else None
        size = root_volume_mib(claim, spec) if admitted is not None or booting else 0
        counted = Counted(spec, admitted, (ns, claim_name), size,
                          held_disk_mib=claim_mib(claim) if admitted is not None or booting else 0)
        if conclusive and not booting:
            self._counted_memo[(ns, name)] = (key, counted)
        return counted

    def _quota_refusal(self, vm: dict) -> Optional[Refusal]:
        """Whether the owner's CloudQuota (cached; none: unlimited) refuses the VM's boot ``spec.bootID``, counted
        over the owner's CloudVMs in the watched namespaces (:func:`model.quota.check_boot`). Call under the
        owner's lock."""
        md, spec = vm["metadata"], vm.get("spec") or {}
        owner = str(spec.get("owner") or "")
        quota = self.store.get("quota", "", owner)
        if quota is None:
            return None
        key = (md["namespace"], md["name"])
        others = [self._counted(o) for o in self.store.owned_by(owner)
                  if (o["metadata"]["namespace"], o["metadata"]["name"]) != key]
        return check_boot(owner, limits_from_spec(quota.get("spec")), others, self._counted(vm, booting=True), *key)

    def _write_status(self, vm: dict, pods: list, plan: Plan, status: dict) -> None:
        """Write ``status`` (``plan.status``; a merge patch of what changed), its transition Event, the metrics. A
        status the API server refuses is a Warning Event and a retry (``plan.refused``); its reason and message
        alone are written instead when that is accepted."""
        md = vm["metadata"]
        ns, name = md["namespace"], md["name"]
        prev = dict(vm.get("status") or {})
        patch = status_patch(prev, status)
        if patch is not None:
            try:
                self._patch_status(ns, name, patch)
            except ApiException as exc:
                refusal = api_refusal(exc.status, exc.body, f"the status of CloudVM {ns}/{name}")
                if refusal is None:
                    raise
                log.warning("CloudVM %s/%s: %s", ns, name, refusal[1])
                self._event(vm, "Warning", REFUSED, refusal[1][:1024])
                plan.refused = REFUSED
                try:  # what was refused, in the fields the status always accepts
                    self._patch_status(ns, name, {"reason": REFUSED, "message": refusal[1][:4096],
                                                  "observedGeneration": int(md.get("generation") or 0)})
                except ApiException as again:
                    if api_refusal(again.status, again.body, "") is None:
                        raise
                return
            event = transition_event(prev, status)
            if event is not None:
                self._event(vm, *event)
            if status.get("phase") == "Running" and (prev.get("phase"), prev.get("bootID")) != (
                    "Running", status.get("bootID")):
                created_at = next((p["metadata"].get("creationTimestamp") for p in pods
                                   if p["metadata"]["name"] == status.get("pod")), None)
                self.metrics.became_running(vm, int(status.get("bootID") or 0), created_at)
        if status.get("reason") in REFUSAL_REASONS:
            plan.refused = status["reason"]
        self.metrics.set_phase((ns, name), status.get("phase"))

    def _patch_status(self, ns: str, name: str, patch: dict) -> dict:
        try:
            written = self._raw(self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, ns, PLURAL,
                                name, {"status": patch})
        except ApiException as exc:
            if exc.status == 404:
                self.store.forget("cloudvm", ns, name)
                raise _Gone(name) from exc
            raise
        self.store.apply("cloudvm", None, written)
        self._remember("cloudvm", ns, name, written)
        return written

    def _fence(self, vm: dict, target: dict) -> None:
        """Blocklist the RBD client of an old launcher Pod on an out-of-service node (:mod:`.fence`), then, only
        if that succeeded, force-delete the Pod (grace 0, preconditioned on its uid): its DELETED event lets
        the next reconcile create the new boot's Pod. A failed fence keeps the Pod (the new boot stays blocked,
        the next event or resync tries again) and is a Warning Event ``FenceFailed``."""
        ns = vm["metadata"]["namespace"]
        if self.fencer is None:  # decide plans no fence without the identity; kept as a guard
            return
        try:
            addresses = self.fencer.fence(target)
        except FenceError as exc:
            log.warning("%s", exc)
            self._event(vm, "Warning", "FenceFailed", str(exc)[:1024])
            return
        self._event(vm, "Warning", "Fenced", f"launcher Pod {target['pod']} on the out-of-service node "
                    f"{target['node']}: RBD client blocklisted ({', '.join(addresses) or 'no client left'}); "
                    "the Pod is force-deleted")
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": target["uid"]}} if target.get("uid") else None
        try:
            self.core.delete_namespaced_pod(target["pod"], ns, grace_period_seconds=0, body=body,
                                            _request_timeout=REQUEST_TIMEOUT, _preload_content=False)
        except ApiException as exc:
            refusal = api_refusal(exc.status, exc.body, f"the force-deletion of launcher Pod {ns}/{target['pod']}")
            if refusal is not None:  # the old client is blocklisted; the new boot waits for the Pod to go
                log.warning("%s", refusal[1])
                self._event(vm, "Warning", "FenceFailed", refusal[1][:1024])
                return
            if exc.status not in (404, 409):  # gone already, or another Pod of that name (uid precondition)
                raise
        log.info("force-deleted launcher Pod %s/%s after the fence", ns, target["pod"])
        pod = self.store.get("pod", ns, target["pod"]) or {}
        pmd = pod.get("metadata") or {}
        if POD_FINALIZER in (pmd.get("finalizers") or []) and pmd.get("uid") == target.get("uid") and \
                self._release(ns, target["pod"], pmd.get("uid"), list(pmd["finalizers"])):
            # force-deleted and released: gone from the API now, so out of the cache before its DELETED event
            # (a reconcile in between would fence it again)
            self.store.forget("pod", ns, target["pod"])

    def _release(self, ns: str, pod: str, uid: Optional[str], finalizers: list) -> bool:
        """Remove :data:`.pod.POD_FINALIZER` from the launcher Pod ``ns/pod`` (a JSON patch that first tests the
        Pod's uid and ``finalizers`` as read, so it neither touches a newer Pod of that name nor drops another
        controller's finalizer added since). A Pod gone or changed since (404, 409, 422: the test failed) is left
        to the next reconcile, which reads it again; any other refusal is logged and also retried then. Returns
        whether the finalizer was removed."""
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []
        kept = [f for f in finalizers if f != POD_FINALIZER]
        ops += [{"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                {"op": "replace", "path": "/metadata/finalizers", "value": kept}]
        try:
            self._send(self.core.patch_namespaced_pod, pod, ns, ops)
        except ApiException as exc:
            if exc.status in (404, 409, 422):
                return False
            refusal = api_refusal(exc.status, exc.body, f"the removal of the finalizer {POD_FINALIZER} of launcher "
                                                        f"Pod {ns}/{pod}")
            if refusal is None:
                raise
            log.warning("%s", refusal[1])
            return False
        log.info("released launcher Pod %s/%s (finalizer %s removed)", ns, pod, POD_FINALIZER)
        return True

    def _event(self, vm: dict, kind: str, reason: str, message: str) -> None:
        md = vm["metadata"]
        now = now_rfc3339()
        body = {"metadata": {"generateName": f"{md['name']}.", "namespace": md["namespace"]},
                "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "name": md["name"],
                                   "namespace": md["namespace"], "uid": md["uid"]},
                "reason": reason, "message": message, "type": kind, "firstTimestamp": now, "lastTimestamp": now,
                "count": 1, "source": {"component": COMPONENT}, "reportingComponent": COMPONENT}
        try:
            self._send(self.core.create_namespaced_event, md["namespace"], body)
        except ApiException as exc:  # an Event is best effort; the status is the record
            log.warning("event for %s/%s not written: %s", md["namespace"], md["name"], exc.reason)

    # ------------------------------------------------------------------ fan-out

    def _watched(self, ns: str) -> bool:
        return not self.namespaces or ns in self.namespaces

    def all_vms(self) -> list[tuple[str, str]]:
        """``(namespace, name)`` of every cached CloudVM in the watched namespaces (for the periodic resync,
        after :meth:`relist`)."""
        self._ensure_primed()
        return [k for k in self.store.keys("cloudvm") if self._watched(k[0])]

    def vms_on_node(self, node: str) -> list[tuple[str, str]]:
        """``(namespace, VM name)`` of the cached launcher Pods bound to ``node`` in the watched namespaces."""
        self._ensure_primed()
        return [k for k in self.store.launchers_on_node(node) if self._watched(k[0])]

    def vms_using_claim(self, ns: str, claim: str) -> list[tuple[str, str]]:
        """``(namespace, name)`` of the cached CloudVMs in ``ns`` whose ``spec.rootVolumeClaim`` is ``claim``."""
        return [(n, v) for n, v in self.store.keys("cloudvm") if n == ns and (
            (self.store.get("cloudvm", n, v) or {}).get("spec") or {}).get("rootVolumeClaim") == claim]


class _Gone(Exception):
    """The CloudVM was deleted since the cache saw it (404 on a write)."""


class _Stale(Exception):
    """A write made with a cached resourceVersion got 409 Conflict: the cache of ``kind``/``name`` was behind."""

    def __init__(self, kind: str, name: str, exc: ApiException) -> None:
        super().__init__(f"{kind} {name}: {exc.reason}")
        self.kind, self.name, self.exc = kind, name, exc
