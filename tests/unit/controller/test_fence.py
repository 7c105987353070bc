"""Fencing in the controller's pure decisions and the fence adapter's address choice: an older boot's launcher
Pod on a NotReady node blocks the new boot; once the node carries ``node.kubernetes.io/out-of-service`` and the
root disk is RBD with a fence identity configured, the plan fences it (never in the same plan as a create); the
old client's addresses come from the image's watchers and lock owners. The real path (real Ceph, real node,
kubelet killed, guest boots) is tests/integration/k8s_node/test_controller_fencing.py."""

from __future__ import annotations

from typing import Any

import pytest
from zjusct_controller.decide import (
    CLAIMED_BY,
    OUT_OF_SERVICE_TAINT,
    CephConfig,
    Config,
    decide,
    pod_name,
)
from zjusct_controller.fence import address_ip, addresses_to_fence

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
    plan = decide(vm(), [old_pod()], node(), claim(), [], CFG, NOW, PV)
    assert plan.create_pod is None and plan.fence == []
    # not even a graceful delete: a terminating Pod on an out-of-service node would be force-deleted by the
    # pod GC before the fence, and with it the record of the client to fence
    assert plan.delete_pods == []
    assert plan.status is not None
    assert (plan.status["phase"], plan.status["reason"], plan.status["bootID"]) == ("Blocked", "PreviousBootRunning",
                                                                                   2)
    assert "n1" in plan.status["message"] and OUT_OF_SERVICE_TAINT in plan.status["message"]


def test_out_of_service_node_fences_the_old_rbd_client_and_creates_nothing_yet() -> None:
    plan = decide(vm(), [old_pod()], node(taints=[OOS]), claim(), [], CFG, NOW, PV)
    assert plan.fence == [{"pod": "web-boot-1", "uid": "pod-uid-1", "node": "n1", "podIP": "10.1.0.5",
                           "pool": "rbd", "image": "alice-web"}]
    assert plan.create_pod is None and plan.delete_pods == []
    assert plan.status is not None and plan.status["phase"] == "Blocked"
    assert "fencing launcher Pod web-boot-1 on the out-of-service node n1" in plan.status["message"]


def test_once_the_fenced_pod_is_gone_the_new_boot_is_created() -> None:
    plan = decide(vm(), [], node(taints=[OOS]), claim(), [], CFG, NOW, PV)
    assert plan.fence == [] and plan.create_pod is not None
    assert plan.create_pod["metadata"]["name"] == "web-boot-2"


def test_a_gone_node_counts_as_out_of_service_and_a_pod_without_ip_is_fenced_too() -> None:
    plan = decide(vm(), [old_pod(ip=None)], {"n1": None}, claim(), [], CFG, NOW, PV)
    assert [(t["pod"], t["podIP"]) for t in plan.fence] == [("web-boot-1", None)]


@pytest.mark.parametrize(("cfg", "pvc", "volume", "words"), [
    (NO_FENCE, claim(), PV, ("cannot be fenced", "ceph.fenceUser")),
    (CFG, claim(mode="Filesystem"), None, ("cannot be fenced", "not an RBD image", "--force")),
])
def test_out_of_service_without_a_fence_identity_or_rbd_disk_stays_blocked_saying_why(
        cfg: Config, pvc: dict, volume: dict | None, words: tuple) -> None:
    plan = decide(vm(), [old_pod()], node(taints=[OOS]), pvc, [], cfg, NOW, volume)
    assert plan.fence == [] and plan.create_pod is None
    assert plan.status is not None and plan.status["reason"] == "PreviousBootRunning"
    for word in words:
        assert word in plan.status["message"], plan.status["message"]


def test_a_ready_node_is_never_fenced_even_with_the_taint() -> None:
    plan = decide(vm(), [old_pod()], node(ready="True", taints=[OOS]), claim(), [], CFG, NOW, PV)
    assert plan.fence == [] and plan.create_pod is None
    assert plan.delete_pods == [("web-boot-1", CFG.stop_timeout_s + 30)]  # the kubelet stops it gracefully


def test_the_current_boot_on_a_lost_node_is_unknown_and_not_fenced() -> None:
    plan = decide(vm(boot=1), [old_pod()], node(taints=[OOS]), claim(), [], CFG, NOW, PV)
    assert plan.fence == [] and plan.create_pod is None and plan.delete_pods == []
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Unknown", "NodeLost")


def test_launcher_pod_tolerates_the_lost_node_taints_so_kubernetes_does_not_evict_it() -> None:
    plan = decide(vm(), [], {}, claim(), [], CFG, NOW, PV)
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
