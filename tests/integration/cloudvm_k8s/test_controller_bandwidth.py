"""Guaranteed bandwidth on Kubernetes: the controller (a real ``python -m zjusct_controller`` process with the
ServiceAccount of config/rbac/controller-role.yaml) puts ``cloud.zjusct.io/bandwidth-mbps`` =
``spec.network.bandwidth.guaranteedMbps`` into each launcher Pod's requests and limits, and the real kube-scheduler
never binds more guaranteed bandwidth to a Node than it advertises: on a Node offering 100 Mbit/s, of two VMs
guaranteeing 60 each one launcher Pod is bound and the other stays Pending, and that VM's status is
Pending/Unschedulable with the scheduler's message; a VM without a guarantee requests none and still fits; once
the first VM is stopped (its Pod gone) the waiting Pod is bound.

The Node is an object of its own (tainted, so that only these launcher Pods go there) kept Ready by a heartbeat;
no kubelet runs, so the test plays the kubelet's part of confirming a graceful Pod deletion. No guest boots.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import BANDWIDTH_RESOURCE, Cluster, wait_for
from tests.cluster._nodes import Heartbeat, NodeSpec, node_manifest
from tests.integration.k8s_node.test_controller import Controller, controller_kubeconfig

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]
GROUP, VERSION, PLURAL = "cloud.zjusct.io", "v1alpha1", "cloudvms"
LABEL_VM = "cloud.zjusct.io/vm"
TAINT = "cloud.zjusct.io/bandwidth-test"
NODE_MBPS = 100


@dataclass
class Env:
    core: Any
    custom: Any
    ns: str
    node: str
    controller: Controller

    def create_vm(self, name: str, bandwidth: dict[str, Any] | None) -> None:
        """A CloudVM asking to run, with a Bound root volume claim ``<name>-root`` (hostPath PV, never mounted)."""
        pv = f"{self.ns}-{name}-root"
        self.core.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": "/nonexistent", "type": "DirectoryOrCreate"},
                     "claimRef": {"namespace": self.ns, "name": f"{name}-root"}}})
        self.core.create_namespaced_persistent_volume_claim(self.ns, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{name}-root"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for(lambda: self.core.read_namespaced_persistent_volume_claim(f"{name}-root", self.ns).status.phase
                 == "Bound", 60, f"{name}-root Bound")
        spec: dict[str, Any] = {"owner": "alice", "rootVolumeClaim": f"{name}-root", "vcpus": 1, "memoryMiB": 512,
                                "powerState": "Running", "bootID": 1}
        if bandwidth is not None:
            spec["network"] = {"bandwidth": bandwidth}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "CloudVM", "metadata": {"name": name}, "spec": spec})

    def pod(self, name: str) -> Any:
        """The VM's one launcher Pod once it exists."""
        def one() -> Any:
            pods = self.core.list_namespaced_pod(self.ns, label_selector=f"{LABEL_VM}={name}").items
            return pods[0] if len(pods) == 1 else None
        return wait_for(one, 60, f"{name}: one launcher Pod")

    def status_when(self, name: str, phase: str, reason: str, timeout: float = 90) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            st = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name).get("status") or {}
            return st if (st.get("phase"), st.get("reason")) == (phase, reason) else None
        try:
            return dict(wait_for(check, timeout, f"{name}: {phase}/{reason}", interval=0.5))
        except BaseException:
            print(self.controller.tail())
            raise


@pytest.fixture
def env(k8s_cluster: Cluster, k8s_api: Any, k8s_namespace: str, cloudvm_crd: Any, tmp_path: Path) -> Iterator[Env]:
    core: Any = client.CoreV1Api(k8s_api)
    custom: Any = client.CustomObjectsApi(k8s_api)
    node = f"bw-{uuid.uuid4().hex[:6]}"
    body = node_manifest(NodeSpec(name=node, address="127.0.10.98", bandwidth_mbps=NODE_MBPS,
                                  labels={TAINT: node}), k8s_cluster.binaries.k8s_version)
    body["spec"]["taints"] = [{"key": TAINT, "value": node, "effect": "NoSchedule"}]
    core.create_node(body)
    beat = Heartbeat({node: k8s_api}, tmp_path, interval=2.0)  # keeps the node Ready and free of lifecycle taints
    beat.start()
    ctl: Controller | None = None
    try:
        wait_for(lambda: [t.key for t in core.read_node(node).spec.taints or []] == [TAINT], 60,
                 f"{node} has no lifecycle taint")
        cfg = tmp_path / "controller.json"
        cfg.write_text(json.dumps({"launcherImage": "localhost/zjusct/launcher:0.1.0", "imageDir": "/nonexistent",
                                   "cmdline": "console=ttyS0", "nodeSelector": {TAINT: node},
                                   "tolerations": [{"key": TAINT, "operator": "Equal", "value": node,
                                                    "effect": "NoSchedule"}]}))
        kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig")
        ctl = Controller(kubeconfig, cfg, k8s_namespace, tmp_path / "controller.log").start()
        yield Env(core, custom, k8s_namespace, node, ctl)
    finally:
        ns = k8s_namespace
        with contextlib.suppress(ApiException):
            for vm in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
                custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, vm["metadata"]["name"])
        with contextlib.suppress(ApiException, TimeoutError):  # no kubelet: confirm the deletions, as it would
            def gone() -> bool:
                core.delete_collection_namespaced_pod(ns, label_selector=LABEL_VM, grace_period_seconds=0)
                return not custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            wait_for(gone, 60, "CloudVMs deleted", interval=1)
        if ctl is not None:
            ctl.stop()
            print(ctl.tail()[-3000:])
        beat.stop()
        for pv in core.list_persistent_volume().items:
            if pv.metadata.name.startswith(f"{ns}-"):
                with contextlib.suppress(ApiException):
                    core.delete_persistent_volume(pv.metadata.name)
        with contextlib.suppress(ApiException):
            core.delete_node(node)


def test_guaranteed_bandwidth_is_never_placed_beyond_what_the_node_advertises(env: Env) -> None:
    env.create_vm("vm-a", {"guaranteedMbps": 60, "ceilMbps": 200})
    first = env.status_when("vm-a", "Pending", "Starting")
    pod_a = env.pod("vm-a")
    wait_for(lambda: env.core.read_namespaced_pod(pod_a.metadata.name, env.ns).spec.node_name == env.node, 60,
             "vm-a's launcher Pod bound")
    res = pod_a.spec.containers[0].resources
    assert (res.requests[BANDWIDTH_RESOURCE], res.limits) == ("60", {BANDWIDTH_RESOURCE: "60"}), res
    assert first["pod"] == pod_a.metadata.name

    env.create_vm("vm-b", {"guaranteedMbps": 60})
    status_b = env.status_when("vm-b", "Pending", "Unschedulable")
    pod_b = env.pod("vm-b")
    assert pod_b.spec.node_name is None
    assert pod_b.spec.containers[0].resources.requests[BANDWIDTH_RESOURCE] == "60"
    assert status_b["message"].startswith(f"launcher Pod {pod_b.metadata.name} cannot be scheduled: ")
    assert f"1 Insufficient {BANDWIDTH_RESOURCE}" in status_b["message"], status_b
    assert "node" not in status_b
    assert status_b["conditions"][0]["reason"] == "Unschedulable"

    env.create_vm("vm-c", None)  # no guarantee: requests none, fits next to vm-a's 60 on the same node
    pod_c = env.pod("vm-c")
    assert BANDWIDTH_RESOURCE not in (pod_c.spec.containers[0].resources.requests or {})
    assert pod_c.spec.containers[0].resources.limits is None
    wait_for(lambda: env.core.read_namespaced_pod(pod_c.metadata.name, env.ns).spec.node_name == env.node, 60,
             "vm-c's launcher Pod bound")
    # bound, its container never started (no kubelet): the status the create wrote stands, no node in it yet
    assert "node" not in env.status_when("vm-c", "Pending", "Starting")

    # vm-a stopped: the controller deletes its Pod gracefully; no kubelet runs, so the test confirms the deletion
    env.custom.patch_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, "vm-a",
                                              {"spec": {"powerState": "Stopped"}})
    wait_for(lambda: env.core.read_namespaced_pod(pod_a.metadata.name, env.ns).metadata.deletion_timestamp, 60,
             "vm-a's Pod being deleted by the controller")
    env.core.delete_namespaced_pod(pod_a.metadata.name, env.ns, grace_period_seconds=0)
    # the 60 Mbit/s are free again: the scheduler binds vm-b's waiting Pod and its status follows
    env.status_when("vm-b", "Pending", "Starting", timeout=120)
    wait_for(lambda: env.core.read_namespaced_pod(pod_b.metadata.name, env.ns).spec.node_name == env.node, 60,
             "vm-b's launcher Pod bound")
