"""The controller's watch-fed caches (zjusct_controller.cache): monotonic by resourceVersion, tombstones of
deleted objects, relist, slim non-launcher Pods and the claim index (claim -> Pods mounting it)."""

from __future__ import annotations

from typing import Any

from zjusct_controller.cache import Store, slim_pod

LABEL_VM = "cloud.zjusct.io/vm"


def pod(name: str, rv: int, claim: str | None = "web-root", vm: str | None = None, phase: str = "Running",
        ns: str = "alice", node: str | None = "n1") -> dict[str, Any]:
    labels = {LABEL_VM: vm} if vm else {"app": "x"}
    vols = [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}] if claim else []
    vols.append({"name": "tmp", "emptyDir": {}})
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv), "labels": labels},
            "spec": {"volumes": vols, "nodeName": node, "containers": [{"name": "c", "image": "big" * 100}]},
            "status": {"phase": phase}}


def vm(rv: int, phase: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "web", "namespace": "alice", "resourceVersion": str(rv)},
            "spec": {"rootVolumeClaim": "web-root"}, "status": {"phase": phase} if phase else {}}


def test_an_older_version_never_replaces_a_newer_one_and_own_writes_count() -> None:
    s = Store()
    assert s.apply("cloudvm", "ADDED", vm(10))
    assert s.apply("cloudvm", None, vm(12, "Pending"))  # our own write's response
    assert not s.apply("cloudvm", "MODIFIED", vm(11))  # the watch catching up late
    assert s.get("cloudvm", "alice", "web")["status"] == {"phase": "Pending"}
    assert s.apply("cloudvm", "MODIFIED", vm(13, "Running"))
    assert s.get("cloudvm", "alice", "web")["status"] == {"phase": "Running"}


def test_a_deleted_object_is_not_brought_back_by_a_late_older_event_but_a_recreated_one_is_kept() -> None:
    s = Store()
    s.apply("pod", "ADDED", pod("web-boot-1", 5, vm="web"))
    assert s.apply("pod", "DELETED", pod("web-boot-1", 7, vm="web"))
    assert not s.apply("pod", "MODIFIED", pod("web-boot-1", 6, vm="web"))
    assert s.launcher_pods("alice", "web") == [] and s.claim_users("alice", "web-root") == []
    assert s.apply("pod", "ADDED", pod("web-boot-1", 9, vm="web"))  # the same name created again
    assert not s.apply("pod", "DELETED", pod("web-boot-1", 7, vm="web"))  # the old object's delete, replayed
    assert [p["metadata"]["resourceVersion"] for p in s.launcher_pods("alice", "web")] == ["9"]


def test_claim_index_names_the_pods_mounting_a_claim_that_have_not_ended_except_the_vms_own_launchers() -> None:
    s = Store()
    s.apply("pod", None, pod("web-boot-1", 1, vm="web"))
    s.apply("pod", None, pod("backup", 2))
    s.apply("pod", None, pod("done", 3, phase="Succeeded"))
    s.apply("pod", None, pod("elsewhere", 4, ns="bob"))
    s.apply("pod", None, pod("other-claim", 5, claim="db-root"))
    assert s.claim_users("alice", "web-root") == ["backup", "web-boot-1"]
    assert s.claim_users("alice", "web-root", except_vm="web") == ["backup"]
    s.apply("pod", "MODIFIED", pod("backup", 6, phase="Failed"))
    assert s.claim_users("alice", "web-root", except_vm="web") == []
    s.apply("pod", "MODIFIED", pod("other-claim", 7, claim="web-root"))  # volumes differ: re-indexed
    assert s.claim_users("alice", "db-root") == [] and "other-claim" in s.claim_users("alice", "web-root")
    s.apply("pod", "DELETED", pod("other-claim", 8, claim="web-root"))
    assert s.claim_users("alice", "web-root", except_vm="web") == []


def test_non_launcher_pods_are_kept_slim_launcher_pods_whole() -> None:
    s = Store()
    s.apply("pod", None, pod("backup", 2))
    s.apply("pod", None, pod("web-boot-1", 1, vm="web"))
    slim = s.get("pod", "alice", "backup")
    assert slim == slim_pod(pod("backup", 2)) and "containers" not in slim["spec"]
    assert slim["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "web-root"
    assert s.get("pod", "alice", "web-boot-1")["spec"]["containers"]


def test_relist_drops_what_the_list_no_longer_has_but_keeps_newer_objects_and_other_namespaces() -> None:
    s = Store()
    assert not s.primed("pod")
    s.apply("pod", "ADDED", pod("gone", 3, vm="web"))  # its DELETED event was missed
    s.apply("pod", "ADDED", pod("new", 20, vm="web"))  # created after the list was taken
    s.apply("pod", "ADDED", pod("theirs", 4, ns="bob"))
    s.replace("pod", [pod("kept", 5, vm="web")], "10", namespaces=["alice"])
    assert s.primed("pod")
    assert [p["metadata"]["name"] for p in s.launcher_pods("alice", "web")] == ["kept", "new"]
    assert s.get("pod", "bob", "theirs") is not None
    assert s.launchers_on_node("n1") == [("alice", "web")]


def test_nodes_are_cluster_scoped_and_forget_drops_one_object() -> None:
    s = Store()
    s.apply("node", None, {"metadata": {"name": "n1", "resourceVersion": "1"}})
    assert s.get("node", "", "n1") is not None
    s.forget("node", "", "n1")
    assert s.get("node", "", "n1") is None and s.sizes()["node"] == 0
