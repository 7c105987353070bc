"""The Kubernetes source checks a status that says Running against its launcher Pod: the pure parts
(``_inventory.pod_namespaces``, ``_inventory.launcher_checked``, the Pod list of ``_kube_list``) and the plugin's
listing (``InventoryModule._list_kubernetes``) over a fake API server that answers CloudVM and Pod lists by path.

The statuses are what the controller writes (``status.pod`` names the boot's launcher Pod); a Pod the node
lifecycle controller marked not Ready has ``Ready=False`` (``MarkPodsNotReady``).
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
from ansible_collections.zjusct.cloud.plugins.inventory.cloudvm import InventoryModule
from ansible_collections.zjusct.cloud.plugins.module_utils.model.launcher_pod import LAUNCHER_SELECTOR, slim
from ansible_collections.zjusct.cloud.plugins.plugin_utils import _inventory as inv
from ansible_collections.zjusct.cloud.plugins.plugin_utils import _kube_list as kube


def cloudvm(name: str, namespace: str = "tenant-alice", phase: str = "Running", pod: Optional[str] = "") -> dict:
    status: dict[str, Any] = {"phase": phase, "reason": "SSHReady" if phase == "Running" else phase, "bootID": 3,
                              "node": "node-2", "sshEndpoint": {"host": "10.244.1.7", "port": 22}}
    if pod is not None:
        status["pod"] = pod or f"{name}-boot-3"
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"u-{name}", "labels": {}},
            "spec": {"owner": "alice", "vcpus": 1, "memoryMiB": 512, "bootID": 3}, "status": status}


def launcher(vm: str, namespace: str = "tenant-alice", ready: str = "True", node: str = "node-2") -> dict:
    return {"metadata": {"name": f"{vm}-boot-3", "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "zjusct-launcher", "cloud.zjusct.io/vm": vm},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": node, "containers": [{"name": "launcher"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": "2026-12-06T20:35:10Z"}]}}


def opts(**overrides: Any) -> inv.InventoryOptions:
    defaults: dict[str, Any] = {"source": "kubernetes", "include_phases": ["Running"],
                                "group_by": ["owner", "namespace", "node"], "use_proxy_command": True}
    defaults.update(overrides)
    return inv.InventoryOptions.from_options(defaults.get)


# --------------------------------------------------------------------------- pure parts


def test_pods_are_listed_only_where_a_status_says_running_with_a_pod() -> None:
    items = [cloudvm("a"), cloudvm("b", "tenant-bob", phase="Stopped"), cloudvm("c", "tenant-carol", pod=None)]
    assert inv.pod_namespaces(items, ["tenant-alice", "tenant-bob", "tenant-carol"]) == ["tenant-alice"]
    assert inv.pod_namespaces(items, []) == [], "CloudVMs listed cluster-wide: one cluster-wide Pod list"
    assert inv.pod_namespaces(items[1:], []) is None, "nothing says Running: no Pod list at all"


def test_a_running_vm_whose_pod_is_not_ready_or_gone_becomes_unknown_with_a_warning_naming_it() -> None:
    items = [cloudvm("up"), cloudvm("lost"), cloudvm("gone"), cloudvm("off", phase="Stopped")]
    pods = {("tenant-alice", "up-boot-3"): launcher("up"),
            ("tenant-alice", "lost-boot-3"): launcher("lost", ready="False")}
    records, warnings = inv.launcher_checked(items, pods)
    assert [(r["name"], r["phase"], r["reason"]) for r in records] == [
        ("up", "Running", "SSHReady"), ("lost", "Unknown", "LauncherPodNotReady"),
        ("gone", "Unknown", "LauncherPodGone"), ("off", "Stopped", "Stopped")]
    assert len(warnings) == 2
    assert warnings[0].startswith("CloudVM tenant-alice/lost: status says Running but launcher Pod lost-boot-3 is "
                                  "not Ready (Ready=False, since 2026-12-06T20:35:10Z) on node node-2")
    assert warnings[0].endswith("; listed with phase Unknown, not Running")
    assert warnings[1].startswith("CloudVM tenant-alice/gone: status says Running but launcher Pod "
                                  "tenant-alice/gone-boot-3 is gone")
    selected = inv.select(records, opts())
    assert [r["name"] for r in selected] == ["up"], "the default include_phases [Running] leaves them out"
    assert [r["name"] for r in inv.select(records, opts(include_phases=["Unknown"]))] == ["gone", "lost"]


def test_without_the_pods_the_statuses_are_taken_as_written() -> None:
    items = [cloudvm("lost")]
    records, warnings = inv.launcher_checked(items, None)
    assert records == [inv.vm_record(items[0])] and warnings == []


def test_pod_list_pages_reduce_each_pod_and_a_403_carries_its_status() -> None:
    pods = [launcher(f"vm{i}") for i in range(7)]
    calls: list[tuple[str, dict]] = []

    def get_json(path: str, query: dict) -> dict:
        calls.append((path, dict(query)))
        start = int(query.get("continue", "0"))
        page, more = pods[start:start + 3], start + 3 < len(pods)
        return {"items": page, "metadata": {"continue": str(start + 3) if more else ""}}

    got, requests = kube.list_objects(get_json, ["tenant-alice"], LAUNCHER_SELECTOR, page_size=3,
                                      path=kube.pod_list_path, keep=slim)
    assert requests == 3 and len(got) == 7 and all("managedFields" not in p["metadata"] for p in got)
    assert {p for p, _ in calls} == {"/api/v1/namespaces/tenant-alice/pods"}
    assert calls[0][1] == {"limit": "3", "labelSelector": "app.kubernetes.io/name=zjusct-launcher"}
    assert kube.pod_list_path(None) == "/api/v1/pods"
    err = kube.http_error(403, "pods is forbidden", "https://k", "/api/v1/namespaces/tenant-alice/pods")
    assert err.status == 403 and str(err).startswith("listing launcher Pods at https://k/api/v1/namespaces/")
    assert kube.http_error(403, "no", "https://k", kube.list_path("x")).status == 403


# --------------------------------------------------------------------------- the plugin's listing


class FakeApiServer:
    """Answers the CloudVM list and the Pod list by path; ``forbid_pods``: the Pod list is refused with 403."""

    def __init__(self, vms: list[dict], pods: list[dict], forbid_pods: bool = False) -> None:
        self.vms, self.pods, self.forbid_pods = vms, pods, forbid_pods
        self.paths: list[str] = []

    def __call__(self, path: str, query: dict) -> dict:
        self.paths.append(path)
        if path.endswith("/pods"):
            if self.forbid_pods:
                raise kube.http_error(403, 'pods is forbidden: User "alice" cannot list resource "pods"',
                                      "https://k", path)
            assert query.get("labelSelector") == LAUNCHER_SELECTOR
            return {"items": self.pods, "metadata": {}}
        return {"items": self.vms, "metadata": {}}


class FakeDisplay:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, msg: str) -> None:
        self.warnings.append(msg)

    def vvv(self, msg: str) -> None:
        pass


def list_kubernetes(monkeypatch: pytest.MonkeyPatch, server: FakeApiServer,
                    namespaces: list[str]) -> tuple[list[dict], list[str]]:
    plugin = InventoryModule()
    options: dict[str, Any] = {name: None for name in kube.AUTH_OPTIONS}
    options.update(request_timeout=30, page_size=500)
    monkeypatch.setattr(plugin, "get_option", options.__getitem__)
    display = FakeDisplay()
    monkeypatch.setattr(plugin, "display", display)
    monkeypatch.setattr(kube, "http_get_json", lambda conn, timeout: server)
    records = plugin._list_kubernetes(opts(namespaces=namespaces), kube.Connection(server="https://k"))
    return records, display.warnings


def test_the_plugin_lists_pods_once_per_namespace_and_flags_a_running_vm_whose_pod_is_not_ready(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeApiServer([cloudvm("up"), cloudvm("lost")], [launcher("up"), launcher("lost", ready="False")])
    records, warnings = list_kubernetes(monkeypatch, server, ["tenant-alice"])
    assert {r["name"]: r["phase"] for r in records} == {"up": "Running", "lost": "Unknown"}
    assert server.paths == [kube.list_path("tenant-alice"), "/api/v1/namespaces/tenant-alice/pods"]
    (warning,) = warnings
    assert warning.startswith("CloudVM tenant-alice/lost: status says Running but launcher Pod lost-boot-3 is not "
                              "Ready")
    entries, _ = inv.host_entries(inv.select(records, opts()), opts())
    assert [e.name for e in entries] == ["up.tenant-alice"]


def test_the_plugin_keeps_the_statuses_and_warns_once_when_pods_may_not_be_listed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeApiServer([cloudvm("up"), cloudvm("lost")], [], forbid_pods=True)
    records, warnings = list_kubernetes(monkeypatch, server, [])
    assert {r["name"]: r["phase"] for r in records} == {"up": "Running", "lost": "Running"}
    assert server.paths == [kube.list_path(None), "/api/v1/pods"], "cluster-wide CloudVMs: one cluster-wide Pod list"
    (warning,) = warnings
    assert "the launcher Pods could not be listed" in warning and "(HTTP 403)" in warning


def test_the_plugin_lists_no_pods_when_no_status_says_running(monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeApiServer([cloudvm("off", phase="Stopped"), cloudvm("played", pod=None)], [])
    records, warnings = list_kubernetes(monkeypatch, server, ["tenant-alice"])
    assert server.paths == [kube.list_path("tenant-alice")] and warnings == []
    assert {r["name"]: r["phase"] for r in records} == {"off": "Stopped", "played": "Running"}
