"""A tenant namespace deleted while it holds CloudVMs (issue 39, input 3), with the owner admission policies applied
and the real controller: the namespace controller's deletes are admitted, the running VM's launcher Pod is stopped
(the kubelet stand-in of tests/cluster plays the node's part: it reports the Pod Running, and once the Pod is being
deleted reports it terminated and removes it, as a kubelet does after the launcher stopped the guest), the
controller releases its finalizers and the namespace is gone. The root volume claims go with the namespace; their
PersistentVolumes (reclaim policy Retain, as root_volume_claim makes them) stay, Released.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import CONTROL_PLANE_WAIT, wait_for
from tests.integration.cloudvm_k8s.cloudvm_helpers import GROUP, PLURAL, VERSION, CloudVMs
from tests.integration.controller_process import Controller

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]

FINALIZER = "cloud.zjusct.io/launcher"
DEADLINE = 300  # seconds for the namespace to go; the namespace controller re-checks every few seconds
STOP_TIMEOUT = 10  # the launcher's stopTimeoutSeconds: the Pods' grace period is 40 s


def _status(cvm_api: CloudVMs, ns: str, name: str) -> dict[str, Any]:
    return dict((cvm_api.get(ns, name) or {}).get("status") or {})


def test_a_namespace_deleted_with_a_running_and_a_stopped_vm_goes_and_keeps_the_volumes(
        start_controller: Callable[..., Controller], k8s_cluster: Any, k8s_api: Any, k8s_namespace: str,
        cvm_api: CloudVMs, bound_claim: Callable[[str, str], str]) -> None:
    ns = k8s_namespace
    core: Any = client.CoreV1Api(k8s_api)
    start_controller(nodeSelector={}, stopTimeoutSeconds=STOP_TIMEOUT)  # launcher Pods go to the test Nodes
    pvs = {vm: bound_claim(f"{vm}-root", "alice") for vm in ("run", "off")}
    cvm_api.create(ns, "run", owner="alice", powerState="Running", bootID=1)
    cvm_api.create(ns, "off", owner="alice", powerState="Stopped")

    def bound() -> Any:
        pods = core.list_namespaced_pod(ns, label_selector="cloud.zjusct.io/vm=run").items
        return pods[0] if pods and pods[0].spec.node_name else None

    pod = wait_for(bound, CONTROL_PLANE_WAIT, "run's launcher Pod bound to a Node")
    kubelet = k8s_cluster.kubelet(pod.spec.node_name)
    kubelet.mark_running(ns, pod.metadata.name)
    wait_for(lambda: _status(cvm_api, ns, "run").get("phase") == "Running", CONTROL_PLANE_WAIT, "run Running")
    wait_for(lambda: _status(cvm_api, ns, "off").get("phase") == "Stopped"
             and FINALIZER in (cvm_api.get(ns, "off") or {})["metadata"].get("finalizers", []), CONTROL_PLANE_WAIT,
             "off Stopped, with the controller's finalizer")
    assert FINALIZER in (cvm_api.get(ns, "run") or {})["metadata"]["finalizers"]

    core.delete_namespace(ns)
    seen: dict[str, Any] = {"stopping": set(), "deleted_vms": set(), "statuses": set()}
    kubelets: dict[str, Any] = {}

    def kubelet_step_and_gone() -> bool:
        """One round of the node's part, then: is the namespace gone? (what was seen is kept for the message)"""
        pods = core.list_namespaced_pod(ns).items
        seen["pods"] = [(p.metadata.name, p.spec.node_name, p.status.phase, bool(p.metadata.deletion_timestamp))
                        for p in pods]
        for p in pods:
            if p.metadata.deletion_timestamp and p.spec.node_name:
                seen["stopping"].add(p.metadata.name)
                result = {"kind": "LauncherResult", "reason": "StopRequested", "exitCode": 0}
                node = kubelets.setdefault(p.spec.node_name, k8s_cluster.kubelet(p.spec.node_name))
                try:
                    if p.status.phase not in ("Succeeded", "Failed"):
                        node.mark_terminated(ns, p.metadata.name, exit_code=0, message=json.dumps(result))
                    # the kubelet's final delete of a Pod whose containers ended
                    node.core.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0,
                                                    body=client.V1DeleteOptions(grace_period_seconds=0,
                                                    preconditions=client.V1Preconditions(uid=p.metadata.uid)))
                except (ApiException, ValueError) as exc:  # gone meanwhile (404, 409), or no longer bound
                    seen["kubelet"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        for vm in client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
            if vm["metadata"].get("deletionTimestamp"):
                seen["deleted_vms"].add(vm["metadata"]["name"])
            st = vm.get("status") or {}
            seen["statuses"].add((vm["metadata"]["name"], st.get("phase"), st.get("reason")))
        try:
            namespace = core.read_namespace(ns)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        seen["conditions"] = [(c.type, c.status, c.message) for c in namespace.status.conditions or []
                              if c.status == "True"]
        return False

    try:
        wait_for(kubelet_step_and_gone, DEADLINE, f"namespace {ns} deleted", interval=1.0)
    except TimeoutError as exc:
        raise AssertionError(f"namespace {ns} still there after {DEADLINE} s; last seen: {seen}") from exc
    assert pod.metadata.name in seen["stopping"], seen  # the running VM's launcher was stopped through the node
    # the namespace controller deletes the Pods first, the CloudVMs once they are gone (OrderedNamespaceDeletion):
    # meanwhile the controller reports the running VM's launcher lost
    assert ("run", "Failed", "LauncherLost") in seen["statuses"], seen
    assert client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"] == []
    assert core.list_namespaced_pod(ns).items == []
    # the kept volumes: the claims went with the namespace, each PV stays (Retain), Released, naming its old claim
    for vm, pv_name in pvs.items():
        pv = wait_for(lambda pv_name=pv_name: (lambda v: v if v.status.phase == "Released" else None)(  # type: ignore[misc]
            core.read_persistent_volume(pv_name)), CONTROL_PLANE_WAIT, f"PV {pv_name} Released")
        assert pv.spec.persistent_volume_reclaim_policy == "Retain"
        assert (pv.spec.claim_ref.namespace, pv.spec.claim_ref.name) == (ns, f"{vm}-root")
        assert pv.metadata.labels["cloud.zjusct.io/owner"] == "alice"

    # the way back that docs/security.md gives the operator: the namespace made anew, the claim again, the PV's
    # claimRef.uid removed - the volume binds to the new claim
    wait_for(lambda: core.create_namespace({"metadata": {"name": ns, "labels": {"cloud.zjusct.io/test": "true"}}}),
             CONTROL_PLANE_WAIT, f"namespace {ns} created again")
    core.create_namespaced_persistent_volume_claim(ns, {
        "metadata": {"name": "run-root", "labels": {"cloud.zjusct.io/owner": "alice"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pvs["run"],
                 "resources": {"requests": {"storage": "1Gi"}}}})
    core.patch_persistent_volume(pvs["run"], [{"op": "remove", "path": "/spec/claimRef/uid"}],
                                 _content_type="application/json-patch+json")
    wait_for(lambda: core.read_namespaced_persistent_volume_claim("run-root", ns).status.phase == "Bound",
             CONTROL_PLANE_WAIT, "the kept volume bound to the new claim")
