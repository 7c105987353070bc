"""The controller's pure decisions (zjusct_controller.decide): which Pod to create or delete and which status to
write, from a CloudVM, its launcher Pods, their Nodes and its root volume claim. Objects are hand-made dicts in
the API's shape; the real API server path is tests/integration/k8s_node/test_controller.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model.names import DNS1123_LABEL_MAX
from zjusct_controller.config import Config
from zjusct_controller.decide import FINALIZER, decide, needs_volume, status_patch, transition_event
from zjusct_controller.pod import LAUNCHER_TOLERATIONS, OWNER_LABEL, launcher_pod, pod_name, pod_resources
from zjusct_controller.volume import CLAIMED_BY

CFG = Config(launcher_image="launcher:1", image_dir="/srv/images", cmdline="console=ttyS0",
             node_selector={"zone": "a"}, tolerations=[{"key": "t", "operator": "Exists"}])
NOW = "2026-01-01T00:00:00Z"
UID = "0b7c1f4e-0000-4000-8000-000000000001"


def vm(power: str = "Running", boot: int = 1, status: dict | None = None, finalizers: Any = (FINALIZER,),
       deleting: bool = False, generation: int = 3) -> dict[str, Any]:
    md: dict[str, Any] = {"name": "web", "namespace": "alice", "uid": UID, "generation": generation,
                          "finalizers": list(finalizers)}
    if deleting:
        md["deletionTimestamp"] = NOW
    return {"metadata": md, "spec": {"owner": "alice", "rootVolumeClaim": "web-root", "powerState": power,
                                     "bootID": boot, "vcpus": 2, "memoryMiB": 1024},
            "status": status or {}}


def claim(phase: str = "Bound", holder: str | None = UID) -> dict[str, Any]:
    ann = {CLAIMED_BY: holder} if holder else {}
    return {"metadata": {"name": "web-root", "annotations": ann}, "status": {"phase": phase}}


def pod(boot: int = 1, *, phase: str = "Running", ready: bool = False, terminated: dict | None = None,
        deleting: bool = False, node: str | None = "n1", ip: str = "10.1.0.5") -> dict[str, Any]:
    state: dict[str, Any] = {}
    if terminated is not None:
        state = {"terminated": terminated}
    elif phase == "Running":
        state = {"running": {"startedAt": "2026-01-01T00:00:01Z"}}
    md: dict[str, Any] = {"name": pod_name("web", boot), "labels": {"cloud.zjusct.io/vm": "web",
                                                                    "cloud.zjusct.io/boot-id": str(boot)}}
    if deleting:
        md["deletionTimestamp"] = NOW
    conds = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": "2026-01-01T00:03:00Z"}]
    return {"metadata": md, "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "podIP": ip, "conditions": conds,
                       "containerStatuses": [{"name": "launcher", "state": state}]}}


READY_NODE = {"n1": {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}}
NOT_READY_NODE = {"n1": {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}}


def result(reason: str, code: int = 0) -> dict[str, Any]:
    return {"exitCode": code, "message": json.dumps({"kind": "LauncherResult", "reason": reason, "exitCode": code,
                                                     "finishedAt": "2026-01-01T01:00:00Z",
                                                     "readyAt": "2026-01-01T00:03:00Z"})}


def test_running_request_creates_one_pod_named_from_vm_and_boot_and_reports_pending() -> None:
    plan = decide(vm(), [], {}, claim(), lambda: [], CFG, NOW)
    assert plan.create_pod is not None and plan.delete_pods == [] and not plan.add_finalizer
    assert plan.create_pod["metadata"]["name"] == "web-boot-1"
    assert plan.status is not None
    assert (plan.status["phase"], plan.status["reason"], plan.status["bootID"], plan.status["pod"]) == (
        "Pending", "Starting", 1, "web-boot-1")
    assert plan.status["observedGeneration"] == 3
    assert plan.status["conditions"][0]["status"] == "False"


def test_pod_created_before_is_never_created_again_even_when_it_vanished() -> None:
    # the status records the Pod of boot 1: a restart or a retry never makes a second one, and its
    # disappearance while the VM should run is LauncherLost (never Running, no new boot of the same bootID)
    prev = {"phase": "Running", "reason": "SSHReady", "bootID": 1, "pod": "web-boot-1"}
    plan = decide(vm(status=prev), [], {}, claim(), lambda: [], CFG, NOW)
    assert plan.create_pod is None
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Failed", "LauncherLost")


def test_running_only_when_the_pod_is_ready_and_then_ssh_endpoint_is_the_pod_ip() -> None:
    prev = {"phase": "Pending", "reason": "Starting", "bootID": 1, "pod": "web-boot-1"}
    not_ready = decide(vm(status=prev), [pod(ready=False)], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert not_ready.status is not None and not_ready.create_pod is None
    assert (not_ready.status["phase"], not_ready.status["reason"]) == ("Pending", "WaitingForSSH")
    assert "sshEndpoint" not in not_ready.status
    ready = decide(vm(status=not_ready.status), [pod(ready=True)], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert ready.status is not None
    assert (ready.status["phase"], ready.status["reason"]) == ("Running", "SSHReady")
    assert ready.status["sshEndpoint"] == {"host": "10.1.0.5", "port": 22}
    assert ready.status["sshReadyAt"] == "2026-01-01T00:03:00Z"
    assert ready.status["conditions"][0]["status"] == "True"


def test_pod_on_a_not_ready_node_is_unknown_never_running_and_no_second_pod() -> None:
    plan = decide(vm(), [pod(ready=True)], NOT_READY_NODE, claim(), lambda: [], CFG, NOW)
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Unknown", "NodeLost")
    assert plan.create_pod is None and plan.delete_pods == []


def test_guest_shutdown_stays_stopped_until_boot_id_grows() -> None:
    done = pod(phase="Succeeded", terminated=result("GuestShutdown"))
    plan = decide(vm(), [done], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Stopped", "GuestShutdown")
    assert plan.create_pod is None and plan.delete_pods == []
    assert plan.status["exitResult"]["reason"] == "GuestShutdown"
    # bootID 2: the old Pod is deleted and the new one created in the same step (the old one has ended)
    nxt = decide(vm(boot=2, status=plan.status), [done], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert nxt.create_pod is not None and nxt.create_pod["metadata"]["name"] == "web-boot-2"
    assert [name for name, _grace in nxt.delete_pods] == ["web-boot-1"]


def test_pod_failed_with_result_is_failed_with_its_reason_and_without_result_is_launcher_lost() -> None:
    crashed = decide(vm(), [pod(phase="Failed", terminated=result("HypervisorCrashed", 1))], READY_NODE, claim(),
                     lambda: [], CFG, NOW)
    assert crashed.status is not None and (crashed.status["phase"], crashed.status["reason"]) == (
        "Failed", "HypervisorCrashed")
    killed = decide(vm(), [pod(phase="Failed", terminated={"exitCode": 137, "reason": "Error"})], READY_NODE,
                    claim(), lambda: [], CFG, NOW)
    assert killed.status is not None and (killed.status["phase"], killed.status["reason"]) == (
        "Failed", "LauncherLost")
    assert "137" in killed.status["message"]


def test_pod_deleted_by_someone_else_while_running_is_launcher_lost_at_once() -> None:
    plan = decide(vm(), [pod(ready=True, deleting=True)], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Failed", "LauncherLost")
    assert plan.create_pod is None and plan.delete_pods == []
    # the stop that followed (graceful, or killed after stopTimeoutSeconds when the guest ignores ACPI early in
    # its boot) was not asked for by the VM's spec: still LauncherLost, never Stopped
    for reason in ("StopRequested", "StopTimeoutKilled"):
        ended = decide(vm(), [pod(phase="Succeeded", terminated=result(reason), deleting=True)], READY_NODE,
                       claim(), lambda: [], CFG, NOW)
        assert ended.status is not None and (ended.status["phase"], ended.status["reason"]) == (
            "Failed", "LauncherLost"), reason
    # a result from before the deletion that is not a stop's outcome is kept (the guest panicked)
    panicked = decide(vm(), [pod(phase="Failed", terminated=result("GuestPanic", 1), deleting=True)], READY_NODE,
                      claim(), lambda: [], CFG, NOW)
    assert panicked.status is not None and panicked.status["reason"] == "GuestPanic"


def _disrupted(p: dict[str, Any], reason: str) -> dict[str, Any]:
    p["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": reason})
    return p


def test_an_evicted_launcher_stops_its_guest_then_the_same_boot_starts_again_once_the_pod_is_gone() -> None:
    running = {"phase": "Running", "reason": "SSHReady", "bootID": 1, "pod": "web-boot-1", "node": "n1"}
    for reason in ("EvictionByEvictionAPI", "DeletionByTaintManager"):
        evicting = decide(vm(status=running), [_disrupted(pod(ready=True, deleting=True), reason)], READY_NODE,
                          claim(), lambda: [], CFG, NOW)
        assert evicting.status is not None and (evicting.status["phase"], evicting.status["reason"]) == (
            "Stopping", "Evicted"), reason
        assert reason in evicting.status["message"] and "n1" in evicting.status["message"]
        assert evicting.create_pod is None and evicting.delete_pods == [] and "sshEndpoint" not in evicting.status
    # the launcher stopped the guest; the Pod is still there: still Stopping, nothing created
    stopped = _disrupted(pod(phase="Succeeded", terminated=result("StopRequested"), deleting=True),
                         "EvictionByEvictionAPI")
    ended = decide(vm(status=running), [stopped], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert ended.status is not None and ended.status["reason"] == "Evicted" and ended.create_pod is None
    # gone, its node Ready (cordoned by the drain): the boot's Pod again, the same name and bootID, its claim's
    # PersistentVolume read again as for any Pod created (the owner mark, the RBD image)
    assert needs_volume(vm(status=ended.status), claim())
    assert not needs_volume(vm(status=running), claim())
    again = decide(vm(status=ended.status), [], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert again.create_pod is not None and again.create_pod["metadata"]["name"] == "web-boot-1"
    assert again.status is not None and (again.status["phase"], again.status["reason"], again.status["bootID"]) == (
        "Pending", "Starting", 1)


def test_an_eviction_is_not_a_move_when_the_node_is_lost_or_the_guest_failed() -> None:
    running = {"phase": "Running", "reason": "SSHReady", "bootID": 1, "pod": "web-boot-1", "node": "n1"}
    evicting = _disrupted(pod(ready=True, deleting=True), "EvictionByEvictionAPI")
    lost = decide(vm(status=running), [evicting], NOT_READY_NODE, claim(), lambda: [], CFG, NOW)
    assert lost.status is not None and lost.status["reason"] != "Evicted" and lost.create_pod is None
    # the evicted Pod vanished while its node does not answer (or is gone): its guest may still run
    was = dict(running, phase="Stopping", reason="Evicted")
    for nodes in (NOT_READY_NODE, {}):
        gone = decide(vm(status=was), [], nodes, claim(), lambda: [], CFG, NOW)
        assert gone.create_pod is None
        assert gone.status is not None and (gone.status["phase"], gone.status["reason"]) == ("Failed", "LauncherLost")
    # the guest panicked as it was stopped: Failed with its reason, not started again
    panicked = _disrupted(pod(phase="Failed", terminated=result("GuestPanic", 1), deleting=True),
                          "EvictionByEvictionAPI")
    failed = decide(vm(status=running), [panicked], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert failed.status is not None and failed.status["reason"] == "GuestPanic" and failed.create_pod is None
    # a deletion that is no eviction (the pod GC, a person) stays LauncherLost
    collected = decide(vm(status=running), [_disrupted(pod(ready=True, deleting=True), "DeletionByPodGC")],
                       READY_NODE, claim(), lambda: [], CFG, NOW)
    assert collected.status is not None and collected.status["reason"] == "LauncherLost"
    # the VM was stopped meanwhile: no new Pod
    off = decide(vm("Stopped", status=dict(running, phase="Stopping", reason="Evicted")), [], READY_NODE, claim(),
                 lambda: [], CFG, NOW)
    assert off.create_pod is None and off.status is not None and off.status["phase"] == "Stopped"


def test_stop_deletes_the_pod_with_the_grace_period_then_stopped_and_kept_after_the_pod_is_gone() -> None:
    prev = {"phase": "Running", "reason": "SSHReady", "bootID": 1, "pod": "web-boot-1"}
    plan = decide(vm("Stopped", status=prev), [pod(ready=True)], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert plan.delete_pods == [("web-boot-1", CFG.stop_timeout_s + 30)]
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Stopping", "StopRequested")
    term = pod(phase="Succeeded", terminated=result("StopRequested"), deleting=True)
    done = decide(vm("Stopped", status=plan.status), [term], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert done.status is not None and (done.status["phase"], done.status["reason"]) == ("Stopped", "StopRequested")
    assert done.delete_pods == []  # already being deleted
    gone = decide(vm("Stopped", status=done.status), [], {}, claim(), lambda: [], CFG, NOW)
    assert gone.status == done.status and status_patch(done.status, gone.status) is None
    # the Pod vanished before its result was seen: Stopped too (the stop was asked for)
    lost = decide(vm("Stopped", status=plan.status), [], {}, claim(), lambda: [], CFG, NOW)
    assert lost.status is not None and (lost.status["phase"], lost.status["reason"]) == ("Stopped", "StopRequested")


def test_a_lingering_older_boot_blocks_the_new_one() -> None:
    prev = {"phase": "Stopping", "reason": "StopRequested", "bootID": 1, "pod": "web-boot-1"}
    old = pod(1, ready=True, deleting=True)
    plan = decide(vm(boot=2, status=prev), [old], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert plan.create_pod is None
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == (
        "Blocked", "PreviousBootRunning")


@pytest.mark.parametrize(("pvc", "writers", "why", "reason"), [
    (None, [], "does not exist", "VolumeClaimNotReady"),
    (claim(phase="Pending"), [], "Pending", "VolumeClaimNotReady"),
    (claim(holder="another-uid"), [], "another-uid", "VolumeInUse"),
    (claim(), ["other-pod"], "other-pod", "VolumeInUse"),
])
def test_root_volume_claim_problems_block_the_start_naming_the_claim(pvc: Any, writers: list, why: str,
                                                                    reason: str) -> None:
    plan = decide(vm(), [], {}, pvc, lambda: writers, CFG, NOW)
    assert plan.create_pod is None
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Blocked", reason)
    assert "web-root" in plan.status["message"] and why in plan.status["message"]


class _Lookup:
    """A claim-users lookup that counts its calls."""

    def __init__(self, users: list[str]) -> None:
        self.users, self.calls = users, 0

    def __call__(self) -> list[str]:
        self.calls += 1
        return self.users


@pytest.mark.parametrize(("case", "args"), [
    ("stopped", (vm("Stopped"), [], READY_NODE, claim())),
    ("deleting", (vm(deleting=True), [], READY_NODE, claim())),
    ("its Pod exists", (vm(), [pod(ready=True)], READY_NODE, claim())),
    ("its Pod was recorded", (vm(status={"phase": "Running", "bootID": 1, "pod": "web-boot-1"}), [], {}, claim())),
    ("claim not Bound", (vm(), [], {}, claim(phase="Pending"))),
    ("claimed by another VM", (vm(), [], {}, claim(holder="another-uid"))),
    ("an older boot runs", (vm(boot=2), [pod(1, ready=True)], READY_NODE, claim())),
])
def test_the_claim_users_are_not_looked_up_when_no_pod_would_be_created(case: str, args: tuple) -> None:
    lookup = _Lookup(["other-pod"])
    plan = decide(*args, lookup, CFG, NOW)
    assert plan.create_pod is None and lookup.calls == 0, case


def test_the_claim_users_are_looked_up_once_before_a_create_and_any_blocks_it() -> None:
    free = _Lookup([])
    plan = decide(vm(), [], {}, claim(holder=None), free, CFG, NOW)
    assert free.calls == 1 and plan.create_pod is not None and plan.mark_claim
    used = _Lookup(["backup", "a-job"])
    plan = decide(vm(), [], {}, claim(holder=None), used, CFG, NOW)
    assert used.calls == 1 and plan.create_pod is None and not plan.mark_claim
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Blocked", "VolumeInUse")
    assert plan.status["message"] == "Pod a-job, backup uses the root volume claim web-root"
    assert "pod" not in plan.status and "admittedBootID" not in plan.status


def _owned(obj: dict[str, Any], owner: str) -> dict[str, Any]:
    obj["metadata"]["labels"] = {OWNER_LABEL: owner}
    return obj


@pytest.mark.parametrize("holder", [None, UID])
def test_a_claim_marked_for_another_owner_is_blocked_naming_both_and_never_marked(holder: str | None) -> None:
    """Case: alice's CloudVM names bob's root volume claim (kept after his VM was deleted, no claim mark)."""
    plan = decide(vm(), [], {}, _owned(claim(holder=holder), "bob"), lambda: [], CFG, NOW)
    assert plan.create_pod is None and not plan.mark_claim
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == (
        "Blocked", "VolumeOwnerMismatch")
    message = plan.status["message"]
    assert "owner bob" in message and "not to alice (spec.owner)" in message and "web-root" in message
    assert f"metadata.labels[{OWNER_LABEL}]" in message


def test_a_persistent_volume_marked_for_another_owner_is_blocked_even_under_an_own_claim() -> None:
    pv = _owned({"metadata": {"name": "pv-web"}}, "bob")
    plan = decide(vm(), [], {}, _owned(claim(holder=None), "alice"), lambda: [], CFG, NOW, pv)
    assert plan.create_pod is None and not plan.mark_claim
    assert plan.status is not None and plan.status["reason"] == "VolumeOwnerMismatch"
    assert "PersistentVolume pv-web" in plan.status["message"] and "owner bob" in plan.status["message"]


def test_own_or_unmarked_claims_and_volumes_start() -> None:
    for pvc, pv in ((_owned(claim(holder=None), "alice"), _owned({"metadata": {"name": "pv"}}, "alice")),
                    (claim(holder=None), {"metadata": {"name": "pv"}})):
        plan = decide(vm(), [], {}, pvc, lambda: [], CFG, NOW, pv)
        assert plan.create_pod is not None and plan.mark_claim


def test_unclaimed_volume_is_marked_with_the_vm_uid() -> None:
    plan = decide(vm(), [], {}, claim(holder=None), lambda: [], CFG, NOW)
    assert plan.mark_claim and plan.create_pod is not None
    assert not decide(vm(), [], {}, claim(), lambda: [], CFG, NOW).mark_claim


def test_finalizer_added_and_removed_only_once_the_pods_are_gone() -> None:
    assert decide(vm(finalizers=()), [], {}, claim(), lambda: [], CFG, NOW).add_finalizer
    deleting = decide(vm(deleting=True), [pod(ready=True)], READY_NODE, claim(), lambda: [], CFG, NOW)
    assert deleting.delete_pods == [("web-boot-1", CFG.stop_timeout_s + 30)]
    assert not deleting.remove_finalizer and deleting.status is None and deleting.create_pod is None
    assert decide(vm(deleting=True), [], {}, claim(), lambda: [], CFG, NOW).remove_finalizer


def test_never_started_vm_is_stopped_never_started() -> None:
    plan = decide(vm("Stopped", boot=0), [], {}, claim(), lambda: [], CFG, NOW)
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Stopped", "NeverStarted")
    assert plan.create_pod is None


def test_pod_manifest_owner_labels_config_and_resources() -> None:
    body = launcher_pod(vm(), CFG)
    md, spec = body["metadata"], body["spec"]
    assert md["ownerReferences"] == [{"apiVersion": "cloud.zjusct.io/v1alpha1", "kind": "CloudVM", "name": "web",
                                      "uid": UID, "controller": True, "blockOwnerDeletion": True}]
    assert md["labels"]["cloud.zjusct.io/boot-id"] == "1" and md["labels"]["cloud.zjusct.io/vm"] == "web"
    # the owner mark the launcher Pod policy lets delete it (config/policy/owner-admission.yaml)
    assert md["labels"]["cloud.zjusct.io/owner"] == vm()["spec"]["owner"]
    assert spec["restartPolicy"] == "Never" and spec["nodeSelector"] == {"zone": "a"}
    # the config's tolerations, then those that keep Kubernetes from evicting it off a lost node (Fencing)
    assert spec["tolerations"] == [*CFG.tolerations, *(dict(t) for t in LAUNCHER_TOLERATIONS)]
    container = spec["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["resources"] == {"requests": {"cpu": "600m", "memory": "875Mi"}}  # 2 vCPU / 1024 MiB, TCG
    cfg = json.loads(md["annotations"]["cloud.zjusct.io/launcher-config"])
    assert cfg["vm"] == {"namespace": "alice", "name": "web", "uid": UID, "bootID": 1}
    assert cfg["machine"] == {"vcpus": 2, "memoryMiB": 1024}
    assert cfg["result"]["path"] == "/vm/result-1.json"
    assert {"name": "vm", "persistentVolumeClaim": {"claimName": "web-root"}} in spec["volumes"]


def test_an_anti_affinity_group_keeps_the_owners_launchers_of_the_group_apart_and_is_named_when_unschedulable() -> None:
    grouped = vm()
    grouped["spec"]["antiAffinityGroup"] = "web"
    body = launcher_pod(grouped, CFG)
    assert body["metadata"]["labels"]["cloud.zjusct.io/anti-affinity-group"] == "web"
    assert body["spec"]["affinity"] == {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"cloud.zjusct.io/owner": "alice",
                                          "cloud.zjusct.io/anti-affinity-group": "web"}},
        "namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}]}}
    assert "affinity" not in launcher_pod(vm(), CFG)["spec"]
    assert "cloud.zjusct.io/anti-affinity-group" not in launcher_pod(vm(), CFG)["metadata"]["labels"]
    waiting = pod(node=None, phase="Pending")
    waiting["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "message": "0/2 nodes are available: 2 node(s) didn't match pod "
                                                   "anti-affinity rules."}]
    prev = {"phase": "Pending", "reason": "Starting", "bootID": 1, "pod": "web-boot-1"}
    grouped["status"] = prev
    plan = decide(grouped, [waiting], {}, claim(), lambda: [], CFG, NOW)
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Pending", "Unschedulable")
    assert "anti-affinity rules" in plan.status["message"] and "spec.antiAffinityGroup 'web'" in plan.status["message"]


def test_resources_formula() -> None:
    assert pod_resources({"vcpus": 1, "memoryMiB": 512}, CFG) == {"requests": {"cpu": "350m", "memory": "534Mi"}}
    kvm = Config(launcher_image="x", image_dir="/x", cmdline="c", accel="kvm")
    assert pod_resources({"vcpus": 4, "memoryMiB": 4096}, kvm) == {"requests": {"cpu": "1100m", "memory": "2795Mi"}}


def test_pod_name_is_deterministic_and_fits_a_dns_label() -> None:
    long = "v" * 63
    assert pod_name(long, 7) == pod_name(long, 7) and len(pod_name(long, 7)) == DNS1123_LABEL_MAX
    assert pod_name(long, 7) != pod_name(long, 8)
    assert pod_name("web", 2) == "web-boot-2"


@pytest.mark.parametrize("length", [1, 50, 55, 56, 57, 62, 63])
@pytest.mark.parametrize("boot", [0, 7, 12345, 2**63 - 1])
def test_pod_name_always_ends_in_the_boot_suffix(length: int, boot: int) -> None:
    """The launcher Pod policy knows a launcher Pod by ``-boot-<bootID>`` at the end of its name (exec, attach,
    port-forward, proxy and eviction requests carry nothing else of the Pod), so no VM name may push it out."""
    name = ("a" + "b" * 61 + "c")[:length - 1] + "z" if length > 1 else "z"
    got = pod_name(name, boot)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", got) and len(got) <= DNS1123_LABEL_MAX
    assert re.search(r"-boot-[0-9]+$", got) and got.endswith(f"-boot-{boot}")
    full = f"{name}-boot-{boot}"
    # shorter than 63: the name itself (what fit() of the whole name gave before); else exactly 63, hashed
    assert got == full if len(full) < DNS1123_LABEL_MAX else (len(got) == DNS1123_LABEL_MAX and got != full)
    assert pod_name(name + "x" if length < 63 else name[:-1] + "x", boot) != got


def test_status_patch_and_events() -> None:
    assert status_patch({"a": 1}, {"a": 1}) is None
    assert status_patch({"a": 1, "sshEndpoint": {"host": "x"}}, {"a": 2}) == {"a": 2, "sshEndpoint": None}
    assert transition_event({"phase": "Pending", "reason": "Starting", "bootID": 1},
                            {"phase": "Pending", "reason": "Starting", "bootID": 1}) is None
    event = transition_event({}, {"phase": "Failed", "reason": "LauncherLost", "bootID": 1})
    assert event is not None
    kind, reason, _msg = event
    assert (kind, reason) == ("Warning", "LauncherLost")


def test_config_refuses_unknown_and_missing_keys() -> None:
    with pytest.raises(ValueError, match="unknown keys bogus"):
        Config.from_dict({"launcherImage": "x", "imageDir": "/x", "cmdline": "c", "bogus": 1})
    with pytest.raises(ValueError, match="required keys missing: imageDir"):
        Config.from_dict({"launcherImage": "x", "cmdline": "c"})


def test_max_concurrent_boots_mounts_the_nodes_slot_directory_and_sets_boot_slots() -> None:
    assert "bootSlots" not in json.loads(launcher_pod(vm(), CFG)["metadata"]["annotations"][
        "cloud.zjusct.io/launcher-config"])
    cfg = Config.from_dict({"launcherImage": "x", "imageDir": "/x", "cmdline": "c", "maxConcurrentBoots": 2,
                            "bootSlotDir": "/run/lock/hv/slots"})
    body = launcher_pod(vm(), cfg)
    launcher = json.loads(body["metadata"]["annotations"]["cloud.zjusct.io/launcher-config"])
    assert launcher["bootSlots"] == {"directory": "/run/zjusct-boot-slots", "count": 2}
    assert launcher["hypervisor"]["tcgCPUModel"] == "qemu64,+rdrand"
    nehalem = Config.from_dict({"launcherImage": "x", "imageDir": "/x", "cmdline": "c", "tcgCPUModel": "Nehalem"})
    assert json.loads(launcher_pod(vm(), nehalem)["metadata"]["annotations"][
        "cloud.zjusct.io/launcher-config"])["hypervisor"]["tcgCPUModel"] == "Nehalem"
    assert {"name": "boot-slots", "hostPath": {"path": "/run/lock/hv/slots", "type": "DirectoryOrCreate"}} \
        in body["spec"]["volumes"]
    assert {"name": "boot-slots", "mountPath": "/run/zjusct-boot-slots"} in body["spec"]["containers"][0][
        "volumeMounts"]
    for bad, named in (({"maxConcurrentBoots": -1}, "maxConcurrentBoots: -1 is not 0"),
                       ({"maxConcurrentBoots": True}, "maxConcurrentBoots: True"),
                       ({"bootSlotDir": "slots"}, "bootSlotDir: 'slots' is not a normalised absolute path"),
                       ({"bootSlotDir": "/"}, "bootSlotDir: '/' is not"),
                       ({"bootSlotDir": "/a/../b"}, "bootSlotDir: '/a/../b' is not")):
        with pytest.raises(ValueError, match=named):
            Config.from_dict({"launcherImage": "x", "imageDir": "/x", "cmdline": "c", **bad})
