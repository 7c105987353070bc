"""Never two writers of a root disk when a node is lost (docs/controller.md, Fencing), and a controller killed
mid-reconcile, on the real control plane and the real node.

* The kubelet is killed (SIGKILL; the launcher and its QEMU keep running under containerd) and a stop arrives
  before the Node is NotReady: the controller's graceful delete of the launcher Pod is never carried out, the VM
  goes Unknown (never Running again on that boot, nor Stopped while the old launcher may write), and the Pod stays
  while the node is not fenced. The operator taints the node ``node.kubernetes.io/out-of-service`` (KEP-2268): the
  pod GC marks the terminating Pod Failed and force-deletes it (its finalizer keeps it), the controller blocklists
  the old QEMU's RBD client with its own cephx identity (``ceph osd blocklist ls`` shows the old watcher; the old
  guest can no longer write), then removes the old Pod, and the VM is Stopped. With the kubelet back a start runs
  bootID 2 with the data synced before the loss, and nothing the old guest wrote after the fence. (Before the
  finalizer the pod GC's force-delete erased the Pod, the stop said Stopped unfenced and the next boot started
  beside the old writer: the fault campaign's finding, docs/kubernetes.md.) The new boot that fences an older
  one is tests/integration/localcluster/test_vms_on_two_nodes.py. Real Ceph bound to the Pod bridge, real
  launcher image, real guest under TCG: two boots.
* The controller is SIGKILLed between the launcher Pod's create and its status write (its right to write the
  status is withdrawn, so the kill lands exactly there): restarted, it makes no second Pod and the status
  converges on the Pod. No guest boot.
"""

from __future__ import annotations

import copy
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.ceph import Cluster as CephCluster
from tests.cluster import Cluster, RealNode, wait_for
from tests.integration.k8s_node.controller_helpers import (
    BOOT_TIMEOUT,
    UNUSED_PUBKEY,
    Controller,
    PodWatch,
    StatusWatch,
    Vms,
    ceph_user_secret,
    cloudvm,
    controller_kubeconfig,
    controller_role_docs,
    fencing_controller_config,
    hostpath_root_volume,
    install_crd,
    rbd_root_volume,
    set_out_of_service,
    ssh,
    ssh_argv,
    ssh_keypair,
    teardown_vms,
)

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.slow]
CEPH_USER = "zjusct-vm"
FENCE_USER = "zjusct-fence"
SECRET = "ceph-vm"


@pytest.mark.ceph
@pytest.mark.guest
@pytest.mark.timeout(3600)
def test_a_stop_cut_by_the_kubelets_death_is_unknown_until_out_of_service_fences_the_old_rbd_client(
    k8s_cluster: Cluster, real_node: RealNode, launcher_image: dict[str, Any], guest_image: Any,
    pod_ceph: CephCluster, k8s_api: Any, k8s_namespace: str, tmp_path: Path,
) -> None:
    ns = k8s_namespace
    core: Any = client.CoreV1Api(k8s_api)
    custom: Any = client.CustomObjectsApi(k8s_api)
    install_crd(k8s_api)
    ceph_user_secret(pod_ceph, core, ns, CEPH_USER, SECRET)
    rbd, image, pv_name = rbd_root_volume(pod_ceph, core, guest_image, ns)
    placement = real_node.pod_placement()
    cfg = fencing_controller_config(pod_ceph, tmp_path, launcher_image["tag"], guest_image, CEPH_USER, SECRET,
                                    FENCE_USER, nodeSelector=placement["nodeSelector"],
                                    tolerations=placement["tolerations"])
    ssh_key, pubkey = ssh_keypair(tmp_path)
    kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig")
    ctl = Controller(kubeconfig, cfg, ns, tmp_path / "controller.log").start()
    vms = Vms(core, custom, ns, ctl)
    node = real_node.name

    try:
        with StatusWatch(custom, ns) as statuses, PodWatch(core, ns, "vm1") as pods:
            vms.create(cloudvm("vm1", pubkey, "Running", 1))
            running = vms.status_when("vm1", lambda s: s.get("phase") in ("Running", "Failed", "Blocked"),
                                      BOOT_TIMEOUT, "vm1 boot 1 Running", interval=2)
            assert (running["status"]["phase"], running["status"]["bootID"]) == ("Running", 1), running["status"]
            old_ip = running["status"]["sshEndpoint"]["host"]
            ssh(ssh_key, old_ip, "echo synced-before-the-loss > /root/marker && sync")
            old_clients = [w["address"] for w in rbd.status(image)]
            assert old_clients and all(a.startswith(f"{old_ip}:") for a in old_clients), old_clients
            (old_pod,) = vms.pods("vm1")

            # (a) the kubelet dies, the launcher keeps running, and a stop arrives before the node is NotReady: the
            # controller deletes the Pod (gracefully), which no kubelet carries out - a stop interrupted by the loss
            real_node.kill_kubelet()
            vms.patch_spec("vm1", powerState="Stopped")
            wait_for(lambda: [p.metadata.deletion_timestamp is not None for p in vms.pods("vm1")] == [True], 12,
                     "the stop's graceful delete of the launcher Pod, before the node is NotReady (16 s)")
            unknown = vms.status_when("vm1", lambda s: s.get("phase") == "Unknown", 180, "vm1 Unknown")
            st = unknown["status"]
            assert (st["reason"], st["bootID"]) == ("NodeLost", 1), st
            assert node in st["message"] and "node.kubernetes.io/out-of-service" in st["message"], st
            seen_reconciles = ctl.reconciles()
            wait_for(lambda: ctl.reconciles() >= seen_reconciles + 2, 60, "two more reconciles (events, resync)")
            assert [p.metadata.uid for p in vms.pods("vm1")] == [old_pod.metadata.uid]
            assert rbd.status(image) != [], "the old QEMU is still a watcher (it runs on the lost node)"

            # (b) the operator states the node is off. The pod GC marks the terminating Pod Failed and force-deletes
            # it, which its finalizer turns into a mark; the controller fences the old client, then removes the Pod,
            # and only then is the stop complete: Stopped, with the old guest cut off from its disk
            set_out_of_service(core, node, True)
            wait_for(lambda: old_pod.metadata.name not in [p.metadata.name for p in vms.pods("vm1")], 180,
                     "old launcher Pod removed after the fence")
            blocklist = pod_ceph.ceph("osd", "blocklist", "ls")
            assert all(addr in blocklist for addr in old_clients), (old_clients, blocklist)
            events = core.list_namespaced_event(ns, field_selector="involvedObject.name=vm1").items
            fenced = [e.message for e in events if e.reason == "Fenced"]
            assert fenced and old_pod.metadata.name in fenced[0], [(e.reason, e.message) for e in events]
            stopped = vms.status_when("vm1", lambda s: s.get("phase") != "Unknown", 60, "vm1 stopped after the fence")
            assert (stopped["status"]["phase"], stopped["status"]["bootID"]) == ("Stopped", 1), stopped["status"]
            # the old guest still runs (its node's kubelet is dead) but its disk writes no longer land
            try:
                late = subprocess.run(ssh_argv(ssh_key, old_ip, "echo written-after-the-fence > /root/late && "
                                               "sync -f /root/late", connect_timeout=20),
                                      capture_output=True, text=True, timeout=120, check=False)
                late_rc: int | None = late.returncode
            except subprocess.TimeoutExpired:
                late_rc = None  # the guest's flush hangs on the blocklisted client: not written either
            print(f"old guest's write after the fence: rc {late_rc}")
            assert late_rc != 0, "the old guest's write and flush succeeded after the fence"

            # the node comes back; the operator removes the taint (KEP-2268's procedure) and starts the VM: boot 2
            real_node.start_kubelet()
            set_out_of_service(core, node, False)
            vms.patch_spec("vm1", powerState="Running", bootID=2)
            again = vms.status_when("vm1", lambda s: s.get("bootID") == 2 and s.get("phase") in (
                "Running", "Failed"), BOOT_TIMEOUT, "vm1 boot 2 Running", interval=2)
            st = again["status"]
            assert (st["phase"], st["reason"], st["pod"]) == ("Running", "SSHReady", "vm1-boot-2"), st
            new_ip = st["sshEndpoint"]["host"]
            assert ssh(ssh_key, new_ip, "cat /root/marker").strip() == "synced-before-the-loss"
            assert ssh(ssh_key, new_ip, "test -e /root/late && echo present || echo absent").strip() == "absent"
            assert [w["address"].split(":")[0] for w in rbd.status(image)] == [new_ip]
        assert pods.names == [old_pod.metadata.name, "vm1-boot-2"], pods.names
        assert pods.max_alive == 1, pods.overlaps
        after_loss = statuses.seen[statuses.seen.index((1, "Unknown", "NodeLost")):]
        assert not [s for s in after_loss if s[0] == 1 and s[1] == "Running"], statuses.seen
    finally:
        if real_node.popens["kubelet"].poll() is not None:
            real_node.start_kubelet()
        set_out_of_service(core, node, False)
        teardown_vms(vms, ["vm1"], [pv_name])


def _status_write_allowed(k8s_api: Any) -> bool:
    sa = next(d for d in controller_role_docs() if d["kind"] == "ServiceAccount")["metadata"]
    review = client.AuthorizationV1Api(k8s_api).create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{sa['namespace']}:{sa['name']}",
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa['namespace']}"],
                 "resourceAttributes": {"group": "cloud.zjusct.io", "resource": "cloudvms", "subresource": "status",
                                        "verb": "patch", "namespace": "default"}}})
    return bool(review.status.allowed)


@pytest.mark.timeout(900)
def test_controller_killed_between_pod_create_and_status_write_makes_no_duplicate_pod_and_converges(
    k8s_cluster: Cluster, real_node: RealNode, k8s_api: Any, k8s_namespace: str, tmp_path: Path,
) -> None:
    ns = k8s_namespace
    core: Any = client.CoreV1Api(k8s_api)
    custom: Any = client.CustomObjectsApi(k8s_api)
    rbac: Any = client.RbacAuthorizationV1Api(k8s_api)
    install_crd(k8s_api)
    pv_name = hostpath_root_volume(core, ns, tmp_path, size="1Gi")
    placement = real_node.pod_placement()
    cfg = tmp_path / "controller.json"
    cfg.write_text(json.dumps({"launcherImage": "zjusct-launcher:absent", "imageDir": str(tmp_path),
                               "cmdline": "console=ttyS0", "nodeSelector": placement["nodeSelector"],
                               "tolerations": placement["tolerations"]}))
    kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig")
    role = next(d for d in controller_role_docs() if d["kind"] == "ClusterRole")
    no_status = copy.deepcopy(role)
    no_status["rules"] = [r for r in role["rules"] if "cloudvms/status" not in r["resources"]]
    ctl = Controller(kubeconfig, cfg, ns, tmp_path / "controller.log")
    vms = Vms(core, custom, ns, ctl)
    try:
        rbac.replace_cluster_role(role["metadata"]["name"], no_status)
        wait_for(lambda: not _status_write_allowed(k8s_api), 60, "status write denied to the controller")
        ctl.start()
        with PodWatch(core, ns, "vm1") as pods:
            vms.create(cloudvm("vm1", UNUSED_PUBKEY, "Running", 1))
            (pod,) = wait_for(lambda: vms.pods("vm1"), 120, "launcher Pod created")
            wait_for(lambda: "403" in ctl.log.read_text(errors="replace"), 60, "the status write refused")
            ctl.stop(signal.SIGKILL)  # the Pod exists, its status was never written
            assert not vms.vm("vm1").get("status"), vms.vm("vm1")
            rbac.replace_cluster_role(role["metadata"]["name"], role)
            wait_for(lambda: _status_write_allowed(k8s_api), 60, "status write allowed again")
            ctl.start()
            # the restarted controller records the boot's Pod (its image does not exist, so the container never
            # starts and the status stays the create's: Pending/Starting without a node, docs/controller.md Status)
            converged = vms.status_when("vm1", lambda s: s.get("pod") == pod.metadata.name, 120,
                                        "status converged on the Pod")
            st = converged["status"]
            assert (st["phase"], st["reason"], st["bootID"]) == ("Pending", "Starting", 1), st
            assert core.read_namespaced_pod(pod.metadata.name, ns).spec.node_name == real_node.name
            assert [p.metadata.uid for p in vms.pods("vm1")] == [pod.metadata.uid]
            seen = ctl.reconciles()  # a resync later still one Pod, the same
            wait_for(lambda: ctl.reconciles() >= seen + 2, 60, "two more reconciles")
            assert [p.metadata.uid for p in vms.pods("vm1")] == [pod.metadata.uid]
        assert pods.names == ["vm1-boot-1"], pods.names
    finally:
        rbac.replace_cluster_role(role["metadata"]["name"], role)
        teardown_vms(vms, ["vm1"], [pv_name])
