"""Verify of the Molecule scenario ``cluster``: what roles/cluster promises (meta/argument_specs.yml).

Runs under pytest-testinfra against the scenario's inventory (``--connection=ansible``); the one host is the
test control plane's admin client on this machine, so the checks run kubernetes.core modules on it through
testinfra's ``host.ansible`` with the kubeconfigs that create.yml left in the ephemeral directory; the two
admission checks use the kubernetes Python client (server-side dry runs as the tenant). Each test
reads the cluster's live state; none depends on another.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kubernetes import config
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

STATE = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "k8s"
ADMIN = STATE / "kubeconfig" / "admin.kubeconfig"
TENANT = STATE / "kubeconfig" / "alice.kubeconfig"  # user alice: the built-in "edit" role in tenant-alice only
CRD = "cloudvms.cloud.zjusct.io"
POLICY = "cloudvm-owner.cloud.zjusct.io"


def get(host, kind: str, name: str, api_version: str = "v1", namespace: str = "") -> dict:
    """One object as kubernetes.core.k8s_info returns it (admin kubeconfig); fails the test if it is absent."""
    args = f"kubeconfig={ADMIN} api_version={api_version} kind={kind} name={name}"
    if namespace:
        args += f" namespace={namespace}"
    found = host.ansible("kubernetes.core.k8s_info", args, check=False)["resources"]
    assert len(found) == 1, f"{kind} {name} not found"
    return found[0]


def test_crd_established(host) -> None:
    crd = get(host, "CustomResourceDefinition", CRD, "apiextensions.k8s.io/v1")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert crd["spec"]["group"] == "cloud.zjusct.io"
    assert crd["spec"]["names"]["kind"] == "CloudVM"


@pytest.mark.parametrize("verb", ["view", "edit", "admin"])
def test_aggregate_roles_reach_builtin_roles(host, verb: str) -> None:
    """config/rbac/aggregate-roles.yaml: the built-in admin/edit/view ClusterRoles now cover cloudvms."""
    role = get(host, "ClusterRole", verb, "rbac.authorization.k8s.io/v1")
    resources = {r for rule in role.get("rules", []) for r in rule.get("resources", [])
                 if "cloud.zjusct.io" in rule.get("apiGroups", [])}
    assert "cloudvms" in resources, f"ClusterRole {verb} has no cloudvms rule: {role.get('rules')}"


def test_controller_identity(host) -> None:
    """config/rbac/controller-role.yaml: the controller's ServiceAccount is bound to a role writing CloudVM status."""
    get(host, "ServiceAccount", "cloudvm-controller", namespace="zjusct-cloud-system")
    binding = get(host, "ClusterRoleBinding", "zjusct-cloud-cloudvm-controller", "rbac.authorization.k8s.io/v1")
    assert {"kind": "ServiceAccount", "name": "cloudvm-controller", "namespace": "zjusct-cloud-system"} in [
        {k: s.get(k) for k in ("kind", "name", "namespace")} for s in binding["subjects"]]
    role = get(host, "ClusterRole", binding["roleRef"]["name"], "rbac.authorization.k8s.io/v1")
    assert any("cloudvms/status" in rule.get("resources", []) and "update" in rule.get("verbs", [])
               for rule in role["rules"]), role["rules"]


@pytest.mark.parametrize("name", [POLICY, "root-volume-claim.cloud.zjusct.io", "launcher-pod.cloud.zjusct.io",
                                  "cloudvm-dependent.cloud.zjusct.io"])
def test_owner_policy_bound(host, name: str) -> None:
    """config/policy/owner-admission.yaml: each policy applied, enforcing (Fail, Deny)."""
    api = "admissionregistration.k8s.io/v1"
    policy = get(host, "ValidatingAdmissionPolicy", name, api)
    binding = get(host, "ValidatingAdmissionPolicyBinding", name, api)
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == name and binding["spec"]["validationActions"] == ["Deny"]


def _dry_run_create_as_alice(owner: str) -> dict:
    """Create a CloudVM in tenant-alice as alice with a server-side dry run: RBAC and admission decide, nothing
    is stored. Returns the object the API server answered with; raises kubernetes' ApiException when refused.

    The kubernetes Python client talks to the API server directly (the scenario's host is this machine):
    kubernetes.core.k8s in check mode may decide client-side without asking the server."""
    client = config.new_client_from_config(config_file=str(TENANT))
    body = {
        "apiVersion": "cloud.zjusct.io/v1alpha1",
        "kind": "CloudVM",
        "metadata": {"name": f"molecule-{owner}", "namespace": "tenant-alice"},
        "spec": {"owner": owner, "rootVolumeClaim": f"molecule-{owner}-root"},
    }
    return CustomObjectsApi(client).create_namespaced_custom_object(
        "cloud.zjusct.io", "v1alpha1", "tenant-alice", "cloudvms", body, dry_run="All")


def test_tenant_may_create_own_cloudvm() -> None:
    """alice has only the built-in edit role: creating her own CloudVM works through the aggregated rule."""
    assert _dry_run_create_as_alice("alice")["spec"]["owner"] == "alice"


def test_tenant_refused_for_other_owner() -> None:
    """The owner admission policy refuses alice a CloudVM whose spec.owner is bob."""
    with pytest.raises(ApiException) as refused:
        _dry_run_create_as_alice("bob")
    assert refused.value.status == 403
    assert "spec.owner: user alice may not create" in str(refused.value.body), refused.value.body
