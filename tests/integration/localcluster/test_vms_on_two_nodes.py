"""CloudVMs on two real nodes of the local cluster: what only a second node shows (docs/kubernetes.md, "VMs on two
nodes"; docs/controller.md, Fencing and Bandwidth).

The local cluster (zjusct_localcluster: two nodes in their own namespaces, kube-proxy, kube-router, Ceph with three
OSDs on the host bridge) runs the real launcher image on both nodes (imported into each node's containerd, as an
operator without a registry does) and the controller as a process with the rights of
config/rbac/controller-role.yaml; root disks are RBD clones of the guest image's template.

* **Node loss.** alice's VM boots on whichever node the scheduler picks. That node then loses its kubelet and
  containerd (``lose_node(how="agents")``: the launcher and its QEMU keep running and keep reaching Ceph, the case in
  which a second writer would corrupt the disk). The operator does what docs/controller.md says: taint the node
  ``node.kubernetes.io/out-of-service`` and start the VM again (a new bootID, what ``vm_start`` writes). The
  controller blocklists the old QEMU's RBD client, removes the old Pod, and the new boot runs on the *other* node:
  the file synced before the loss is there, the one the old guest wrote after the fence is not. Throughout, a
  sampler reads the image's watchers and exclusive-lock owners and then the OSD blocklist: at no sample do two
  clients that are not blocklisted hold the image. Then the lost node comes back and the operator drains the other
  one (``kubernetes.core.k8s_drain``): the launcher stops the guest (Stopping/Evicted) and, once its Pod is gone, the
  same boot starts again on the node that came back, with both files; one writer still.
* **Capacity per node.** Both nodes advertise 1000 Mbit/s of guaranteed bandwidth (module ``k8s_node_resources``, as
  the cluster role does). A VM guaranteed 600 Mbit/s leaves its node 400, so the next such VM lands on the other
  node; a third fits nowhere and is Pending/Unschedulable with the scheduler's message naming
  ``cloud.zjusct.io/bandwidth-mbps``; once the first is stopped the third is placed on the node it left. Its
  launchers wait on a boot slot the test holds: placement is what it is about, and no guest boots.
* **Spread.** Three VMs of alice's anti-affinity group ``web``: two land on different nodes, the third is
  Pending/Unschedulable naming the scheduler's anti-affinity rule and the group; bob's VM of a group also called
  ``web`` is placed regardless; once one of hers stops, the third takes its node. No guest boots either.
* **Tenants' networks.** alice's and bob's VMs in namespaces of their own: alice's guest opens bob's guest's SSH
  through his launcher Pod's IP; once the cluster role's NetworkPolicy (``launcher_isolation.yml``, what site.yml
  applies with ``cluster_pod_cidrs``) is in, kube-router refuses that both ways, while the host still logs in to
  both guests and both reach the host through their Pods' NAT. The policy trusts source addresses, so alice's guest
  then sends frames with bob's launcher Pod's IP and with a foreign MAC (the host backend's attacks,
  tests/integration/hostnet/isolation_checks.py, run in her launcher Pod's network namespace): her TAP carries them,
  the Pod's bridge never does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.k8s_node_resources_module import run as node_resources
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import Connection, ImageRef, Rbd
from kubernetes import client
from zjusct_localcluster.cluster import LocalCluster

from tests.cluster import BANDWIDTH_RESOURCE, wait_for
from tests.integration.hostnet import isolation_checks as chk
from tests.integration.k8s_node.controller_helpers import (
    BOOT_TIMEOUT,
    Controller,
    PodWatch,
    StatusWatch,
    Vms,
    WriterSampler,
    blocked,
    blocklist,
    ceph_user_secret,
    cloudvm,
    controller_kubeconfig,
    fencing_controller_config,
    image_archive,
    install_crd,
    rbd_root_volume,
    set_out_of_service,
    ssh,
    ssh_argv,
    ssh_keypair,
    teardown_vms,
)
from tests.integration.localcluster.conftest import WAIT

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.multinode, pytest.mark.kubelet, pytest.mark.k8s, pytest.mark.ceph, pytest.mark.guest,
              pytest.mark.slow]
CEPH_USER = "zjusct-vm"
LAUNCHER_CONFIG = "cloud.zjusct.io/launcher-config"  # the launcher Pod's LauncherConfig (docs/controller.md)
FENCE_USER = "zjusct-fence"
SECRET = "ceph-vm"


@pytest.fixture(scope="module")
def launcher_tag(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The launcher image (``playbooks/launcher_image.yml``, cached archive) imported into every node's containerd;
    its tag."""
    info = image_archive(tmp_path_factory.mktemp("launcher-image"), "launcher")
    for name in local_cluster.node_names:
        local_cluster.node(name).import_image(Path(info["archive"]))
    return str(info["tag"])


@dataclass
class Cloud:
    """One test's CloudVM world on the local cluster: the controller watching the test's namespace, alice's ssh key,
    and what to remove afterwards."""

    cluster: LocalCluster
    ns: str
    core: Any
    custom: Any
    rbd: Rbd
    vms: Vms
    guest_image: Any
    ssh_key: Path
    pubkey: str
    names: list[str] = field(default_factory=list)
    pv_names: list[str] = field(default_factory=list)

    def create(self, name: str, **spec: Any) -> ImageRef:
        """CloudVM ``name`` of alice (1 vCPU / 512 MiB, powerState Running, bootID 1, ``spec`` merged) on an RBD
        clone of the template; returns the image."""
        _rbd, image, pv_name = rbd_root_volume(self.cluster.ceph, self.core, self.guest_image, self.ns,
                                               claim=f"{name}-root")
        self.pv_names.append(pv_name)
        body = cloudvm(name, self.pubkey, "Running", 1)
        body["spec"].update(spec)
        self.names.append(name)
        self.vms.create(body)
        return image


@pytest.fixture
def cloud(local_cluster: LocalCluster, lc_core: Any, lc_namespace: str, launcher_tag: str, guest_image: Any,
          tmp_path: Path) -> Iterator[Cloud]:
    """The controller with the test suite's boot slots: guests boot."""
    yield from _cloud(local_cluster, lc_core, lc_namespace, launcher_tag, guest_image, tmp_path)


@pytest.fixture
def cloud_without_boots(local_cluster: LocalCluster, lc_core: Any, lc_namespace: str, launcher_tag: str,
                        guest_image: Any, tmp_path: Path) -> Iterator[Cloud]:
    """The controller with one boot slot of its own, which the test holds: every launcher runs (its Pod bound and
    Running, holding its requests) but waits for the slot and starts no guest, so a test about placement burns no
    TCG boot; a stop ends such a launcher at once (docs/launcher-protocol.md, boot slots)."""
    from zjusct_launcher import lock

    slots = tmp_path / "held-boot-slot"
    held = lock.try_boot_slot(str(slots), 1)
    assert held is not None
    try:
        yield from _cloud(local_cluster, lc_core, lc_namespace, launcher_tag, guest_image, tmp_path,
                          maxConcurrentBoots=1, bootSlotDir=str(slots))
    finally:
        os.close(held[0])


def _cloud(local_cluster: LocalCluster, core: Any, ns: str, launcher_tag: str, guest_image: Any, tmp_path: Path,
           **controller: Any) -> Iterator[Cloud]:
    ceph = local_cluster.ceph
    assert ceph is not None
    api = local_cluster.api_client()
    install_crd(api)
    ceph_user_secret(ceph, core, ns, CEPH_USER, SECRET)
    cfg = fencing_controller_config(ceph, tmp_path, launcher_tag, guest_image, CEPH_USER, SECRET, FENCE_USER,
                                    **controller)
    ssh_key, pubkey = ssh_keypair(tmp_path)
    kubeconfig = controller_kubeconfig(api, local_cluster.kubeconfig, tmp_path / "controller.kubeconfig")
    ctl = Controller(kubeconfig, cfg, ns, tmp_path / "controller.log").start()
    custom: Any = client.CustomObjectsApi(api)
    rbd = Rbd(Connection(conf=str(ceph.conf), keyring=str(ceph.keyring), timeout=120))
    world = Cloud(local_cluster, ns, core, custom, rbd, Vms(core, custom, ns, ctl), guest_image, ssh_key, pubkey)
    try:
        yield world
    finally:
        teardown_vms(world.vms, world.names, world.pv_names)
        api.close()


def _watchers(rbd: Rbd, image: ImageRef) -> list[str]:
    return [str(w["address"]).split(":")[0] for w in rbd.status(image)]


@pytest.mark.timeout(3600)
def test_node_lost_vm_fenced_and_running_on_the_other_node_with_its_rbd_disk_then_drained_back(
        cloud: Cloud, local_cluster: LocalCluster) -> None:
    core, vms, rbd, key = cloud.core, cloud.vms, cloud.rbd, cloud.ssh_key
    ceph = local_cluster.ceph
    lost: str | None = None
    drained: str | None = None
    image = cloud.create("vm1")
    try:
        with StatusWatch(cloud.custom, cloud.ns) as statuses, PodWatch(core, cloud.ns, "vm1") as pods, \
                WriterSampler(rbd, image, ceph) as writers:
            running = vms.status_when("vm1", lambda s: s.get("phase") in ("Running", "Failed", "Blocked"),
                                      BOOT_TIMEOUT, "vm1 boot 1 Running", interval=2)
            st = running["status"]
            assert (st["phase"], st["bootID"]) == ("Running", 1), st
            first, old_ip = st["node"], st["sshEndpoint"]["host"]
            (other,) = [n for n in local_cluster.node_names if n != first]
            ssh(key, old_ip, "echo synced-before-the-loss > /root/marker && sync")
            old_clients = [str(w["address"]) for w in rbd.status(image)]
            assert old_clients and all(a.startswith(f"{old_ip}:") for a in old_clients), old_clients
            (old_pod,) = vms.pods("vm1")

            # the node loses its agents; the launcher and QEMU keep running and keep reaching Ceph
            lost, lost_at, seen_before_loss = first, time.monotonic(), len(statuses.seen)
            local_cluster.lose_node(first, how="agents")
            unknown = vms.status_when("vm1", lambda s: s.get("phase") == "Unknown", WAIT, "vm1 Unknown")
            assert (unknown["status"]["reason"], unknown["status"]["bootID"]) == ("NodeLost", 1), unknown["status"]
            assert first in unknown["status"]["message"]
            assert "written" in ssh(key, old_ip, "echo while-not-ready > /root/alive && sync && echo written"), \
                "the old guest still writes its disk while its node is NotReady (what fencing exists for)"

            # the operator: the node is off (out-of-service), and the VM is started again (a new bootID)
            set_out_of_service(core, first, True)
            vms.patch_spec("vm1", bootID=2)
            wait_for(lambda: old_pod.metadata.name not in [p.metadata.name for p in vms.pods("vm1")], WAIT,
                     "the old launcher Pod removed after the fence")
            listed = blocklist(ceph)
            assert all(blocked(a, listed) for a in old_clients), (old_clients, listed)
            try:
                late = subprocess.run(ssh_argv(key, old_ip, "echo written-after-the-fence > /root/late && "
                                               "sync -f /root/late", connect_timeout=20),
                                      capture_output=True, text=True, timeout=120, check=False)
                late_rc: int | None = late.returncode
            except subprocess.TimeoutExpired:
                late_rc = None  # the old guest's flush hangs on the blocklisted client: not written either
            assert late_rc != 0, "the old guest's write and flush succeeded after the fence"

            again = vms.status_when("vm1", lambda s: s.get("bootID") == 2 and s.get("phase") in (
                "Running", "Failed"), BOOT_TIMEOUT, "vm1 boot 2 Running on the other node", interval=2)
            failover_s = time.monotonic() - lost_at
            st = again["status"]
            assert (st["phase"], st["reason"], st["pod"], st["node"]) == (
                "Running", "SSHReady", "vm1-boot-2", other), st
            new_ip = st["sshEndpoint"]["host"]
            assert ssh(key, new_ip, "cat /root/marker").strip() == "synced-before-the-loss"
            assert ssh(key, new_ip, "test -e /root/late && echo present || echo absent").strip() == "absent"
            assert _watchers(rbd, image) == [new_ip]
            print(f"node {first} lost -> vm1 Running on {other} after {failover_s:.0f} s (fence and boot included)")

            # the node comes back: its kubelet finds the old Pod gone and ends the old QEMU; one writer remains
            local_cluster.restore_node(first, timeout=WAIT)
            set_out_of_service(core, first, False)
            lost = None
            wait_for(lambda: _watchers(rbd, image) == [new_ip], WAIT,
                     "only the new boot's QEMU watching the image once the lost node is back")
            assert vms.vm("vm1")["status"]["phase"] == "Running"
            ssh(key, new_ip, "echo synced-before-the-drain > /root/drained && sync")

            # maintenance: the operator drains the node the VM now runs on (kubectl drain's module); the launcher
            # stops the guest, and once its Pod is gone the same boot starts again on the node that came back
            drained, seen_before_drain = other, len(statuses.seen)
            _k8s_drain(local_cluster, other, "drain")
            back = vms.status_when("vm1", lambda s: s.get("phase") in ("Running", "Failed") and s.get(
                "node") == first, BOOT_TIMEOUT, f"vm1 Running on {first} after the drain of {other}", interval=2)
            st = back["status"]
            assert (st["phase"], st["bootID"], st["pod"]) == ("Running", 2, "vm1-boot-2"), st
            moved = statuses.seen[seen_before_drain:]
            assert (2, "Stopping", "Evicted") in moved and not [s for s in moved if s[1] in ("Blocked", "Failed")], (
                moved)  # straight from Evicted to Pending: no detour through a claim or Pod problem
            back_ip = st["sshEndpoint"]["host"]
            assert ssh(key, back_ip, "cat /root/marker /root/drained").split() == [
                "synced-before-the-loss", "synced-before-the-drain"]
            assert _watchers(rbd, image) == [back_ip]
            _k8s_drain(local_cluster, other, "uncordon")
            drained = None
        assert pods.names == [old_pod.metadata.name, "vm1-boot-2"], pods.names
        assert pods.max_alive == 1, pods.overlaps
        # from the loss on (a busy node may have been NotReady for a moment before it, which is no loss)
        after_loss = statuses.seen[seen_before_loss:]
        assert (1, "Unknown", "NodeLost") in after_loss, statuses.seen
        assert not [s for s in after_loss if s[0] == 1 and s[1] == "Running"], statuses.seen
        holders = [live for _, live in writers.samples]
        print(f"{len(holders)} samples of the image's holders ({len(writers.errors)} lost): "
              f"{sum(1 for h in holders if h)} with one holder (the blocklist is read only for two or more), "
              f"{sum(1 for h in holders if not h)} with none, {len({a for h in holders for a in h})} distinct holders")
        assert len(writers.samples) >= 10, (writers.samples, writers.errors)
        assert writers.most_live() <= 1, [s for s in writers.samples if len(s[1]) > 1]
        assert any(live for _, live in writers.samples), "the sampler saw the image's holder"
    finally:
        if lost is not None:
            local_cluster.restore_node(lost, timeout=WAIT)
            set_out_of_service(core, lost, False)
        if drained is not None:
            _k8s_drain(local_cluster, drained, "uncordon")


def _k8s_drain(local_cluster: LocalCluster, node: str, state: str) -> None:
    """``kubernetes.core.k8s_drain`` as the operator runs it (docs/controller.md, Drain): ``state`` drain (waits
    until the evicted Pods are gone) or uncordon, with the cluster's admin kubeconfig."""
    args = {"name": node, "state": state}
    if state == "drain":
        args["delete_options"] = {"delete_emptydir_data": True, "ignore_daemonsets": True, "wait_timeout": 900}
    env = dict(os.environ, K8S_AUTH_KUBECONFIG=str(local_cluster.kubeconfig), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-m", "kubernetes.core.k8s_drain",
                           "-a", json.dumps(args)], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
                          check=False)
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:])


def _bound(vms: Vms, name: str) -> str | None:
    """The node the VM's launcher Pod is bound to, once the scheduler bound it."""
    pods = vms.pods(name)
    return pods[0].spec.node_name if len(pods) == 1 and pods[0].spec.node_name else None


@pytest.mark.timeout(1800)
def test_a_node_out_of_bandwidth_sends_the_vm_to_the_other_node_and_none_left_is_unschedulable(
        cloud_without_boots: Cloud, local_cluster: LocalCluster) -> None:
    cloud = cloud_without_boots
    core, vms = cloud.core, cloud.vms
    nodes = local_cluster.node_names
    guaranteed = {"network": {"bandwidth": {"guaranteedMbps": 600}}}
    try:
        for node in nodes:
            node_resources({"name": node, "resources": {BANDWIDTH_RESOURCE: 1000}, "state": "present"}, False,
                           core=core)
        cloud.create("bw-a", **guaranteed)
        node_a = wait_for(lambda: _bound(vms, "bw-a"), WAIT, "bw-a's launcher Pod bound")
        cloud.create("bw-b", **guaranteed)
        node_b = wait_for(lambda: _bound(vms, "bw-b"), WAIT, "bw-b's launcher Pod bound")
        assert node_b != node_a, f"bw-b bound to {node_b}, where bw-a already holds 600 of 1000 Mbit/s"

        cloud.create("bw-c", **guaranteed)
        refused = vms.status_when("bw-c", lambda s: s.get("reason") == "Unschedulable", WAIT,
                                  "bw-c Pending/Unschedulable")
        st = refused["status"]
        assert st["phase"] == "Pending", st
        assert f"Insufficient {BANDWIDTH_RESOURCE}" in st["message"] and "0/2 nodes are available" in st["message"], st
        assert _bound(vms, "bw-c") is None

        vms.patch_spec("bw-a", powerState="Stopped")  # its 600 Mbit/s are given back when its Pod is gone
        node_c = wait_for(lambda: _bound(vms, "bw-c"), BOOT_TIMEOUT, "bw-c's launcher Pod bound once bw-a stopped")
        assert node_c == node_a, f"bw-c bound to {node_c}; only {node_a} had 600 Mbit/s free"
    finally:
        for node in nodes:
            node_resources({"name": node, "resources": {BANDWIDTH_RESOURCE: 0}, "state": "absent"}, False, core=core)


@pytest.mark.timeout(1800)
def test_vms_of_one_owners_anti_affinity_group_never_share_a_node_and_one_more_is_unschedulable(
        cloud_without_boots: Cloud, local_cluster: LocalCluster) -> None:
    cloud = cloud_without_boots
    vms = cloud.vms
    cloud.create("web-1", antiAffinityGroup="web")
    node_1 = wait_for(lambda: _bound(vms, "web-1"), WAIT, "web-1's launcher Pod bound")
    cloud.create("web-2", antiAffinityGroup="web")
    node_2 = wait_for(lambda: _bound(vms, "web-2"), WAIT, "web-2's launcher Pod bound")
    assert node_2 != node_1, f"web-2 bound to {node_2}, where web-1 of the same group runs"

    cloud.create("web-3", antiAffinityGroup="web")
    refused = vms.status_when("web-3", lambda s: s.get("reason") == "Unschedulable", WAIT,
                              "web-3 Pending/Unschedulable")
    st = refused["status"]
    assert st["phase"] == "Pending", st
    assert "0/2 nodes are available" in st["message"] and "anti-affinity" in st["message"], st
    assert "spec.antiAffinityGroup 'web'" in st["message"] and "owner alice" in st["message"], st
    assert _bound(vms, "web-3") is None

    # another owner's group of the same name neither blocks nor is blocked by hers
    cloud.create("bob-web", owner="bob", antiAffinityGroup="web")
    assert wait_for(lambda: _bound(vms, "bob-web"), WAIT, "bob-web's launcher Pod bound") in (node_1, node_2)

    vms.patch_spec("web-1", powerState="Stopped")  # its node is free for the group once its Pod is gone
    node_3 = wait_for(lambda: _bound(vms, "web-3"), BOOT_TIMEOUT, "web-3's launcher Pod bound once web-1 stopped")
    assert node_3 == node_1, f"web-3 bound to {node_3}; only {node_1} had no VM of the group"


def _reaches(key: Path, guest_ip: str, target: str, port: int) -> bool:
    """From inside the guest at ``guest_ip``: does a TCP connection to ``target:port`` open within 5 s (bash's
    /dev/tcp, in every Debian guest)?"""
    out = ssh(key, guest_ip, f"timeout 5 bash -c 'exec 3<>/dev/tcp/{target}/{port}' && echo open || echo closed")
    return out.strip().endswith("open")


@contextlib.contextmanager
def _launcher_pod_netns(pod_ip: str) -> Iterator[str]:
    """A name (``ip netns attach``) for the network namespace of the launcher Pod whose ``eth0`` has ``pod_ip``,
    found through its QEMU process; the name is removed afterwards (the namespace stays the Pod's)."""
    found = None
    for pid in (p.name for p in Path("/proc").iterdir() if p.name.isdigit()):
        with contextlib.suppress(OSError):
            if not Path(f"/proc/{pid}/comm").read_text().startswith("qemu-system"):
                continue
            addr = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-4", "-o", "addr", "show", "dev",
                                   "eth0"], capture_output=True, text=True, timeout=30, check=False).stdout
            if f" {pod_ip}/" in addr:
                found = pid
                break
    assert found, f"no QEMU process in a network namespace with {pod_ip} on eth0"
    name = f"zjc-pod-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "attach", name, found], check=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


def _guest(name: str, key: Path, ip: str, network: dict[str, Any]) -> chk.Guest:
    """A guest on Kubernetes as the isolation checks see it: ``network`` is its launcher Pod's LauncherConfig
    ``network`` (TAP, MAC, address: the same in every Pod)."""
    source = chk.PROBE.read_text()

    def probe(*args: str) -> dict:
        argv = ssh_argv(key, ip, "python3 - " + " ".join(shlex.quote(a) for a in args))
        out = subprocess.run(argv, input=source, capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, f"netprobe {args} in {name}'s guest: {out.stderr}"
        return json.loads(out.stdout.strip().splitlines()[-1])

    def shell(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(ssh_argv(key, ip, command), capture_output=True, text=True, timeout=300, check=False)

    return chk.Guest(name, ip, network["mac"], network["tap"], probe, shell)


@pytest.mark.timeout(2400)
def test_the_cluster_roles_network_policy_keeps_other_tenants_guests_away_from_a_launcher_pod(
        cloud: Cloud, local_cluster: LocalCluster, lc_core: Any, launcher_tag: str, guest_image: Any,
        tmp_path: Path) -> None:
    bob_ns = f"t-{uuid.uuid4().hex[:8]}"
    lc_core.create_namespace({"metadata": {"name": bob_ns}})
    wait_for(lambda: lc_core.read_namespaced_service_account("default", bob_ns), WAIT, f"ServiceAccount {bob_ns}")
    (tmp_path / "bob").mkdir()
    bob_world = _cloud(local_cluster, lc_core, bob_ns, launcher_tag, guest_image, tmp_path / "bob")
    try:
        bob = next(bob_world)
        cloud.create("alice")
        bob.create("bob", owner="bob")
        running = {}
        for world, name in ((cloud, "alice"), (bob, "bob")):
            st = world.vms.status_when(name, lambda s: s.get("phase") in ("Running", "Failed"), BOOT_TIMEOUT,
                                       f"{name} Running", interval=2)["status"]
            assert st["phase"] == "Running", st
            running[name] = st["sshEndpoint"]["host"]
        alice_ip, bob_ip = running["alice"], running["bob"]
        # without the policy every Pod reaches every guest's SSH: alice's guest opens bob's (the test can fail)
        assert _reaches(cloud.ssh_key, alice_ip, bob_ip, 22)

        # the cluster role's task, as site.yml runs it for cluster_launcher_namespaces with cluster_pod_cidrs
        playbook = tmp_path / "isolation.yml"
        playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [{
            "ansible.builtin.include_role": {"name": "zjusct.cloud.cluster", "tasks_from": "launcher_isolation"},
            "loop": [cloud.ns, bob_ns], "loop_control": {"loop_var": "cluster_isolation_namespace"},
            "vars": {"cluster_pod_cidrs": [a.pod_cidr for a in local_cluster.addressing]}}]}]))
        env = dict(os.environ, K8S_AUTH_KUBECONFIG=str(local_cluster.kubeconfig),
                   ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
        applied = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(playbook)], cwd=REPO,
                                 env=env, capture_output=True, text=True, timeout=600, check=False)
        assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-2000:]

        # kube-router enforces it on both nodes: neither tenant's guest reaches the other's launcher Pod
        wait_for(lambda: not _reaches(cloud.ssh_key, alice_ip, bob_ip, 22), WAIT,
                 "alice's guest refused at bob's launcher Pod")
        assert not _reaches(bob.ssh_key, bob_ip, alice_ip, 22)
        # while the host (outside the Pod network) still logs in to both, and both guests reach it through NAT
        host = local_cluster.control_plane.server.split("//")[1].split(":")[0]
        for key, ip in ((cloud.ssh_key, alice_ip), (bob.ssh_key, bob_ip)):
            assert ssh(key, ip, "echo in").strip() == "in"
            assert _reaches(key, ip, host, 6443), f"{ip} -> {host}:6443 (the API server, outside the Pod network)"

        # the policy admits bob's namespace by source address: alice's guest sending as bob's Pod (or with any
        # MAC but its own) is stopped at her TAP by the Pod's L2 guard, toward her Pod and beyond it (the host)
        (pod,) = [p for p in cloud.vms.pods("alice") if p.status.pod_ip == alice_ip]
        network = json.loads(pod.metadata.annotations[LAUNCHER_CONFIG])["network"]
        attacker = _guest("alice", cloud.ssh_key, alice_ip, network)
        # every guest on Kubernetes has the same MAC in its own Pod: the victim's stands for any foreign one
        victim = chk.Guest("bob", bob_ip, "52:54:00:0b:00:02", network["tap"], attacker.probe, attacker.shell)
        with _launcher_pod_netns(alice_ip) as netns:
            view = chk.Cloud(netns, network["bridge"], network["gateway"], "", (host,))
            chk.check_spoofed_ip_dropped(view, attacker, victim, "192.0.2.77")
            chk.check_spoofed_mac_dropped(view, attacker, victim)
    finally:
        bob_world.close()
        with contextlib.suppress(Exception):
            lc_core.delete_namespace(bob_ns)
