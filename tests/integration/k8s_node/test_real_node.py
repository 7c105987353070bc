"""Pods on a real kubelet + containerd node of the test control plane.

Each test creates its own Pods in its own namespace and waits for the very state it asserts (API watch/poll).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.stream import stream

from tests.cluster import CONTROL_PLANE_WAIT, RealNode, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet]


def busybox_pod(node: RealNode, name: str, script: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            **node.pod_placement(),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": str(node.images["busybox"]), "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", script]}],
            **spec,
        },
    }


def wait_phase(core: Any, ns: str, name: str, phases: set[str], timeout: float = 120) -> Any:
    """Watch the Pod until its phase is one of ``phases``; return the Pod."""
    w = watch.Watch()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for event in w.stream(core.list_namespaced_pod, ns, field_selector=f"metadata.name={name}",
                                  timeout_seconds=max(1, int(deadline - time.monotonic()))):
                pod = event["object"]
                if pod.status and pod.status.phase in phases:
                    return pod
    finally:
        w.stop()
    pod = core.read_namespaced_pod(name, ns)
    raise AssertionError(f"pod {ns}/{name} not in {phases} after {timeout}s: {pod.status}")


def test_node_is_ready_with_real_kubelet_version_and_runtime(real_node: RealNode, k8s_api: Any) -> None:
    node: Any = client.CoreV1Api(k8s_api).read_node(real_node.name)
    info = node.status.node_info
    assert info.kubelet_version == f"v{real_node.binaries.k8s_version}"
    assert info.container_runtime_version.startswith("containerd://")
    assert {a.type: a.address for a in node.status.addresses}["InternalIP"] == real_node.ip
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    # tainted: Pods of other tests (scheduling onto node-a/node-b) never land on the real node
    assert [(t.key, t.effect) for t in node.spec.taints] == [("cloud.zjusct.io/real-node", "NoSchedule")]


def test_pod_runs_and_succeeds_with_its_exit_code(real_node: RealNode, k8s_api: Any, k8s_namespace: str) -> None:
    core: Any = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod(k8s_namespace, busybox_pod(real_node, "ok", "test -f /etc/passwd && exit 0"))
    core.create_namespaced_pod(k8s_namespace, busybox_pod(real_node, "bad", "exit 3"))
    ok = wait_phase(core, k8s_namespace, "ok", {"Succeeded", "Failed"})
    bad = wait_phase(core, k8s_namespace, "bad", {"Succeeded", "Failed"})
    assert ok.status.phase == "Succeeded", ok.status
    assert ok.spec.node_name == real_node.name and ok.status.host_ip == real_node.ip
    assert bad.status.phase == "Failed"
    assert bad.status.container_statuses[0].state.terminated.exit_code == 3


def test_logs_and_exec_through_the_api_server(real_node: RealNode, k8s_api: Any, k8s_namespace: str) -> None:
    core: Any = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod(
        k8s_namespace, busybox_pod(real_node, "talk", "echo zjusct-log-line; exec sleep 3600")
    )
    running = wait_phase(core, k8s_namespace, "talk", {"Running"})
    assert running.status.pod_ip.startswith("10.233.0.")  # from the node's CNI bridge
    logs = wait_for(
        lambda: "zjusct-log-line" in core.read_namespaced_pod_log("talk", k8s_namespace), CONTROL_PLANE_WAIT,
        "the log line",
    )
    assert logs
    out = stream(core.connect_get_namespaced_pod_exec, "talk", k8s_namespace,
                 command=["/bin/sh", "-c", "echo exec-$((6*7)); hostname"], stderr=True, stdin=False,
                 stdout=True, tty=False)
    assert out.splitlines() == ["exec-42", "talk"]


def test_a_second_real_node_on_the_machine_waits_for_the_lock(real_node: RealNode) -> None:
    second = RealNode(real_node.cluster_state_dir, name="second-node", lock_timeout=1)
    with pytest.raises(TimeoutError, match=f"work {real_node.work}"):
        second.start()
    assert not second.work.exists()
