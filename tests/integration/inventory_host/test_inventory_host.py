"""The inventory's host source against a real host store (SQLite) written with HostStore.

Listing needs no running guest: the records and their status are written the way the host
backend's reconcile loop writes them. Reaching a real guest over SSH through this inventory is
``ping_via_inventory`` in the host backend's e2e test.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils._store import HostStore

from tests.integration.inventory_host.inventory_host_helpers import (
    INVENTORY,
    REPO,
    VENV_BIN,
    host_env,
    list_via_inventory,
)

PROXY = "ip netns exec zjusct-cloud nc %h %p"


@pytest.fixture
def host_cloud(tmp_path: Path) -> tuple[Path, Path]:
    """A host config naming a fresh store; returns (config path, store path)."""
    store = tmp_path / "lib" / "cloud.db"
    config = tmp_path / "host.json"
    config.write_text(json.dumps({"store_path": str(store), "node": "hv1"}))
    return config, store


def add_vm(store: Path, name: str, owner: str, phase: str | None, ip: str = "10.200.0.2",
           labels: dict | None = None, namespace: str = "default") -> None:
    with HostStore(str(store)) as db:
        db.create_vm(namespace, name, {"owner": owner, "vcpus": 2, "memoryMiB": 1024, "bootID": 1,
                                       "powerState": "Running"}, labels=labels)
        if phase is not None:  # as the host backend's reconcile writes it
            db.update_vm(namespace, name, status={
                "phase": phase, "reason": "SSHReady" if phase == "Running" else phase, "bootID": 1, "node": "hv1",
                "sshEndpoint": {"host": ip, "port": 22}, "sshProxyCommand": PROXY})


def test_quickstart_inventory_lists_alices_running_vm_under_owner_alice(host_cloud):
    config, store = host_cloud
    add_vm(store, "alice", "alice", "Running", "10.200.0.2", labels={"course": "os"})
    add_vm(store, "bob", "bob", "Stopped", "10.200.0.3")
    add_vm(store, "carol", "carol", None)
    inv = list_via_inventory(config)
    assert set(inv["_meta"]["hostvars"]) == {"alice.default"}
    assert inv["owner_alice"]["hosts"] == ["alice.default"]
    assert inv["node_hv1"]["hosts"] == ["alice.default"]
    hv = inv["_meta"]["hostvars"]["alice.default"]
    assert (hv["ansible_host"], hv["ansible_port"], hv["ansible_user"]) == ("10.200.0.2", 22, "root")
    assert shlex.split(hv["ansible_ssh_common_args"]) == ["-o", f"ProxyCommand={PROXY}"]
    assert hv["cloudvm_owner"] == "alice" and hv["cloudvm_vcpus"] == 2 and hv["cloudvm_memory_mib"] == 1024
    assert hv["cloudvm_labels"] == {"course": "os"} and hv["cloudvm_boot_id"] == 1


def test_graph_shows_the_vm_under_its_owner_group(host_cloud):
    config, store = host_cloud
    add_vm(store, "alice", "alice", "Running")
    proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(INVENTORY), "--graph"], cwd=REPO,
                          env=host_env(config), capture_output=True, text=True, timeout=300, check=True)
    lines = [line.strip() for line in proc.stdout.splitlines()]
    at = lines.index("|--@owner_alice:")
    assert lines[at + 1] == "|  |--alice.default"


def test_host_source_filters_owner_namespace_and_labels(host_cloud, tmp_path):
    config, store = host_cloud
    add_vm(store, "a", "alice", "Running", labels={"tier": "web"})
    add_vm(store, "b", "bob", "Running", labels={"tier": "db"})
    add_vm(store, "c", "alice", "Running", namespace="lab", labels={"tier": "db"})
    src = tmp_path / "filtered.cloudvm.yml"
    src.write_text(f"plugin: zjusct.cloud.cloudvm\nsource: host\nhost_config: {config}\n"
                   "owners: [alice]\nlabel_selector: tier in (db)\n")
    inv = list_via_inventory(Path("/nonexistent-because-host_config-wins"), inventory=src)
    assert set(inv["_meta"]["hostvars"]) == {"c.lab"}
    src.write_text(f"plugin: zjusct.cloud.cloudvm\nsource: host\nhost_config: {config}\nnamespaces: [default]\n")
    assert set(list_via_inventory(config, inventory=src)["_meta"]["hostvars"]) == {"a.default", "b.default"}


def test_a_host_that_never_ran_a_vm_has_an_empty_inventory(host_cloud):
    config, store = host_cloud
    inv = list_via_inventory(config)
    assert inv["_meta"]["hostvars"] == {}
    assert not store.exists(), "listing must not create the store"


def test_missing_host_config_is_a_clear_error(tmp_path):
    proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(INVENTORY), "--list"], cwd=REPO,
                          env=host_env(tmp_path / "absent.json"), capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode != 0
    assert f"source host: host_config: {tmp_path / 'absent.json'} does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
