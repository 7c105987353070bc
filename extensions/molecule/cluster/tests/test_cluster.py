"""Verify of the Molecule scenario ``cluster``: what roles/cluster promises (meta/argument_specs.yml).

Runs under pytest-testinfra against the scenario's inventory (``--connection=ansible``); the one host is the
test control plane's admin client on this machine, so commands run ``kubectl`` with the kubeconfig that
create.yml left in the ephemeral directory. Each test reads the cluster's live state; none depends on another.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

STATE = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "k8s"
ADMIN = STATE / "kubeconfig" / "admin.kubeconfig"
TENANT = STATE / "kubeconfig" / "alice.kubeconfig"  # user alice: the built-in "edit" role in tenant-alice only
CRD = "cloudvms.cloud.zjusct.io"
POLICY = "cloudvm-owner.cloud.zjusct.io"


def kubectl(host, *args: str, kubeconfig: Path = ADMIN, stdin: str | None = None):
    """Run kubectl on the host; return testinfra's CommandResult (rc, stdout, stderr)."""
    cmd = "kubectl --kubeconfig=%s" + " %s" * len(args)
    if stdin is not None:
        cmd = "printf %%s %s | " + cmd
        return host.run(cmd, stdin, str(kubeconfig), *args)
    return host.run(cmd, str(kubeconfig), *args)


def get_json(host, *args: str) -> dict:
    out = kubectl(host, "get", *args, "-o", "json")
    assert out.rc == 0, out.stderr
    return json.loads(out.stdout)


def test_crd_established(host) -> None:
    crd = get_json(host, "crd", CRD)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert crd["spec"]["group"] == "cloud.zjusct.io"
    assert crd["spec"]["names"]["kind"] == "CloudVM"


@pytest.mark.parametrize("verb", ["view", "edit", "admin"])
def test_aggregate_roles_reach_builtin_roles(host, verb: str) -> None:
    """config/rbac/aggregate-roles.yaml: the built-in admin/edit/view ClusterRoles now cover cloudvms."""
    role = get_json(host, "clusterrole", verb)
    resources = {r for rule in role.get("rules", []) for r in rule.get("resources", [])
                 if "cloud.zjusct.io" in rule.get("apiGroups", [])}
    assert "cloudvms" in resources, f"ClusterRole {verb} has no cloudvms rule: {role.get('rules')}"


def test_controller_identity(host) -> None:
    """config/rbac/controller-role.yaml: the controller's ServiceAccount may write CloudVM status."""
    sa = "system:serviceaccount:zjusct-cloud-system:cloudvm-controller"
    out = kubectl(host, "auth", "can-i", "update", "cloudvms/status", "--all-namespaces", f"--as={sa}")
    assert out.rc == 0 and out.stdout.strip() == "yes", out.stdout + out.stderr


def test_owner_policy_bound(host) -> None:
    policy = get_json(host, "validatingadmissionpolicy", POLICY)
    binding = get_json(host, "validatingadmissionpolicybinding", POLICY)
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == POLICY


def _cloudvm(owner: str) -> str:
    return json.dumps({
        "apiVersion": "cloud.zjusct.io/v1alpha1",
        "kind": "CloudVM",
        "metadata": {"name": f"molecule-{owner}", "namespace": "tenant-alice"},
        "spec": {"owner": owner, "rootVolumeClaim": f"molecule-{owner}-root"},
    })


def test_tenant_may_create_own_cloudvm(host) -> None:
    """alice has only the built-in edit role: creating her own CloudVM works through the aggregated rule."""
    out = kubectl(host, "create", "--dry-run=server", "-f", "-", kubeconfig=TENANT, stdin=_cloudvm("alice"))
    assert out.rc == 0, out.stderr


def test_tenant_refused_for_other_owner(host) -> None:
    """The owner admission policy refuses alice a CloudVM whose spec.owner is bob."""
    out = kubectl(host, "create", "--dry-run=server", "-f", "-", kubeconfig=TENANT, stdin=_cloudvm("bob"))
    assert out.rc != 0
    assert "spec.owner: user alice may not create" in out.stderr, out.stderr
