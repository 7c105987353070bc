"""site.yml's Kubernetes path installs the CloudVM API (CRD, RBAC, owner admission policy) on a real API server,
idempotently."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
# the ClusterRoleBinding of config/rbac/controller-role.yaml: on the shared plane only site.yml makes it
CONTROLLER_BINDING = "zjusct-cloud-cloudvm-controller"


def run_site(kubeconfig: Path, *options: str) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    # no zjusct_cloud_hosts: on the kubernetes backend its default (the group "hypervisors", absent from the
    # implicit localhost inventory) converges no host as a hypervisor
    extra = {"zjusct_cloud_backend": "kubernetes",
             "cluster_kubeconfig": str(kubeconfig), "cluster_deploy_controller": False}  # no node to run it
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), *options, "site.yml", "-e", json.dumps(extra)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_site_installs_the_cloudvm_api_and_second_run_changes_nothing(k8s_cluster, k8s_api):
    # The shared control plane may hold site.yml's objects already (another test ran site.yml first): remove one
    # that only site.yml makes, so that the first run has something to install, whatever ran before.
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    with contextlib.suppress(ApiException):
        rbac.delete_cluster_role_binding(CONTROLLER_BINDING)
    first = run_site(k8s_cluster.kubeconfig)
    assert first["stats"]["localhost"]["changed"] >= 1
    hypervisor_play = [p for p in first["plays"] if p["play"]["name"] == "Bring up zjusct.cloud hypervisors"]
    assert hypervisor_play and hypervisor_play[0]["tasks"] == [], "site.yml made the playbook host a hypervisor"
    assert rbac.read_cluster_role_binding(CONTROLLER_BINDING).role_ref.name == "zjusct-cloud-cloudvm-controller"
    crd = client.ApiextensionsV1Api(k8s_api).read_custom_resource_definition("cloudvms.cloud.zjusct.io")
    established = [c for c in crd.status.conditions if c.type == "Established"]
    assert established and established[0].status == "True"
    roles = {r.metadata.name for r in rbac.list_cluster_role(
        label_selector="app.kubernetes.io/name=zjusct-cloud").items}
    assert {"zjusct-cloud-cloudvm-edit", "zjusct-cloud-cloudvm-controller"} <= roles
    admission = client.AdmissionregistrationV1Api(k8s_api)
    for name in ("cloudvm-owner", "root-volume-claim", "launcher-pod", "cloudvm-dependent"):
        policy = admission.read_validating_admission_policy(f"{name}.cloud.zjusct.io")
        assert [v.expression for v in policy.spec.validations]
        binding = admission.read_validating_admission_policy_binding(f"{name}.cloud.zjusct.io")
        assert binding.spec.validation_actions == ["Deny"]
    second = run_site(k8s_cluster.kubeconfig, "--diff")
    changed = {t["task"]["name"]: [r.get("diff") for r in t["hosts"].values()] for p in second["plays"]
               for t in p["tasks"] if any(r.get("changed") for r in t["hosts"].values())}
    assert second["stats"]["localhost"]["changed"] == 0, json.dumps(changed)[:6000]


def run_site_failing(kubeconfig: Path, extra: dict) -> str:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    args = {"zjusct_cloud_hosts": "no-hypervisors", "zjusct_cloud_backend": "kubernetes",
            "cluster_kubeconfig": str(kubeconfig), **extra}
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "site.yml", "-e", json.dumps(args)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode != 0, proc.stdout[-4000:]
    return proc.stdout + proc.stderr


def test_a_fence_secret_without_fence_user_or_missing_fails_naming_it_and_deploys_nothing(k8s_cluster, k8s_api):
    config = {"launcherImage": "localhost/zjusct/launcher:0.1.0", "imageDir": "/nonexistent",
              "cmdline": "console=ttyS0", "ceph": {"monitors": ["10.0.0.1:6789"], "user": "vm", "secretName": "s"}}
    out = run_site_failing(k8s_cluster.kubeconfig, {"cluster_controller_config": config,
                                                    "cluster_controller_fence_secret": "no-such-fence"})
    assert "cluster_controller_fence_secret=no-such-fence" in out and "fenceUser" in out, out[-3000:]
    config["ceph"]["fenceUser"] = "zjusct-fence"
    out = run_site_failing(k8s_cluster.kubeconfig, {"cluster_controller_config": config,
                                                    "cluster_controller_fence_secret": "no-such-fence"})
    assert "zjusct-cloud-system/no-such-fence does not exist" in out, out[-3000:]
    deployments = client.AppsV1Api(k8s_api).list_namespaced_deployment("zjusct-cloud-system").items
    assert [d.metadata.name for d in deployments] == []
    assert "controller.json" not in json.dumps(
        [c.data for c in client.CoreV1Api(k8s_api).list_namespaced_config_map("zjusct-cloud-system").items])
