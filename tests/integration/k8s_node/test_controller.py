"""The controller (controller/zjusct_controller, run as a process) on the real node: a CloudVM becomes one launcher
Pod, the status says Running only once the guest's SSH banner answers at status.sshEndpoint, a controller restart
never makes a second Pod, powerState Stopped deletes the Pod and ends Stopped (the cloudvm module's waits end on
these statuses), a launcher Pod deleted behind the controller's back ends Failed/LauncherLost, never Running, and a
frozen kubelet makes the VM Unknown/NodeLost without a second Pod. The controller runs with the ServiceAccount
token of config/rbac/controller-role.yaml, so the role's rights are what is tested.

The root volume is a PVC bound to a hostPath PV holding a copy of the guest image's root filesystem (the step
before RBD; docs/controller.md). One guest boot under TCG (minutes on a shared 2-core machine) in the first test;
the others never wait for a boot.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster import Cluster, RealNode, wait_for
from tests.conftest import TEST_BOOT_SLOT_DIR, TEST_BOOT_SLOTS
from tests.integration.cloudvm_k8s import cloudvm_helpers
from tests.integration.cloudvm_k8s.cloudvm_helpers import PlayRun, cloudvm_task, finish_play, run_play
from tests.integration.k8s_node.controller_helpers import (
    BOOT_TIMEOUT,
    GROUP,
    PLURAL,
    VERSION,
    Controller,
    PodWatch,
    StatusWatch,
    Vms,
    cloudvm,
    controller_kubeconfig,
    hostpath_root_volume,
    install_crd,
    teardown_vms,
)
from tests.integration.k8s_node.test_launcher_pod import ssh_banner
from tests.integration.k8s_node.test_real_node import busybox_pod

pytestmark = [pytest.mark.k8s, pytest.mark.kubelet, pytest.mark.guest, pytest.mark.slow, pytest.mark.timeout(2700)]


@dataclass
class Env(Vms):
    key: Path = Path()
    vm_dir: Path = Path()
    seen: list[tuple[Any, Any, Any]] = field(default_factory=list)  # (bootID, phase, reason) in watch order


# For a test that stops the launcher while its guest boots: a booting guest cannot act on the power button yet, so
# the stop ends in the kill after stopTimeoutSeconds. What such a test checks is the controller, not the guest's
# shutdown: 10 s instead of the default 120 s (a boot's worth of CPU for nothing).
STOPPED_WHILE_BOOTING = pytest.mark.controller_config(stopTimeoutSeconds=10)


@pytest.fixture
def env(k8s_cluster: Cluster, real_node: RealNode, launcher_image: dict[str, Any], guest_image: Any,
        k8s_api: Any, k8s_namespace: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Env]:
    """CRD, a bound root volume claim ``vm1-root`` (hostPath PV with the guest's root.raw), the controller (its
    controller.json plus the fields of the test's ``controller_config`` mark)."""
    install_crd(k8s_api)
    core: Any = client.CoreV1Api(k8s_api)
    custom: Any = client.CustomObjectsApi(k8s_api)
    ns = k8s_namespace
    vm_dir = tmp_path / "volume"
    vm_dir.mkdir()
    subprocess.run(["cp", "--sparse=always", "--reflink=auto", str(guest_image.rootfs), str(vm_dir / "root.raw")],
                   check=True, timeout=600)
    pv_name = hostpath_root_volume(core, ns, vm_dir, size="4Gi")
    placement = real_node.pod_placement()
    cfg = tmp_path / "controller.json"
    marked = request.node.get_closest_marker("controller_config") or pytest.mark.controller_config.mark
    cfg.write_text(json.dumps({"launcherImage": launcher_image["tag"], "imageDir": str(guest_image.dir),
                               "cmdline": guest_image.default_cmdline, "accel": "tcg",
                               "maxConcurrentBoots": TEST_BOOT_SLOTS, "bootSlotDir": TEST_BOOT_SLOT_DIR,
                               "nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"],
                               **marked.kwargs}))
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
    kubeconfig = controller_kubeconfig(k8s_api, k8s_cluster.kubeconfig, tmp_path / "controller.kubeconfig")
    ctl = Controller(kubeconfig, cfg, ns, tmp_path / "controller.log").start()
    e = Env(core, custom, ns, ctl, key, vm_dir)
    statuses = StatusWatch(custom, ns)
    e.seen = statuses.seen
    try:
        with statuses:
            yield e
    finally:
        teardown_vms(e, ["vm1"], [pv_name])


def test_cloudvm_module_start_runs_on_the_real_node_ssh_answers_restart_keeps_one_pod_and_stop_deletes_it(
    env: Env, k8s_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cloudvm module (backend kubernetes) against the real controller: its waits end on the status the
    controller writes, with no stand-in."""
    monkeypatch.setattr(cloudvm_helpers, "PLAY_TIMEOUT", BOOT_TIMEOUT + 300)  # one TCG boot inside the play
    pubkey = env.key.with_suffix(".pub").read_text().strip()
    vm_args = {"name": "vm1", "namespace": env.ns, "owner": "alice", "root_volume_claim": "vm1-root",
               "vcpus": 1, "memory_mib": 512, "ssh_authorized_keys": [pubkey], "wait_timeout": BOOT_TIMEOUT}
    start = run_play([cloudvm_task(**vm_args, power_state="running")], kubeconfig=k8s_cluster.kubeconfig,
                     tmp_path=tmp_path, background=True)
    assert isinstance(start, subprocess.Popen)

    # the controller creates the Pod and reports the boot as Pending until the guest answers
    pending = env.status_when("vm1", lambda s: s.get("bootID") == 1 and s.get("pod"), 120, "status names the Pod")
    assert pending["status"]["phase"] in ("Pending", "Running"), pending["status"]
    assert pending["metadata"]["finalizers"] == ["cloud.zjusct.io/launcher"]
    (pod,) = env.pods("vm1")
    assert pod.metadata.name == "vm1-boot-1" == pending["status"]["pod"]
    assert pod.metadata.owner_references[0].uid == pending["metadata"]["uid"]
    assert pod.spec.restart_policy == "Never"
    assert pod.spec.containers[0].resources.requests == {"cpu": "350m", "memory": "534Mi"}
    config = json.loads(pod.metadata.annotations["cloud.zjusct.io/launcher-config"])
    assert config["vm"] == {"namespace": env.ns, "name": "vm1", "uid": pending["metadata"]["uid"], "bootID": 1}

    # restart the controller while the boot is in progress: still exactly one Pod, same uid
    env.controller.stop()
    env.controller.start()
    started = finish_play(start)
    assert started.rc == 0 and started.results[0].get("phase") == "Running", (
        started.stdout[-3000:], env.controller.tail())
    assert started.results[0]["changed"] is True and started.results[0]["boot_id"] == 1
    running = env.vm("vm1")
    st = running["status"]
    assert (st["phase"], st["reason"], st["bootID"]) == ("Running", "SSHReady", 1), st
    pods = env.pods("vm1")
    assert [p.metadata.uid for p in pods] == [pod.metadata.uid]
    endpoint = st["sshEndpoint"]
    assert endpoint == {"host": pods[0].status.pod_ip, "port": 22}
    assert ssh_banner(endpoint["host"], endpoint["port"]).startswith("SSH-2.0-OpenSSH")
    assert st["observedGeneration"] == running["metadata"]["generation"] and st["sshReadyAt"]
    ready = [c for c in st["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    # Running was never reported before the boot passed through Pending (no Running from a stale status)
    boot1 = [s for s in env.seen if s[0] == 1]
    assert boot1[0][1] == "Pending" and ("Running" in [s[1] for s in boot1]), env.seen
    # the restarted controller's metrics: it saw the transition to Running of the Pod created before its restart
    samples = wait_for(lambda: (m := env.controller.metrics()).get(
        ("zjusct_cloudvm_start_to_running_seconds_count", ())) and m, 60, "start -> Running observed")
    assert samples[("zjusct_cloudvm_phase", (("phase", "Running"),))] == 1
    assert samples[("zjusct_controller_reconciles_total", ())] > 0
    assert 0 < samples[("zjusct_cloudvm_start_to_running_seconds_sum", ())] < BOOT_TIMEOUT
    events = env.core.list_namespaced_event(env.ns, field_selector="involvedObject.name=vm1").items
    assert {"Starting", "SSHReady"} <= {e.reason for e in events}, [e.reason for e in events]

    # power_state stopped: the Pod is deleted with a grace period, the guest stops, the module's wait ends Stopped
    stop = run_play([cloudvm_task(**vm_args, power_state="stopped")], kubeconfig=k8s_cluster.kubeconfig,
                    tmp_path=tmp_path)
    assert isinstance(stop, PlayRun)
    assert stop.rc == 0 and stop.results[0].get("phase") == "Stopped", (stop.stdout[-3000:], env.controller.tail())
    assert not stop.results[0].get("warnings"), stop.results[0]  # Stopped, not Failed
    stopped = env.vm("vm1")
    assert (stopped["status"]["phase"], stopped["status"]["reason"]) == ("Stopped", "StopRequested"), stopped
    assert "sshEndpoint" not in stopped["status"]
    wait_for(lambda: not env.pods("vm1"), 300, "launcher Pod gone")
    assert not ssh_banner(endpoint["host"], timeout=2)
    assert "Stopping" in [s[1] for s in env.seen if s[0] == 1], env.seen


@STOPPED_WHILE_BOOTING
def test_launcher_pod_deleted_behind_the_controller_is_failed_never_running(env: Env) -> None:
    pubkey = env.key.with_suffix(".pub").read_text().strip()
    env.custom.create_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, cloudvm("vm1", pubkey, "Running", 1))

    pod = env.launcher_running("vm1")
    env.core.delete_namespaced_pod(pod.metadata.name, env.ns)
    failed = env.status_when("vm1", lambda s: s.get("phase") in ("Failed", "Stopped", "Running"), 120,
                             "vm1 Failed")
    assert (failed["status"]["phase"], failed["status"]["reason"]) == ("Failed", "LauncherLost"), failed["status"]
    wait_for(lambda: not env.pods("vm1"), 300, "launcher Pod gone")
    # gone for good: the controller does not boot bootID 1 again (the Pod's DELETED event was reconciled)
    assert env.pods("vm1") == []
    assert env.vm("vm1")["status"]["phase"] == "Failed"
    assert "Running" not in [s[1] for s in env.seen], env.seen


def test_node_not_ready_makes_the_vm_unknown_with_no_second_pod_and_it_recovers(env: Env, real_node: RealNode,
                                                                                 k8s_api: Any) -> None:
    """The kubelet is frozen (SIGSTOP: it stops reporting, the launcher keeps running): the node goes NotReady,
    the VM Unknown/NodeLost, and no second launcher Pod appears; thawed, the same Pod is observed again."""
    pubkey = env.key.with_suffix(".pub").read_text().strip()
    env.custom.create_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, cloudvm("vm1", pubkey, "Running", 1))

    pod = env.launcher_running("vm1")
    kubelet = real_node.popens["kubelet"]
    core: Any = client.CoreV1Api(k8s_api)

    def node_ready() -> bool:
        conds = core.read_node(pod.spec.node_name).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conds)

    kubelet.send_signal(signal.SIGSTOP)
    try:
        unknown = env.status_when("vm1", lambda s: s.get("phase") == "Unknown", 180, "vm1 Unknown")
        assert unknown["status"]["reason"] == "NodeLost", unknown["status"]
        assert pod.spec.node_name in unknown["status"]["message"]
        assert [p.metadata.uid for p in env.pods("vm1")] == [pod.metadata.uid]
    finally:
        kubelet.send_signal(signal.SIGCONT)
    wait_for(node_ready, 180, "node Ready again")
    back = env.status_when("vm1", lambda s: s.get("phase") in ("Pending", "Running"), 180, "vm1 observed again")
    assert back["status"]["bootID"] == 1 and back["status"]["pod"] == pod.metadata.name
    assert [p.metadata.uid for p in env.pods("vm1")] == [pod.metadata.uid]
    assert [s for s in env.seen if s[1] == "Unknown"] == [(1, "Unknown", "NodeLost")], env.seen


def test_root_volume_claim_used_by_another_pod_blocks_the_start_until_it_is_gone(env: Env, real_node: RealNode) -> None:
    """Never two writers: a Pod that mounts the VM's root volume claim blocks the launcher (Blocked/VolumeInUse,
    naming it); once it is gone the launcher Pod is created and the claim marked with the VM's uid."""
    other = busybox_pod(real_node, "squatter", "exec sleep 3600",
                        volumes=[{"name": "root", "persistentVolumeClaim": {"claimName": "vm1-root"}}])
    other["spec"]["containers"][0]["volumeMounts"] = [{"name": "root", "mountPath": "/data"}]
    env.core.create_namespaced_pod(env.ns, other)
    wait_for(lambda: env.core.read_namespaced_pod("squatter", env.ns).status.phase == "Running", 120,
             "squatter Running")
    pubkey = env.key.with_suffix(".pub").read_text().strip()
    env.custom.create_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, cloudvm("vm1", pubkey, "Running", 1))
    blocked = env.status_when("vm1", lambda s: s.get("phase") == "Blocked", 60, "vm1 Blocked")
    assert blocked["status"]["reason"] == "VolumeInUse" and "squatter" in blocked["status"]["message"], blocked
    assert env.pods("vm1") == []
    env.core.delete_namespaced_pod("squatter", env.ns, grace_period_seconds=0)
    pending = env.status_when("vm1", lambda s: s.get("pod") == "vm1-boot-1", 120, "launcher Pod created")
    assert pending["status"]["phase"] in ("Pending", "Running"), pending["status"]
    assert [p.metadata.name for p in env.pods("vm1")] == ["vm1-boot-1"]
    claim = env.core.read_namespaced_persistent_volume_claim("vm1-root", env.ns)
    assert claim.metadata.annotations["cloud.zjusct.io/claimed-by"] == pending["metadata"]["uid"]


def test_launcher_process_killed_is_failed_launcher_lost_never_running_and_the_next_start_boots_in_one_run(
    env: Env, real_node: RealNode, k8s_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launcher container's main process is killed (SIGKILL through containerd, as a crash): no
    LauncherResult, so the boot is Failed/LauncherLost; no status ever says Running and no second Pod appears.
    Then one run of the cloudvm module with power_state running boots bootID 2 and ends Running (a newcomer's first
    start after such a kill used to end "boot N ended in phase Failed" and start nothing)."""
    monkeypatch.setattr(cloudvm_helpers, "PLAY_TIMEOUT", BOOT_TIMEOUT + 300)  # one TCG boot inside the play
    pubkey = env.key.with_suffix(".pub").read_text().strip()
    with PodWatch(env.core, env.ns, "vm1") as pods:
        env.custom.create_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL,
                                                   cloudvm("vm1", pubkey, "Running", 1))
        pod = env.launcher_running("vm1")
        real_node.kill_container(pod.status.container_statuses[0].container_id)
        failed = env.status_when("vm1", lambda s: s.get("phase") in ("Failed", "Stopped", "Running"), 180,
                                 "vm1 ended")
        assert (failed["status"]["phase"], failed["status"]["reason"]) == ("Failed", "LauncherLost"), failed
        assert failed["status"]["bootID"] == 1 and failed["status"]["pod"] == pod.metadata.name
        # the ended Pod stays (restartPolicy Never) and is not replaced; its phase follows the container's end
        (after,) = wait_for(lambda: (p := env.pods("vm1")) and p[0].status.phase == "Failed" and p, 120,
                            "launcher Pod phase Failed")
        assert after.metadata.uid == pod.metadata.uid
        term = after.status.container_statuses[0].state.terminated
        assert term is not None and term.exit_code == 137 and not term.message
    assert "Running" not in [s[1] for s in env.seen], env.seen
    assert pods.names == ["vm1-boot-1"], pods.names

    start = run_play([cloudvm_task(name="vm1", namespace=env.ns, owner="alice", power_state="running",
                                   wait_timeout=BOOT_TIMEOUT)], kubeconfig=k8s_cluster.kubeconfig, tmp_path=tmp_path)
    assert isinstance(start, PlayRun)
    assert start.rc == 0 and start.results[0].get("phase") == "Running", (start.stdout[-3000:], env.controller.tail())
    assert start.results[0]["boot_id"] == 2 and start.results[0]["changed"] is True
    assert [p.metadata.name for p in env.pods("vm1") if p.status.phase == "Running"] == ["vm1-boot-2"]


@STOPPED_WHILE_BOOTING
def test_stop_and_immediate_start_never_has_two_launcher_pods_alive_and_ends_running_on_the_new_boot(
        env: Env) -> None:
    """powerState Stopped and, at once, Running with bootID 2 while boot 1's launcher runs: boot 2's Pod is
    created only once boot 1's launcher has ended (one writer of the root disk at any time), and the VM ends
    Running on boot 2 with its guest answering SSH."""
    pubkey = env.key.with_suffix(".pub").read_text().strip()
    with PodWatch(env.core, env.ns, "vm1") as pods:
        env.custom.create_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL,
                                                   cloudvm("vm1", pubkey, "Running", 1))
        first = env.launcher_running("vm1")
        env.custom.patch_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, "vm1",
                                                  {"spec": {"powerState": "Stopped"}})
        env.custom.patch_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, "vm1",
                                                  {"spec": {"powerState": "Running", "bootID": 2}})
        running = env.status_when("vm1", lambda s: s.get("bootID") == 2 and s.get("phase") in (
            "Running", "Failed", "Stopped"), BOOT_TIMEOUT + 300, "boot 2 Running")
        st = running["status"]
        assert (st["phase"], st["reason"], st["pod"]) == ("Running", "SSHReady", "vm1-boot-2"), st
        assert ssh_banner(st["sshEndpoint"]["host"], st["sshEndpoint"]["port"]).startswith("SSH-2.0-OpenSSH")
        wait_for(lambda: [p.metadata.name for p in env.pods("vm1")] == ["vm1-boot-2"], 300, "boot 1's Pod gone")
    assert pods.names == [first.metadata.name, "vm1-boot-2"], pods.names
    assert pods.max_alive == 1, pods.overlaps
    assert "Running" not in [s[1] for s in env.seen if s[0] == 1], env.seen


@STOPPED_WHILE_BOOTING
def test_api_server_restart_while_booting_the_controller_recovers_without_a_duplicate_pod(
        env: Env, k8s_cluster: Cluster) -> None:
    """kube-apiserver is restarted while the launcher boots the guest: the controller's watches reconnect, the
    status converges on what the Pod shows (container running on the node), no second Pod is ever created, and
    a change after the restart (the launcher Pod deleted behind its back) is seen: Failed/LauncherLost."""
    pubkey = env.key.with_suffix(".pub").read_text().strip()
    with PodWatch(env.core, env.ns, "vm1") as pods:
        env.custom.create_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL,
                                                   cloudvm("vm1", pubkey, "Running", 1))
        env.status_when("vm1", lambda s: s.get("pod") == "vm1-boot-1", 120, "launcher Pod created")
        k8s_cluster.restart_apiserver()
        pod = env.launcher_running("vm1")
        converged = env.status_when("vm1", lambda s: s.get("node") == pod.spec.node_name and bool(
            s.get("startedAt")) and s.get("phase") in ("Pending", "Running"), 180, "status shows the launcher started")
        assert converged["status"]["pod"] == "vm1-boot-1", converged["status"]
        assert converged["status"]["startedAt"] == pod.status.container_statuses[0].state.running.started_at.strftime(
            "%Y-%m-%dT%H:%M:%SZ"), converged["status"]
        env.core.delete_namespaced_pod(pod.metadata.name, env.ns)
        failed = env.status_when("vm1", lambda s: s.get("phase") in ("Failed", "Stopped"), 180, "vm1 Failed")
        assert (failed["status"]["phase"], failed["status"]["reason"]) == ("Failed", "LauncherLost"), failed
        wait_for(lambda: not env.pods("vm1"), 300, "launcher Pod gone")
    assert pods.names == ["vm1-boot-1"], pods.names
    assert pods.max_alive == 1, pods.overlaps
