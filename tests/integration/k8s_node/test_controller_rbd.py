"""An RBD root disk on the Kubernetes backend: the controller (run as a process, with the ServiceAccount token of
config/rbac/controller-role.yaml) reads the Block claim's PersistentVolume (``spec.csi`` of driver
``rbd.csi.ceph.com``, Ceph-CSI's attribute names, no CSI driver installed), gives the launcher ``rootDisk.rbd``
and QEMU in the real launcher image opens the image through librbd from inside the Pod with a cephx user whose
keyring comes from a Secret.

Real control plane, real node, real Ceph, real launcher image, real guest image under TCG (two boots: minutes on
a shared 2-core machine). The Ceph cluster of this module binds the host side of the real node's CNI bridge
(``cni-zjusct0``, 10.233.0.1, on the Pods' own subnet: the bridge plugin runs with ``isGateway`` but gives Pods no
default route, so an address elsewhere on the host is out of their reach, measured: librbd "Connection timed
out"). The bridge exists once the node has run a Pod; the fixture runs one first. The session's 127.0.0.1 cluster
is out of a Pod's reach too.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils._rbd import Connection, ImageRef, Rbd
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.ceph import Cluster as CephCluster
from tests.ceph import start_cluster
from tests.cluster import Cluster, RealNode, wait_for
from tests.conftest import require
from tests.integration.ceph.conftest import _have_ceph
from tests.integration.controller_process import Controller, controller_kubeconfig
from tests.integration.k8s_node.test_controller import (
    BOOT_TIMEOUT,
    CRD_FILE,
    GROUP,
    LABEL_VM,
    PLURAL,
    VERSION,
    _cloudvm,
    _create_or_keep,
)
from tests.integration.k8s_node.test_launcher_pod import ssh_banner
from tests.integration.k8s_node.test_real_node import busybox_pod

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.ceph, pytest.mark.guest, pytest.mark.slow,
              pytest.mark.timeout(3600)]
CEPH_IF = "cni-zjusct0"  # tests/cluster/_realnode.py BRIDGE
CEPH_ADDR = "10.233.0.1"  # its host side (POD_GATEWAY), on-link for every Pod
CEPH_USER = "zjusct-vm"
SECRET = "ceph-vm"
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl unused"  # never booted


def _bridge_has_address() -> bool:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", CEPH_IF], capture_output=True, text=True,
                         timeout=30, check=False)
    return f" {CEPH_ADDR}/" in out.stdout


@pytest.fixture(scope="module")
def pod_ceph(real_node: RealNode, k8s_api: Any) -> Iterator[CephCluster]:
    """A Ceph cluster bound to ``CEPH_ADDR`` on the node's CNI bridge (stopped at the end; the bridge is the
    node's and goes with it)."""
    require("ceph", _have_ceph(), "ceph-mon/mgr/osd and rbd not installed (hack/install-deps.sh)")
    if not _bridge_has_address():  # the bridge plugin creates the bridge with the first Pod sandbox
        core: Any = client.CoreV1Api(k8s_api)
        core.create_namespaced_pod("default", busybox_pod(real_node, "bridge-up", "true"))
        try:
            wait_for(_bridge_has_address, 180, f"{CEPH_ADDR} on {CEPH_IF}")
        finally:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod("bridge-up", "default", grace_period_seconds=0)
    cluster = start_cluster(timeout=180, address=CEPH_ADDR)
    try:
        yield cluster
    finally:
        cluster.stop()


def _ssh(key: Path, host: str, command: str) -> str:
    argv = ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
            "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=60", "-o", "LogLevel=ERROR", f"root@{host}", command]
    out = None
    for _ in range(6):  # sshd sends its banner slightly before it accepts logins under heavy load
        out = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
        if out.returncode == 0:
            return out.stdout
        time.sleep(5)
    raise AssertionError(f"ssh {host} {command!r}: {out.stderr if out else ''}")


def test_rbd_root_disk_boots_keeps_a_file_across_stop_and_start_and_the_key_is_nowhere(
    k8s_cluster: Cluster, real_node: RealNode, launcher_image: dict[str, Any], guest_image: Any,
    pod_ceph: CephCluster, k8s_api: Any, k8s_namespace: str, tmp_path: Path,
) -> None:
    ns = k8s_namespace
    core: Any = client.CoreV1Api(k8s_api)
    custom: Any = client.CustomObjectsApi(k8s_api)
    ext = client.ApiextensionsV1Api(k8s_api)
    (crd,) = [d for d in yaml.safe_load_all(CRD_FILE.read_text()) if d]
    _create_or_keep(lambda: ext.create_custom_resource_definition(crd))
    wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                         ext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []),
             60, "CloudVM CRD Established")

    # the cephx user QEMU connects as (rbd profile on pool rbd only), its keyring in a Secret of the namespace
    keyring = pod_ceph.ceph("auth", "get-or-create", f"client.{CEPH_USER}", "mon", "profile rbd", "osd",
                            "profile rbd pool=rbd")
    key = next(line.split("=", 1)[1].strip() for line in keyring.splitlines() if line.strip().startswith("key"))
    assert len(key) > 20
    core.create_namespaced_secret(ns, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
                                       "type": "Opaque", "stringData": {"keyring": keyring}})

    # the root volume: a clone of the guest image's template snapshot, as rbd_volume makes it
    rbd = Rbd(Connection(conf=str(pod_ceph.conf), keyring=str(pod_ceph.keyring), timeout=900))
    template = ImageRef("rbd", "tmpl-guest")
    rbd.import_raw(str(guest_image.rootfs), template, timeout=900)
    rbd.snap_create(template.at("base"))
    rbd.snap_protect(template.at("base"))
    image = ImageRef("rbd", f"{ns}-vm1-root")
    rbd.clone(template.at("base"), image)

    pv_name = f"{ns}-vm1-root"
    core.create_persistent_volume({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "volumeMode": "Block", "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"namespace": ns, "name": "vm1-root"},
                 "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": image.spec,
                         "volumeAttributes": {"pool": image.pool, "imageName": image.image}}}})
    core.create_namespaced_persistent_volume_claim(ns, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "vm1-root"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeMode": "Block",
                 "volumeName": pv_name, "resources": {"requests": {"storage": "2Gi"}}}})
    wait_for(lambda: core.read_namespaced_persistent_volume_claim("vm1-root", ns).status.phase == "Bound", 120,
             "root volume claim Bound")

    placement = real_node.pod_placement()
    cfg = tmp_path / "controller.json"
    cfg.write_text(json.dumps({"launcherImage": launcher_image["tag"], "imageDir": str(guest_image.dir),
                               "cmdline": guest_image.default_cmdline, "accel": "tcg",
                               "nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"],
                               "ceph": {"monitors": [pod_ceph.mon_host], "user": CEPH_USER,
                                        "secretName": SECRET}}))
    ssh_key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_key)], check=True, timeout=60)
    pubkey = ssh_key.with_suffix(".pub").read_text().strip()
    kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig")
    ctl = Controller(kubeconfig, cfg, ns, tmp_path / "controller.log").start()

    def vm() -> dict[str, Any]:
        return dict(custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "vm1"))

    def status_when(pred: Any, timeout: float, what: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = vm()
            return obj if pred(obj.get("status") or {}) else None

        try:
            return dict(wait_for(check, timeout, what, interval=2))
        except BaseException:
            print(ctl.tail())
            with contextlib.suppress(Exception):
                print(vm().get("status"))
            for p in core.list_namespaced_pod(ns, label_selector=LABEL_VM).items:
                with contextlib.suppress(Exception):
                    print(core.read_namespaced_pod_log(p.metadata.name, ns)[-4000:])
            raise

    def power(state: str, boot: int) -> None:
        custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "vm1",
                                              {"spec": {"powerState": state, "bootID": boot}})

    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _cloudvm("vm1", pubkey, "Running", 1))
        running = status_when(lambda s: s.get("phase") in ("Running", "Failed", "Blocked") and s.get("bootID") == 1,
                              BOOT_TIMEOUT, "vm1 boot 1 Running")
        st = running["status"]
        assert (st["phase"], st["reason"]) == ("Running", "SSHReady"), st
        (pod,) = core.list_namespaced_pod(ns, label_selector=f"{LABEL_VM}=vm1").items
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
        _ssh(ssh_key, endpoint["host"], "echo written-on-rbd > /root/marker && sync && cat /root/marker")

        power("Stopped", 1)
        stopped = status_when(lambda s: s.get("phase") in ("Stopped", "Failed"), 600, "vm1 Stopped")
        assert (stopped["status"]["phase"], stopped["status"]["reason"]) == ("Stopped", "StopRequested"), stopped
        wait_for(lambda: not core.list_namespaced_pod(ns, label_selector=LABEL_VM).items, 300, "launcher Pod gone")
        wait_for(lambda: rbd.status(image) == [], 120, "no watcher once QEMU is gone")

        power("Running", 2)
        again = status_when(lambda s: s.get("bootID") == 2 and s.get("phase") in ("Running", "Failed", "Blocked"),
                            BOOT_TIMEOUT, "vm1 boot 2 Running")
        assert (again["status"]["phase"], again["status"]["reason"]) == ("Running", "SSHReady"), again["status"]
        assert _ssh(ssh_key, again["status"]["sshEndpoint"]["host"], "cat /root/marker").strip() == "written-on-rbd"

        # the cephx key is in the Secret only: not in the Pod (spec, annotations), Events, status, logs
        api = client.ApiClient()
        (pod2,) = core.list_namespaced_pod(ns, label_selector=f"{LABEL_VM}=vm1").items
        seen = {
            "pod": json.dumps(api.sanitize_for_serialization(pod2)),
            "events": json.dumps(api.sanitize_for_serialization(core.list_namespaced_event(ns))),
            "cloudvm": json.dumps(vm()),
            "launcher log": core.read_namespaced_pod_log(pod2.metadata.name, ns),
            "controller log": ctl.log.read_text(errors="replace"),
            "boot 1 result": json.dumps(stopped["status"].get("exitResult")),
        }
        for what, text in seen.items():
            assert key not in text, f"the cephx key appears in the {what}"
        assert stopped["status"].get("exitResult"), stopped["status"]
    finally:
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(ns, label_selector=LABEL_VM, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "vm1")
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"], 300,
                     "CloudVM deleted")
        ctl.stop()
        with contextlib.suppress(ApiException):
            core.delete_persistent_volume(pv_name)
        print(ctl.tail()[-3000:])


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
    ext = client.ApiextensionsV1Api(k8s_api)
    (crd,) = [d for d in yaml.safe_load_all(CRD_FILE.read_text()) if d]
    _create_or_keep(lambda: ext.create_custom_resource_definition(crd))
    wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                         ext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []),
             60, "CloudVM CRD Established")
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

    def status_when(pred: Any, timeout: float, what: str, name: str = "vm1") -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = dict(custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))
            return obj if pred(obj.get("status") or {}) else None

        try:
            return dict(wait_for(check, timeout, what, interval=1))
        except BaseException:
            print(ctl.tail())
            raise

    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _cloudvm("bad", PUBKEY,
                                                                                      "Running", 1))
        bad = status_when(lambda s: s.get("phase") == "Blocked", 60, "bad Blocked on its PV", "bad")
        assert bad["status"]["reason"] == "VolumeNotSupported", bad["status"]
        for word in (f"PersistentVolume {pvs['bad']}", "spec.csi.driver", "other.csi.example.com",
                     "rbd.csi.ceph.com"):
            assert word in bad["status"]["message"], bad["status"]
        assert core.list_namespaced_pod(ns, label_selector=LABEL_VM).items == []

        # an RBD PV, but another Pod names the claim as its root disk (mounting nothing)
        squatter = busybox_pod(real_node, "squatter", "exec sleep 3600")
        squatter["metadata"]["annotations"] = {"cloud.zjusct.io/root-claim": "vm1-root"}
        core.create_namespaced_pod(ns, squatter)
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _cloudvm("vm1", PUBKEY,
                                                                                      "Running", 1))
        busy = status_when(lambda s: s.get("reason") == "VolumeInUse", 120, "vm1 Blocked by the squatter")
        assert busy["status"]["phase"] == "Blocked" and "squatter" in busy["status"]["message"], busy["status"]
        assert core.list_namespaced_pod(ns, label_selector=LABEL_VM).items == []

        core.delete_namespaced_pod("squatter", ns, grace_period_seconds=0)
        created = status_when(lambda s: s.get("pod") == "vm1-boot-1", 120, "launcher Pod created")
        assert created["status"]["phase"] in ("Pending", "Running"), created["status"]
        pod = core.read_namespaced_pod("vm1-boot-1", ns)
        assert not [v for v in pod.spec.volumes if v.persistent_volume_claim is not None]
        assert [v.secret.secret_name for v in pod.spec.volumes if v.secret is not None] == [SECRET]
        assert pod.metadata.annotations["cloud.zjusct.io/root-claim"] == "vm1-root"
    finally:
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        for vm_name in pvs:
            with contextlib.suppress(ApiException):
                custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, vm_name)
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"], 120,
                     "CloudVMs deleted")
        ctl.stop()
        for pv_name in pvs.values():
            with contextlib.suppress(ApiException):
                core.delete_persistent_volume(pv_name)
