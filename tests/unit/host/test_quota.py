"""Per-owner quotas: the pure arithmetic (model.quota), the store's quotas and audit tables, owner_quota's body.

The store tests use a real SQLite file; the concurrency test runs real processes against it.
"""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.admission import within_quota
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import MIGRATIONS, SCHEMA_VERSION, HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.host.tenancy import (
    TenancyError,
    list_audit,
    set_quota,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.model import quota
from ansible_collections.zjusct.cloud.plugins.module_utils.model.lifecycle import CloudVMError


def spec(power: str = "Stopped", vcpus: int = 1, memory: int = 512, guaranteed: int = 0, owner: str = "alice") -> dict:
    out = {"owner": owner, "powerState": power, "vcpus": vcpus, "memoryMiB": memory, "bootID": 0,
           "rootVolumeClaim": "x"}
    if guaranteed:
        out["network"] = {"bandwidth": {"guaranteedMbps": guaranteed, "ceilMbps": guaranteed * 10}}
    return out


# --- pure arithmetic ----------------------------------------------------------------------------------
def test_a_stopped_vm_counts_only_as_a_vm_and_a_running_one_counts_its_resources() -> None:
    assert quota.vm_footprint(None) == quota.zero()
    assert quota.vm_footprint(spec("Stopped", 4, 4096, 100)) == dict(quota.zero(), vms=1)
    assert quota.vm_footprint(spec("Running", 4, 4096, 100)) == \
        {"vms": 1, "vcpus": 4, "memory_mib": 4096, "disk_mib": 0, "bandwidth_mbps": 100}  # the ceiling is not counted


def test_usage_sums_vms_and_every_volume() -> None:
    got = quota.usage([spec("Running", 2, 1024, 10), spec("Stopped", 8, 8192), spec("Running", 1, 512)],
                      [2048, 4096])
    assert got == {"vms": 3, "vcpus": 3, "memory_mib": 1536, "disk_mib": 6144, "bandwidth_mbps": 10}


def test_no_quota_or_no_limit_is_unlimited() -> None:
    huge = dict(quota.zero(), vms=10**6, vcpus=10**6)
    assert quota.check("alice", None, quota.zero(), quota.zero(), huge) is None
    assert quota.check("alice", {"vms": None, "vcpus": None}, quota.zero(), quota.zero(), huge) is None


def test_up_to_the_limit_is_allowed_one_over_is_refused_with_the_numbers() -> None:
    limits = {"vcpus": 4}
    in_use = dict(quota.zero(), vcpus=3)
    start = quota.vm_footprint(spec("Running", 1))
    assert quota.check("alice", limits, in_use, quota.zero(), start) is None
    refusal = quota.check("alice", limits, dict(in_use, vcpus=4), quota.zero(), start)
    assert refusal is not None
    assert refusal.message == (
        "vcpus: owner 'alice' would use 5 of quota 4 vCPUs (in use 4, this request 1, asked by vcpus); stop"
        " another VM of 'alice', or ask the operator to raise owner_quota vcpus")
    assert refusal.details() == {"reason": "QuotaExceeded", "quota": "vcpus", "owner": "alice", "limit": 4,
                                 "in_use": 4, "requested": 1}


def test_only_growth_is_checked_so_a_lowered_quota_never_blocks_a_stop_or_shrink() -> None:
    limits = {"vcpus": 1, "memory_mib": 256}
    in_use = dict(quota.zero(), vms=1, vcpus=4, memory_mib=4096)
    running = quota.vm_footprint(spec("Running", 4, 4096))
    assert quota.check("alice", limits, in_use, running, quota.vm_footprint(spec("Stopped", 4, 4096))) is None
    assert quota.check("alice", limits, in_use, running, running) is None  # e.g. new SSH keys only
    assert quota.check("alice", limits, in_use, running, quota.vm_footprint(spec("Running", 2, 4096))) is None


def test_the_first_dimension_over_is_named_in_a_fixed_order() -> None:
    refusal = quota.check("bob", {"vms": 0, "vcpus": 0}, quota.zero(), quota.zero(),
                          quota.vm_footprint(spec("Running")))
    assert refusal is not None and refusal.dimension == "vms" and refusal.limit == 0
    refusal = quota.check("bob", {"disk_mib": 100}, dict(quota.zero(), disk_mib=90), quota.zero(),
                          dict(quota.zero(), disk_mib=20))
    assert refusal is not None and "would use 110 of quota 100 MiB of disk (in use 90, this request 20," \
        " asked by volume_size_mib (the root volume's size))" in refusal.message


def test_limits_must_be_integers_not_below_zero() -> None:
    assert quota.validate_limits({"vcpus": 0, "vms": None}) == []
    assert quota.validate_limits({"vcpus": -1, "memory_mib": True}) == [
        "vcpus: -1 is not an integer >= 0 (omit it for no limit on vCPUs)",
        "memory_mib: True is not an integer >= 0 (omit it for no limit on MiB of memory)"]


# --- the store -----------------------------------------------------------------------------------------
def test_quotas_usage_and_audit_live_in_the_store_and_survive_reopening(tmp_path: Path) -> None:
    path = str(tmp_path / "cloud.db")
    with HostStore(path) as store:
        assert store.get_quota("alice") is None
        store.put_quota("alice", {"vms": 2, "vcpus": 4})
        store.create_vm("default", "a1", spec("Running", 2, 1024, 5))
        store.create_vm("default", "a2", spec("Stopped", 8, 8192))
        store.create_vm("default", "b1", spec("Running", 1, 512, owner="bob"))
        store.put_volume({"name": "a1-root", "driver": "file", "location": "/x", "size_mib": 2048, "owner": "alice"})
        store.record_audit("alice", "start", "default/a1", "succeeded", "ok", owner="alice")
        store.record_audit("ops", "delete", "default/b1", "refused", "no", owner="bob", operator=True,
                           reason="Forbidden", data={"delete_volume": True})
    with HostStore(path, read_only=True) as store:
        assert store.get_quota("alice") == {"vms": 2, "vcpus": 4, "memory_mib": None, "disk_mib": None,
                                            "bandwidth_mbps": None}
        assert store.owner_usage("alice") == {"vms": 2, "vcpus": 2, "memory_mib": 1024, "disk_mib": 2048,
                                              "bandwidth_mbps": 5}
        records = store.audit()
        assert [(r["actor"], r["action"], r["result"], r["operator"]) for r in records] == \
            [("alice", "start", "succeeded", False), ("ops", "delete", "refused", True)]
        assert records[1]["data"] == {"delete_volume": True} and records[1]["reason"] == "Forbidden"
        assert records[0]["ts"] < records[1]["ts"] or records[0]["id"] < records[1]["id"]
        assert len(records[0]["ts"]) == len("2026-11-30T07:00:00.123456Z") and records[0]["ts"].endswith("Z")
        assert [r["subject"] for r in store.audit(owner="bob")] == ["default/b1"]
        assert store.audit(since="2999-01-01") == []
        assert [r["actor"] for r in store.audit(limit=1)] == ["ops"]


def test_a_version_2_store_is_migrated_with_its_data(tmp_path: Path) -> None:
    path = tmp_path / "cloud.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version in range(2):
        for statement in MIGRATIONS[version]:
            conn.execute(statement)  # versions 1-2 are plain SQL
    conn.execute("INSERT INTO events (ts, kind, subject, reason, message) VALUES ('t', 'Normal', 's', 'r', 'm')")
    conn.execute("PRAGMA user_version=2")
    conn.close()
    with HostStore(str(path)) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        assert len(store.events()) == 1 and store.audit() == [] and store.list_quotas() == {}
        columns = {row[1] for row in store.conn.execute("PRAGMA table_info(audit)")}
        assert "ended" in columns


def _create_under_quota(path: str, name: str, barrier: Any,
                        results: Any) -> None:
    store = HostStore(path)
    planned = spec("Running", owner="carol")
    barrier.wait()
    try:
        with store.transaction():
            within_quota(store, None, planned)
            store.create_vm("default", name, planned)
        results.put((name, "created"))
    except CloudVMError as exc:
        results.put((name, exc.details["reason"]))
    finally:
        store.close()


def test_concurrent_writers_cannot_together_exceed_a_quota(tmp_path: Path) -> None:
    path = str(tmp_path / "cloud.db")
    with HostStore(path) as store:
        store.put_quota("carol", {"vcpus": 1})
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_create_under_quota, args=(path, f"c{i}", barrier, results)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = sorted(results.get(timeout=5)[1] for _ in procs)
    assert outcomes == ["QuotaExceeded"] * 3 + ["created"], outcomes
    with HostStore(path, read_only=True) as store:
        assert store.owner_usage("carol")["vcpus"] == 1


# --- owner_quota and audit_info bodies -------------------------------------------------------------------
@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"store_path": str(tmp_path / "state" / "cloud.db")}))
    return str(path)


def test_owner_quota_check_mode_diff_idempotence_and_removal(config: str) -> None:
    params = {"owner": "alice", "state": "present", "host_config": config, "vcpus": 4, "memory_mib": 4096}
    planned = set_quota(params, check_mode=True, diff=True)
    assert planned["changed"] and planned["diff"] == {"before": {}, "after": dict(
        quota.zero(), vms=None, vcpus=4, memory_mib=4096, disk_mib=None, bandwidth_mbps=None)}
    assert list_audit({"host_config": config, "limit": 10})["records"] == []  # check mode wrote nothing
    assert set_quota(params)["changed"] is True
    assert set_quota(params)["changed"] is False
    assert set_quota(params, check_mode=True)["changed"] is False
    assert set_quota(dict(params, vcpus=2))["quota"]["vcpus"] == 2
    removed = set_quota(dict(params, state="absent"), diff=True)
    assert removed["changed"] and removed["quota"] is None and removed["diff"]["after"] == {}
    assert set_quota(dict(params, state="absent"))["changed"] is False
    records = list_audit({"host_config": config, "owner": "alice", "limit": 10})["records"]
    assert [(r["action"], r["subject"], r["actor"]) for r in records] == [
        ("quota-set", "quota/alice", "operator"), ("quota-set", "quota/alice", "operator"),
        ("quota-remove", "quota/alice", "operator")]
    assert records[1]["data"]["before"]["vcpus"] == 4 and records[1]["data"]["after"]["vcpus"] == 2


def test_owner_quota_warns_when_set_below_the_usage(config: str) -> None:
    params = {"owner": "alice", "state": "present", "host_config": config}
    set_quota(params)
    store_path = json.loads(Path(config).read_text())["store_path"]
    with HostStore(store_path) as store:
        store.create_vm("default", "a1", spec("Running", 2))
    out = set_quota(dict(params, vcpus=1))
    assert out["warnings"] == ["vcpus: owner 'alice' already uses 2 of the quota 1 vCPUs; nothing is stopped, growth"
                               " is refused until the usage is below the quota"]


def test_bad_owner_quota_and_audit_info_input_names_the_option(config: str) -> None:
    with pytest.raises(TenancyError, match=r"^vcpus: -2 is not an integer >= 0"):
        set_quota({"owner": "alice", "state": "present", "host_config": config, "vcpus": -2})
    with pytest.raises(TenancyError, match=r"^owner: 'Alice_' is not a DNS label"):
        set_quota({"owner": "Alice_", "state": "present", "host_config": config})
    with pytest.raises(TenancyError, match=r"^since: 'yesterday' is not an RFC 3339 UTC time"):
        list_audit({"host_config": config, "since": "yesterday", "limit": 5})
    with pytest.raises(TenancyError, match=r"^limit: 0 is not an integer >= 1"):
        list_audit({"host_config": config, "limit": 0})


def test_a_root_volume_size_grows_the_volume_record_and_is_refused_below_it() -> None:
    from ansible_collections.zjusct.cloud.plugins.module_utils.host.admission import volume_growth

    volume = {"name": "alice-root", "size_mib": 2048}
    assert volume_growth(volume, spec()) == 0  # unset: the volume as it is
    assert volume_growth(None, dict(spec(), rootVolumeSizeMiB=4096)) == 0  # a new volume is made that size
    assert volume_growth(volume, dict(spec(), rootVolumeSizeMiB=2048)) == 0
    assert volume_growth(volume, dict(spec(), rootVolumeSizeMiB=3072)) == 1024  # counted in disk_mib
    with pytest.raises(CloudVMError, match=r"^spec.rootVolumeSizeMiB: 1024 is below the size of the root volume "
                                           r"alice-root, 2048 MiB; a root volume only grows$"):
        volume_growth(volume, dict(spec(), rootVolumeSizeMiB=1024))


def test_a_new_root_volume_counts_the_size_asked_else_the_images_root_file_system(tmp_path: Any) -> None:
    from ansible_collections.zjusct.cloud.plugins.module_utils.host.admission import new_volume_mib

    image_dir = tmp_path / "debian-x"
    image_dir.mkdir()
    with open(image_dir / "rootfs.raw", "wb") as fh:
        fh.truncate(3 * 1024 * 1024)  # sparse: the apparent size counts
    assert new_volume_mib({"dir": str(image_dir)}, 4096) == 4096
    assert new_volume_mib({"dir": str(image_dir)}, None) == 3
    assert new_volume_mib({"dir": str(tmp_path / "absent")}, None) == 0
    assert new_volume_mib(None, None) == 0
