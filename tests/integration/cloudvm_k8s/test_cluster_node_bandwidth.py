"""The ``cluster`` role advertises each hypervisor Node's guaranteed bandwidth as the extended resource
``cloud.zjusct.io/bandwidth-mbps`` (module ``zjusct.cloud.k8s_node_resources``, a JSON Patch of
``nodes/<name>/status``) on the real kube-apiserver: changed on the first run, nothing on the second (the whole
role: changed=0), check mode reports a change and sends none, the scheduler counts the resource, and a bad value
fails naming the variable. The Node is an object of its own (no kubelet).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import BANDWIDTH_RESOURCE, wait_for
from tests.cluster._nodes import Heartbeat, NodeSpec, node_manifest
from tests.integration.cloudvm_k8s.cloudvm_helpers import PlayRun

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]
TAINT = "cloud.zjusct.io/test-only"
TASK = "Advertise each hypervisor Node's guaranteed bandwidth (extended resource, Mbit/s)"


@pytest.fixture
def node(k8s_cluster: Any, k8s_api: Any, tmp_path: Path) -> Iterator[str]:
    """A Node object without the bandwidth resource, tainted so that only this test's Pods go there, kept Ready
    by a heartbeat (no kubelet)."""
    core = client.CoreV1Api(k8s_api)
    name = f"bw-role-{uuid.uuid4().hex[:6]}"
    body = node_manifest(NodeSpec(name=name, address="127.0.10.99"), k8s_cluster.binaries.k8s_version)
    for field in ("capacity", "allocatable"):
        body["status"][field].pop(BANDWIDTH_RESOURCE)
    body["spec"]["taints"] = [{"key": TAINT, "effect": "NoSchedule"}]
    core.create_node(body)
    beat = Heartbeat({name: k8s_api}, tmp_path, interval=2.0)
    beat.start()
    try:
        wait_for(lambda: [t.key for t in core.read_node(name).spec.taints or []] == [TAINT], 60,
                 f"{name} has no lifecycle taint")
        yield name
    finally:
        beat.stop()
        with contextlib.suppress(ApiException):
            core.delete_node(name)


def _role(play: Any, vars_: dict[str, Any], **kwargs: Any) -> tuple[PlayRun, dict[str, Any]]:
    task = {"name": "cluster role", "ansible.builtin.include_role": {"name": "zjusct.cloud.cluster"},
            "vars": {"cluster_deploy_controller": False, "cluster_apply_owner_policy": False,
                     "cluster_apply_rbac": False, **vars_}}
    run = play([task], **kwargs)
    doc = json.loads(run.stdout[run.stdout.index("{"):])
    return run, doc


def _task(doc: dict[str, Any], name: str) -> dict[str, Any]:
    for task in doc["plays"][0]["tasks"]:
        if task["task"]["name"].split(" : ", 1)[-1] == name:
            return dict(task["hosts"]["localhost"])
    raise AssertionError(f"task {name!r} not in the play: {[t['task']['name'] for t in doc['plays'][0]['tasks']]}")


def _advertised(core: Any, node: str) -> tuple[str | None, str | None]:
    status = core.read_node(node).status
    return (status.capacity or {}).get(BANDWIDTH_RESOURCE), (status.allocatable or {}).get(BANDWIDTH_RESOURCE)


def _pod(name: str, node: str, mbps: int) -> dict[str, Any]:
    res = {"cpu": "10m", BANDWIDTH_RESOURCE: str(mbps)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                     "tolerations": [{"key": TAINT, "operator": "Exists"}],
                     "containers": [{"name": "main", "image": "registry.invalid/none:0",
                                     "resources": {"requests": res, "limits": res}}]}}


def test_the_role_advertises_the_bandwidth_once_a_second_run_changes_nothing_and_the_scheduler_counts_it(
        play: Any, k8s_api: Any, k8s_namespace: str, node: str) -> None:
    core = client.CoreV1Api(k8s_api)
    ns = k8s_namespace
    assert _advertised(core, node) == (None, None)
    bandwidth = {"cluster_node_bandwidth_mbps": {node: 100}}

    check_run, check_doc = _role(play, bandwidth, check=True, diff=True)
    assert check_run.rc == 0, check_run.stdout[-3000:]
    item = _task(check_doc, TASK)["results"][0]
    assert item["changed"] is True and item["diff"] == {"before": {BANDWIDTH_RESOURCE: None},
                                                         "after": {BANDWIDTH_RESOURCE: "100"}}
    assert _advertised(core, node) == (None, None)  # check mode sent nothing

    first, doc = _role(play, bandwidth)
    assert first.rc == 0, first.stdout[-3000:]
    assert _task(doc, TASK)["results"][0]["changed"] is True
    assert _advertised(core, node) == ("100", "100")

    second, doc = _role(play, bandwidth)
    assert second.rc == 0, second.stdout[-3000:]
    assert _task(doc, TASK)["results"][0]["changed"] is False
    assert doc["stats"]["localhost"]["changed"] == 0, doc["stats"]

    # the scheduler counts it: 100 Mbit/s fit, one more does not
    core.create_namespaced_pod(ns, _pod("fits", node, 100))
    wait_for(lambda: core.read_namespaced_pod("fits", ns).spec.node_name == node, 60, "fits bound")
    core.create_namespaced_pod(ns, _pod("over", node, 1))

    def refused() -> Any:
        conds = core.read_namespaced_pod("over", ns).status.conditions or []
        return next((c for c in conds if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

    assert f"Insufficient {BANDWIDTH_RESOURCE}" in wait_for(refused, 60, "over Unschedulable").message

    # an overcommit ratio: floor(100 x 1.57) = 157 (not 156: float noise is rounded away first); the waiting Pod
    # then fits
    third, doc = _role(play, {**bandwidth, "cluster_bandwidth_overcommit": 1.57})
    assert third.rc == 0 and _task(doc, TASK)["results"][0]["changed"] is True
    assert _advertised(core, node) == ("157", "157")
    wait_for(lambda: core.read_namespaced_pod("over", ns).spec.node_name == node, 60, "over bound")


def test_a_bad_rate_fails_naming_the_variable_and_changes_nothing(play: Any, k8s_api: Any, node: str) -> None:
    core = client.CoreV1Api(k8s_api)
    run, doc = _role(play, {"cluster_node_bandwidth_mbps": {node: "10G"}})
    assert run.rc != 0
    failed = _task(doc, "Check the hypervisor Nodes' bandwidth")
    assert failed.get("failed") is True
    assert "cluster_node_bandwidth_mbps" in failed["msg"] and "10G" in failed["msg"]
    assert _advertised(core, node) == (None, None)
