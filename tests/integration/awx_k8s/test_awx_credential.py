"""The zjusct.cloud credential type injected as AWX injects it, against the real kube-apiserver of tests/cluster.

The credential's inputs are a ServiceAccount token, the API server URL and the cluster CA (PEM text, as an
operator pastes it into AWX); tests/awx_runner.py renders the injectors over them (CA into a private file under the
job's env/ directory, K8S_AUTH_SSL_CA_CERT pointing at it) and hands exactly that environment to ansible-runner.
No kubeconfig is reachable (KUBECONFIG points nowhere, HOME is empty), so anything listed was read with the token.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.awx_runner import credential_type, inject_credential, job_template, launch_extra_vars, run_job
from tests.cluster import wait_for

pytestmark = pytest.mark.k8s
REPO = Path(__file__).resolve().parents[3]


def _token(k8s_api: Any, namespace: str, cluster_wide: bool) -> str:
    """A ServiceAccount token that may read CloudVMs (ClusterRole view, with the CRD's aggregated rules)."""
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "awx"}})
    subject = [{"kind": "ServiceAccount", "name": "awx", "namespace": namespace}]
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}
    if cluster_wide:
        rbac.create_cluster_role_binding({"metadata": {"name": f"{namespace}-awx-view"}, "roleRef": ref,
                                          "subjects": subject})
    else:
        rbac.create_namespaced_role_binding(namespace, {"metadata": {"name": "awx-view"}, "roleRef": ref,
                                                        "subjects": subject})
    return core.create_namespaced_service_account_token(
        "awx", namespace, {"spec": {"expirationSeconds": 3600}}).status.token


def _inputs(k8s_cluster: Any, token: str) -> dict[str, str]:
    return {"backend": "kubernetes", "k8s_host": k8s_cluster.server, "k8s_api_key": token,
            "k8s_ca_cert": (k8s_cluster.state_dir / "pki" / "ca.crt").read_text()}


def _base_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
            "KUBECONFIG": "/nonexistent", "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections")}


def test_job_authenticates_with_the_injected_token_and_ca(k8s_cluster, k8s_api, vms, k8s_namespace, tmp_path):
    """A vm_stop job of bob on alice's CloudVM: the playbook reads the VM through the API with the credential
    (its owner is only known after an authenticated GET) and refuses, naming both; at -vvv nothing secret shows."""
    token = _token(k8s_api, k8s_namespace, cluster_wide=False)
    vms.start(k8s_namespace, "alice", owner="alice")
    private = tmp_path / "job"
    injected = inject_credential(credential_type(), _inputs(k8s_cluster, token), private)
    assert Path(injected.env["K8S_AUTH_SSL_CA_CERT"]).parent == private / "env"
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[hypervisors]\nlocalhost ansible_connection=local "
                         f"ansible_python_interpreter={sys.executable}\n")
    extra = launch_extra_vars(job_template("playbooks/vm_stop.yml"), {"name": "alice"}, "bob",
                              {"zjusct_cloud_hosts": "hypervisors", "vm_namespace": k8s_namespace})

    def job() -> Any:
        return run_job(private, "playbooks/vm_stop.yml", extra, injected, str(inventory),
                       env=_base_env(tmp_path), verbosity=3)

    # the view role's CloudVM rules are aggregated asynchronously: wait for the refusal itself
    result = wait_for(lambda: (lambda j: j if "which belongs to owner 'alice'" in " ".join(j.failed_messages())
                               else None)(job()), 90, "bob's job refused after reading alice's VM")
    assert result.status == "failed" and result.stats["failures"] == {"localhost": 1}
    (msg,) = result.failed_messages()
    assert msg.startswith(f"owner: 'bob' may not act on CloudVM {k8s_namespace}/alice, which belongs to owner "
                          "'alice'"), msg
    (found,) = result.task_results("Look up the VM and check that it belongs to the acting owner")
    assert (found["reason"], found["vm_owner"]) == ("Forbidden", "alice"), found
    everything = result.stdout + "".join(json.dumps(e) for e in result.events)
    assert token not in everything, "the token must never reach a job event or stdout, -vvv included"


def test_inventory_source_syncs_with_the_injected_token_and_ca(k8s_cluster, k8s_api, vms, k8s_namespace,
                                                               tmp_path):
    """AWX's inventory update runs ansible-inventory on the project's inventory/kubernetes.cloudvm.yml with the
    credential's environment: the Running CloudVM becomes a host, owner group included."""
    import ansible_runner

    token = _token(k8s_api, k8s_namespace, cluster_wide=True)
    try:
        vms.start(k8s_namespace, "inv-vm", owner="carol")
        private = tmp_path / "update"
        injected = inject_credential(credential_type(), _inputs(k8s_cluster, token), private)
        env = {**_base_env(tmp_path), **injected.env, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "1",
               "ANSIBLE_INVENTORY_ENABLED": "zjusct.cloud.cloudvm"}

        def listed() -> dict | None:
            out, err = ansible_runner.get_inventory(
                action="list", inventories=[str(REPO / "inventory/kubernetes.cloudvm.yml")], response_format="json",
                private_data_dir=str(private), envvars=env, quiet=True, host_cwd=str(REPO))
            assert token not in str(out) + str(err)
            host = f"inv-vm.{k8s_namespace}"
            return out if isinstance(out, dict) and host in out.get("_meta", {}).get("hostvars", {}) else None

        inv = wait_for(listed, 90, "the CloudVM listed through the injected credential")
        assert f"inv-vm.{k8s_namespace}" in inv["owner_carol"]["hosts"]
    finally:
        client.RbacAuthorizationV1Api(k8s_api).delete_cluster_role_binding(f"{k8s_namespace}-awx-view")
