"""The zjusct.cloud.cloudvm and cloudvm_info modules run by ansible-playbook (collection from this
checkout) against the real kube-apiserver with the CloudVM CRD from config/crd/.

The waits that need no running guest observe the real controller (the ``controller`` fixture): this control
plane has no kubelet, so its launcher Pods are created and stay unscheduled. Start, stop, restart and the guest's
own shutdown with a booted guest are tested on the real node
(tests/integration/k8s_node/test_cloudvm_module_power.py).
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import in_user_terms
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import TENANT_NAMESPACE, wait_for
from tests.integration.cloudvm_k8s.cloudvm_helpers import (
    CloudVMs,
    PlayRun,
    cloudvm_task,
    finish_play,
    run_play,
)
from tests.integration.controller_process import Controller

pytestmark = pytest.mark.k8s

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE1qBq5mUL3Tj8Yo3Gc0wLkqj0ZC1S4Kk5uGq2pX3cQh alice@laptop"


def _vm(ns: str, name: str, **args: Any) -> dict[str, Any]:
    return cloudvm_task(namespace=ns, name=name, **args)


def test_case_A2_create_is_idempotent_diffed_and_deleted(play: Callable[..., PlayRun], cvm_api: CloudVMs,
                                                         k8s_namespace: str) -> None:
    ns = k8s_namespace
    run = play([
        _vm(ns, "idem", owner="alice", memory_mib=1024, ssh_authorized_keys=[KEY], labels={"tier": "gold"}),
        _vm(ns, "idem", owner="alice", memory_mib=1024, ssh_authorized_keys=[KEY], labels={"tier": "gold"}),
        _vm(ns, "idem", vcpus=2),
        _vm(ns, "idem", state="absent"),
        _vm(ns, "idem", state="absent"),
    ], diff=True)
    created, again, update, deleted, deleted_again = run.results
    assert created["changed"] is True, created
    assert created["cloudvm"]["spec"] == {"owner": "alice", "rootVolumeClaim": "idem-root", "vcpus": 1,
                                          "memoryMiB": 1024, "powerState": "Stopped", "bootID": 0,
                                          "sshAuthorizedKeys": [KEY]}
    assert created["diff"]["before"] == {} and created["diff"]["after"]["memoryMiB"] == 1024
    assert again["changed"] is False, again
    assert again["cloudvm"]["metadata"]["resourceVersion"] == created["cloudvm"]["metadata"]["resourceVersion"]
    assert update["changed"] is True
    assert (update["diff"]["before"]["vcpus"], update["diff"]["after"]["vcpus"]) == (1, 2)
    assert update["cloudvm"]["spec"]["memoryMiB"] == 1024  # options left out keep their values
    assert deleted["changed"] is True and "cloudvm" not in deleted
    assert deleted_again["changed"] is False
    assert cvm_api.get(ns, "idem") is None


def test_case_A2_check_mode_creates_nothing_and_predicts_the_object(play: Callable[..., PlayRun], cvm_api: CloudVMs,
                                                                    k8s_namespace: str) -> None:
    ns = k8s_namespace
    cvm_api.create(ns, "exists", vcpus=1)
    run = play([
        _vm(ns, "fresh", owner="alice", power_state="running"),
        _vm(ns, "exists", vcpus=3, power_state="running"),
        _vm(ns, "exists", owner="bob"),
        _vm(ns, "exists", state="absent"),
    ], check=True, diff=True)
    fresh, update, immutable, delete = run.results
    assert fresh["changed"] is True and fresh["cloudvm"]["spec"]["bootID"] == 1, fresh  # server-side dry run
    assert update["changed"] is True and update["diff"]["after"]["vcpus"] == 3
    assert immutable.get("failed") is True and "spec.owner" in immutable["msg"], immutable  # dry run validates too
    assert delete["changed"] is True
    assert cvm_api.get(ns, "fresh") is None
    still = cvm_api.get(ns, "exists")
    assert still is not None and still["spec"]["vcpus"] == 1 and still["spec"]["bootID"] == 0


def test_module_refusals_carry_the_servers_field_path_and_touch_nothing(play: Callable[..., PlayRun],
                                                                        cvm_api: CloudVMs, k8s_namespace: str) -> None:
    ns = k8s_namespace
    cases = [
        ({"root_volume_claim": "other-root"}, "spec.rootVolumeClaim: Forbidden",
         "is immutable (was rej-root, requested other-root)"),
        ({"vcpus": 0}, "spec.vcpus: Invalid value: 0", "greater than or equal to 1"),
        ({"vcpus": 5}, "spec.vcpus: Invalid value: 5", "less than or equal to 4"),
        ({"memory_mib": 127}, "spec.memoryMiB: Invalid value: 127", "greater than or equal to 128"),
        ({"memory_mib": 4097}, "spec.memoryMiB: Invalid value: 4097", "less than or equal to 4096"),
        ({"ssh_authorized_keys": ["ssh-rsa"]}, "spec.sshAuthorizedKeys[0]: Invalid value", "should match"),
        ({"bandwidth": {"guaranteed_mbps": 100, "ceil_mbps": 10}}, "spec.network.bandwidth.ceilMbps",
         "must be at least guaranteedMbps"),
        ({"disk_io": {"write_iops": 5}}, "spec.diskIO.writeIOPS: Invalid value: 5", "greater than or equal to 20"),
        ({"disk_io": {"read_bytes_per_second": 2**40 + 1}},
         f"spec.diskIO.readBytesPerSecond: Invalid value: {2**40 + 1}", "less than or equal to 1099511627776"),
    ]
    before = cvm_api.create(ns, "rej")
    run = play([_vm(ns, "rej", **{"vcpus": 2, **change}) for change, _, _ in cases] +
               [_vm(ns, "rej", vcpus=2, owner="bob")])
    # another owner is refused by the module before it writes (the owner rule, docs/security.md); the API
    # server's own immutability rule for spec.owner is tested in test_cloudvm_crd.py
    *results, other_owner = run.results
    assert other_owner.get("failed") is True and other_owner["reason"] == "Forbidden", other_owner
    assert "owner: 'bob' may not act on CloudVM" in other_owner["msg"], other_owner["msg"]
    for (change, field, text), result in zip(cases, results, strict=True):
        assert result.get("failed") is True, (change, result)
        # the server's field path, put in the user's words: "vcpus (spec.vcpus; allowed 1 to 4): Invalid value: 0"
        assert in_user_terms(field) in result["msg"] and text in result["msg"], (change, result["msg"])
        assert in_user_terms(field) != field or ":" not in field, field
        assert result["api_status"] == 422 and result["api_reason"] == "Invalid", result
    after = cvm_api.get(ns, "rej")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_concurrent_starts_request_one_boot(k8s_cluster: Any, cloudvm_crd: dict[str, Any], cvm_api: CloudVMs,
                                            k8s_namespace: str, tmp_path: Path) -> None:
    """Two ansible-playbook runs start the same stopped VM at once: resourceVersion-guarded writes make
    exactly one of them request boot 2; the other re-plans after its 409 and changes nothing."""
    ns = k8s_namespace
    cvm_api.create(ns, "race", powerState="Stopped", bootID=1)
    tasks = [_vm(ns, "race", power_state="running", wait=False)]
    procs = [run_play(tasks, kubeconfig=k8s_cluster.kubeconfig, tmp_path=tmp_path, background=True)
             for _ in range(2)]
    results = [finish_play(p).results[0] for p in procs]  # type: ignore[arg-type]
    assert sorted(r["changed"] for r in results) == [False, True], results
    assert {r["boot_id"] for r in results} == {2}
    assert cvm_api.get(ns, "race")["spec"]["bootID"] == 2  # type: ignore[index]


@pytest.fixture
def root_claim(k8s_api: Any, k8s_namespace: str) -> Iterator[Callable[[str], str]]:
    """Factory ``root_claim(name)``: a root volume claim ``name`` in the test's namespace, Bound to a PV of its
    own (a CSI source that is never mounted: no kubelet runs the Pod); returns the name. The PVs are deleted
    afterwards."""
    core: Any = client.CoreV1Api(k8s_api)
    ns, made = k8s_namespace, []

    def make(name: str) -> str:
        pv = f"{ns}-{name}"
        core.create_persistent_volume({
            "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain", "claimRef": {"namespace": ns, "name": name},
                     "csi": {"driver": "test.cloud.zjusct.io", "volumeHandle": pv}}})
        made.append(pv)
        core.create_namespaced_persistent_volume_claim(ns, {
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for(lambda: core.read_namespaced_persistent_volume_claim(name, ns).status.phase == "Bound", 60,
                 f"{name} Bound")
        return name

    yield make
    for pv in made:
        with contextlib.suppress(ApiException):
            core.delete_persistent_volume(pv)


def test_wait_timeout_names_last_phase_and_reason(play: Callable[..., PlayRun], controller: Controller,
                                                  root_claim: Callable[[str], str], k8s_api: Any,
                                                  k8s_namespace: str) -> None:
    """The real controller's status at the timeout: a bound root volume claim gets a launcher Pod that the
    scheduler cannot place (Pending/Unschedulable, with the scheduler's message); a missing claim blocks the start
    (Blocked/VolumeClaimNotReady)."""
    ns = k8s_namespace
    root_claim("slow-root")
    slow, blocked = play([_vm(ns, "slow", owner="alice", power_state="running", wait_timeout=20),
                          _vm(ns, "lost", owner="alice", power_state="running", wait_timeout=20)]).results
    assert slow.get("failed") is True and slow["changed"] is True, slow  # the start request was written
    assert "timed out after 20 s waiting until Running (SSH ready) with bootID 1" in slow["msg"], slow["msg"]
    assert "last phase Pending, reason Unschedulable, status.bootID 1" in slow["msg"], slow["msg"]
    assert "launcher Pod slow-boot-1 cannot be scheduled: 0/" in slow["msg"], slow["msg"]
    # what the controller waits on: its launcher Pod, which the real scheduler cannot place
    assert slow["cloudvm"]["status"]["pod"] == "slow-boot-1", slow["cloudvm"]["status"]
    pod: Any = client.CoreV1Api(k8s_api).read_namespaced_pod("slow-boot-1", ns)
    scheduled = {c.type: c for c in pod.status.conditions or []}.get("PodScheduled")
    assert scheduled is not None and (scheduled.status, scheduled.reason) == ("False", "Unschedulable"), pod.status
    assert blocked.get("failed") is True and blocked["changed"] is True, blocked
    assert "last phase Blocked, reason VolumeClaimNotReady, status.bootID 1" in blocked["msg"], blocked["msg"]
    assert "the root volume claim lost-root does not exist" in blocked["msg"], blocked["msg"]


def test_stop_waits_for_the_controllers_stopped(play: Callable[..., PlayRun], controller: Controller,
                                                root_claim: Callable[[str], str], cvm_api: CloudVMs, k8s_api: Any,
                                                k8s_namespace: str) -> None:
    """A stop ends on the Stopped the real controller writes: for a VM never started (NeverStarted) and for a
    started one whose launcher Pod the controller deletes (StopRequested); a second stop changes nothing."""
    ns = k8s_namespace
    core: Any = client.CoreV1Api(k8s_api)
    root_claim("off-root")
    created, start = play([_vm(ns, "off", owner="alice", power_state="stopped", wait_timeout=60),
                           _vm(ns, "off", power_state="running", wait=False)]).results
    assert (created["changed"], created["phase"]) == (True, "Stopped"), created
    assert created["cloudvm"]["status"]["reason"] == "NeverStarted", created["cloudvm"]["status"]
    assert (start["changed"], start["boot_id"]) == (True, 1), start
    wait_for(lambda: core.list_namespaced_pod(ns, label_selector="cloud.zjusct.io/vm=off").items, 60,
             "off's launcher Pod created")
    stop, stop_again = play([_vm(ns, "off", power_state="stopped", wait_timeout=60)] * 2).results
    assert (stop["changed"], stop["phase"]) == (True, "Stopped"), stop
    status = stop["cloudvm"]["status"]
    assert (status["reason"], status["bootID"]) == ("StopRequested", 1), status
    assert (stop_again["changed"], stop_again["phase"]) == (False, "Stopped"), stop_again
    assert core.list_namespaced_pod(ns, label_selector="cloud.zjusct.io/vm=off").items == []
    assert cvm_api.get(ns, "off")["spec"]["powerState"] == "Stopped"  # type: ignore[index]


def test_tenant_manages_cloudvms_only_in_her_namespace(play: Callable[..., PlayRun], cvm_api: CloudVMs,
                                                       k8s_namespace: str) -> None:
    if cvm_api.get(TENANT_NAMESPACE, "alice-vm") is not None:  # left over by an interrupted run
        cvm_api.api.delete_namespaced_custom_object("cloud.zjusct.io", "v1alpha1", TENANT_NAMESPACE, "cloudvms",
                                                    "alice-vm")
    run = play([
        _vm(TENANT_NAMESPACE, "alice-vm", owner="alice"),
        {"zjusct.cloud.cloudvm_info": {"namespace": TENANT_NAMESPACE, "owner": "alice"}},
        _vm(k8s_namespace, "intruder", owner="alice"),
        {"zjusct.cloud.cloudvm_info": {"owner": "alice"}},
        _vm(TENANT_NAMESPACE, "alice-vm", state="absent"),
    ], user="alice")
    created, listed, elsewhere, everywhere, deleted = run.results
    assert created["changed"] is True, created
    assert [o["metadata"]["name"] for o in listed["cloudvms"]] == ["alice-vm"], listed
    assert elsewhere.get("failed") is True and elsewhere["api_status"] == 403, elsewhere
    assert 'cannot get resource "cloudvms"' in elsewhere["msg"] or "forbidden" in elsewhere["msg"], elsewhere["msg"]
    assert everywhere.get("failed") is True and everywhere["api_status"] == 403, everywhere
    assert deleted["changed"] is True
    assert cvm_api.get(k8s_namespace, "intruder") is None


def test_case_A3_credentials_never_in_results_or_vvv_output(play: Callable[..., PlayRun], k8s_cluster: Any,
                                                            k8s_api: Any, k8s_namespace: str, tmp_path: Path) -> None:
    """A kubeconfig passed as a dict (embedded client key) and a bearer token passed as api_key, in
    successful and failing tasks, with -vvv: neither secret appears anywhere in the output."""
    ns = k8s_namespace
    kubeconfig = yaml.safe_load(Path(k8s_cluster.kubeconfig).read_text())
    key_data = kubeconfig["users"][0]["user"]["client-key-data"]
    key_pem_line = base64.b64decode(key_data).decode().splitlines()[1]
    ca = tmp_path / "ca.crt"
    ca.write_bytes(base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]))
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "robot"}})
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "robot-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": ns}]})
    request = {"spec": {"expirationSeconds": 3600}}
    token = core.create_namespaced_service_account_token("robot", ns, request).status.token
    by_token = {"host": k8s_cluster.server, "api_key": token, "ca_cert": str(ca)}
    deadline = time.monotonic() + 30
    while True:  # the RoleBinding reaches the authorizer's cache within a moment
        review = client.AuthorizationV1Api(k8s_api).create_subject_access_review({"spec": {
            "user": f"system:serviceaccount:{ns}:robot",
            "resourceAttributes": {"namespace": ns, "verb": "create", "group": "cloud.zjusct.io",
                                   "resource": "cloudvms"}}})
        if review.status.allowed or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    tasks = [
        _vm(ns, "sec", owner="alice", kubeconfig=kubeconfig),
        _vm(ns, "sec", owner="bob", kubeconfig=kubeconfig),  # fails: immutable owner
        _vm(ns, "sec", vcpus=2, **by_token),
        _vm(ns, "sec", vcpus=9, **by_token),  # fails: above the maximum
        {"zjusct.cloud.cloudvm_info": {"namespace": ns, **by_token}},
    ]
    for json_output in (True, False):
        run = play(tasks, user="", verbosity=3, json_output=json_output)
        text = run.stdout + run.stderr
        for secret in (key_data, key_pem_line, token):
            assert secret not in text
        if json_output:
            ok, refused, by_tok, too_big, info = run.results
            assert ok["changed"] is True, ok
            assert refused.get("failed") and "spec.owner" in refused["msg"], refused
            # the robot is not the VM's owner: the owner admission policy refuses it, and says so without
            # echoing the token
            assert by_tok.get("failed") and by_tok["api_status"] == 403, by_tok
            assert "may not update CloudVM" in by_tok["msg"] and "owned by alice" in by_tok["msg"], by_tok
            assert too_big.get("failed") and "spec.vcpus" in too_big["msg"], too_big
            assert [o["metadata"]["name"] for o in info["cloudvms"]] == ["sec"], info
        else:
            assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in text or "********" in text
