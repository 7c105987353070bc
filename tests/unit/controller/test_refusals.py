"""Refused writes and the per-owner quota in the controller: the pure parts (zjusct_controller.refusal: which answers
are refusals, the backoff; zjusct_controller.decide: the refused plan) and the adapter (zjusct_controller.reconcile)
against the stub API of test_reconcile_scope.py. The real API server, ResourceQuota, LimitRange and controller process:
tests/integration/cloudvm_k8s/test_controller_quota.py."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from zjusct_controller.decide import decide, refuse, transition_event
from zjusct_controller.refusal import QUOTA_EXCEEDED, REFUSED, api_refusal, retry_delay

from tests.unit.controller.test_decide import CFG, NOW, claim, pod, vm
from tests.unit.controller.test_reconcile_scope import _Api, _reconciler, _resp

QUOTA_BODY = json.dumps({"kind": "Status", "reason": "Forbidden", "message": (
    'pods "web-boot-1" is forbidden: exceeded quota: tiny, requested: requests.cpu=350m, used: requests.cpu=0, '
    "limited: requests.cpu=100m")})
LIMIT_BODY = json.dumps({"message": 'pods "web-boot-1" is forbidden: minimum memory usage per Container is 1Gi, '
                                    "but request is 534Mi"})
PSA_BODY = json.dumps({"message": 'pods "web-boot-1" is forbidden: violates PodSecurity "restricted:latest": '
                                  "privileged"})


# --------------------------------------------------------------------------- pure


@pytest.mark.parametrize("code, body, reason", [
    (403, QUOTA_BODY, QUOTA_EXCEEDED), (403, LIMIT_BODY, QUOTA_EXCEEDED), (403, PSA_BODY, REFUSED),
    (422, json.dumps({"message": "Pod \"x\" is invalid: spec.hostname: Invalid value"}), REFUSED),
    (400, "not json at all", REFUSED)])
def test_a_final_refusal_says_who_refused_what_with_the_api_servers_message(code: int, body: str, reason: str) -> None:
    got = api_refusal(code, body, "the launcher Pod alice/web-boot-1")
    assert got is not None and got[0] == reason
    assert got[1].startswith(f"the API server refused the launcher Pod alice/web-boot-1 (HTTP {code}): ")
    assert (json.loads(body)["message"] if body.startswith("{") else body) in got[1]


@pytest.mark.parametrize("code", [None, 404, 409, 429, 500, 503])
def test_other_answers_are_not_refusals_and_are_retried_as_errors(code: int | None) -> None:
    assert api_refusal(code, QUOTA_BODY, "x") is None


def test_a_refused_start_is_blocked_without_its_pod_and_keeps_the_boot_admitted_before() -> None:
    prev = {"phase": "Stopped", "reason": "StopRequested", "bootID": 1, "pod": "web-boot-1", "admittedBootID": 1}
    obj = vm(boot=2, status=prev)
    plan = decide(obj, [], {}, claim(), lambda: [], CFG, NOW)
    assert plan.create_pod is not None and plan.status is not None
    assert (plan.status["admittedBootID"], plan.status["pod"]) == (2, "web-boot-2")  # what a create records
    refused = refuse(obj, plan, QUOTA_EXCEEDED, "vcpus: owner 'alice' would use ...", NOW)
    assert refused.create_pod is None and not refused.mark_claim and refused.refused == QUOTA_EXCEEDED
    st = refused.status
    assert st is not None
    assert (st["phase"], st["reason"], st["bootID"], st["admittedBootID"]) == ("Blocked", QUOTA_EXCEEDED, 2, 1)
    assert "pod" not in st  # no Pod of boot 2 exists: the next reconcile tries again instead of calling it lost
    assert st["conditions"][0]["reason"] == QUOTA_EXCEEDED and st["conditions"][0]["status"] == "False"
    again = decide(vm(boot=2, status=st), [], {}, claim(), lambda: [], CFG, NOW)
    assert again.create_pod is not None  # retried: still a start to make
    assert transition_event(prev, st) == ("Warning", QUOTA_EXCEEDED, "boot 2: Stopped -> Blocked: vcpus: owner "
                                                                     "'alice' would use ...")


def test_a_refused_stop_keeps_its_phase_and_says_why_in_a_warning() -> None:
    obj = vm(power="Stopped", status={"phase": "Running", "reason": "SSHReady", "bootID": 1, "pod": "web-boot-1"})
    plan = decide(obj, [pod(1, ready=True)], {"n1": {"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}}}, claim(), lambda: [], CFG, NOW)
    assert plan.delete_pods and plan.status is not None and plan.status["phase"] == "Stopping"
    refused = refuse(obj, plan, REFUSED, "the API server refused the deletion of launcher Pod ...", NOW,
                     starting=False)
    assert refused.status is not None and refused.delete_pods == plan.delete_pods
    assert (refused.status["phase"], refused.status["reason"], refused.status["pod"]) == ("Stopping", REFUSED,
                                                                                          "web-boot-1")
    event = transition_event(obj["status"], refused.status)
    assert event is not None and event[:2] == ("Warning", REFUSED)


def test_a_status_from_before_admitted_boot_existed_gets_it_from_its_pod() -> None:
    obj = vm(status={"phase": "Running", "reason": "SSHReady", "bootID": 1, "pod": "web-boot-1"})
    plan = decide(obj, [pod(1, ready=True)], {"n1": {"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}}}, claim(), lambda: [], CFG, NOW)
    assert plan.status is not None and plan.status["admittedBootID"] == 1


def test_retries_back_off_from_2_to_60_seconds() -> None:
    assert [retry_delay(n) for n in range(1, 9)] == [2, 4, 8, 16, 32, 60, 60, 60]


# --------------------------------------------------------------------------- the adapter


class _QuotaApi(_Api):
    """The stub API with two namespaces of alice's and one of bob's VMs, CloudQuotas, and refusals on demand."""

    def __init__(self) -> None:
        super().__init__(())
        self.refuse_create: dict[str, ApiException] = {}  # Pod name -> the refusal of its create
        self.refuse_delete: ApiException | None = None
        self.refuse_status: list[ApiException] = []  # the next status patches to refuse, in order
        self.lose_create: set[str] = set()  # Pod names whose create happens but whose answer is lost
        self.create_delay = 0.0
        self.mark_delay = 0.0
        self.events: list[dict] = []
        self.deleted: list[str] = []

    def add_vm(self, ns: str, name: str, owner: str = "alice", vcpus: int = 1, power: str = "Running") -> None:
        self.vms[(ns, name)] = {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
                                             "generation": 1, "resourceVersion": "1"},
                                "spec": {"owner": owner, "rootVolumeClaim": f"{name}-root", "powerState": power,
                                         "bootID": 1, "vcpus": vcpus, "memoryMiB": 512}}
        self.claims[(ns, f"{name}-root")] = {"metadata": {"name": f"{name}-root", "namespace": ns,
                                                          "resourceVersion": "2"},
                                             "spec": {"resources": {"requests": {"storage": "1Gi"}}},
                                             "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}}

    def create_namespaced_pod(self, ns: str, body: dict, **kw: Any) -> Any:
        name = body["metadata"]["name"]
        if name in self.refuse_create:
            self.calls.append("POST pod (refused)")
            raise self.refuse_create[name]
        time.sleep(self.create_delay)
        got = super().create_namespaced_pod(ns, body, **kw)
        if name in self.lose_create:
            raise TimeoutError("read timed out")  # the Pod exists; this process never hears so
        return got

    def patch_namespaced_persistent_volume_claim(self, *args: Any, **kw: Any) -> Any:
        time.sleep(self.mark_delay)
        return super().patch_namespaced_persistent_volume_claim(*args, **kw)

    def delete_namespaced_pod(self, name: str, ns: str, **_: Any) -> Any:
        if self.refuse_delete is not None:
            raise self.refuse_delete
        self.deleted.append(name)
        return _resp({})

    def patch_namespaced_custom_object_status(self, *args: Any, **kw: Any) -> Any:
        if self.refuse_status:
            raise self.refuse_status.pop(0)
        return super().patch_namespaced_custom_object_status(*args, **kw)

    def create_namespaced_event(self, ns: str, body: dict, **kw: Any) -> Any:
        self.events.append(body)
        return super().create_namespaced_event(ns, body, **kw)


def _refusal(code: int, body: str) -> ApiException:
    exc = ApiException(status=code, reason="Forbidden")
    exc.body = body
    return exc


def test_a_launcher_pod_refused_by_a_resource_quota_is_blocked_quota_exceeded_and_retried_with_backoff() -> None:
    api = _QuotaApi()
    api.add_vm("a", "web")
    api.refuse_create["web-boot-1"] = _refusal(403, QUOTA_BODY)
    r = _reconciler(api)
    clock = [1000.0]
    r.monotonic = lambda: clock[0]
    plan = r.reconcile("a", "web")  # no exception: the status says why
    assert plan is not None and plan.refused == QUOTA_EXCEEDED and not api.pods
    st = api.vms[("a", "web")]["status"]
    assert (st["phase"], st["reason"]) == ("Blocked", QUOTA_EXCEEDED) and "pod" not in st
    assert "exceeded quota: tiny" in st["message"] and "web-boot-1" in st["message"]
    assert [(e["type"], e["reason"]) for e in api.events] == [("Warning", QUOTA_EXCEEDED)]
    assert r.due() == [] and r.waiting(namespace="a") == [("a", "web")] and r.waiting(owner="alice") == [("a", "web")]
    clock[0] += 2.0
    assert r.due() == [("a", "web")]
    r.reconcile("a", "web")  # refused again: the next retry waits twice as long, no second Event
    clock[0] += 2.0
    assert r.due() == [] and len(api.events) == 1
    clock[0] += 2.0
    assert r.due() == [("a", "web")]
    del api.refuse_create["web-boot-1"]  # the quota was raised
    plan = r.reconcile("a", "web")
    assert plan is not None and not plan.refused and list(api.pods) == [("a", "web-boot-1")]
    assert api.vms[("a", "web")]["status"]["reason"] == "Starting" and r.waiting(namespace="a") == []
    assert r.metrics.registry.get_sample_value("zjusct_controller_reconcile_errors_total") == 0


def test_an_owner_over_her_cloudquota_is_refused_across_namespaces_and_another_owner_is_not() -> None:
    api = _QuotaApi()
    api.quotas["alice"] = {"metadata": {"name": "alice", "resourceVersion": "9"}, "spec": {"vcpus": 2}}
    api.add_vm("a", "one", vcpus=2)
    api.add_vm("b", "two", vcpus=1)
    api.add_vm("b", "bobs", owner="bob", vcpus=8)
    r = _reconciler(api)
    assert r.reconcile("a", "one") is not None and ("a", "one-boot-1") in api.pods
    plan = r.reconcile("b", "two")
    assert plan is not None and plan.refused == QUOTA_EXCEEDED and ("b", "two-boot-1") not in api.pods
    st = api.vms[("b", "two")]["status"]
    assert st["message"].startswith("vcpus: owner 'alice' would use 3 of quota 2 vCPUs (in use 2, this request 1, "
                                    "asked by vcpus, spec.vcpus of CloudVM b/two)")
    assert "annotations" not in api.claims[("b", "two-root")]["metadata"]  # nothing marked for a refused boot
    assert r.reconcile("b", "bobs") is not None and ("b", "bobs-boot-1") in api.pods  # bob has no CloudQuota
    assert r.waiting(owner="alice") == [("b", "two")]
    one = api.vms[("a", "one")]
    one["spec"]["powerState"] = "Stopped"  # alice stops her first VM: its vCPUs are free
    r.observe("cloudvm", "MODIFIED", api._next(one))
    r.reconcile("b", "two")
    assert ("b", "two-boot-1") in api.pods and api.vms[("b", "two")]["status"]["admittedBootID"] == 1


def test_a_create_whose_answer_was_lost_still_counts_against_the_quota() -> None:
    api = _QuotaApi()
    api.quotas["alice"] = {"metadata": {"name": "alice", "resourceVersion": "9"}, "spec": {"vcpus": 1}}
    api.add_vm("a", "one")
    api.add_vm("a", "two")
    api.lose_create.add("one-boot-1")
    r = _reconciler(api)
    with pytest.raises(TimeoutError):
        r.reconcile("a", "one")  # the Pod was created; neither its answer nor its watch event arrived
    assert r.store.launcher_pods("a", "one") == [] and "status" not in api.vms[("a", "one")]
    plan = r.reconcile("a", "two")
    assert plan is not None and plan.refused == QUOTA_EXCEEDED and ("a", "two-boot-1") not in api.pods


def test_two_boots_of_one_owner_reconciled_at_once_are_never_admitted_on_the_same_count() -> None:
    api = _QuotaApi()
    api.quotas["alice"] = {"metadata": {"name": "alice", "resourceVersion": "9"}, "spec": {"vcpus": 2}}
    names = [f"vm{i}" for i in range(6)]
    for i, name in enumerate(names):
        api.add_vm("ab"[i % 2], name)
    # the claim mark and the create take a while, as round trips do: without the owner's lock every count would be
    # made before any of the others' boots was admitted
    api.mark_delay = api.create_delay = 0.05
    r = _reconciler(api)
    r.relist()
    threads = [threading.Thread(target=r.reconcile, args=("ab"[i % 2], name)) for i, name in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(api.pods) == 2, sorted(api.pods)
    reasons = sorted(api.vms[("ab"[i % 2], n)]["status"]["reason"] for i, n in enumerate(names))
    assert reasons == [QUOTA_EXCEEDED] * 4 + ["Starting"] * 2


def test_a_refused_stop_and_a_refused_status_end_in_a_warning_not_an_exception() -> None:
    api = _QuotaApi()
    api.add_vm("a", "web")
    r = _reconciler(api)
    r.reconcile("a", "web")
    web = api.vms[("a", "web")]
    web["spec"]["powerState"] = "Stopped"
    r.observe("cloudvm", "MODIFIED", api._next(web))
    api.refuse_delete = _refusal(403, json.dumps({"message": "denied by policy no-deletes"}))
    plan = r.reconcile("a", "web")
    assert plan is not None and plan.refused == REFUSED and not api.deleted
    assert (web["status"]["reason"], "denied by policy no-deletes" in web["status"]["message"]) == (REFUSED, True)
    api.refuse_delete = None
    api.refuse_status = [_refusal(422, json.dumps({"message": "status.node: Too long"}))]
    plan = r.reconcile("a", "web")  # the Pod is deleted; its status is refused once, then reason and message go in
    assert plan is not None and plan.refused == REFUSED and api.deleted == ["web-boot-1"]
    assert web["status"]["reason"] == REFUSED and "status.node: Too long" in web["status"]["message"]
    assert api.events[-1]["type"] == "Warning" and api.events[-1]["reason"] == REFUSED
    assert r.metrics.registry.get_sample_value("zjusct_controller_reconcile_errors_total") == 0


def test_without_the_cloudquota_crd_no_owner_has_a_quota() -> None:
    api = _QuotaApi()
    api.add_vm("a", "web")

    def no_crd(_g: str, _v: str, plural: str, **kw: Any) -> Any:
        if plural == "cloudquotas":
            raise ApiException(status=404, reason="Not Found")
        return _QuotaApi.list_cluster_custom_object(api, _g, _v, plural, **kw)

    api.list_cluster_custom_object = no_crd  # type: ignore[method-assign]
    r = _reconciler(api)
    assert r.reconcile("a", "web") is not None and list(api.pods) == [("a", "web-boot-1")]


def test_a_refused_finalizer_blocks_a_start_and_leaves_a_stopped_vm_stopped() -> None:
    api = _QuotaApi()
    api.add_vm("a", "web")
    api.add_vm("a", "off", power="Stopped")
    policy = _refusal(403, json.dumps({"message": "denied by policy no-finalizers"}))

    def refuse_patch(*_: Any, **__: Any) -> Any:
        raise policy

    api.patch_namespaced_custom_object = refuse_patch  # type: ignore[method-assign]
    r = _reconciler(api)
    plan = r.reconcile("a", "web")
    assert plan is not None and plan.refused == REFUSED and not api.pods  # no launcher Pod without the finalizer
    assert (api.vms[("a", "web")]["status"]["phase"], api.vms[("a", "web")]["status"]["reason"]) == ("Blocked",
                                                                                                      REFUSED)
    assert "denied by policy no-finalizers" in api.vms[("a", "web")]["status"]["message"]
    r.reconcile("a", "off")
    assert (api.vms[("a", "off")]["status"]["phase"], api.vms[("a", "off")]["status"]["reason"]) == ("Stopped",
                                                                                                      REFUSED)


def test_a_stopped_vm_keeps_its_vm_and_its_claims_size_against_the_next_vms_first_boot() -> None:
    api = _QuotaApi()
    api.quotas["alice"] = {"metadata": {"name": "alice", "resourceVersion": "9"}, "spec": {"vms": 2, "diskMiB": 1536}}
    api.add_vm("a", "one")
    api.add_vm("b", "two")
    r = _reconciler(api)
    r.reconcile("a", "one")
    one = api.vms[("a", "one")]
    one["spec"]["powerState"] = "Stopped"
    r.observe("cloudvm", "MODIFIED", api._next(one))
    r.reconcile("a", "one")
    r.observe("pod", "DELETED", api.pods.pop(("a", "one-boot-1")))
    r.reconcile("a", "one")
    assert (one["status"]["phase"], one["status"]["admittedBootID"]) == ("Stopped", 1)
    plan = r.reconcile("b", "two")
    assert plan is not None and plan.refused == QUOTA_EXCEEDED, api.vms[("b", "two")]["status"]
    assert api.vms[("b", "two")]["status"]["message"].startswith(
        "disk_mib: owner 'alice' would use 2048 of quota 1536 MiB of disk (in use 1024, this request 1024,")
