"""A CloudVM status that says Running, checked against its launcher Pod (model/launcher_pod.py) by the Kubernetes
adapter (k8s/cloudvm.py ``running_doubt``, ``running_doubts``) over a fake ``CoreV1Api``.

The Pods are shaped like kube-apiserver's JSON: a Ready launcher Pod, the same Pod after kube-controller-manager's
node lifecycle controller marked its node's Pods not Ready (``MarkPodsNotReady`` sets ``Ready`` to False and keeps
the condition's empty reason), a Pod being deleted, and none (404). The statuses are what the controller writes
(``status.pod`` names the boot's Pod).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Optional

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import cloudvm as k8s
from ansible_collections.zjusct.cloud.plugins.module_utils.model import launcher_pod
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError


def pod(name: str = "alice-boot-3", ready: Optional[str] = "True", node: str = "node-2", ns: str = "tenant-alice",
        deleting: Optional[str] = None, reason: Optional[str] = None, message: Optional[str] = None) -> dict:
    conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"}]
    if ready is not None:
        cond = {"type": "Ready", "status": ready, "lastTransitionTime": "2026-12-06T20:35:10Z"}
        cond.update({k: v for k, v in (("reason", reason), ("message", message)) if v})
        conditions.append(cond)
    metadata: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}",
                                "labels": {"app.kubernetes.io/name": "zjusct-launcher", "cloud.zjusct.io/vm": "alice",
                                           "cloud.zjusct.io/boot-id": name.rsplit("-", 1)[-1]},
                                "managedFields": [{"manager": "kubelet"}]}
    if deleting:
        metadata["deletionTimestamp"] = deleting
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"nodeName": node, "containers": [{"name": "launcher"}]},
            "status": {"phase": "Running", "podIP": "10.244.1.7", "conditions": conditions}}


def vm(name: str = "alice", ns: str = "tenant-alice", phase: str = "Running", boot: int = 3,
       status_boot: Optional[int] = None, pod_name: Optional[str] = "alice-boot-3") -> dict:
    status: dict[str, Any] = {"phase": phase, "reason": "SSHReady" if phase == "Running" else phase,
                              "bootID": boot if status_boot is None else status_boot, "node": "node-2",
                              "observedGeneration": 4}
    if pod_name:
        status["pod"] = pod_name
    return {"apiVersion": "cloud.zjusct.io/v1alpha1", "kind": "CloudVM",
            "metadata": {"name": name, "namespace": ns, "generation": 4},
            "spec": {"owner": "alice", "powerState": "Running", "bootID": boot}, "status": status}


class _Raw:
    """What ``CoreV1Api`` returns with ``_preload_content=False``: the raw answer, its body in ``data``."""

    def __init__(self, doc: dict) -> None:
        self.data = json.dumps(doc).encode()


class FakeCore:
    """``CoreV1Api``'s read and list of Pods over ``pods`` ({(namespace, name): Pod}); ``fail`` is raised instead
    (an ApiException with a status, or a connection error); every call is recorded."""

    def __init__(self, pods: Optional[list] = None, fail: Optional[Exception] = None) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods or []}
        self.fail = fail
        self.calls: list[tuple] = []

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> _Raw:
        self.calls.append(("read", namespace, name, kwargs.get("_request_timeout")))
        assert kwargs.get("_preload_content") is False, "read raw JSON, no model classes"
        if self.fail is not None:
            raise self.fail
        if (namespace, name) not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return _Raw(copy.deepcopy(self.pods[(namespace, name)]))

    def list_namespaced_pod(self, namespace: str, label_selector: str = "", **kwargs: Any) -> _Raw:
        self.calls.append(("list", namespace, label_selector, kwargs.get("_request_timeout")))
        if self.fail is not None:
            raise self.fail
        return _Raw({"kind": "PodList", "items": [copy.deepcopy(p) for (ns, _), p in sorted(self.pods.items())
                                                  if ns == namespace]})


def adapter(core: Optional[FakeCore]) -> k8s.KubernetesCloudVMApi:
    return k8s.KubernetesCloudVMApi(custom_objects=None, sleep=lambda s: None, core=core)


# --------------------------------------------------------------------------- the rule (pure)


def test_a_ready_pod_backs_a_running_status() -> None:
    assert launcher_pod.doubt("tenant-alice", vm()["status"], pod()) is None


def test_a_pod_marked_not_ready_by_the_node_lifecycle_controller_is_a_doubt_naming_pod_node_and_controller() -> None:
    found = launcher_pod.doubt("tenant-alice", vm()["status"], pod(ready="False"))
    assert found is not None and found.reason == "LauncherPodNotReady"
    assert found.message.startswith("status says Running but launcher Pod alice-boot-3 is not Ready (Ready=False, "
                                    "since 2026-12-06T20:35:10Z) on node node-2: its node may have stopped reporting")
    assert "the controller has not recorded that (it may be down or unable to update the status)" in found.message


def test_the_conditions_reason_and_message_are_named_when_there_are_some() -> None:
    found = launcher_pod.doubt("ns", vm()["status"], pod(ready="False", reason="NodeNotReady", message="node gone"))
    assert found is not None and "is not Ready (NodeNotReady: node gone, since 2026-12-06T20:35:10Z) on node node-2" \
        in found.message
    unknown = launcher_pod.doubt("ns", vm()["status"], pod(ready=None))
    assert unknown is not None and "(no Ready condition)" in unknown.message


def test_a_missing_pod_and_a_pod_being_deleted_are_doubts() -> None:
    gone = launcher_pod.doubt("tenant-alice", vm()["status"], None)
    assert gone is not None and gone.reason == "LauncherPodGone"
    assert gone.message.startswith("status says Running but launcher Pod tenant-alice/alice-boot-3 is gone; ")
    deleting = launcher_pod.doubt("tenant-alice", vm()["status"], pod(deleting="2026-12-06T20:36:00Z"))
    assert deleting is not None and deleting.reason == "LauncherPodTerminating"
    assert "alice-boot-3 on node node-2 is being deleted (since 2026-12-06T20:36:00Z)" in deleting.message


def test_nothing_to_check_without_a_running_status_that_names_its_pod() -> None:
    assert launcher_pod.doubt("ns", vm(phase="Stopped")["status"], None) is None
    assert launcher_pod.doubt("ns", vm(pod_name=None)["status"], None) is None
    assert launcher_pod.doubt("ns", None, None) is None


def test_slim_keeps_what_the_rule_reads_and_judges_alike() -> None:
    for whole in (pod(), pod(ready="False", reason="R", message="m"), pod(deleting="t"), pod(ready=None)):
        small = launcher_pod.slim(whole)
        assert launcher_pod.doubt("ns", vm()["status"], small) == launcher_pod.doubt("ns", vm()["status"], whole)
        assert "managedFields" not in json.dumps(small) and len(json.dumps(small)) < len(json.dumps(whole))


# --------------------------------------------------------------------------- the Kubernetes adapter


def test_adapter_doubts_a_running_status_whose_pod_is_not_ready_with_one_get() -> None:
    core = FakeCore([pod(ready="False")])
    doubt = adapter(core).running_doubt(vm())
    assert doubt is not None and "launcher Pod alice-boot-3 is not Ready" in doubt and "node node-2" in doubt
    assert core.calls == [("read", "tenant-alice", "alice-boot-3", k8s.REQUEST_TIMEOUT)]


def test_adapter_doubts_a_running_status_whose_pod_is_gone() -> None:
    doubt = adapter(FakeCore([])).running_doubt(vm())
    assert doubt is not None and "launcher Pod tenant-alice/alice-boot-3 is gone" in doubt


def test_adapter_trusts_a_running_status_whose_pod_is_ready() -> None:
    assert adapter(FakeCore([pod()])).running_doubt(vm()) is None


@pytest.mark.parametrize("fail", [ApiException(status=403, reason="Forbidden"),
                                  ApiException(status=500, reason="Internal Server Error"),
                                  MaxRetryError(None, "/api/v1/namespaces/tenant-alice/pods/alice-boot-3")],
                         ids=["forbidden", "server-error", "unreachable"])
def test_adapter_trusts_the_status_when_the_pod_cannot_be_read(fail: Exception) -> None:
    core = FakeCore([pod(ready="False")], fail=fail)
    assert adapter(core).running_doubt(vm()) is None
    assert len(core.calls) == 1
    assert adapter(None).running_doubt(vm()) is None


def test_adapter_reads_no_pod_unless_the_status_says_running_for_spec_boot_id() -> None:
    core = FakeCore([])
    api = adapter(core)
    assert api.running_doubt(vm(phase="Pending")) is None
    assert api.running_doubt(vm(status_boot=2)) is None
    assert api.running_doubt(vm(pod_name=None)) is None
    assert core.calls == []


def test_adapter_running_doubts_lists_pods_once_per_namespace_with_a_running_vm() -> None:
    core = FakeCore([pod(), pod("bob-boot-1", ready="False", ns="tenant-bob", node="node-3")])
    vms = [vm(), vm("carol", pod_name="carol-boot-3"), vm("bob", ns="tenant-bob", pod_name="bob-boot-1"),
           vm("dave", ns="tenant-dave", phase="Stopped", pod_name="dave-boot-1")]
    doubts = adapter(core).running_doubts(vms)
    assert set(doubts) == {"tenant-alice/carol", "tenant-bob/bob"}
    assert "launcher Pod tenant-alice/carol-boot-3 is gone" in doubts["tenant-alice/carol"]
    assert "bob-boot-1 is not Ready" in doubts["tenant-bob/bob"] and "node node-3" in doubts["tenant-bob/bob"]
    assert [c[:3] for c in core.calls] == [("list", "tenant-alice", launcher_pod.LAUNCHER_SELECTOR),
                                           ("list", "tenant-bob", launcher_pod.LAUNCHER_SELECTOR)]
    forbidden = FakeCore([], fail=ApiException(status=403, reason="Forbidden"))
    assert adapter(forbidden).running_doubts(vms) == {}, "a namespace whose Pods cannot be read adds nothing"
