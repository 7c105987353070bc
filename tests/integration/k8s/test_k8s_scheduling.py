"""The real kube-scheduler binds Pods to registered Nodes by capacity, including the bandwidth
extended resource, and the harness plays the kubelet's API role (no kubelet runs here)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import BANDWIDTH_RESOURCE, CONTROL_PLANE_WAIT, Cluster, wait_for

pytestmark = pytest.mark.k8s

NODES = {"node-a", "node-b"}


def _bound_node(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    pod = core.read_namespaced_pod(name, ns)
    return pod.spec.node_name


def _failed_scheduling(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    """Message of the scheduler's FailedScheduling event for the Pod, if any."""
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}")
    for ev in events.items:
        if ev.reason == "FailedScheduling":
            return str(ev.message)
    return None


def _scheduling_outcome(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    """``"FailedScheduling: <message>"`` once the scheduler refused the Pod, ``"bound to <node>"`` once it bound
    it, else None: a wait for a refusal ends (and its assertion says so) when the scheduler binds instead."""
    message = _failed_scheduling(core, ns, name)
    if message:
        return f"FailedScheduling: {message}"
    node = _bound_node(core, ns, name)
    return f"bound to {node}" if node else None


def _refusal(core: client.CoreV1Api, ns: str, name: str) -> str:
    """Wait for the scheduler's verdict on Pod ``name`` and return its FailedScheduling message.

    Raises:
        AssertionError: the scheduler bound the Pod instead.
        TimeoutError: no verdict within CONTROL_PLANE_WAIT seconds.
    """
    outcome = wait_for(
        lambda: _scheduling_outcome(core, ns, name), CONTROL_PLANE_WAIT, f"the scheduler's verdict on {name}"
    )
    assert outcome.startswith("FailedScheduling: "), f"{name} was expected to be unschedulable but is {outcome}"
    return outcome.removeprefix("FailedScheduling: ")


def _pod_scheduled(core: client.CoreV1Api, ns: str, name: str) -> Any:
    """The Pod's PodScheduled condition once the scheduler has written one, else None."""
    pod = core.read_namespaced_pod(name, ns)
    return next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)


def test_pod_is_bound_to_a_node_with_room(k8s_api: Any, k8s_namespace: str, make_pod: Any) -> None:
    core = client.CoreV1Api(k8s_api)
    make_pod("fits", {"cpu": "500m", "memory": "256Mi", BANDWIDTH_RESOURCE: "100"})
    node = wait_for(lambda: _bound_node(core, k8s_namespace, "fits"), CONTROL_PLANE_WAIT, "pod bound")
    assert node in NODES
    pod = core.read_namespaced_pod("fits", k8s_namespace)
    scheduled = {c.type: c.status for c in pod.status.conditions}
    assert scheduled.get("PodScheduled") == "True"
    assert pod.status.phase == "Pending"  # nothing runs it: no kubelet


def test_pod_stays_pending_without_bandwidth(k8s_api: Any, k8s_namespace: str, make_pod: Any) -> None:
    core = client.CoreV1Api(k8s_api)
    make_pod("too-much-bw", {"cpu": "100m", BANDWIDTH_RESOURCE: "5000"})  # each node has 1000
    # The scheduler records an unschedulable Pod twice, in two separate writes: a FailedScheduling event and a
    # patch of the Pod's PodScheduled condition. Wait for each of them before asserting on it.
    message = _refusal(core, k8s_namespace, "too-much-bw")
    assert f"Insufficient {BANDWIDTH_RESOURCE}" in message
    assert "0/2 nodes are available" in message
    cond = wait_for(
        lambda: _pod_scheduled(core, k8s_namespace, "too-much-bw"), CONTROL_PLANE_WAIT, "PodScheduled condition"
    )
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    assert f"Insufficient {BANDWIDTH_RESOURCE}" in (cond.message or "")
    pod = core.read_namespaced_pod("too-much-bw", k8s_namespace)
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"


def test_bandwidth_is_accounted_across_bound_pods(k8s_api: Any, k8s_namespace: str, make_pod: Any) -> None:
    """Two 600 Mbit/s Pods fill both 1000 Mbit/s nodes; a third one cannot fit anywhere."""
    core = client.CoreV1Api(k8s_api)
    bw = {"cpu": "100m", BANDWIDTH_RESOURCE: "600"}
    make_pod("bw-1", bw)
    first = wait_for(lambda: _bound_node(core, k8s_namespace, "bw-1"), CONTROL_PLANE_WAIT, "bw-1 bound")
    make_pod("bw-2", bw)
    second = wait_for(lambda: _bound_node(core, k8s_namespace, "bw-2"), CONTROL_PLANE_WAIT, "bw-2 bound")
    assert {first, second} == NODES
    make_pod("bw-3", bw)
    message = _refusal(core, k8s_namespace, "bw-3")
    assert f"2 Insufficient {BANDWIDTH_RESOURCE}" in message
    # freeing capacity lets the scheduler bind the waiting Pod
    core.delete_namespaced_pod("bw-1", k8s_namespace, grace_period_seconds=0)
    bound = wait_for(lambda: _bound_node(core, k8s_namespace, "bw-3"), CONTROL_PLANE_WAIT, "bw-3 bound, bw-1 gone")
    assert bound == first


def test_pod_stays_pending_without_cpu(k8s_api: Any, k8s_namespace: str, make_pod: Any) -> None:
    core = client.CoreV1Api(k8s_api)
    make_pod("too-much-cpu", {"cpu": "64"})
    message = _refusal(core, k8s_namespace, "too-much-cpu")
    assert "Insufficient cpu" in message


def test_kubelet_stand_in_reports_pod_status(
    k8s_cluster: Cluster, k8s_api: Any, k8s_namespace: str, make_pod: Any
) -> None:
    """Where a test needs a Pod to have run, the node's own identity writes its status, as a kubelet would."""
    core = client.CoreV1Api(k8s_api)
    make_pod("runs", {"cpu": "100m"})
    node = wait_for(lambda: _bound_node(core, k8s_namespace, "runs"), CONTROL_PLANE_WAIT, "pod bound")
    other = (NODES - {node}).pop()
    # the Node authorizer refuses status writes from a node the Pod is not bound to
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(k8s_cluster.api_client(other)).patch_namespaced_pod_status(
            "runs", k8s_namespace, {"status": {"phase": "Running"}}
        )
    assert err.value.status == 403
    kubelet = k8s_cluster.kubelet(node)
    pod = kubelet.mark_running(k8s_namespace, "runs")
    assert pod.status.phase == "Running"
    assert pod.status.container_statuses[0].ready is True
    result = json.dumps({"kind": "LauncherResult", "reason": "GuestShutdown", "exitCode": 0})
    pod = kubelet.mark_terminated(k8s_namespace, "runs", exit_code=0, message=result)
    assert pod.status.phase == "Succeeded"
    assert json.loads(pod.status.container_statuses[0].state.terminated.message)["reason"] == "GuestShutdown"


def test_lost_node_is_tainted_and_avoided(
    k8s_cluster: Cluster, k8s_api: Any, k8s_namespace: str, make_pod: Any
) -> None:
    """Stopping node-b's heartbeat makes the node lifecycle controller mark it unreachable (case L1)."""
    core = client.CoreV1Api(k8s_api)
    k8s_cluster.stop_heartbeat("node-b")
    try:
        node = k8s_cluster.wait_node_ready(
            "node-b", ready=False, timeout=k8s_cluster.node_grace_seconds + CONTROL_PLANE_WAIT
        )
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready == "Unknown"
        # the node lifecycle controller taints the node in a write of its own after the Ready=Unknown one: a Pod
        # made in between may still be bound there, so wait for the taint the scheduler is to honour
        wait_for(lambda: [t for t in core.read_node("node-b").spec.taints or []
                          if (t.key, t.effect) == ("node.kubernetes.io/unreachable", "NoSchedule")],
                 CONTROL_PLANE_WAIT, "node-b tainted node.kubernetes.io/unreachable:NoSchedule")
        make_pod("wants-b", {"cpu": "100m"}, nodeSelector={"kubernetes.io/hostname": "node-b"})
        message = _refusal(core, k8s_namespace, "wants-b")
        assert "1 node(s) had untolerated taint" in message  # node-b: node.kubernetes.io/unreachable
    finally:
        k8s_cluster.resume_heartbeat("node-b")
    k8s_cluster.wait_node_ready("node-b", ready=True, timeout=CONTROL_PLANE_WAIT)
    bound = wait_for(lambda: _bound_node(core, k8s_namespace, "wants-b"), CONTROL_PLANE_WAIT, "bound, node-b back")
    assert bound == "node-b"
