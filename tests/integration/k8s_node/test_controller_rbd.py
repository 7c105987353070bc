"""An RBD root disk on the Kubernetes backend: the controller (run as a process, with the ServiceAccount token of
config/rbac/controller-role.yaml) reads the Block claim's PersistentVolume (``spec.csi`` of driver
``rbd.csi.ceph.com``, Ceph-CSI's attribute names, no CSI driver installed), gives the launcher ``rootDisk.rbd``
and QEMU in the real launcher image opens the image through librbd from inside the Pod with a cephx user whose
keyring comes from a Secret.

Real control plane, real node, real Ceph (``pod_ceph``: bound to the node's CNI bridge, the host address Pods
reach), real launcher image, real guest image under TCG (two boots: minutes on a shared 2-core machine).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.ceph import Cluster as CephCluster
from tests.cluster import Cluster, RealNode, wait_for
from tests.conftest import TEST_BOOT_SLOT_DIR, TEST_BOOT_SLOTS
from tests.integration.k8s_node.conftest import CEPH_ADDR
from tests.integration.k8s_node.controller_helpers import (
    BOOT_TIMEOUT,
    LABEL_VM,
    UNUSED_PUBKEY,
    Controller,
    Vms,
    ceph_user_secret,
    cloudvm,
    controller_kubeconfig,
    install_crd,
    rbd_root_volume,
    ssh,
    teardown_vms,
)
from tests.integration.k8s_node.test_launcher_pod import ssh_banner
from tests.integration.k8s_node.test_real_node import busybox_pod

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.ceph, pytest.mark.guest, pytest.mark.slow,
              pytest.mark.timeout(3600)]
CEPH_USER = "zjusct-vm"
SECRET = "ceph-vm"
PUBKEY = UNUSED_PUBKEY


def test_rbd_root_disk_boots_keeps_a_file_across_stop_and_start_and_the_key_is_nowhere(
    k8s_cluster: Cluster, real_node: RealNode, launcher_image: dict[str, Any], guest_image: Any,
    pod_ceph: CephCluster, k8s_api: Any, k8s_namespace: str, tmp_path: Path,
) -> None:
    ns = k8s_namespace
    core: Any = client.CoreV1Api(k8s_api)
    custom: Any = client.CustomObjectsApi(k8s_api)
    install_crd(k8s_api)
    key = ceph_user_secret(pod_ceph, core, ns, CEPH_USER, SECRET)
    rbd, image, pv_name = rbd_root_volume(pod_ceph, core, guest_image, ns)

    placement = real_node.pod_placement()
    cfg = tmp_path / "controller.json"
    cfg.write_text(json.dumps({"launcherImage": launcher_image["tag"], "imageDir": str(guest_image.dir),
                               "cmdline": guest_image.default_cmdline, "accel": "tcg",
                               "maxConcurrentBoots": TEST_BOOT_SLOTS, "bootSlotDir": TEST_BOOT_SLOT_DIR,
                               "nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"],
                               "ceph": {"monitors": [pod_ceph.mon_host], "user": CEPH_USER,
                                        "secretName": SECRET}}))
    ssh_key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_key)], check=True, timeout=60)
    pubkey = ssh_key.with_suffix(".pub").read_text().strip()
    kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig")
    ctl = Controller(kubeconfig, cfg, ns, tmp_path / "controller.log").start()
    vms = Vms(core, custom, ns, ctl)

    try:
        vms.create(cloudvm("vm1", pubkey, "Running", 1))
        running = vms.status_when("vm1", lambda s: s.get("phase") in ("Running", "Failed", "Blocked") and s.get(
            "bootID") == 1, BOOT_TIMEOUT, "vm1 boot 1 Running", interval=2)
        st = running["status"]
        assert (st["phase"], st["reason"]) == ("Running", "SSHReady"), st
        (pod,) = vms.pods("vm1")
        # the claim is not mounted (no CSI driver on the node); the launcher opened the image through librbd
        assert not [v for v in pod.spec.volumes if v.persistent_volume_claim is not None]
        assert pod.metadata.annotations["cloud.zjusct.io/root-claim"] == "vm1-root"
        launcher_cfg = json.loads(pod.metadata.annotations["cloud.zjusct.io/launcher-config"])
        assert launcher_cfg["rootDisk"]["rbd"] == {
            "pool": "rbd", "image": image.image, "conf": "/etc/zjusct/ceph.conf", "user": CEPH_USER,
            "keyringPath": "/etc/zjusct-ceph/keyring"}
        watchers = rbd.status(image)
        assert [w["address"].split(":")[0] for w in watchers] == [pod.status.pod_ip], watchers
        endpoint = st["sshEndpoint"]
        assert ssh_banner(endpoint["host"], endpoint["port"]).startswith("SSH-2.0-OpenSSH")
        ssh(ssh_key, endpoint["host"], "echo written-on-rbd > /root/marker && sync && cat /root/marker")

        vms.patch_spec("vm1", powerState="Stopped", bootID=1)
        stopped = vms.status_when("vm1", lambda s: s.get("phase") in ("Stopped", "Failed"), 600, "vm1 Stopped",
                                  interval=2)
        assert (stopped["status"]["phase"], stopped["status"]["reason"]) == ("Stopped", "StopRequested"), stopped
        wait_for(lambda: not core.list_namespaced_pod(ns, label_selector=LABEL_VM).items, 300, "launcher Pod gone")
        wait_for(lambda: rbd.status(image) == [], 120, "no watcher once QEMU is gone")

        vms.patch_spec("vm1", powerState="Running", bootID=2)
        again = vms.status_when("vm1", lambda s: s.get("bootID") == 2 and s.get("phase") in (
            "Running", "Failed", "Blocked"), BOOT_TIMEOUT, "vm1 boot 2 Running", interval=2)
        assert (again["status"]["phase"], again["status"]["reason"]) == ("Running", "SSHReady"), again["status"]
        assert ssh(ssh_key, again["status"]["sshEndpoint"]["host"], "cat /root/marker").strip() == "written-on-rbd"

        # the cephx key is in the Secret only: not in the Pod (spec, annotations), Events, status, logs
        api = client.ApiClient()
        (pod2,) = vms.pods("vm1")
        seen = {
            "pod": json.dumps(api.sanitize_for_serialization(pod2)),
            "events": json.dumps(api.sanitize_for_serialization(core.list_namespaced_event(ns))),
            "cloudvm": json.dumps(vms.vm("vm1")),
            "launcher log": core.read_namespaced_pod_log(pod2.metadata.name, ns),
            "controller log": ctl.log.read_text(errors="replace"),
            "boot 1 result": json.dumps(stopped["status"].get("exitResult")),
        }
        for what, text in seen.items():
            assert key not in text, f"the cephx key appears in the {what}"
        assert stopped["status"].get("exitResult"), stopped["status"]
    finally:
        teardown_vms(vms, ["vm1"], [pv_name])


def test_block_claim_writers_and_non_rbd_pvs_block_the_start_naming_them(
    k8s_cluster: Cluster, real_node: RealNode, k8s_api: Any, k8s_namespace: str, tmp_path: Path,
) -> None:
    """No guest boot: a Pod that names the Block claim in ``cloud.zjusct.io/root-claim`` (as an RBD launcher does;
    it mounts nothing) blocks the start (VolumeInUse, naming it); a Block claim whose PV is not an RBD PV is
    Blocked/VolumeNotSupported naming the PV and the field; fixed, the launcher Pod is created without the claim
    mounted and with the Secret's keyring."""
    ns = k8s_namespace
    core: Any = client.CoreV1Api(k8s_api)
    custom: Any = client.CustomObjectsApi(k8s_api)
    install_crd(k8s_api)
    pvs = {"bad": f"{ns}-bad-root", "vm1": f"{ns}-vm1-root"}
    csis = {"bad": {"driver": "other.csi.example.com", "volumeHandle": "x"},
            "vm1": {"driver": "rbd.csi.ceph.com", "volumeHandle": "rbd/img",
                    "volumeAttributes": {"pool": "rbd", "imageName": "img"}}}
    for vm_name, pv_name in pvs.items():
        core.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "volumeMode": "Block", "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": ns, "name": f"{vm_name}-root"}, "csi": csis[vm_name]}})
        core.create_namespaced_persistent_volume_claim(ns, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{vm_name}-root"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeMode": "Block",
                     "volumeName": pv_name, "resources": {"requests": {"storage": "1Gi"}}}})
    for vm_name in pvs:
        wait_for(lambda n=vm_name: core.read_namespaced_persistent_volume_claim(f"{n}-root", ns).status.phase
                 == "Bound", 120, f"{vm_name}-root Bound")
    placement = real_node.pod_placement()
    cfg = tmp_path / "controller.json"
    cfg.write_text(json.dumps({"launcherImage": "zjusct-launcher:absent", "imageDir": str(tmp_path),
                               "cmdline": "console=ttyS0", "nodeSelector": placement["nodeSelector"],
                               "tolerations": placement["tolerations"],
                               "ceph": {"monitors": [f"{CEPH_ADDR}:6789"], "user": CEPH_USER,
                                        "secretName": SECRET}}))
    kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig")
    ctl = Controller(kubeconfig, cfg, ns, tmp_path / "controller.log").start()
    vms = Vms(core, custom, ns, ctl)

    try:
        vms.create(cloudvm("bad", PUBKEY, "Running", 1))
        bad = vms.status_when("bad", lambda s: s.get("phase") == "Blocked", 60, "bad Blocked on its PV")
        assert bad["status"]["reason"] == "VolumeNotSupported", bad["status"]
        for word in (f"PersistentVolume {pvs['bad']}", "spec.csi.driver", "other.csi.example.com",
                     "rbd.csi.ceph.com"):
            assert word in bad["status"]["message"], bad["status"]
        assert core.list_namespaced_pod(ns, label_selector=LABEL_VM).items == []

        # an RBD PV, but another Pod names the claim as its root disk (mounting nothing)
        squatter = busybox_pod(real_node, "squatter", "exec sleep 3600")
        squatter["metadata"]["annotations"] = {"cloud.zjusct.io/root-claim": "vm1-root"}
        core.create_namespaced_pod(ns, squatter)
        vms.create(cloudvm("vm1", PUBKEY, "Running", 1))
        busy = vms.status_when("vm1", lambda s: s.get("reason") == "VolumeInUse", 120, "vm1 Blocked by the squatter")
        assert busy["status"]["phase"] == "Blocked" and "squatter" in busy["status"]["message"], busy["status"]
        assert core.list_namespaced_pod(ns, label_selector=LABEL_VM).items == []

        core.delete_namespaced_pod("squatter", ns, grace_period_seconds=0)
        created = vms.status_when("vm1", lambda s: s.get("pod") == "vm1-boot-1", 120, "launcher Pod created")
        assert created["status"]["phase"] in ("Pending", "Running"), created["status"]
        pod = core.read_namespaced_pod("vm1-boot-1", ns)
        assert not [v for v in pod.spec.volumes if v.persistent_volume_claim is not None]
        assert [v.secret.secret_name for v in pod.spec.volumes if v.secret is not None] == [SECRET]
        assert pod.metadata.annotations["cloud.zjusct.io/root-claim"] == "vm1-root"
    finally:
        teardown_vms(vms, list(pvs), list(pvs.values()))
