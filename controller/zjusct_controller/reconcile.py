"""The Kubernetes adapter: read what exists, call :func:`.decide.decide`, carry out the :class:`.decide.Plan`.

Every reconcile reads fresh from the API server (no cache), so a decision is never made on an object older than
the last write of this process: the CloudVM, its launcher Pods (label selector), their Nodes, its root volume
claim, and - only when a Pod is about to be created - the namespace's Pods that mount that claim. Concurrent
reconciles of one VM in this process are serialised by a per-VM lock.
Launcher Pods have deterministic names (:func:`.decide.pod_name`), so a second controller process or a retry
gets ``409 AlreadyExists`` and never makes a second Pod.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from collections import defaultdict
from typing import Any, Optional

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .decide import (
    CLAIMED_BY,
    FINALIZER,
    GROUP,
    LABEL_VM,
    PLURAL,
    ROOT_CLAIM,
    VERSION,
    Config,
    Plan,
    decide,
    needs_volume,
    status_patch,
    transition_event,
)
from .metrics import Metrics

log = logging.getLogger("zjusct_controller")
REQUEST_TIMEOUT = 30  # seconds, every API call
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
        self._count_requests(api_client)

    def _count_requests(self, api_client: Any) -> None:
        """Count every request of this client in ``zjusct_controller_api_requests_total{method}``."""
        inner = api_client.call_api
        counter = self.metrics.api_requests

        def call_api(method: str, *args: Any, **kwargs: Any) -> Any:
            counter.labels(method=str(method).upper()).inc()
            return inner(method, *args, **kwargs)

        api_client.call_api = call_api

    def _plain(self, obj: Any) -> Any:
        return self.api_client.sanitize_for_serialization(obj)

    def _lock(self, ns: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks[(ns, name)]

    # ------------------------------------------------------------------ reads

    def _get_vm(self, ns: str, name: str) -> Optional[dict]:
        try:
            return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name,
                                                                 _request_timeout=REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _read(self, vm: dict) -> tuple[list, dict, Optional[dict]]:
        """The VM's launcher Pods (label selector), their Nodes and its root volume claim."""
        ns, name = vm["metadata"]["namespace"], vm["metadata"]["name"]
        claim_name = (vm.get("spec") or {}).get("rootVolumeClaim")
        pods = [self._plain(p) for p in self.core.list_namespaced_pod(
            ns, label_selector=f"{LABEL_VM}={name}", _request_timeout=REQUEST_TIMEOUT).items]
        nodes: dict[str, Optional[dict]] = {}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node and node not in nodes:
                try:
                    nodes[node] = self._plain(self.core.read_node(node, _request_timeout=REQUEST_TIMEOUT))
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    nodes[node] = None
        claim = None
        if claim_name:
            try:
                claim = self._plain(self.core.read_namespaced_persistent_volume_claim(
                    claim_name, ns, _request_timeout=REQUEST_TIMEOUT))
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return pods, nodes, claim

    def _root_volume(self, claim: Optional[dict]) -> Optional[dict]:
        """The PersistentVolume a Bound claim names (``spec.volumeName``), or None when it has none or is gone.
        Read only when :func:`.decide.needs_volume` says so (a Block claim about to get a launcher Pod)."""
        pv_name = ((claim or {}).get("spec") or {}).get("volumeName")
        if not pv_name:
            return None
        try:
            return dict(self._plain(self.core.read_persistent_volume(pv_name, _request_timeout=REQUEST_TIMEOUT)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _claim_writers(self, vm: dict) -> list[str]:
        """Names of Pods in the VM's namespace, not its own launchers, that have not ended and mount its root volume
        claim or name it in their ``cloud.zjusct.io/root-claim`` annotation (launchers of RBD root disks, which
        do not mount the claim). One namespace-wide list, made only when a launcher Pod is about to be created."""
        ns, name = vm["metadata"]["namespace"], vm["metadata"]["name"]
        claim_name = (vm.get("spec") or {}).get("rootVolumeClaim")
        writers = []
        # raw JSON: the typed models' deserialization costs ~10x the transfer for a namespace of many Pods
        resp = self.core.list_namespaced_pod(ns, _request_timeout=REQUEST_TIMEOUT, _preload_content=False)
        for p in json.loads(resp.data).get("items", []):
            md, spec, st = p.get("metadata") or {}, p.get("spec") or {}, p.get("status") or {}
            if (md.get("labels") or {}).get(LABEL_VM) == name or st.get("phase") in ("Succeeded", "Failed"):
                continue
            mounted = any((vol.get("persistentVolumeClaim") or {}).get("claimName") == claim_name
                          for vol in spec.get("volumes") or [])
            if mounted or (md.get("annotations") or {}).get(ROOT_CLAIM) == claim_name:
                writers.append(md.get("name", ""))
        return writers

    # ------------------------------------------------------------------ one reconcile

    def _remember(self, kind: str, ns: str, name: str, written: Any) -> None:
        rv = written["metadata"]["resourceVersion"] if isinstance(written, dict) else written.metadata.resource_version
        seen = self._own_rv[(kind, ns, name)]
        if len(seen) >= 8:
            seen.clear()
        seen.add(rv)

    def own_write(self, kind: str, ns: str, name: str, resource_version: Optional[str]) -> bool:
        """True when a watch event of a CloudVM (``kind`` ``cloudvm``) or launcher Pod (``pod``) shows exactly an
        object one of our own writes produced: nothing new to observe (any other change has its own event)."""
        return resource_version is not None and resource_version in self._own_rv.get((kind, ns, name), set())

    def reconcile(self, ns: str, name: str) -> Optional[Plan]:
        """Reconcile one CloudVM; returns the plan carried out (None when the CloudVM does not exist).

        Raises:
            ApiException: an API call failed (kopf logs it; the next event or resync retries).
        """
        with self._lock(ns, name):
            self.metrics.reconciles.inc()
            try:
                return self._reconcile(ns, name)
            except Exception:
                self.metrics.errors.inc()
                raise

    def _reconcile(self, ns: str, name: str) -> Optional[Plan]:
        vm = self._get_vm(ns, name)
        if vm is None:
            self.metrics.set_phase((ns, name), None)
            self._own_rv.pop(("cloudvm", ns, name), None)
            return None
        pods, nodes, claim = self._read(vm)
        volume = self._root_volume(claim) if needs_volume(vm, claim) else None
        plan = decide(vm, pods, nodes, claim, [], self.cfg, now_rfc3339(), volume)
        if plan.create_pod is not None:  # only now: is the claim used by any other Pod?
            writers = self._claim_writers(vm)
            if writers:
                plan = decide(vm, pods, nodes, claim, writers, self.cfg, now_rfc3339(), volume)
        rv = vm["metadata"]["resourceVersion"]
        if plan.add_finalizer:
            finalizers = [*(vm["metadata"].get("finalizers") or []), FINALIZER]
            vm = self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, {"metadata": {"finalizers": finalizers, "resourceVersion": rv}},
                _request_timeout=REQUEST_TIMEOUT)
            self._remember("cloudvm", ns, name, vm)
        for pod, grace in plan.delete_pods:
            log.info("deleting launcher Pod %s/%s (grace %d s)", ns, pod, grace)
            try:
                self.core.delete_namespaced_pod(pod, ns, grace_period_seconds=grace,
                                                _request_timeout=REQUEST_TIMEOUT)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        if plan.mark_claim and claim is not None:
            self.core.patch_namespaced_persistent_volume_claim(
                claim["metadata"]["name"], ns,
                {"metadata": {"annotations": {CLAIMED_BY: vm["metadata"]["uid"]},
                              "resourceVersion": claim["metadata"]["resourceVersion"]}},
                _request_timeout=REQUEST_TIMEOUT)
        if plan.create_pod is not None:
            try:
                created = self.core.create_namespaced_pod(ns, plan.create_pod, _request_timeout=REQUEST_TIMEOUT)
                self._remember("pod", ns, plan.create_pod["metadata"]["name"], created)
                log.info("created launcher Pod %s/%s", ns, plan.create_pod["metadata"]["name"])
                self.metrics.pods_created.inc()
            except ApiException as exc:
                if exc.status != 409:
                    raise
                log.info("launcher Pod %s/%s exists already", ns, plan.create_pod["metadata"]["name"])
        if plan.status is not None:
            prev = dict(vm.get("status") or {})
            patch = status_patch(prev, plan.status)
            if patch is not None:
                written = self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, ns, PLURAL, name, {"status": patch}, _request_timeout=REQUEST_TIMEOUT)
                self._remember("cloudvm", ns, name, written)
                event = transition_event(prev, plan.status)
                if event is not None:
                    self._event(vm, *event)
                if plan.status.get("phase") == "Running" and (prev.get("phase"), prev.get("bootID")) != (
                        "Running", plan.status.get("bootID")):
                    created = next((p["metadata"].get("creationTimestamp") for p in pods
                                    if p["metadata"]["name"] == plan.status.get("pod")), None)
                    self.metrics.became_running(vm, int(plan.status.get("bootID") or 0), created)
            self.metrics.set_phase((ns, name), plan.status.get("phase"))
        if plan.remove_finalizer:
            finalizers = [f for f in vm["metadata"].get("finalizers") or [] if f != FINALIZER]
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name,
                {"metadata": {"finalizers": finalizers, "resourceVersion": vm["metadata"]["resourceVersion"]}},
                _request_timeout=REQUEST_TIMEOUT)
        return plan

    def _event(self, vm: dict, kind: str, reason: str, message: str) -> None:
        md = vm["metadata"]
        now = datetime.datetime.now(datetime.UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{md['name']}.", namespace=md["namespace"]),
            involved_object=client.V1ObjectReference(api_version=f"{GROUP}/{VERSION}", kind="CloudVM",
                                                     name=md["name"], namespace=md["namespace"], uid=md["uid"]),
            reason=reason, message=message, type=kind, first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component=COMPONENT), reporting_component=COMPONENT)
        try:
            self.core.create_namespaced_event(md["namespace"], body, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:  # an Event is best effort; the status is the record
            log.warning("event for %s/%s not written: %s", md["namespace"], md["name"], exc.reason)

    # ------------------------------------------------------------------ fan-out

    def _watched(self, ns: str) -> bool:
        return not self.namespaces or ns in self.namespaces

    def all_vms(self) -> list[tuple[str, str]]:
        """``(namespace, name)`` of every CloudVM in the watched namespaces (for the periodic resync)."""
        got = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=REQUEST_TIMEOUT)
        return [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in got.get("items", [])
                if self._watched(o["metadata"]["namespace"])]

    def vms_on_node(self, node: str) -> list[tuple[str, str]]:
        """``(namespace, VM name)`` of the launcher Pods bound to ``node`` in the watched namespaces."""
        pods = self.core.list_pod_for_all_namespaces(label_selector=LABEL_VM, field_selector=f"spec.nodeName={node}",
                                                     _request_timeout=REQUEST_TIMEOUT).items
        return sorted({(p.metadata.namespace, p.metadata.labels[LABEL_VM]) for p in pods
                       if self._watched(p.metadata.namespace)})
