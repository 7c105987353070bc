"""Guaranteed bandwidth as the extended resource ``cloud.zjusct.io/bandwidth-mbps`` of a launcher Pod
(zjusct_controller.pod.pod_resources), and the status of a launcher Pod the scheduler cannot place
(Pending/Unschedulable with the scheduler's message). The real scheduler's side is
tests/integration/cloudvm_k8s/test_controller_bandwidth.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import validate_spec, with_defaults
from zjusct_controller.config import Config
from zjusct_controller.decide import FINALIZER, decide
from zjusct_controller.observe import unschedulable
from zjusct_controller.pod import BANDWIDTH_RESOURCE, guaranteed_mbps, launcher_pod, pod_name, pod_resources

from tests.cluster import BANDWIDTH_RESOURCE as HARNESS_RESOURCE

CFG = Config(launcher_image="launcher:1", image_dir="/srv/images", cmdline="console=ttyS0")
UID = "0b7c1f4e-0000-4000-8000-000000000001"
NOW = "2026-01-01T00:00:00Z"
SCHEDULER_MESSAGE = ("0/3 nodes are available: 1 Insufficient cloud.zjusct.io/bandwidth-mbps, 2 node(s) didn't "
                     "match Pod's node affinity/selector. preemption: 0/3 nodes are available: 1 No preemption "
                     "victims found for incoming pod, 2 Preemption is not helpful for scheduling.")


def spec(bandwidth: dict | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"owner": "alice", "rootVolumeClaim": "web-root", "vcpus": 1, "memoryMiB": 512, **extra}
    if bandwidth is not None:
        out["network"] = {"bandwidth": bandwidth}
    return out


def test_the_resource_name_is_the_one_the_test_nodes_advertise_and_a_valid_extended_resource_name() -> None:
    assert BANDWIDTH_RESOURCE == HARNESS_RESOURCE
    domain, _, name = BANDWIDTH_RESOURCE.partition("/")
    assert domain == "cloud.zjusct.io" and name  # domain-prefixed, outside kubernetes.io


@pytest.mark.parametrize(("bandwidth", "mbps"), [
    ({"guaranteedMbps": 60, "ceilMbps": 200, "pool": "default", "priority": 5}, 60),
    ({"guaranteedMbps": 1}, 1),
    ({"guaranteedMbps": 100000}, 100000),
])
def test_a_guarantee_is_requested_and_limited_in_whole_mbits(bandwidth: dict, mbps: int) -> None:
    s = spec(bandwidth)
    assert validate_spec(with_defaults(s)) == []
    assert guaranteed_mbps(s) == mbps
    res = pod_resources(s, CFG)
    # requests == limits (Kubernetes' rule for an extended resource); the guarantee itself, no ratio applied
    assert res["requests"][BANDWIDTH_RESOURCE] == str(mbps)
    assert res["limits"] == {BANDWIDTH_RESOURCE: str(mbps)}
    assert (res["requests"]["cpu"], res["requests"]["memory"]) == ("350m", "534Mi")  # CPU/memory unchanged, no limit


@pytest.mark.parametrize("bandwidth", [None, {}, {"guaranteedMbps": 0}, {"guaranteedMbps": 0, "ceilMbps": 500},
                                       {"ceilMbps": 100, "pool": "p"}])
def test_no_guarantee_requests_no_bandwidth_and_sets_no_limits(bandwidth: dict | None) -> None:
    s = spec(bandwidth)
    assert guaranteed_mbps(s) == 0
    assert pod_resources(s, CFG) == {"requests": {"cpu": "350m", "memory": "534Mi"}}


def test_the_overcommit_ratios_of_cpu_and_memory_do_not_divide_the_guarantee() -> None:
    dense = Config(launcher_image="x", image_dir="/x", cmdline="c", cpu_ratio=8.0, memory_ratio=3.0)
    res = pod_resources(spec({"guaranteedMbps": 75}), dense)
    assert res["requests"][BANDWIDTH_RESOURCE] == "75" and res["limits"] == {BANDWIDTH_RESOURCE: "75"}


def test_the_launcher_pod_carries_the_bandwidth_request() -> None:
    vm = {"metadata": {"name": "web", "namespace": "alice", "uid": UID, "generation": 1},
          "spec": spec({"guaranteedMbps": 60}, powerState="Running", bootID=1)}
    resources = launcher_pod(vm, CFG)["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "350m", "memory": "534Mi", BANDWIDTH_RESOURCE: "60"},
                         "limits": {BANDWIDTH_RESOURCE: "60"}}


def _pending_pod(conditions: list[dict[str, Any]], node: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": pod_name("web", 1), "labels": {"cloud.zjusct.io/vm": "web",
                                                                 "cloud.zjusct.io/boot-id": "1"}},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": "Pending", "conditions": conditions}}


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": SCHEDULER_MESSAGE}


def test_an_unschedulable_launcher_pod_makes_the_vm_pending_unschedulable_with_the_schedulers_message() -> None:
    vm = {"metadata": {"name": "web", "namespace": "alice", "uid": UID, "generation": 2,
                       "finalizers": [FINALIZER]},
          "spec": spec({"guaranteedMbps": 60}, powerState="Running", bootID=1),
          "status": {"phase": "Pending", "reason": "Starting", "bootID": 1, "pod": "web-boot-1"}}
    plan = decide(vm, [_pending_pod([UNSCHEDULABLE])], {}, None, lambda: [], CFG, NOW)
    assert plan.status is not None and plan.create_pod is None and plan.delete_pods == []
    assert (plan.status["phase"], plan.status["reason"]) == ("Pending", "Unschedulable")
    assert plan.status["message"] == f"launcher Pod web-boot-1 cannot be scheduled: {SCHEDULER_MESSAGE}"
    assert plan.status["conditions"][0]["reason"] == "Unschedulable"
    assert "node" not in plan.status


@pytest.mark.parametrize("conditions", [
    [],  # the scheduler has not looked at it yet
    [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "gated"}],
    [{"type": "PodScheduled", "status": "True"}],
])
def test_a_pod_not_judged_unschedulable_stays_pending_starting(conditions: list[dict[str, Any]]) -> None:
    assert unschedulable(_pending_pod(conditions)) is None
    vm = {"metadata": {"name": "web", "namespace": "alice", "uid": UID, "generation": 2, "finalizers": [FINALIZER]},
          "spec": spec(powerState="Running", bootID=1),
          "status": {"phase": "Pending", "reason": "Starting", "bootID": 1, "pod": "web-boot-1"}}
    plan = decide(vm, [_pending_pod(conditions)], {}, None, lambda: [], CFG, NOW)
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Pending", "Starting")


def test_a_bound_pod_is_never_unschedulable_even_with_a_stale_condition() -> None:
    assert unschedulable(_pending_pod([UNSCHEDULABLE], node="n1")) is None
    assert unschedulable(_pending_pod([UNSCHEDULABLE])) == SCHEDULER_MESSAGE
