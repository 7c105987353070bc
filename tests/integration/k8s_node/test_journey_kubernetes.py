"""The operator's and the tenant's journey on the Kubernetes backend, end to end, with the playbooks an operator
runs and nothing else: ``site.yml -e zjusct_cloud_backend=kubernetes`` deploys the controller (as the Deployment,
on the real node) → ``vm_start.yml -e owner=alice`` creates her RBD root volume (a clone of the guest image's
template), its PersistentVolume and claim, and the CloudVM, and returns once her guest answers SSH → the dynamic
inventory lists her and Ansible runs a command in her guest → a file written and synced survives ``vm_stop.yml`` +
``vm_start.yml`` (bootID 2) → ``vm_backup.yml`` / ``vm_restore.yml`` round-trip it into a new VM → ``vm_delete.yml``
removes the CloudVM and keeps the volume → ``vm_start.yml`` again makes a new VM on the kept volume, file intact.

Real control plane, real node (containerd + kubelet), real Ceph (bound to the Pod bridge's host address, as in
test_controller_rbd.py), the real launcher and controller images and the real guest image under QEMU/TCG: four
boots, minutes each on a shared 2-core machine.
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
import yaml
from kubernetes import client

from tests.cluster import Cluster, RealNode, wait_for
from tests.conftest import TEST_BOOT_SLOT_DIR, TEST_BOOT_SLOTS
from tests.e2e.playbook_results import task_result
from tests.integration.inventory_k8s.inventory_k8s_helpers import run_inventory
from tests.integration.k8s_node.controller_helpers import ceph_user_secret, release_launcher_pods, ssh
from tests.integration.k8s_node.test_controller_deployment import run_site
from tests.integration.k8s_node.test_controller_rbd import CEPH_USER, SECRET

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.ceph, pytest.mark.guest, pytest.mark.slow,
              pytest.mark.timeout(5400)]
REPO = Path(__file__).resolve().parents[3]
GROUP, VERSION, PLURAL = "cloud.zjusct.io", "v1alpha1", "cloudvms"
VENV_BIN = Path(sys.executable).parent


def _rbd(ceph: Any, *args: str) -> str:
    """``rbd <args>`` against the test Ceph cluster as client.admin."""
    return subprocess.run(["rbd", "-c", str(ceph.conf), "--keyring", str(ceph.keyring), *args], capture_output=True,
                          text=True, timeout=120, check=True).stdout


class Operator:
    """Runs the collection's playbooks and inventory against the Kubernetes backend, as an operator's shell would:
    ``ZJUSCT_CLOUD_BACKEND=kubernetes``, ``K8S_AUTH_KUBECONFIG`` and the Ceph client settings in the environment."""

    def __init__(self, kubeconfig: Path, ceph_conf: Path, ceph_keyring: Path, work: Path) -> None:
        self.work = work
        self.env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ZJUSCT_CLOUD_BACKEND="kubernetes",
                        K8S_AUTH_KUBECONFIG=str(kubeconfig), CEPH_CONF=str(ceph_conf),
                        CEPH_KEYRING=str(ceph_keyring), CEPH_USER="admin",
                        PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")

    def play(self, playbook: str, extra: dict[str, Any], ok: bool = True) -> dict[str, Any]:
        proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), f"playbooks/{playbook}", "-e", json.dumps(extra)],
                              cwd=REPO, env=self.env, capture_output=True, text=True, timeout=2400, check=False)
        if ok:
            assert proc.returncode == 0, f"{playbook}: {proc.stdout[-8000:]}\n{proc.stderr[-3000:]}"
        doc: dict[str, Any] = json.loads(proc.stdout) if proc.stdout.startswith("{") else {"raw": proc.stdout}
        return doc

    def inventory(self, source: Path) -> dict[str, Any]:
        run = run_inventory(source, env=dict(self.env, ANSIBLE_STDOUT_CALLBACK="default"))
        return run.inventory

    def adhoc(self, source: Path, pattern: str, command: str, key: Path) -> str:
        proc = subprocess.run([str(VENV_BIN / "ansible"), "-i", str(source), pattern, "-m", "ansible.builtin.command",
                               "-a", command, "--private-key", str(key), "-o"], cwd=REPO,
                              env=dict(self.env, ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_HOST_KEY_CHECKING="False"),
                              capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout


OPERATOR_WRITE_BPS, TENANT_WRITE_BPS = 6291456, 3145728  # 6 and 3 MiB/s


def _launcher_config(core: Any, ns: str, vm: str) -> dict[str, Any]:
    """The LauncherConfig of the VM's launcher Pod (its annotation)."""
    (pod,) = core.list_namespaced_pod(ns, label_selector=f"cloud.zjusct.io/vm={vm}").items
    return json.loads(pod.metadata.annotations["cloud.zjusct.io/launcher-config"])


def _write_rate(key: Path, host: str) -> float:
    """Bytes per second of 12 MiB of O_DIRECT writes in the guest, as its dd reports them."""
    out = ssh(key, host, "dd if=/dev/zero of=/var/tmp/zjc-io bs=1M count=12 oflag=direct conv=fsync 2>&1 >/dev/null;"
              " rm -f /var/tmp/zjc-io")
    copied = [line.split() for line in out.splitlines() if " bytes " in line and " copied, " in line]
    assert copied, out
    return int(copied[0][0]) / float(copied[0][copied[0].index("copied,") + 1])


def test_site_then_vm_start_inventory_stop_start_backup_restore_delete_on_kubernetes(
    k8s_cluster: Cluster, k8s_api: Any, real_node: RealNode, launcher_image: dict[str, Any],
    controller_image: dict[str, Any], service_route: None, guest_image: Any, pod_ceph: Any,
    k8s_namespace: str, tmp_path: Path,
) -> None:
    ns = k8s_namespace
    core: Any = client.CoreV1Api(k8s_api)
    custom: Any = client.CustomObjectsApi(k8s_api)
    apps: Any = client.AppsV1Api(k8s_api)

    # the operator's one-time Ceph step (docs/controller.md "Root disk"): the cephx user QEMU connects as and its
    # keyring in a Secret of the tenant namespace
    ceph_user_secret(pod_ceph, core, ns, CEPH_USER, SECRET)

    placement = real_node.pod_placement()
    site_vars = {"cluster_controller_image": controller_image["key_tag"],
                 "cluster_controller_config": {
                     "launcherImage": launcher_image["tag"], "imageDir": str(guest_image.dir),
                     "cmdline": guest_image.default_cmdline, "accel": "tcg",
                     "maxConcurrentBoots": TEST_BOOT_SLOTS, "bootSlotDir": TEST_BOOT_SLOT_DIR,
                     "nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"],
                     "ceph": {"monitors": [pod_ceph.mon_host], "user": CEPH_USER, "secretName": SECRET},
                     "diskIOLimits": {"writeBytesPerSecond": OPERATOR_WRITE_BPS}},
                 "cluster_controller_node_selector": placement["nodeSelector"],
                 "cluster_controller_tolerations": placement["tolerations"],
                 "cluster_controller_namespaces": [ns],
                 "cluster_launcher_namespaces": [ns]}
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
    op = Operator(k8s_cluster.kubeconfig, pod_ceph.conf, pod_ceph.keyring, tmp_path)
    vm_vars = {"owner": "alice", "vm_namespace": ns, "ssh_public_key": key.with_suffix(".pub").read_text().strip(),
               "images_dir": str(guest_image.dir.parent), "wait_timeout": 1800}
    try:
        run_site(k8s_cluster.kubeconfig, site_vars)

        # vm_start: volume, PV, claim, CloudVM; returns once SSH answers
        started = op.play("vm_start.yml", vm_vars)
        res = task_result(started, "Start the VM and wait until its SSH answers")
        vm = res["cloudvm"]
        assert (res["phase"], vm["status"]["bootID"]) == ("Running", 1), res
        ep = vm["status"]["sshEndpoint"]["host"]
        claim = core.read_namespaced_persistent_volume_claim(vm["spec"]["rootVolumeClaim"], ns)
        pv = core.read_persistent_volume(claim.spec.volume_name)
        assert claim.status.phase == "Bound" and claim.spec.volume_mode == "Block"
        pool, image = pv.spec.csi.volume_attributes["pool"], pv.spec.csi.volume_attributes["imageName"]
        assert _rbd(pod_ceph, "image-meta", "get", f"{pool}/{image}", "cloud.zjusct.io/owner").strip() == "alice"
        assert ssh(key, ep, "cat /proc/cmdline") != ""
        fs_mib = "df -Pm / | awk 'NR == 2 {print $2}'"
        first_fs_mib = int(ssh(key, ep, fs_mib).strip())
        # the operator's disk write limit (controller diskIOLimits) is every VM's default: QEMU's root device throup
        limits = _launcher_config(core, ns, "alice")["rootDisk"]["ioLimits"]
        assert limits == {"writeBytesPerSecond": OPERATOR_WRITE_BPS}, limits
        operator_rate = _write_rate(key, ep)
        assert operator_rate <= OPERATOR_WRITE_BPS * 1.1, operator_rate

        # the inventory lists her; Ansible reaches her guest
        source = tmp_path / "inventory" / "kubernetes.cloudvm.yml"
        source.parent.mkdir()
        source.write_text(yaml.safe_dump({"plugin": "zjusct.cloud.cloudvm", "source": "kubernetes",
                                          "kubeconfig": str(k8s_cluster.kubeconfig), "namespaces": [ns],
                                          "group_by": ["owner", "namespace"]}))
        inv = op.inventory(source)
        host = f"alice.{ns}"
        assert host in inv["owner_alice"]["hosts"], inv
        assert inv["_meta"]["hostvars"][host]["ansible_host"] == ep
        op.adhoc(source, host, "sh -c 'echo journey-1 > /root/marker && sync'", key)

        # stop, start: boot 2 keeps the file
        op.play("vm_stop.yml", {"owner": "alice", "vm_namespace": ns})
        assert custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "alice")["status"]["phase"] == "Stopped"
        # started again with limits of her own: a lower write limit wins, a read limit the operator has not set
        # applies as asked; and a root volume 256 MiB larger, grown by the launcher (QEMU's block_resize of the RBD
        # image) before the guest runs, its root file system filling it at boot
        grown_mib = guest_image.rootfs.stat().st_size // 2**20 + 256
        restarted = task_result(op.play("vm_start.yml", {**vm_vars, "disk_write_bytes_per_second": TENANT_WRITE_BPS,
                                                         "disk_read_iops": 5000, "volume_size_mib": grown_mib}),
                                "Start the VM and wait until its SSH answers")
        assert (restarted["phase"], restarted["cloudvm"]["status"]["bootID"]) == ("Running", 2), restarted
        assert restarted["cloudvm"]["spec"]["diskIO"] == {"writeBytesPerSecond": TENANT_WRITE_BPS, "readIOPS": 5000}
        ep = restarted["cloudvm"]["status"]["sshEndpoint"]["host"]
        assert ssh(key, ep, "cat /root/marker").strip() == "journey-1"
        assert _launcher_config(core, ns, "alice")["rootDisk"]["sizeMiB"] == grown_mib
        assert int(ssh(key, ep, "cat /sys/block/vda/size").strip()) == grown_mib * 2048
        assert int(ssh(key, ep, fs_mib).strip()) >= first_fs_mib + 200  # ext4 keeps some of the 256 MiB
        assert json.loads(_rbd(pod_ceph, "info", "--format", "json", f"{pool}/{image}"))["size"] == grown_mib * 2**20
        assert _launcher_config(core, ns, "alice")["rootDisk"]["ioLimits"] == {"writeBytesPerSecond": TENANT_WRITE_BPS,
                                                                               "readIOPS": 5000}
        tenant_rate = _write_rate(key, ep)
        print(f"guest O_DIRECT writes on RBD: {operator_rate / 2**20:.2f} MiB/s under the operator's limit"
              f" ({OPERATOR_WRITE_BPS / 2**20:g} MiB/s), {tenant_rate / 2**20:.2f} MiB/s under the tenant's"
              f" ({TENANT_WRITE_BPS / 2**20:g} MiB/s)")
        assert tenant_rate <= TENANT_WRITE_BPS * 1.1 < operator_rate, (tenant_rate, operator_rate)

        # offline backup (stops her VM first), restore into a new VM that boots with the file
        backup_dir = tmp_path / "backups"
        backed = op.play("vm_backup.yml", {"owner": "alice", "vm_namespace": ns, "stop_if_running": True,
                                           "backup_dir": str(backup_dir)})
        backup_id = task_result(backed, "Back up the root volume (refused while it is in use)")["backup_id"]
        restore_vars = {k: v for k, v in vm_vars.items() if k != "images_dir"}
        restored = op.play("vm_restore.yml", {**restore_vars, "backup": backup_id, "backup_dir": str(backup_dir),
                                              "name": "alice-restored"})
        vms = {v["metadata"]["name"]: v for v in custom.list_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL)["items"]}
        assert vms["alice-restored"]["status"]["phase"] == "Running", restored.get("raw", "")[-3000:]
        ep2 = vms["alice-restored"]["status"]["sshEndpoint"]["host"]
        assert ssh(key, ep2, "cat /root/marker").strip() == "journey-1"

        # delete keeps the volume: image, PV and claim stay; vm_start again makes a new VM on it, with her file
        op.play("vm_delete.yml", {"owner": "alice", "vm_namespace": ns})
        wait_for(lambda: "alice" not in {v["metadata"]["name"] for v in custom.list_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL)["items"]}, 300, "CloudVM alice deleted")
        assert core.read_namespaced_persistent_volume_claim(claim.metadata.name, ns).status.phase == "Bound"
        assert core.read_persistent_volume(pv.metadata.name).spec.csi.volume_handle == f"{pool}/{image}"
        assert image in _rbd(pod_ceph, "ls", pool).split()
        again = op.play("vm_start.yml", vm_vars)
        volume = task_result(again, "Ensure the new VM's root volume (RBD image, PersistentVolume, claim)")
        assert any(a.startswith("release the claim mark of deleted CloudVM") for a in volume["actions"]), volume
        res = task_result(again, "Start the VM and wait until its SSH answers")
        assert res["phase"] == "Running" and res["cloudvm"]["metadata"]["uid"] != vm["metadata"]["uid"], res
        assert res["cloudvm"]["spec"]["rootVolumeClaim"] == claim.metadata.name
        assert ssh(key, res["cloudvm"]["status"]["sshEndpoint"]["host"], "cat /root/marker").strip() == "journey-1"
    finally:
        for name in ("alice", "alice-restored"):
            with contextlib.suppress(Exception):
                custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        with contextlib.suppress(Exception):
            core.delete_collection_namespaced_pod(ns, label_selector="cloud.zjusct.io/vm", grace_period_seconds=0)
        with contextlib.suppress(Exception):
            print(core.read_namespaced_pod_log(
                core.list_namespaced_pod("zjusct-cloud-system").items[0].metadata.name, "zjusct-cloud-system")[-4000:])
        with contextlib.suppress(Exception):
            apps.delete_namespaced_deployment("cloudvm-controller", "zjusct-cloud-system")
        release_launcher_pods(core, ns)  # the controller is gone: what it had not released yet
        for pv_obj in core.list_persistent_volume().items:  # cluster-scoped: not removed with the namespace
            if pv_obj.metadata.name.startswith(f"{ns}."):
                with contextlib.suppress(Exception):
                    core.delete_persistent_volume(pv_obj.metadata.name)
