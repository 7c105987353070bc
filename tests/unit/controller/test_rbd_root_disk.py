"""RBD root disks in the controller's pure decisions: a Block claim's PersistentVolume -> the launcher's
``rootDisk.rbd``, the refusals naming the object and field, the launcher Pod without the claim mounted, the
``ceph`` section of the controller config. The real path (real Ceph, real node, guest boot) is
tests/integration/k8s_node/test_controller_rbd.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from zjusct_controller.config import CephConfig, Config
from zjusct_controller.decide import decide, needs_volume
from zjusct_controller.pod import CEPH_CONF_ANNOTATION, ROOT_CLAIM
from zjusct_controller.reconcile import Reconciler
from zjusct_controller.volume import CLAIMED_BY, VolumeProblem, rbd_root_disk

CEPH = CephConfig(monitors=("[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]",), user="vm", secret_name="ceph-vm")
CFG = Config(launcher_image="launcher:1", image_dir="/srv/images", cmdline="console=ttyS0", ceph=CEPH)
NOW = "2026-01-01T00:00:00Z"
UID = "0b7c1f4e-0000-4000-8000-000000000001"
RBD = {"pool": "rbd", "image": "alice-web", "conf": "/etc/zjusct/ceph.conf", "user": "vm",
       "keyringPath": "/etc/zjusct-ceph/keyring"}


def vm(power: str = "Running", boot: int = 1, status: dict | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "web", "namespace": "alice", "uid": UID, "generation": 1,
                         "finalizers": ["cloud.zjusct.io/launcher"]},
            "spec": {"owner": "alice", "rootVolumeClaim": "web-root", "powerState": power, "bootID": boot},
            "status": status or {}}


def claim(phase: str = "Bound", mode: str = "Block") -> dict[str, Any]:
    return {"metadata": {"name": "web-root", "namespace": "alice", "uid": "pvc-uid", "annotations": {CLAIMED_BY: UID}},
            "spec": {"volumeMode": mode, "volumeName": "alice-web-root"}, "status": {"phase": phase}}


def pv(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"volumeMode": "Block", "claimRef": {"namespace": "alice", "name": "web-root",
                                                                 "uid": "pvc-uid"},
                            "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "rbd/alice-web",
                                    "volumeAttributes": {"pool": "rbd", "imageName": "alice-web"}}}
    spec.update(over)
    return {"metadata": {"name": "alice-web-root"}, "spec": spec}


def test_rbd_pv_gives_the_launcher_root_disk_rbd() -> None:
    assert rbd_root_disk(claim(), pv(), CFG) == RBD


@pytest.mark.parametrize(("volume", "cfg", "reason", "words"), [
    (None, CFG, "VolumeClaimNotReady", ("PersistentVolume alice-web-root", "spec.volumeName", "does not exist")),
    (pv(), Config(launcher_image="l", image_dir="/i", cmdline="c"), "VolumeNotSupported",
     ("web-root", "spec.volumeMode", "no ceph section")),
    (pv(csi=None, hostPath={"path": "/srv"}), CFG, "VolumeNotSupported",
     ("PersistentVolume alice-web-root", "spec.csi.driver", "(none)", "rbd.csi.ceph.com")),
    (pv(csi={"driver": "cephfs.csi.ceph.com", "volumeHandle": "x"}), CFG, "VolumeNotSupported",
     ("spec.csi.driver", "cephfs.csi.ceph.com")),
    (pv(volumeMode="Filesystem"), CFG, "VolumeNotSupported", ("spec.volumeMode", "Filesystem", "Block")),
    (pv(claimRef={"namespace": "alice", "name": "other"}), CFG, "VolumeClaimNotReady",
     ("spec.claimRef", "alice/other", "alice/web-root")),
    (pv(claimRef={"namespace": "alice", "name": "web-root", "uid": "old-uid"}), CFG, "VolumeClaimNotReady",
     ("spec.claimRef",)),
    (pv(csi={"driver": "rbd.csi.ceph.com", "volumeHandle": "x", "volumeAttributes": {"pool": "rbd",
                                                                                      "imageName": "a/b"}}),
     CFG, "VolumeNotSupported", ("spec.csi.volumeAttributes.imageName", "'a/b'")),
    (pv(csi={"driver": "rbd.csi.ceph.com", "volumeHandle": "x", "volumeAttributes": {"imageName": "a"}}),
     CFG, "VolumeNotSupported", ("spec.csi.volumeAttributes.pool", "None")),
])
def test_refusals_name_the_object_and_the_field(volume: Any, cfg: Config, reason: str, words: tuple) -> None:
    with pytest.raises(VolumeProblem) as exc:
        rbd_root_disk(claim(), volume, cfg)
    assert exc.value.reason == reason
    for w in words:
        assert w in exc.value.message, exc.value.message
    # through decide(): Blocked with that reason and message, no Pod
    plan = decide(vm(), [], {}, claim(), lambda: [], cfg, NOW, volume)
    assert plan.create_pod is None and plan.status is not None
    assert (plan.status["phase"], plan.status["reason"], plan.status["message"]) == (
        "Blocked", reason, exc.value.message)


def test_claim_not_bound_is_refused_before_the_pv_is_read() -> None:
    assert not needs_volume(vm(), claim(phase="Pending"))
    plan = decide(vm(), [], {}, claim(phase="Pending"), lambda: [], CFG, NOW, None)
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == (
        "Blocked", "VolumeClaimNotReady")
    assert "web-root" in plan.status["message"] and "Pending" in plan.status["message"]


def test_pv_is_read_only_when_a_pod_may_be_created() -> None:
    assert needs_volume(vm(), claim())
    assert needs_volume(vm(), claim(mode="Filesystem"))  # its PV's owner mark is checked too
    assert not needs_volume(vm(power="Stopped"), claim())
    assert not needs_volume(vm(status={"bootID": 1, "pod": "web-boot-1"}), claim())  # this boot has its Pod
    assert needs_volume(vm(boot=2, status={"bootID": 1, "pod": "web-boot-1"}), claim())
    deleting = vm()
    deleting["metadata"]["deletionTimestamp"] = NOW
    assert not needs_volume(deleting, claim())


def test_launcher_pod_of_an_rbd_disk_mounts_no_claim_and_gets_conf_and_keyring_secret() -> None:
    plan = decide(vm(), [], {}, claim(), lambda: [], CFG, NOW, pv())
    pod = plan.create_pod
    assert pod is not None and plan.status is not None and plan.status["phase"] == "Pending"
    ann = pod["metadata"]["annotations"]
    assert ann[ROOT_CLAIM] == "web-root"
    assert json.loads(ann["cloud.zjusct.io/launcher-config"])["rootDisk"] == {"rbd": RBD, "cache": "Writeback"}
    assert ann[CEPH_CONF_ANNOTATION] == (
        "[global]\nmon_host = [v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]\nauth_client_required = cephx\n")
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert not [v for v in vols.values() if "persistentVolumeClaim" in v]
    assert vols["vm"] == {"name": "vm", "emptyDir": {}}
    assert vols["ceph-keyring"]["secret"] == {"secretName": "ceph-vm", "defaultMode": 0o400,
                                              "items": [{"key": "keyring", "path": "keyring"}]}
    assert {i["path"] for i in vols["config"]["downwardAPI"]["items"]} == {"launcher.json", "ceph.conf"}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["ceph-keyring"] == {"name": "ceph-keyring", "mountPath": "/etc/zjusct-ceph", "readOnly": True}


def test_filesystem_claim_keeps_the_mounted_root_raw_and_names_the_claim() -> None:
    fs_claim = claim(mode="Filesystem")
    plan = decide(vm(), [], {}, fs_claim, lambda: [], CFG, NOW)
    pod = plan.create_pod
    assert pod is not None
    assert pod["metadata"]["annotations"][ROOT_CLAIM] == "web-root"
    assert CEPH_CONF_ANNOTATION not in pod["metadata"]["annotations"]
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["vm"]["persistentVolumeClaim"] == {"claimName": "web-root"} and "ceph-keyring" not in vols
    assert json.loads(pod["metadata"]["annotations"]["cloud.zjusct.io/launcher-config"])["rootDisk"] == {
        "path": "/vm/root.raw", "cache": "Writeback"}


def test_writers_include_pods_naming_the_claim_in_the_root_claim_annotation() -> None:
    def pod(name: str, rv: int, **md: Any) -> dict:
        status = md.pop("status", {"phase": "Running"})
        spec = md.pop("spec", {})
        return {"metadata": {"name": name, "namespace": "alice", "resourceVersion": str(rv), **md},
                "spec": spec, "status": status}

    pods = [
        pod("mounts", 1, spec={"volumes": [{"persistentVolumeClaim": {"claimName": "web-root"}}]}),
        pod("other-launcher", 2, annotations={ROOT_CLAIM: "web-root"}),
        pod("ended", 3, annotations={ROOT_CLAIM: "web-root"}, status={"phase": "Succeeded"}),
        pod("own", 4, labels={"cloud.zjusct.io/vm": "web"}, annotations={ROOT_CLAIM: "web-root"}),
        pod("unrelated", 5, annotations={ROOT_CLAIM: "x"}),
    ]
    r = Reconciler(client.ApiClient(), CFG)
    for p in pods:
        r.store.apply("pod", "ADDED", p)
    vm_ = vm()
    vm_["metadata"].setdefault("namespace", "alice")
    assert sorted(r._claim_writers(vm_)) == ["mounts", "other-launcher"]


@pytest.mark.parametrize(("raw", "words"), [
    ({"monitors": ["10.0.0.1:6789"], "user": "vm"}, ("required keys missing", "secretName")),
    ({"monitors": ["10.0.0.1:6789"], "user": "vm", "secretName": "s", "key": "AQ"}, ("unknown keys", "key")),
    ({"monitors": ["10.0.0.1 6789"], "user": "vm", "secretName": "s"}, ("ceph.monitors", "10.0.0.1 6789")),
    ({"monitors": "10.0.0.1:6789", "user": "vm", "secretName": "s"}, ("ceph.monitors",)),
    ({"monitors": ["10.0.0.1:6789"], "user": "client.vm", "secretName": "s"}, ("ceph.user", "client.vm")),
    ({"monitors": ["10.0.0.1:6789"], "user": "vm", "secretName": "Bad_Name"}, ("ceph.secretName", "Bad_Name")),
    ("mon", ("ceph: must be an object",)),
])
def test_ceph_config_refusals_name_the_key_and_value(raw: Any, words: tuple) -> None:
    with pytest.raises(ValueError) as exc:
        Config.from_dict({"launcherImage": "l", "imageDir": "/i", "cmdline": "c", "ceph": raw})
    for w in words:
        assert w in str(exc.value), str(exc.value)


def test_ceph_config_is_read() -> None:
    cfg = Config.from_dict({"launcherImage": "l", "imageDir": "/i", "cmdline": "c", "ceph": {
        "monitors": ["10.0.0.1:6789", "10.0.0.2:6789"], "user": "vm", "secretName": "ceph-vm"}})
    assert cfg.ceph == CephConfig(monitors=("10.0.0.1:6789", "10.0.0.2:6789"), user="vm", secret_name="ceph-vm")
    assert "mon_host = 10.0.0.1:6789,10.0.0.2:6789\n" in cfg.ceph.conf_text()
    assert Config.from_dict({"launcherImage": "l", "imageDir": "/i", "cmdline": "c"}).ceph is None
