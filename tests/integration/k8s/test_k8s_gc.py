"""Garbage collection by the real kube-controller-manager: dependents with an ownerReference
follow their owner (background and foreground deletion) or are orphaned when asked."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import wait_for

pytestmark = pytest.mark.k8s


def _gone(read: Any) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def _dependent(name: str, owner: dict[str, str], block: bool) -> dict[str, Any]:
    ref = {**owner, "blockOwnerDeletion": block}
    return {"metadata": {"name": name, "ownerReferences": [ref]}, "data": {"k": "v"}}


@pytest.mark.parametrize("policy", ["Background", "Foreground"])
def test_deleting_owner_collects_dependent(k8s_api: Any, k8s_namespace: str, policy: str) -> None:
    core = client.CoreV1Api(k8s_api)
    owner = core.create_namespaced_config_map(k8s_namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(k8s_namespace, _dependent("dependent", ref, block=policy == "Foreground"))
    core.delete_namespaced_config_map("owner", k8s_namespace, propagation_policy=policy)
    wait_for(
        lambda: _gone(lambda: core.read_namespaced_config_map("dependent", k8s_namespace)), 60, "dependent collected"
    )
    wait_for(lambda: _gone(lambda: core.read_namespaced_config_map("owner", k8s_namespace)), 60, "owner gone")


def test_custom_resource_owner_collects_pod(k8s_api: Any, k8s_namespace: str, widget_crd: dict[str, str]) -> None:
    """The CloudVM pattern: a custom resource owns a Pod; deleting it removes the Pod."""
    custom = client.CustomObjectsApi(k8s_api)
    core = client.CoreV1Api(k8s_api)
    g, v, p = widget_crd["group"], widget_crd["version"], widget_crd["plural"]
    owner = custom.create_namespaced_custom_object(
        g,
        v,
        k8s_namespace,
        p,
        {
            "apiVersion": f"{g}/{v}",
            "kind": "Widget",
            "metadata": {"name": "vm"},
            "spec": {"owner": "alice", "minReplicas": 0, "maxReplicas": 1},
        },
    )
    ref = {
        "apiVersion": f"{g}/{v}",
        "kind": "Widget",
        "name": "vm",
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    core.create_namespaced_pod(
        k8s_namespace,
        {
            "metadata": {"name": "vm-launcher", "ownerReferences": [ref]},
            # unschedulable on purpose: a Pod bound to a node would wait for a kubelet to confirm deletion
            "spec": {
                "containers": [{"name": "main", "image": "registry.invalid/zjusct/none:0"}],
                "nodeSelector": {"cloud.zjusct.io/no-such-node": "true"},
            },
        },
    )
    custom.delete_namespaced_custom_object(g, v, k8s_namespace, p, "vm")
    # the garbage collector picks up a new CRD's kind on its periodic discovery resync (30 s)
    wait_for(
        lambda: _gone(lambda: core.read_namespaced_pod("vm-launcher", k8s_namespace)), 90, "launcher Pod collected"
    )


def test_orphan_policy_keeps_dependent(k8s_api: Any, k8s_namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    owner = core.create_namespaced_config_map(k8s_namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(k8s_namespace, _dependent("dependent", ref, block=False))
    core.delete_namespaced_config_map("owner", k8s_namespace, propagation_policy="Orphan")
    wait_for(lambda: _gone(lambda: core.read_namespaced_config_map("owner", k8s_namespace)), 60, "owner gone")

    def orphaned() -> Any:
        cm = core.read_namespaced_config_map("dependent", k8s_namespace)
        return cm if not cm.metadata.owner_references else None

    dep = wait_for(orphaned, 60, "ownerReference removed by the garbage collector")
    assert dep.data == {"k": "v"}
