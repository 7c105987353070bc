"""site.yml's Kubernetes path installs the CloudVM API (CRD, RBAC, owner admission policy) on a real API server,
idempotently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent


def run_site(kubeconfig: Path) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    extra = {"zjusct_cloud_hosts": "no-hypervisors", "zjusct_cloud_backend": "kubernetes",
             "cluster_kubeconfig": str(kubeconfig), "cluster_deploy_controller": False}  # no node to run it
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "site.yml", "-e", json.dumps(extra)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_site_installs_the_cloudvm_api_and_second_run_changes_nothing(k8s_cluster, k8s_api):
    first = run_site(k8s_cluster.kubeconfig)
    assert first["stats"]["localhost"]["changed"] >= 1
    crd = client.ApiextensionsV1Api(k8s_api).read_custom_resource_definition("cloudvms.cloud.zjusct.io")
    established = [c for c in crd.status.conditions if c.type == "Established"]
    assert established and established[0].status == "True"
    roles = {r.metadata.name for r in client.RbacAuthorizationV1Api(k8s_api).list_cluster_role(
        label_selector="app.kubernetes.io/name=zjusct-cloud").items}
    assert {"zjusct-cloud-cloudvm-edit", "zjusct-cloud-cloudvm-controller"} <= roles
    admission = client.AdmissionregistrationV1Api(k8s_api)
    policy = admission.read_validating_admission_policy("cloudvm-owner.cloud.zjusct.io")
    assert [v.expression for v in policy.spec.validations]
    binding = admission.read_validating_admission_policy_binding("cloudvm-owner.cloud.zjusct.io")
    assert binding.spec.validation_actions == ["Deny"]
    second = run_site(k8s_cluster.kubeconfig)
    assert second["stats"]["localhost"]["changed"] == 0
