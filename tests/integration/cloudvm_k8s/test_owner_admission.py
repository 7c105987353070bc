"""Owner authorization on Kubernetes: config/policy/owner-admission.yaml on the real kube-apiserver.

Every request is made as a real identity — the tenant's own client certificate, or the admin's client
impersonating a user and group (``Impersonate-User`` / ``Impersonate-Group``, as ``kubectl --as``) —
so the API server's authentication, RBAC and the ValidatingAdmissionPolicy all take part.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.cluster import TENANT_NAMESPACE, TENANT_USER
from tests.integration.cloudvm_k8s.cloudvm_helpers import GROUP, PLURAL, VERSION, CloudVMs, api_error

pytestmark = pytest.mark.k8s

CONTROLLER = "system:serviceaccount:zjusct-cloud-system:cloudvm-controller"


@pytest.fixture
def as_user(k8s_cluster: Any, k8s_api: Any, k8s_namespace: str,
            cloudvm_crd: dict[str, Any]) -> Iterator[Callable[..., CloudVMs]]:
    """``as_user(name, group=None)``: CloudVM access as that user, who gets ``edit`` in the test namespace.

    RBAC lets every such user write CloudVMs in the namespace, so a refusal can only come from the
    owner policy.
    """
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    clients: list[Any] = []

    def _make(user: str, group: str | None = None) -> CloudVMs:
        name = f"edit-{len(clients)}"
        rbac.create_namespaced_role_binding(k8s_namespace, {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
        api = k8s_cluster.api_client("admin")
        api.set_default_header("Impersonate-User", user)
        if group:
            api.set_default_header("Impersonate-Group", group)
        clients.append(api)
        return CloudVMs(client.CustomObjectsApi(api))

    yield _make
    for api in clients:
        with contextlib.suppress(Exception):
            api.close()


def _refusal(call: Callable[[], Any]) -> str:
    status = api_error(call)
    assert status["http_status"] == 403, status
    assert "cloudvm-owner.cloud.zjusct.io" in status["message"], status["message"]
    return str(status["message"])


def test_tenant_creates_own_vm_but_not_one_for_another_owner(tenant_api: Any, cvm_api: CloudVMs) -> None:
    tenant = CloudVMs(client.CustomObjectsApi(tenant_api))
    try:
        created = tenant.create(TENANT_NAMESPACE, "own-vm", owner=TENANT_USER)
        assert created["spec"]["owner"] == TENANT_USER
        message = _refusal(lambda: tenant.create(TENANT_NAMESPACE, "bobs-vm", owner="bob"))
        assert f"user {TENANT_USER} may not create CloudVM {TENANT_NAMESPACE}/bobs-vm owned by bob" in message
        assert cvm_api.get(TENANT_NAMESPACE, "bobs-vm") is None
    finally:
        with contextlib.suppress(Exception):
            cvm_api.api.delete_namespaced_custom_object(GROUP, VERSION, TENANT_NAMESPACE, PLURAL, "own-vm")


def test_another_user_cannot_start_change_keys_or_delete(as_user: Callable[..., CloudVMs], cvm_api: CloudVMs,
                                                         k8s_namespace: str) -> None:
    alice, bob = as_user("alice"), as_user("bob")
    alice.create(k8s_namespace, "alice", owner="alice")
    before = cvm_api.get(k8s_namespace, "alice")
    assert before is not None

    start = _refusal(lambda: bob.patch_spec(k8s_namespace, "alice", powerState="Running", bootID=1))
    assert f"user bob may not update CloudVM {k8s_namespace}/alice owned by alice" in start
    _refusal(lambda: bob.patch_spec(k8s_namespace, "alice", sshAuthorizedKeys=["ssh-ed25519 AAAAC3Nz bob"]))
    delete = _refusal(lambda: bob.api.delete_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL,
                                                                       "alice"))
    assert f"user bob may not delete CloudVM {k8s_namespace}/alice owned by alice" in delete

    after = cvm_api.get(k8s_namespace, "alice")
    assert after is not None and after["spec"] == before["spec"]
    alice.patch_spec(k8s_namespace, "alice", powerState="Running", bootID=1)
    alice.api.delete_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, "alice")


def test_owner_group_operators_and_controller_may_act(as_user: Callable[..., CloudVMs], cvm_api: CloudVMs,
                                                      k8s_namespace: str) -> None:
    as_user("alice").create(k8s_namespace, "team", owner="alice")
    teammate = as_user("carol", group="cloud.zjusct.io:owner:alice")
    assert teammate.patch_spec(k8s_namespace, "team", vcpus=2)["spec"]["vcpus"] == 2
    operator = as_user("ops", group="cloud.zjusct.io:operators")
    assert operator.patch_spec(k8s_namespace, "team", vcpus=3)["spec"]["vcpus"] == 3
    controller = as_user(CONTROLLER)
    assert controller.patch_spec(k8s_namespace, "team", vcpus=4)["spec"]["vcpus"] == 4
    # a group for another owner grants nothing
    outsider = as_user("dave", group="cloud.zjusct.io:owner:bob")
    _refusal(lambda: outsider.patch_spec(k8s_namespace, "team", vcpus=1))
    _refusal(lambda: outsider.create(k8s_namespace, "dave", owner="alice"))
    operator.api.delete_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, "team")
    assert cvm_api.get(k8s_namespace, "team") is None or \
        cvm_api.get(k8s_namespace, "team")["metadata"].get("deletionTimestamp")  # type: ignore[index]


def test_module_reports_the_refusal_and_changes_nothing(play: Callable[..., Any], cvm_api: CloudVMs) -> None:
    """The tenant's own playbook run against a VM of another owner in her namespace: refused, named."""
    name = "bobs-in-alices-ns"
    if cvm_api.get(TENANT_NAMESPACE, name) is None:
        cvm_api.create(TENANT_NAMESPACE, name, owner="bob")
    try:
        run = play([
            {"zjusct.cloud.cloudvm": {"name": name, "namespace": TENANT_NAMESPACE, "power_state": "running",
                                      "wait": False}},
            {"zjusct.cloud.cloudvm": {"name": name, "namespace": TENANT_NAMESPACE, "state": "absent",
                                      "wait": False}},
        ], user=TENANT_USER)
        start, delete = run.results
        for result, verb in ((start, "update"), (delete, "delete")):
            assert result.get("failed") is True and result.get("api_status") == 403, result
            assert f"user {TENANT_USER} may not {verb} CloudVM {TENANT_NAMESPACE}/{name} owned by bob" \
                in result["msg"], result["msg"]
        vm = cvm_api.get(TENANT_NAMESPACE, name)
        assert vm is not None and vm["spec"]["powerState"] == "Stopped" and vm["spec"]["bootID"] == 0
    finally:
        with contextlib.suppress(Exception):
            cvm_api.api.delete_namespaced_custom_object(GROUP, VERSION, TENANT_NAMESPACE, PLURAL, name)
