"""A start the host's capacity cannot hold (plugins/module_utils/host/reconciler.py ``HostReconciler.start_boot``), with
a real SQLite host store: refused naming the dimension, nothing allocated, and the ``InsufficientCapacity`` Warning is
in the store's events (it used to be written inside the transaction the refusal rolled back)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.reconciler import HostReconciler
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
