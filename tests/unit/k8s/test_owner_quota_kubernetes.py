"""owner_quota's Kubernetes body (k8s.quota) over an in-memory CloudQuota store: exactly the limits given, a
truthful ``changed``, check mode as a dry run, the usage counted as the controller counts it, and the dispatch by
``backend``. Against the real API server: tests/integration/cloudvm_k8s/test_controller_quota.py."""

from __future__ import annotations

import copy
from typing import Any, Optional

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils import owner_quota_module
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s import quota as k8s_quota
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import DNS_LABEL_RULE


class FakeQuotaApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.writes: list[tuple[str, bool]] = []
        self.vms: list[dict] = []
        self.claims: dict[tuple[str, str], dict] = {}
        self.rv = 0

    def get(self, owner: str) -> Optional[dict]:
        return copy.deepcopy(self.objects.get(owner))

    def write(self, body: dict, existing: Optional[dict], dry_run: bool) -> dict:
        self.writes.append(("create" if existing is None else "replace", dry_run))
        if existing is not None and body["metadata"]["resourceVersion"] != self.objects[body["metadata"]["name"]][
                "metadata"]["resourceVersion"]:
            raise k8s_quota.Conflict("changed")
        self.rv += 1
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if not dry_run:
            self.objects[body["metadata"]["name"]] = obj
        return obj

    def delete(self, owner: str, dry_run: bool) -> None:
        self.writes.append(("delete", dry_run))
        if not dry_run:
            del self.objects[owner]

    def owner_vms(self, owner: str) -> list:
        return [v for v in self.vms if v["spec"]["owner"] == owner]

    def claim(self, namespace: str, name: str) -> Optional[dict]:
        return self.claims.get((namespace, name))


def params(**kw: Any) -> dict:
    out: dict[str, Any] = {"owner": "alice", "state": "present", "vms": None, "vcpus": None, "memory_mib": None,
                           "disk_mib": None, "bandwidth_mbps": None, "actor": "operator"}
    out.update(kw)
    return out


def test_first_run_creates_second_changes_nothing_and_check_mode_writes_as_a_dry_run() -> None:
    api = FakeQuotaApi()
    predicted = k8s_quota.set_quota(params(vcpus=4, memory_mib=4096), True, True, api)
    assert predicted["changed"] is True and api.objects == {} and api.writes == [("create", True)]
    assert predicted["diff"] == {"before": {}, "after": {"vms": None, "vcpus": 4, "memory_mib": 4096,
                                                          "disk_mib": None, "bandwidth_mbps": None}}
    first = k8s_quota.set_quota(params(vcpus=4, memory_mib=4096), False, False, api)
    assert first["changed"] is True and api.objects["alice"]["spec"] == {"vcpus": 4, "memoryMiB": 4096}
    assert api.objects["alice"]["kind"] == "CloudQuota" and api.objects["alice"]["metadata"]["name"] == "alice"
    second = k8s_quota.set_quota(params(vcpus=4, memory_mib=4096), False, False, api)
    assert second["changed"] is False and len(api.writes) == 2
    assert second["quota"] == {"vms": None, "vcpus": 4, "memory_mib": 4096, "disk_mib": None, "bandwidth_mbps": None}
    third = k8s_quota.set_quota(params(vcpus=2), False, False, api)  # the quota holds exactly what the task says
    assert third["changed"] is True and api.objects["alice"]["spec"] == {"vcpus": 2}
    gone = k8s_quota.set_quota(params(state="absent"), False, False, api)
    assert gone["changed"] is True and gone["quota"] is None and "alice" not in api.objects
    assert k8s_quota.set_quota(params(state="absent"), False, False, api)["changed"] is False


def test_a_concurrent_writer_makes_the_replace_read_again() -> None:
    api = FakeQuotaApi()
    k8s_quota.set_quota(params(vcpus=4), False, False, api)
    real_get = api.get
    calls = {"n": 0}

    def racing_get(owner: str) -> Optional[dict]:
        got = real_get(owner)
        calls["n"] += 1
        if calls["n"] == 1:  # someone else writes between this read and our replace
            api.objects["alice"]["metadata"]["resourceVersion"] = "99"
        return got

    api.get = racing_get  # type: ignore[method-assign]
    assert k8s_quota.set_quota(params(vcpus=8), False, False, api)["changed"] is True
    assert api.objects["alice"]["spec"] == {"vcpus": 8} and calls["n"] == 2


def test_usage_is_counted_as_the_controller_counts_and_lowering_below_it_warns() -> None:
    api = FakeQuotaApi()
    api.vms = [
        {"metadata": {"namespace": "a", "name": "one"}, "spec": {"owner": "alice", "powerState": "Running",
                                                              "bootID": 2, "vcpus": 2, "memoryMiB": 1024,
                                                              "rootVolumeClaim": "one-root"},
         "status": {"admittedBootID": 2}},
        {"metadata": {"namespace": "b", "name": "two"}, "spec": {"owner": "alice", "powerState": "Running",
                                                              "bootID": 1, "vcpus": 8, "rootVolumeClaim": "two-root"},
         "status": {"phase": "Blocked", "reason": "QuotaExceeded", "bootID": 1}},  # never admitted: nothing
    ]
    api.claims[("a", "one-root")] = {"status": {"capacity": {"storage": "2Gi"}}}
    out = k8s_quota.set_quota(params(vcpus=1), False, False, api)
    assert out["usage"] == {"vms": 1, "vcpus": 2, "memory_mib": 1024, "disk_mib": 2048, "bandwidth_mbps": 0}
    assert out["warnings"] == ["vcpus: owner 'alice' already uses 2 of the quota 1 vCPUs; nothing is stopped, growth"
                               " is refused until the usage is below the quota"]


@pytest.mark.parametrize("change, message", [
    ({"vcpus": -1}, "vcpus: -1 is not an integer >= 0 (omit it for no limit on vCPUs) (CloudQuota spec.vcpus)"),
    ({"memory_mib": True}, "(CloudQuota spec.memoryMiB)"),
    ({"owner": "Alice"}, f"owner: 'Alice' is not a DNS label ({DNS_LABEL_RULE}); the CloudVM spec.owner rule; it"
                         " names the CloudQuota"),
])
def test_bad_input_names_the_option_and_the_cloudquota_field_before_anything_is_written(change: dict,
                                                                                         message: str) -> None:
    api = FakeQuotaApi()
    with pytest.raises(k8s_quota.QuotaError) as err:
        k8s_quota.set_quota(params(**change), False, False, api)
    assert message in str(err.value) and api.writes == []


def test_the_backend_option_chooses_the_host_store_or_the_cloudquota(tmp_path: Any, monkeypatch: Any) -> None:
    seen: list[str] = []
    monkeypatch.setattr(k8s_quota, "ensure_quota", lambda p, c, d: seen.append("kubernetes") or {"changed": False})
    assert owner_quota_module.run_owner_quota(params(backend="kubernetes", vcpus=1), False, False) == {"changed": False}
    assert seen == ["kubernetes"]
    cfg = tmp_path / "host.json"
    cfg.write_text('{"store_path": "%s"}' % (tmp_path / "store.db"))
    got = owner_quota_module.run_owner_quota(params(backend="host", vcpus=1, host_config=str(cfg)), True, False)
    assert got["changed"] is True and seen == ["kubernetes"]  # the host store's body answered
    assert "owner" in owner_quota_module.owner_quota_argument_spec() and "kubeconfig" in \
        owner_quota_module.owner_quota_argument_spec()
