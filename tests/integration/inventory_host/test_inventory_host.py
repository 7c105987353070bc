"""The inventory's host source against a real host store (SQLite) written with HostStore.

Listing needs no running guest, but the phase is never read from the store: it is derived from
what runs, as cloudvm_info derives it (launcher lock, boot files; plugins/module_utils/host/supervisor).
A VM that should be Running here therefore gets a stand-in launcher: a process that holds the VM's
launcher lock with ``boot-1.json`` on its command line, next to the boot's ``spawned``/``ready``
records, exactly what the real launcher leaves (the real launcher and guest are in
tests/e2e/host). Reaching a real guest over SSH through this inventory is ``ping_via_inventory`` in
the host backend's e2e test.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore

from tests.integration.inventory_host.inventory_host_helpers import (
    INVENTORY,
    REPO,
    VENV_BIN,
    host_env,
    list_via_inventory,
)

PROXY = "ip netns exec zjusct-cloud nc %h %p"
# holds the flock on argv[1] for an hour; argv[2] is the boot config, as on a launcher's command line
STAND_IN = ("import fcntl, sys, time\nfh = open(sys.argv[1], 'a')\nfcntl.flock(fh, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\ntime.sleep(3600)\n")


class HostCloud:
    """A host config naming a fresh store and private state/runtime directories."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.store = root / "lib" / "cloud.db"
        self.config = root / "host.json"
        self.state = root / "state"
        self.runtime = root / "run"
        self.config.write_text(json.dumps({"store_path": str(self.store), "node": "hv1",
                                           "state_dir": str(self.state), "runtime_dir": str(self.runtime)}))
        self.launchers: dict[str, subprocess.Popen] = {}

    def start_launcher(self, namespace: str, name: str) -> subprocess.Popen:
        """A process holding ``name``'s launcher lock for boot 1, ready (SSH answered) a minute ago."""
        state, runtime = self.state / "vms" / f"{namespace}_{name}", self.runtime / "vms" / f"{namespace}_{name}"
        state.mkdir(parents=True, exist_ok=True)
        runtime.mkdir(parents=True, exist_ok=True)
        (state / "boot-1.json").write_text("{}")
        earlier = time.time() - 60
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(earlier))
        proc = subprocess.Popen([sys.executable, "-c", STAND_IN, str(runtime / "launcher.lock"),
                                 str(state / "boot-1.json")], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        (state / "spawned-1").write_text(json.dumps({"pid": proc.pid, "time": earlier, "startedAt": stamp}))
        (state / "ready-1").write_text(json.dumps({"readyAt": stamp}))
        self.launchers[f"{namespace}/{name}"] = proc
        return proc

    def stop_all(self) -> None:
        for proc in self.launchers.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[HostCloud]:
    c = HostCloud(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def host_cloud(cloud: HostCloud) -> tuple[Path, Path]:
    """(config path, store path) of :func:`cloud`."""
    return cloud.config, cloud.store


def add_vm(cloud: HostCloud, name: str, owner: str, phase: str | None, ip: str = "10.200.0.2",
           labels: dict | None = None, namespace: str = "default") -> None:
    """A CloudVM record with the status the host backend's reconcile wrote; a Running one gets its
    (stand-in) launcher, because the listing derives the phase from what runs."""
    with HostStore(str(cloud.store)) as db:
        db.create_vm(namespace, name, {"owner": owner, "vcpus": 2, "memoryMiB": 1024, "bootID": 1,
                                       "powerState": "Running"}, labels=labels)
        if phase is not None:  # as the host backend's reconcile writes it
            db.update_vm(namespace, name, status={
                "phase": phase, "reason": "SSHReady" if phase == "Running" else phase, "bootID": 1, "node": "hv1",
                "sshEndpoint": {"host": ip, "port": 22}, "sshProxyCommand": PROXY})
    if phase == "Running":
        cloud.start_launcher(namespace, name)


def info_phases(config: Path) -> dict[str, str]:
    """``namespace/name`` -> status.phase as the cloudvm_info module returns them."""
    env = host_env(config)
    env.pop("ANSIBLE_INVENTORY_UNPARSED_FAILED")  # the implicit localhost, no inventory
    env.update(ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    proc = subprocess.run([str(VENV_BIN / "ansible"), "localhost", "-m", "zjusct.cloud.cloudvm_info"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return {f"{vm['metadata']['namespace']}/{vm['metadata']['name']}": vm["status"].get("phase")
            for vm in result["cloudvms"]}


def inventory_phases(config: Path, tmp_path: Path) -> dict[str, str]:
    """``namespace/name`` -> cloudvm_phase of every VM, whatever its phase (include_all)."""
    src = tmp_path / "all.cloudvm.yml"
    src.write_text(f"plugin: zjusct.cloud.cloudvm\nsource: host\nhost_config: {config}\ninclude_all: true\n")
    hostvars = list_via_inventory(config, inventory=src)["_meta"]["hostvars"]
    return {f"{hv['cloudvm_namespace']}/{hv['cloudvm_name']}": hv["cloudvm_phase"] for hv in hostvars.values()}


def test_quickstart_inventory_lists_alices_running_vm_under_owner_alice(cloud):
    config = cloud.config
    add_vm(cloud, "alice", "alice", "Running", "10.200.0.2", labels={"course": "os"})
    add_vm(cloud, "bob", "bob", "Stopped", "10.200.0.3")
    add_vm(cloud, "carol", "carol", None)
    inv = list_via_inventory(config)
    assert set(inv["_meta"]["hostvars"]) == {"alice.default"}
    assert inv["owner_alice"]["hosts"] == ["alice.default"]
    assert inv["node_hv1"]["hosts"] == ["alice.default"]
    hv = inv["_meta"]["hostvars"]["alice.default"]
    assert (hv["ansible_host"], hv["ansible_port"], hv["ansible_user"]) == ("10.200.0.2", 22, "root")
    assert shlex.split(hv["ansible_ssh_common_args"]) == ["-o", f"ProxyCommand={PROXY}"]
    assert hv["cloudvm_owner"] == "alice" and hv["cloudvm_vcpus"] == 2 and hv["cloudvm_memory_mib"] == 1024
    assert hv["cloudvm_labels"] == {"course": "os"} and hv["cloudvm_boot_id"] == 1


def test_nested_layout_lists_the_host_stores_vm_as_one_cloudvm_dict(cloud, tmp_path):
    add_vm(cloud, "alice", "alice", "Running", "10.200.0.2", labels={"course": "os"})
    add_vm(cloud, "bob", "bob", "Stopped", "10.200.0.3")
    src = tmp_path / "nested.cloudvm.yml"
    src.write_text(f"plugin: zjusct.cloud.cloudvm\nsource: host\nhost_config: {cloud.config}\n"
                   "hostvars_layout: nested\nkeyed_groups: [{key: cloudvm.labels.course, prefix: course}]\n")
    inv = list_via_inventory(cloud.config, inventory=src)
    assert set(inv["_meta"]["hostvars"]) == {"alice.default"}
    hv = inv["_meta"]["hostvars"]["alice.default"]
    assert set(hv) == {"ansible_host", "ansible_port", "ansible_user", "ansible_ssh_common_args", "cloudvm"}
    assert (hv["ansible_host"], hv["ansible_port"], hv["ansible_user"]) == ("10.200.0.2", 22, "root")
    assert shlex.split(hv["ansible_ssh_common_args"]) == ["-o", f"ProxyCommand={PROXY}"]
    with HostStore(str(cloud.store)) as db:
        uid = db.get_vm("default", "alice")["metadata"]["uid"]
    assert hv["cloudvm"] == {"namespace": "default", "name": "alice", "uid": uid, "owner": "alice", "vcpus": 2,
                             "memory_mib": 1024, "node": "hv1", "boot_id": 1, "phase": "Running",
                             "reason": "SSHReady", "labels": {"course": "os"}}
    assert inv["course_os"]["hosts"] == ["alice.default"] and inv["owner_alice"]["hosts"] == ["alice.default"]


def test_graph_shows_the_vm_under_its_owner_group(cloud):
    config = cloud.config
    add_vm(cloud, "alice", "alice", "Running")
    proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(INVENTORY), "--graph"], cwd=REPO,
                          env=host_env(config), capture_output=True, text=True, timeout=300, check=True)
    lines = [line.strip() for line in proc.stdout.splitlines()]
    at = lines.index("|--@owner_alice:")
    assert lines[at + 1] == "|  |--alice.default"


def test_host_source_filters_owner_namespace_and_labels(cloud, tmp_path):
    config = cloud.config
    add_vm(cloud, "a", "alice", "Running", labels={"tier": "web"})
    add_vm(cloud, "b", "bob", "Running", labels={"tier": "db"})
    add_vm(cloud, "c", "alice", "Running", namespace="lab", labels={"tier": "db"})
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


def wait_until(check, timeout: float, what: str):
    """Poll ``check()`` until it returns a truthy value; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.5)


def test_a_stored_running_status_without_a_launcher_is_not_listed(cloud, tmp_path):
    """The store says Running but no launcher ever ran this VM (state directory lost): not a host."""
    with HostStore(str(cloud.store)) as db:
        db.create_vm("default", "ghost", {"owner": "alice", "vcpus": 1, "memoryMiB": 512, "bootID": 1,
                                          "powerState": "Running"})
        db.update_vm("default", "ghost", status={"phase": "Running", "reason": "SSHReady", "bootID": 1,
                                                 "sshEndpoint": {"host": "10.200.0.9", "port": 22}})
    assert list_via_inventory(cloud.config)["_meta"]["hostvars"] == {}
    assert info_phases(cloud.config) == inventory_phases(cloud.config, tmp_path) == {"default/ghost": "Pending"}


def test_killed_launcher_gives_the_same_phase_in_cloudvm_info_and_the_inventory(cloud, tmp_path):
    add_vm(cloud, "alice", "alice", "Running")
    add_vm(cloud, "bob", "bob", "Running", "10.200.0.3")
    assert info_phases(cloud.config) == inventory_phases(cloud.config, tmp_path) == \
        {"default/alice": "Running", "default/bob": "Running"}
    cloud.launchers["default/bob"].send_signal(signal.SIGKILL)
    wait_until(lambda: info_phases(cloud.config)["default/bob"] != "Running", 60, "cloudvm_info: bob not Running")
    assert info_phases(cloud.config) == inventory_phases(cloud.config, tmp_path) == \
        {"default/alice": "Running", "default/bob": "Failed"}
    assert set(list_via_inventory(cloud.config)["_meta"]["hostvars"]) == {"alice.default"}
    with HostStore(str(cloud.store)) as db:  # reading changed nothing: the stored status is still the old one
        assert db.get_vm("default", "bob")["status"]["phase"] == "Running"


def test_listing_succeeds_while_another_process_holds_a_write_transaction(cloud, tmp_path):
    add_vm(cloud, "alice", "alice", "Running")
    writer = sqlite3.connect(str(cloud.store), isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE cloudvms SET labels = '{\"held\": \"yes\"}'")
        assert set(list_via_inventory(cloud.config)["_meta"]["hostvars"]) == {"alice.default"}
        assert info_phases(cloud.config) == {"default/alice": "Running"}
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_store_with_an_older_schema_is_refused_and_left_as_it_is(cloud):
    add_vm(cloud, "alice", "alice", "Running")
    conn = sqlite3.connect(str(cloud.store))
    conn.execute("PRAGMA user_version=1")
    conn.close()
    proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(INVENTORY), "--list"], cwd=REPO,
                          env=host_env(cloud.config), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert f"host store {cloud.store} has schema version 1, older than this collection's" in proc.stderr
    assert "run site.yml to migrate it" in proc.stderr and "Traceback" not in proc.stderr
    conn = sqlite3.connect(str(cloud.store))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1, "listing must not migrate the store"
    conn.close()


def test_cache_answers_only_for_the_same_host_config(cloud, tmp_path):
    """Issue case: cache on, ZJUSCT_CLOUD_CONFIG switched from a cloud with alice to an empty one."""
    add_vm(cloud, "alice", "alice", "Running")
    other = HostCloud(tmp_path / "other")
    try:
        HostStore(str(other.store)).close()  # an existing, empty store
        cache = tmp_path / "cache"
        src = tmp_path / "cached.cloudvm.yml"
        src.write_text("plugin: zjusct.cloud.cloudvm\nsource: host\ncache: true\n"
                       f"cache_plugin: ansible.builtin.jsonfile\ncache_connection: {cache}\ncache_timeout: 3600\n")

        def hosts(config: Path, *args: str) -> set[str]:
            proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(src), "--list", *args], cwd=REPO,
                                  env=host_env(config), capture_output=True, text=True, timeout=300, check=True)
            return set(json.loads(proc.stdout)["_meta"]["hostvars"])

        assert hosts(cloud.config) == {"alice.default"}
        assert hosts(other.config) == hosts(other.config, "--flush-cache") == set()
        add_vm(cloud, "bob", "bob", "Running", "10.200.0.3")
        assert hosts(cloud.config) == {"alice.default"}, "the first cloud's entry still answers for it"
        assert hosts(cloud.config, "--flush-cache") == {"alice.default", "bob.default"}
        assert len(os.listdir(cache)) == 2, "one cache entry per host config"
    finally:
        other.stop_all()
