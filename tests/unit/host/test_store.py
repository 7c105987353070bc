"""The SQLite host store (plugins/module_utils/host/store.py): migrations, concurrency, no lost updates."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import SCHEMA_VERSION, HostStore, StoreError


def test_schema_is_migrated_and_newer_schema_is_refused(tmp_path):
    path = str(tmp_path / "cloud.db")
    HostStore(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this collection"):
        HostStore(path)


def test_vm_roundtrip_and_duplicate_refused(tmp_path):
    with HostStore(str(tmp_path / "db")) as store:
        vm = store.create_vm("default", "alice", {"owner": "alice", "bootID": 0})
        assert vm["metadata"]["uid"] and vm["spec"]["owner"] == "alice"
        with pytest.raises(StoreError, match="already exists"):
            store.create_vm("default", "alice", {"owner": "alice"})
        store.update_vm("default", "alice", spec={"owner": "alice", "bootID": 1}, status={"phase": "Pending"})
        again = store.get_vm("default", "alice")
        assert again["metadata"]["generation"] == 2 and again["status"] == {"phase": "Pending"}


def test_concurrent_read_modify_write_loses_no_update(tmp_path):
    path = str(tmp_path / "db")
    with HostStore(path) as store:
        store.create_vm("default", "c", {"owner": "c", "bootID": 0})

    def bump():
        with HostStore(path) as s:
            for _ in range(25):
                with s.transaction():
                    vm = s.get_vm("default", "c")
                    s.update_vm("default", "c", spec=dict(vm["spec"], bootID=vm["spec"]["bootID"] + 1))

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with HostStore(path) as store:
        assert store.get_vm("default", "c")["spec"]["bootID"] == 100


def test_lease_conflict_is_refused(tmp_path):
    with HostStore(str(tmp_path / "db")) as store:
        store.put_lease({"ipv4": "10.200.0.2", "vm_uid": "a", "mac": "02:00:00:00:00:01", "tap": "zjta"})
        with pytest.raises(StoreError):
            store.put_lease({"ipv4": "10.200.0.2", "vm_uid": "b", "mac": "02:00:00:00:00:02", "tap": "zjtb"})


def test_read_only_open_takes_no_lock_never_migrates_and_never_writes(tmp_path):
    path = str(tmp_path / "cloud.db")
    with pytest.raises(StoreError, match="does not exist"):
        HostStore(path, read_only=True)
    assert not (tmp_path / "cloud.db").exists(), "a read-only open creates nothing"
    with HostStore(path) as store:
        store.create_vm("default", "alice", {"owner": "alice", "bootID": 0})
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        with HostStore(path, busy_timeout=0.5, read_only=True) as store:  # would time out on a write lock
            assert [vm["metadata"]["name"] for vm in store.list_vms()] == ["alice"]
            with pytest.raises(sqlite3.OperationalError):
                store.conn.execute("DELETE FROM cloudvms")
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION - 1}")
    conn.close()
    with pytest.raises(StoreError, match=r"older than this collection's .*: run site.yml to migrate it"):
        HostStore(path, read_only=True)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION - 1
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this collection"):
        HostStore(path, read_only=True)
