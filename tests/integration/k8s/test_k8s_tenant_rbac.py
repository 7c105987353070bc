"""RBAC is enforced by the real API server: the tenant ``alice`` has ``edit`` rights in
``tenant-alice`` only."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import TENANT_NAMESPACE, TENANT_USER

pytestmark = pytest.mark.k8s


def _status(call: Any) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def _can(api: Any, verb: str, resource: str, namespace: str | None = None, group: str = "") -> bool:
    attrs = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attrs["namespace"] = namespace
    review = client.AuthorizationV1Api(api).create_self_subject_access_review({"spec": {"resourceAttributes": attrs}})
    return bool(review.status.allowed)


def test_tenant_allowed_in_own_namespace(tenant_api: Any) -> None:
    core = client.CoreV1Api(tenant_api)
    name = f"cm-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_config_map(TENANT_NAMESPACE, {"metadata": {"name": name}, "data": {"a": "1"}})
    try:
        assert core.read_namespaced_config_map(name, TENANT_NAMESPACE).data == {"a": "1"}
        assert name in [c.metadata.name for c in core.list_namespaced_config_map(TENANT_NAMESPACE).items]
        core.patch_namespaced_config_map(name, TENANT_NAMESPACE, {"data": {"a": "2"}})
    finally:
        core.delete_namespaced_config_map(name, TENANT_NAMESPACE)
    assert _can(tenant_api, "create", "pods", TENANT_NAMESPACE)
    assert _can(tenant_api, "delete", "persistentvolumeclaims", TENANT_NAMESPACE)


def test_tenant_denied_outside_own_namespace(tenant_api: Any, k8s_namespace: str) -> None:
    core = client.CoreV1Api(tenant_api)
    cm = {"metadata": {"name": "intruder"}}
    assert _status(lambda: core.create_namespaced_config_map(k8s_namespace, cm)) == 403
    assert _status(lambda: core.list_namespaced_pod(k8s_namespace)) == 403
    assert _status(lambda: core.list_namespaced_secret("kube-system")) == 403
    assert _status(lambda: core.list_namespace()) == 403
    assert _status(lambda: core.list_node()) == 403
    assert _status(lambda: core.list_pod_for_all_namespaces()) == 403
    assert not _can(tenant_api, "create", "pods", k8s_namespace)
    assert not _can(tenant_api, "create", "pods", "default")


def test_tenant_cannot_escalate_in_own_namespace(tenant_api: Any) -> None:
    """``edit`` does not include RBAC: alice cannot grant herself (or others) more rights."""
    rbac = client.RbacAuthorizationV1Api(tenant_api)
    binding = {
        "metadata": {"name": "alice-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT_USER}],
    }
    assert _status(lambda: rbac.create_namespaced_role_binding(TENANT_NAMESPACE, binding)) == 403
    assert _status(lambda: rbac.delete_namespaced_role_binding(f"{TENANT_USER}-edit", TENANT_NAMESPACE)) == 403
    assert not _can(tenant_api, "create", "rolebindings", TENANT_NAMESPACE, group="rbac.authorization.k8s.io")


def test_admin_is_not_limited(k8s_api: Any, k8s_namespace: str) -> None:
    """Sanity check of the other side: the same request succeeds for the admin identity."""
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_config_map(k8s_namespace, {"metadata": {"name": "allowed"}})
    assert _can(k8s_api, "create", "pods", k8s_namespace)
