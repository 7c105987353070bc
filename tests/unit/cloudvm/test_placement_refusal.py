"""A start the host's capacity cannot hold (plugins/module_utils/host/reconciler.py ``HostReconciler.start_boot``), with
a real SQLite host store: refused naming the dimension, nothing allocated, and the ``InsufficientCapacity`` Warning is
in the store's events (it used to be written inside the transaction the refusal rolled back)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.reconciler import HostReconciler, group_peers
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError
from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import with_defaults


def test_a_start_beyond_capacity_is_refused_allocates_nothing_and_records_why(tmp_path: Path) -> None:
    cfg = HostConfig(physical={"cpu": 1, "memory": 1024, "disk": 10240}, volumes_dir=str(tmp_path))
    root = tmp_path / "bob-root.raw"
    root.write_bytes(b"\0" * 4096)
    with HostStore(str(tmp_path / "cloud.db")) as store:
        store.put_volume({"name": "bob-root", "driver": "file", "location": str(root), "size_mib": 1,
                          "owner": "bob", "claimed_by": None})
        vm = store.create_vm("default", "bob", with_defaults({"owner": "bob", "rootVolumeClaim": "bob-root",
                                                              "vcpus": 8, "powerState": "Running", "bootID": 1}))
        with pytest.raises(CloudVMError) as refused:
            HostReconciler.from_config(cfg, store).start_boot(vm)  # 8 vCPUs on 1 CPU x 4.0 overcommit
        assert refused.value.details["dimension"] == "cpu"
        assert store.allocations(cfg.node) == [] and store.lease_for(vm["metadata"]["uid"]) is None
        assert store.get_volume("bob-root")["claimed_by"] is None
        (event,) = [e for e in store.events("default/bob") if e["reason"] == "InsufficientCapacity"]
        assert event["kind"] == "Warning" and str(refused.value) in event["message"]


def test_a_second_running_vm_of_an_owners_anti_affinity_group_is_unschedulable_on_the_one_host(tmp_path: Path) -> None:
    cfg = HostConfig(physical={"cpu": 8, "memory": 8192, "disk": 10240}, volumes_dir=str(tmp_path))
    with HostStore(str(tmp_path / "cloud.db")) as store:
        def vm(owner: str, name: str, group: str | None) -> dict:
            root = tmp_path / f"{name}-root.raw"
            root.write_bytes(b"\0" * 4096)
            store.put_volume({"name": f"{name}-root", "driver": "file", "location": str(root), "size_mib": 1,
                              "owner": owner, "claimed_by": None})
            spec = {"owner": owner, "rootVolumeClaim": f"{name}-root", "powerState": "Running", "bootID": 1}
            if group:
                spec["antiAffinityGroup"] = group
            return store.create_vm("default", name, with_defaults(spec))

        first = vm("alice", "web-1", "web")
        store.put_allocation({"vm_uid": first["metadata"]["uid"], "node": cfg.node, "vcpus": 1, "memory_mib": 512,
                              "disk_mib": 1, "bandwidth_mbps": 0})  # web-1's launcher runs
        second = vm("alice", "web-2", "web")
        with pytest.raises(CloudVMError) as refused:
            HostReconciler.from_config(cfg, store).start_boot(second)
        details = refused.value.details
        assert (details["reason"], details["rule"]) == ("Unschedulable", "antiAffinityGroup")
        assert "spec.antiAffinityGroup: 'web'" in str(refused.value) and "default/web-1" in str(refused.value)
        assert [a["vm_uid"] for a in store.allocations(cfg.node)] == [first["metadata"]["uid"]]
        assert store.get_volume("web-2-root")["claimed_by"] is None
        (event,) = [e for e in store.events("default/web-2") if e["reason"] == "AntiAffinity"]
        assert event["kind"] == "Warning"
        # another owner's group of the same name, and the owner's VMs outside the group, are not constrained
        placed = {first["metadata"]["uid"]}
        assert group_peers(store, vm("bob", "api", "web")["spec"], placed) == []
        assert group_peers(store, vm("alice", "db", None)["spec"], placed) == []
        assert group_peers(store, vm("alice", "cache", "cache")["spec"], placed) == []
        # once web-1 no longer runs (its allocation released), web-2 may run here
        store.delete_allocation(first["metadata"]["uid"])
        assert group_peers(store, second["spec"], set()) == []
