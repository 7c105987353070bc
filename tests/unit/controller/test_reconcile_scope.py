"""The Kubernetes adapter (zjusct_controller.reconcile) against a stub API: it reads the watch-fed caches, not the
API server, per reconcile; writes go back into the caches; a stale cache meets 409 Conflict and is refreshed; a
controller started with ``--namespace`` acts only there. The real API path is tests/integration/k8s_node."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from zjusct_controller import reconcile
from zjusct_controller.config import Config
from zjusct_controller.decide import FINALIZER
from zjusct_controller.reconcile import Reconciler
from zjusct_controller.volume import CLAIMED_BY

CFG = Config(launcher_image="x", image_dir="/x", cmdline="c")
UID = "0b7c1f4e-0000-4000-8000-000000000001"


def _resp(doc: dict) -> Any:
    return SimpleNamespace(data=json.dumps(doc).encode())


class _Api:
    """CustomObjectsApi and CoreV1Api in one stub: a dict of objects, a resourceVersion counter, a call log."""

    def __init__(self, namespaces: tuple[str, ...] = ("alice",)) -> None:
        self.rv = 100
        self.unread = 0  # responses whose body nobody read (their connection would not return to the pool)
        self.calls: list[str] = []
        self.vms = {(ns, "web"): {"metadata": {"name": "web", "namespace": ns, "uid": UID, "generation": 1,
                                               "resourceVersion": "1"},
                                  "spec": {"owner": "alice", "rootVolumeClaim": "web-root", "powerState": "Running",
                                           "bootID": 1}} for ns in namespaces}
        self.claims = {(ns, "web-root"): {"metadata": {"name": "web-root", "namespace": ns, "resourceVersion": "2"},
                                          "status": {"phase": "Bound"}} for ns in namespaces}
        self.pods: dict[tuple[str, str], dict] = {}
        self.quotas: dict[str, dict] = {}  # CloudQuotas by owner

    def _next(self, obj: dict) -> dict:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return obj

    @staticmethod
    def _list(objs: Any) -> Any:
        return _resp({"metadata": {"resourceVersion": "50"}, "items": list(objs)})

    # lists (relist)
    def list_node(self, **_: Any) -> Any:
        self.calls.append("LIST nodes")
        return self._list([{"metadata": {"name": "n1", "resourceVersion": "3"},
                            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}])

    def list_cluster_custom_object(self, _g: str, _v: str, plural: str, **__: Any) -> Any:
        self.calls.append(f"LIST {plural}")
        return self._list(self.quotas.values() if plural == "cloudquotas" else self.vms.values())

    def list_namespaced_custom_object(self, _g: str, _v: str, ns: str, _p: str, **__: Any) -> Any:
        self.calls.append("LIST cloudvms")
        return self._list(v for k, v in self.vms.items() if k[0] == ns)

    def list_pod_for_all_namespaces(self, **_: Any) -> Any:
        self.calls.append("LIST pods")
        return self._list(self.pods.values())

    def list_namespaced_pod(self, ns: str, **_: Any) -> Any:
        self.calls.append("LIST pods")
        return self._list(v for k, v in self.pods.items() if k[0] == ns)

    def list_persistent_volume_claim_for_all_namespaces(self, **_: Any) -> Any:
        self.calls.append("LIST claims")
        return self._list(self.claims.values())

    def list_namespaced_persistent_volume_claim(self, ns: str, **_: Any) -> Any:
        self.calls.append("LIST claims")
        return self._list(v for k, v in self.claims.items() if k[0] == ns)

    # reads and writes
    def get_namespaced_custom_object(self, _g: str, _v: str, ns: str, _p: str, name: str, **_: Any) -> Any:
        self.calls.append("GET cloudvm")
        return _resp(self.vms[(ns, name)])

    def patch_namespaced_custom_object(self, _g: str, _v: str, ns: str, _p: str, name: str, body: dict,
                                       **_: Any) -> Any:
        self.calls.append("PATCH cloudvm")
        if (ns, name) not in self.vms:
            raise ApiException(status=404, reason="Not Found")
        vm = self.vms[(ns, name)]
        if body["metadata"].get("resourceVersion") != vm["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        vm["metadata"]["finalizers"] = body["metadata"]["finalizers"]
        return _resp(self._next(vm))

    def patch_namespaced_custom_object_status(self, _g: str, _v: str, ns: str, _p: str, name: str, body: dict,
                                              **_: Any) -> Any:
        self.calls.append("PATCH cloudvm/status")
        vm = self.vms[(ns, name)]
        vm["status"] = {k: v for k, v in {**(vm.get("status") or {}), **body["status"]}.items() if v is not None}
        return _resp(self._next(vm))

    def patch_namespaced_persistent_volume_claim(self, name: str, ns: str, body: dict, **_: Any) -> Any:
        self.calls.append("PATCH claim")
        claim = self.claims[(ns, name)]
        if body["metadata"]["resourceVersion"] != claim["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        claim["metadata"]["annotations"] = body["metadata"]["annotations"]
        return _resp(self._next(claim))

    def read_namespaced_persistent_volume_claim(self, name: str, ns: str, **_: Any) -> Any:
        self.calls.append("GET claim")
        return _resp(self.claims[(ns, name)])

    def create_namespaced_pod(self, ns: str, body: dict, **_: Any) -> Any:
        self.calls.append("POST pod")
        key = (ns, body["metadata"]["name"])
        if key in self.pods:
            raise ApiException(status=409, reason="AlreadyExists")
        self.pods[key] = self._next(json.loads(json.dumps(body)))
        return _resp(self.pods[key])

    def create_namespaced_event(self, *_: Any, **__: Any) -> Any:
        self.calls.append("POST event")
        return _Unread(self, b"{}")


class _Unread:
    """A ``_preload_content=False`` response: counts whether its body was read (which releases the connection)."""

    def __init__(self, api: _Api, body: bytes) -> None:
        self.api, self.body = api, body
        api.unread += 1

    @property
    def data(self) -> bytes:
        self.api.unread -= 1
        return self.body


def _reconciler(api: _Api, namespaces: tuple[str, ...] = ()) -> Reconciler:
    r = Reconciler(client.ApiClient(), CFG, namespaces=namespaces)
    r.custom = r.core = api
    return r


def test_first_reconcile_lists_once_then_reads_only_caches_five_writes_the_binding_none_the_start_one() -> None:
    api = _Api()
    r = _reconciler(api)
    plan = r.reconcile("alice", "web")
    assert plan is not None and plan.create_pod is not None
    assert api.calls == ["LIST nodes", "LIST cloudquotas", "LIST cloudvms", "LIST pods", "LIST claims", "PATCH cloudvm",
                         "PATCH claim", "POST pod", "PATCH cloudvm/status", "POST event"]
    assert api.vms[("alice", "web")]["metadata"]["finalizers"] == [FINALIZER]
    assert api.unread == 0  # the Event's answer was read to the end too
    assert api.claims[("alice", "web-root")]["metadata"]["annotations"] == {CLAIMED_BY: UID}
    assert list(api.pods) == [("alice", "web-boot-1")]
    api.calls.clear()
    bound = api.pods[("alice", "web-boot-1")]
    bound["spec"]["nodeName"] = "n1"  # the scheduler's binding, as the Pod watch shows it
    assert r.observe("pod", "MODIFIED", api._next(bound))
    plan = r.reconcile("alice", "web")  # bound, not started: the create's status stands, no request
    assert plan is not None and plan.create_pod is None
    assert api.calls == []
    assert "node" not in api.vms[("alice", "web")]["status"]
    started = api.pods[("alice", "web-boot-1")] = json.loads(json.dumps(bound))  # a new object, as a watch gives
    started["status"] = {"phase": "Running", "containerStatuses": [
        {"name": "launcher", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
    assert r.observe("pod", "MODIFIED", api._next(started))
    r.reconcile("alice", "web")  # the container runs: one status write with the node, nothing read
    assert api.calls == ["PATCH cloudvm/status", "POST event"]
    assert api.vms[("alice", "web")]["status"]["node"] == "n1"
    assert api.vms[("alice", "web")]["status"]["reason"] == "WaitingForSSH"
    api.calls.clear()
    r.reconcile("alice", "web")  # the caches hold every write's response: nothing to do, no request
    assert api.calls == []


def test_a_stale_cached_cloudvm_meets_409_conflict_is_read_fresh_and_the_reconcile_goes_on() -> None:
    api = _Api()
    r = _reconciler(api)
    r.relist()
    api.vms[("alice", "web")]["metadata"]["resourceVersion"] = "77"  # changed behind the cache
    api.calls.clear()
    plan = r.reconcile("alice", "web")
    assert plan is not None
    assert api.calls[:3] == ["PATCH cloudvm", "GET cloudvm", "PATCH cloudvm"]
    assert list(api.pods) == [("alice", "web-boot-1")]


def test_a_cloudvm_deleted_since_the_cache_saw_it_ends_the_reconcile_quietly() -> None:
    api = _Api()
    r = _reconciler(api)
    r.relist()
    del api.vms[("alice", "web")]
    assert r.reconcile("alice", "web") is None
    assert r.store.get("cloudvm", "alice", "web") is None and not api.pods
    assert r.metrics.registry.get_sample_value("zjusct_controller_reconcile_errors_total") == 0


def test_a_pod_mounting_the_claim_in_the_index_blocks_the_create_without_any_pod_list() -> None:
    api = _Api()
    api.pods[("alice", "backup")] = {"metadata": {"name": "backup", "namespace": "alice", "resourceVersion": "3"},
                                     "spec": {"volumes": [{"name": "v",
                                                           "persistentVolumeClaim": {"claimName": "web-root"}}]},
                                     "status": {"phase": "Running"}}
    r = _reconciler(api)
    r.relist()
    api.calls.clear()
    plan = r.reconcile("alice", "web")
    assert plan is not None and plan.create_pod is None
    assert plan.status is not None and (plan.status["phase"], plan.status["reason"]) == ("Blocked", "VolumeInUse")
    assert "backup" in plan.status["message"]
    assert not any(c.startswith(("LIST", "GET")) for c in api.calls)
    r.observe("pod", "DELETED", api.pods.pop(("alice", "backup")))  # the watch shows it gone
    plan = r.reconcile("alice", "web")
    assert plan is not None and plan.create_pod is not None and list(api.pods) == [("alice", "web-boot-1")]


def test_a_reconcile_decides_once_and_looks_up_the_claim_users_only_before_a_create(monkeypatch: Any) -> None:
    api = _Api()
    api.pods[("alice", "backup")] = {"metadata": {"name": "backup", "namespace": "alice", "resourceVersion": "3"},
                                     "spec": {"volumes": [{"name": "v",
                                                           "persistentVolumeClaim": {"claimName": "web-root"}}]},
                                     "status": {"phase": "Running"}}
    r = _reconciler(api)
    r.relist()
    decided: list[str] = []
    looked_up: list[str] = []

    def counted_decide(*args: Any, **kwargs: Any) -> Any:
        decided.append(args[0]["metadata"]["name"])
        return real_decide(*args, **kwargs)

    def counted_users(*args: Any, **kwargs: Any) -> list[str]:
        looked_up.append(args[1])
        return real_users(*args, **kwargs)

    real_decide, real_users = reconcile.decide, r.store.claim_users
    monkeypatch.setattr(reconcile, "decide", counted_decide)
    monkeypatch.setattr(r.store, "claim_users", counted_users)
    plan = r.reconcile("alice", "web")  # the backup Pod blocks the create
    assert plan is not None and plan.create_pod is None and (decided, looked_up) == (["web"], ["web-root"])
    r.observe("pod", "DELETED", api.pods.pop(("alice", "backup")))
    plan = r.reconcile("alice", "web")  # nothing blocks it now: created
    assert plan is not None and plan.create_pod is not None and (len(decided), len(looked_up)) == (2, 2)
    plan = r.reconcile("alice", "web")  # the boot's Pod exists: no create, so no lookup
    assert plan is not None and plan.create_pod is None and (len(decided), len(looked_up)) == (3, 2)


def test_namespaced_controller_resyncs_and_fans_out_only_its_namespaces() -> None:
    api = _Api(("a", "b"))
    for ns in ("a", "b"):
        api.pods[(ns, "web-boot-1")] = {"metadata": {"name": "web-boot-1", "namespace": ns, "resourceVersion": "4",
                                                     "labels": {"cloud.zjusct.io/vm": "web"}},
                                        "spec": {"nodeName": "n1"}, "status": {}}
    assert _reconciler(api, ("a",)).all_vms() == [("a", "web")]
    assert _reconciler(api, ("a",)).vms_on_node("n1") == [("a", "web")]
    assert _reconciler(api).all_vms() == [("a", "web"), ("b", "web")]
    r = _reconciler(api, ("a",))
    assert not r.observe("cloudvm", "ADDED", api.vms[("b", "web")])  # another namespace's event is ignored


def test_every_request_of_the_reconciler_client_is_counted_by_method() -> None:
    api = client.ApiClient()
    sent: list[str] = []
    api.call_api = lambda method, *a, **k: sent.append(method)  # type: ignore[method-assign]
    r = Reconciler(api, CFG)
    api.call_api("GET", "/api/v1/pods")
    api.call_api("PATCH", "/apis/x")
    assert sent == ["GET", "PATCH"]
    get = r.metrics.registry.get_sample_value
    assert get("zjusct_controller_api_requests_total", {"method": "GET"}) == 1
    assert get("zjusct_controller_api_requests_total", {"method": "PATCH"}) == 1
