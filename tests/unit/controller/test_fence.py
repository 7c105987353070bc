"""Fencing in the controller's pure decisions and the fence adapter's address choice: an older boot's launcher
Pod on a NotReady node blocks the new boot; once the node carries ``node.kubernetes.io/out-of-service`` and the
root disk is RBD with a fence identity configured, the plan fences it (never in the same plan as a create); the
old client's addresses come from the image's watchers and lock owners. An RBD launcher Pod carries a finalizer so
that a terminating one on a lost node (a stop just before the loss) stays the record of its client: the pod GC marks
it Failed and force-deletes it, and a stop or a new boot then fences it. The real path (real Ceph, real node,
kubelet killed, guest boots) is tests/integration/k8s_node/test_controller_fencing.py."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import OUT_OF_SERVICE_TAINT
from zjusct_controller.config import CephConfig, Config
from zjusct_controller.decide import decide
from zjusct_controller.fence import address_ip, addresses_to_fence
from zjusct_controller.observe import observe, pod_rbd, releasable
from zjusct_controller.pod import CONFIG_ANNOTATION, POD_FINALIZER, pod_name
from zjusct_controller.volume import CLAIMED_BY

CEPH = CephConfig(monitors=("10.0.0.1:6789",), user="vm", secret_name="ceph-vm", fence_user="fence",
                  fence_keyring="/etc/zjusct-fence/keyring")
CFG = Config(launcher_image="launcher:1", image_dir="/srv/images", cmdline="console=ttyS0", ceph=CEPH)
NO_FENCE = Config(launcher_image="launcher:1", image_dir="/srv/images", cmdline="console=ttyS0",
                  ceph=CephConfig(monitors=("10.0.0.1:6789",), user="vm", secret_name="ceph-vm"))
NOW = "2026-01-01T00:00:00Z"
UID = "0b7c1f4e-0000-4000-8000-000000000001"
OOS = {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}


def vm(boot: int = 2, power: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": "web", "namespace": "alice", "uid": UID, "generation": 2,
                         "finalizers": ["cloud.zjusct.io/launcher"]},
            "spec": {"owner": "alice", "rootVolumeClaim": "web-root", "powerState": power, "bootID": boot},
            "status": {"phase": "Unknown", "reason": "NodeLost", "bootID": 1, "pod": "web-boot-1", "node": "n1"}}


def claim(mode: str = "Block") -> dict[str, Any]:
    return {"metadata": {"name": "web-root", "namespace": "alice", "uid": "pvc-uid", "annotations": {CLAIMED_BY: UID}},
            "spec": {"volumeMode": mode, "volumeName": "alice-web-root"}, "status": {"phase": "Bound"}}


PV = {"metadata": {"name": "alice-web-root"},
      "spec": {"volumeMode": "Block", "claimRef": {"namespace": "alice", "name": "web-root", "uid": "pvc-uid"},
               "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "rbd/alice-web",
                       "volumeAttributes": {"pool": "rbd", "imageName": "alice-web"}}}}


def old_pod(boot: int = 1, ip: str | None = "10.1.0.5", deleting: bool = False) -> dict[str, Any]:
    md: dict[str, Any] = {"name": pod_name("web", boot), "uid": f"pod-uid-{boot}",
                          "labels": {"cloud.zjusct.io/vm": "web", "cloud.zjusct.io/boot-id": str(boot)}}
    if deleting:
        md["deletionTimestamp"] = NOW
    status: dict[str, Any] = {"phase": "Running", "containerStatuses": [
        {"name": "launcher", "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": md, "spec": {"nodeName": "n1"}, "status": status}


def node(ready: str = "Unknown", taints: list | None = None) -> dict[str, dict]:
    return {"n1": {"metadata": {"name": "n1"}, "spec": {"taints": taints or []},
                   "status": {"conditions": [{"type": "Ready", "status": ready}]}}}


def test_not_ready_without_the_taint_blocks_the_new_boot_names_the_taint_and_deletes_nothing() -> None:
    plan = decide(vm(), [old_pod()], node(), claim(), lambda: [], CFG, NOW, PV)
    assert plan.create_pod is None and plan.fence == []
    # not even a graceful delete: a terminating Pod on an out-of-service node would be force-deleted by the
    # pod GC before the fence, and with it the record of the client to fence
    assert plan.delete_pods == []
    assert plan.status is not None
    assert (plan.status["phase"], plan.status["reason"], plan.status["bootID"]) == ("Blocked", "PreviousBootRunning",
                                                                                   2)
    assert "n1" in plan.status["message"] and OUT_OF_SERVICE_TAINT in plan.status["message"]


def test_out_of_service_node_fences_the_old_rbd_client_and_creates_nothing_yet() -> None:
    plan = decide(vm(), [old_pod()], node(taints=[OOS]), claim(), lambda: [], CFG, NOW, PV)
    assert plan.fence == [{"pod": "web-boot-1", "uid": "pod-uid-1", "node": "n1", "podIP": "10.1.0.5",
                           "pool": "rbd", "image": "alice-web"}]
    assert plan.create_pod is None and plan.delete_pods == []
    assert plan.status is not None and plan.status["phase"] == "Blocked"
    assert "fencing launcher Pod web-boot-1 on the out-of-service node n1" in plan.status["message"]


def test_once_the_fenced_pod_is_gone_the_new_boot_is_created() -> None:
    plan = decide(vm(), [], node(taints=[OOS]), claim(), lambda: [], CFG, NOW, PV)
    assert plan.fence == [] and plan.create_pod is not None
    assert plan.create_pod["metadata"]["name"] == "web-boot-2"


def test_a_gone_node_counts_as_out_of_service_and_a_pod_without_ip_is_fenced_too() -> None:
    plan = decide(vm(), [old_pod(ip=None)], {"n1": None}, claim(), lambda: [], CFG, NOW, PV)
    assert [(t["pod"], t["podIP"]) for t in plan.fence] == [("web-boot-1", None)]


@pytest.mark.parametrize(("cfg", "pvc", "volume", "words"), [
    (NO_FENCE, claim(), PV, ("cannot be fenced", "ceph.fenceUser")),
    (CFG, claim(mode="Filesystem"), None, ("cannot be fenced", "not an RBD image", "--force")),
])
def test_out_of_service_without_a_fence_identity_or_rbd_disk_stays_blocked_saying_why(
        cfg: Config, pvc: dict, volume: dict | None, words: tuple) -> None:
    plan = decide(vm(), [old_pod()], node(taints=[OOS]), pvc, lambda: [], cfg, NOW, volume)
    assert plan.fence == [] and plan.create_pod is None
    assert plan.status is not None and plan.status["reason"] == "PreviousBootRunning"
    for word in words:
        assert word in plan.status["message"], plan.status["message"]


def test_a_ready_node_is_never_fenced_even_with_the_taint() -> None:
    plan = decide(vm(), [old_pod()], node(ready="True", taints=[OOS]), claim(), lambda: [], CFG, NOW, PV)
    assert plan.fence == [] and plan.create_pod is None
    assert plan.delete_pods == [("web-boot-1", CFG.stop_timeout_s + 30)]  # the kubelet stops it gracefully


def test_the_current_boot_on_a_lost_node_is_unknown_and_not_fenced() -> None:
    plan = decide(vm(boot=1), [old_pod()], node(taints=[OOS]), claim(), lambda: [], CFG, NOW, PV)
    assert plan.fence == [] and plan.create_pod is None and plan.delete_pods == []
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Unknown", "NodeLost")


def test_launcher_pod_tolerates_the_lost_node_taints_so_kubernetes_does_not_evict_it() -> None:
    plan = decide(vm(), [], {}, claim(), lambda: [], CFG, NOW, PV)
    assert plan.create_pod is not None
    tolerated = {(t["key"], t.get("effect"), t.get("tolerationSeconds"))
                 for t in plan.create_pod["spec"]["tolerations"]}
    assert {("node.kubernetes.io/not-ready", "NoExecute", None), ("node.kubernetes.io/unreachable", "NoExecute", None),
            (OUT_OF_SERVICE_TAINT, "NoExecute", None)} <= tolerated


@pytest.mark.parametrize(("raw", "words"), [
    ({"fenceUser": "fence"}, ("fenceUser and ceph.fenceKeyring go together", "fenceUser alone")),
    ({"fenceUser": "client.fence", "fenceKeyring": "/k"}, ("ceph.fenceUser", "client.fence")),
    ({"fenceUser": "fence", "fenceKeyring": "keyring"}, ("ceph.fenceKeyring", "'keyring'", "absolute path")),
])
def test_fence_identity_config_errors_name_the_key(raw: dict, words: tuple) -> None:
    with pytest.raises(ValueError) as err:
        CephConfig.from_dict({"monitors": ["10.0.0.1:6789"], "user": "vm", "secretName": "s", **raw})
    for word in words:
        assert word in str(err.value)


def test_fence_identity_config_is_read() -> None:
    ceph = CephConfig.from_dict({"monitors": ["10.0.0.1:6789"], "user": "vm", "secretName": "s",
                                 "fenceUser": "fence", "fenceKeyring": "/etc/k"})
    assert (ceph.fence_user, ceph.fence_keyring) == ("fence", "/etc/k")


WATCHERS = [{"address": "10.1.0.5:0/3001", "client": 4101, "cookie": 1},
            {"address": "10.1.0.9:0/3002", "client": 4102, "cookie": 2}]
LOCKS = [{"id": "auto 140", "locker": "client.4101", "address": "v1:10.1.0.5:0/3001"},
         {"id": "auto 141", "locker": "client.4103", "address": "10.1.0.5:0/3003"}]


def test_addresses_of_the_old_pod_ip_from_watchers_and_lock_owners() -> None:
    assert address_ip("v1:10.1.0.5:0/3001") == "10.1.0.5" and address_ip("[fd00::5]:0/7") == "fd00::5"
    assert address_ip("nonsense") is None
    assert addresses_to_fence(WATCHERS, LOCKS, "10.1.0.5") == ["10.1.0.5:0/3001", "10.1.0.5:0/3003",
                                                              "v1:10.1.0.5:0/3001"]


def test_no_client_of_the_pod_ip_left_blocklists_the_whole_ip_and_no_ip_every_client() -> None:
    assert addresses_to_fence(WATCHERS, [], "10.1.0.7") == ["10.1.0.7:0/0"]
    assert addresses_to_fence([], [], "fd00::7") == ["[fd00::7]:0/0"]
    assert addresses_to_fence(WATCHERS, [], None) == ["10.1.0.5:0/3001", "10.1.0.9:0/3002"]


def stopping_pod(boot: int = 1, *, gc_marked: bool = True, terminated: bool = False, grace: int = 210,
                 finalizer: bool = True) -> dict[str, Any]:
    """A launcher Pod a stop deleted (grace ``grace``) before its node was lost; ``gc_marked``: then the pod GC's
    Failed mark and force-delete (grace 0) at the out-of-service taint, which the finalizer turns into an update."""
    p = old_pod(boot, deleting=True)
    p["metadata"]["deletionGracePeriodSeconds"] = 0 if gc_marked else grace
    # the image its launcher opens, as launcher_pod writes it into the LauncherConfig annotation
    p["metadata"]["annotations"] = {CONFIG_ANNOTATION: '{"rootDisk": {"rbd": {"pool": "rbd", "image": "alice-web"}}}'}
    if finalizer:
        p["metadata"]["finalizers"] = [POD_FINALIZER]
    if gc_marked:
        p["status"]["phase"] = "Failed"
    if terminated:
        p["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 0, "message": ""}}
    return p


def test_an_rbd_launcher_pod_carries_the_fence_finalizer_and_a_file_disk_pod_does_not() -> None:
    plan = decide(vm(), [], {}, claim(), lambda: [], CFG, NOW, PV)
    assert plan.create_pod is not None and plan.create_pod["metadata"]["finalizers"] == [POD_FINALIZER]
    assert pod_rbd(plan.create_pod) is not None and pod_rbd(plan.create_pod)["image"] == "alice-web"
    filesystem = decide(vm(), [], {}, claim(mode="Filesystem"), lambda: [], CFG, NOW, None)
    assert filesystem.create_pod is not None and "finalizers" not in filesystem.create_pod["metadata"]


def test_the_pod_gc_failed_mark_on_a_lost_node_is_not_the_launchers_end() -> None:
    p = stopping_pod()
    assert observe(p, False).state == "unknown" and observe(p, None).state == "unknown"
    assert observe(p, True).state == "lost"  # the kubelet answers: a terminal phase is its report
    assert observe(stopping_pod(terminated=True), False).state == "lost"  # reported terminated before the loss


@pytest.mark.parametrize(("pod", "ready", "expected"), [
    (stopping_pod(gc_marked=False), False, False),  # terminating, its node lost: may still run
    (stopping_pod(), False, False),  # the pod GC's force-delete of a lost node's Pod
    (stopping_pod(), None, False),  # ... and of a Pod whose Node object is gone
    (stopping_pod(terminated=True), False, True),  # the kubelet reported the container ended
    (stopping_pod(gc_marked=False), True, False),  # a graceful stop under way on a Ready node
    (stopping_pod(), True, True),  # the kubelet on a Ready node finished it (or kills what a force-delete left)
    (old_pod(), True, False),  # not terminating
])
def test_a_pod_is_released_only_once_its_launcher_is_known_to_have_ended(pod: dict, ready: bool | None,
                                                                        expected: bool) -> None:
    assert releasable(pod, ready) is expected


def test_a_never_bound_terminating_pod_is_released() -> None:
    p = stopping_pod(gc_marked=False)
    p["spec"] = {}
    assert releasable(p, None) is True


def test_a_stop_on_an_out_of_service_node_fences_the_terminating_pod_and_keeps_it_until_then() -> None:
    stopped = vm(boot=1, power="Stopped")
    plan = decide(stopped, [stopping_pod()], node(taints=[OOS]), claim(), lambda: [], CFG, NOW, None)
    assert [t["pod"] for t in plan.fence] == ["web-boot-1"] and plan.release_pods == []
    assert plan.delete_pods == [] and plan.create_pod is None
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Unknown", "NodeLost")
    assert "fencing launcher Pod web-boot-1 on the out-of-service node n1" in plan.status["message"]
    # not yet out of service: nothing fenced, nothing released, the status says what the operator can do
    waiting = decide(stopped, [stopping_pod(gc_marked=False)], node(), claim(), lambda: [], CFG, NOW, None)
    assert waiting.fence == [] and waiting.release_pods == []
    assert waiting.status is not None and OUT_OF_SERVICE_TAINT in waiting.status["message"]
    again = decide({**stopped, "status": waiting.status}, [stopping_pod(gc_marked=False)], node(), claim(), lambda: [],
                   CFG, NOW, None)
    assert again.status is not None and again.status["message"] == waiting.status["message"]  # said once


def test_a_start_after_a_stop_interrupted_by_the_node_loss_waits_for_the_fence() -> None:
    # the defect the fault campaign found: the stopped boot's Pod, force-deleted by the pod GC, was forgotten and
    # the next boot started while the old launcher (a partitioned node) could still write the image
    plan = decide(vm(boot=2), [stopping_pod()], node(taints=[OOS]), claim(), lambda: [], CFG, NOW, PV)
    assert plan.create_pod is None and [t["pod"] for t in plan.fence] == ["web-boot-1"]
    assert plan.status is not None and plan.status["reason"] == "PreviousBootRunning"


def test_a_terminating_current_pod_on_a_lost_node_is_unknown_not_failed() -> None:
    plan = decide(vm(boot=1), [stopping_pod(gc_marked=False)], node(), claim(), lambda: [], CFG, NOW, PV)
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Unknown", "NodeLost")


def test_a_deleted_vm_fences_its_launcher_on_an_out_of_service_node_and_releases_an_ended_one() -> None:
    deleted = vm(boot=1)
    deleted["metadata"]["deletionTimestamp"] = NOW
    plan = decide(deleted, [stopping_pod()], node(taints=[OOS]), claim(), lambda: [], CFG, NOW, None)
    assert [t["pod"] for t in plan.fence] == ["web-boot-1"] and not plan.remove_finalizer
    ended = decide(deleted, [stopping_pod(terminated=True)], node(taints=[OOS]), claim(), lambda: [], CFG, NOW, None)
    assert ended.fence == [] and ended.release_pods == [("web-boot-1", "pod-uid-1", [POD_FINALIZER])]


def test_the_fenced_image_is_the_one_the_pods_own_launcher_config_names() -> None:
    p = stopping_pod()
    p["metadata"]["annotations"] = {CONFIG_ANNOTATION: '{"rootDisk": {"rbd": {"pool": "vms", "image": "old-web"}}}'}
    plan = decide(vm(boot=2), [p], node(taints=[OOS]), claim(), lambda: [], CFG, NOW, PV)
    assert [(t["pool"], t["image"]) for t in plan.fence] == [("vms", "old-web")]
    stopped = decide(vm(boot=1, power="Stopped"), [p], node(taints=[OOS]), claim(), lambda: [], CFG, NOW, None)
    assert [(t["pool"], t["image"]) for t in stopped.fence] == [("vms", "old-web")]
