"""site.yml with ``zjusct_cloud_backend=kubernetes`` deploys the controller (roles/cluster, image from
roles/controller_image) on the real control plane + real node: the Deployment becomes Available with a Pod on the
real node, runs as configured (non-root, read-only root, no capabilities), the in-cluster controller reconciles a
CloudVM created afterwards (finalizer added, Blocked/VolumeClaimNotReady for its missing claim: no guest boot),
and a second site.yml run changes nothing.

The test control plane serves only on 127.0.0.1 and has no kube-proxy: the fixture ``service_route`` (conftest.py)
DNATs the ``kubernetes`` Service address (10.96.0.1:443) arriving from the node's Pod bridge to the API server
(route_localnet), the one thing kube-proxy would do here; removed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import GROUP, PLURAL, VERSION
from kubernetes import client

from tests.cluster import Cluster, RealNode, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.slow, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[3]


def run_site(kubeconfig: Path, extra: dict[str, Any]) -> dict[str, Any]:
    venv_bin = Path(sys.executable).parent
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               PATH=f"{venv_bin}:{os.environ.get('PATH', '')}")
    args = {"zjusct_cloud_hosts": "no-hypervisors", "zjusct_cloud_backend": "kubernetes",
            "cluster_kubeconfig": str(kubeconfig), **extra}
    proc = subprocess.run([str(venv_bin / "ansible-playbook"), "site.yml", "-e", json.dumps(args)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    return dict(json.loads(proc.stdout))


def changed_tasks(result: dict[str, Any]) -> list[str]:
    """The names of the tasks that reported changed in a site.yml run (ansible.posix.json output), for messages."""
    return [task["task"]["name"] for play in result["plays"] for task in play["tasks"]
            if any(host.get("changed") for host in task["hosts"].values())]


def test_site_deploys_the_controller_on_the_real_node_which_reconciles_and_second_run_changes_nothing(
    k8s_cluster: Cluster, k8s_api: Any, real_node: RealNode, controller_image: dict[str, Any],
    service_route: None, k8s_namespace: str,
) -> None:
    placement = real_node.pod_placement()
    extra = {"cluster_controller_image": controller_image["key_tag"],
             "cluster_controller_config": {"launcherImage": "localhost/zjusct/launcher:0.1.0",
                                           "imageDir": "/nonexistent", "cmdline": "console=ttyS0"},
             "cluster_controller_node_selector": placement["nodeSelector"],
             "cluster_controller_tolerations": placement["tolerations"],
             "cluster_launcher_namespaces": [k8s_namespace]}
    core, apps = client.CoreV1Api(k8s_api), client.AppsV1Api(k8s_api)
    try:
        first = run_site(k8s_cluster.kubeconfig, extra)
        assert first["stats"]["localhost"]["changed"] >= 1
        dep = apps.read_namespaced_deployment("cloudvm-controller", "zjusct-cloud-system")
        assert {c.type: c.status for c in dep.status.conditions}.get("Available") == "True"
        (pod,) = core.list_namespaced_pod("zjusct-cloud-system",
                                          label_selector="app.kubernetes.io/component=controller").items
        assert pod.spec.node_name == "real-node" and pod.status.phase == "Running"
        sc = pod.spec.containers[0].security_context
        assert (sc.read_only_root_filesystem, sc.allow_privilege_escalation, sc.capabilities.drop) == (
            True, False, ["ALL"])
        assert pod.spec.security_context.run_as_user == 65534
        ns_labels = core.read_namespace("zjusct-cloud-system").metadata.labels
        assert ns_labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert core.read_namespace(k8s_namespace).metadata.labels[
            "pod-security.kubernetes.io/enforce"] == "privileged"
        # A Lease an earlier test's controller left (its Deployment deleted, the Lease kept) passes to this Pod once
        # it went unrenewed for leaseDurationSeconds (15 s): wait for the take-over rather than read the Lease once.
        coord = client.CoordinationV1Api(k8s_api)
        wait_for(lambda: coord.read_namespaced_lease("cloudvm-controller", "zjusct-cloud-system").spec.holder_identity
                 == pod.metadata.name, 120, f"the controller Lease held by {pod.metadata.name}", interval=1)

        custom = client.CustomObjectsApi(k8s_api)
        custom.create_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": "vm1"},
            "spec": {"owner": "alice", "rootVolumeClaim": "vm1-root", "vcpus": 1, "memoryMiB": 512,
                     "powerState": "Running", "bootID": 1}})

        def blocked() -> dict[str, Any] | None:
            vm = custom.get_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, "vm1")
            return vm if (vm.get("status") or {}).get("phase") == "Blocked" else None

        vm = wait_for(blocked, 120, "vm1 Blocked (reconciled by the in-cluster controller)", interval=1)
        assert vm["status"]["reason"] == "VolumeClaimNotReady" and "cloud.zjusct.io/launcher" in vm["metadata"][
            "finalizers"], vm
        second = run_site(k8s_cluster.kubeconfig, extra)
        assert second["stats"]["localhost"]["changed"] == 0, changed_tasks(second)
        custom.delete_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, "vm1")
        wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL)["items"],
                 60, "vm1 deleted (finalizer removed by the controller)")
    finally:
        with contextlib.suppress(Exception):
            print(core.read_namespaced_pod_log(
                core.list_namespaced_pod("zjusct-cloud-system").items[0].metadata.name, "zjusct-cloud-system")[-4000:])
        with contextlib.suppress(Exception):
            apps.delete_namespaced_deployment("cloudvm-controller", "zjusct-cloud-system")
