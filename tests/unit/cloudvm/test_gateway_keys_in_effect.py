"""The SSH gateway grants a VM the keys of the boot its guest runs, not a newer spec's (issue #39, input 7).

The guest installs the keys of its boot's config disk at boot and keeps them until the boot ends; before this rule
the gateway took a running VM's new spec keys at once, so after a re-key neither key got in. ``gateway_vms`` (what
``sync_gateway`` writes the keys files from) is read here over a real host store, real launcher files and a real
flock held by a stand-in launcher process whose command line names ``boot-<N>.json``, as the launcher's does.
The keys files themselves and the real sshd: tests/e2e/host/test_gateway_site_layout.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import config as _hostconfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.network import gateway_vms
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore

OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld0000000000000000000000000000000000000000 old"
NEW = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINew0000000000000000000000000000000000000000 new"
# holds a flock on argv[1] with argv[2] (a boot-<N>.json) on its command line; says "locked" once it holds it
HOLDER = ("import fcntl, sys, time\nfh = open(sys.argv[1], 'a')\nfcntl.flock(fh, fcntl.LOCK_EX)\n"
          "print('locked', flush=True)\ntime.sleep(3600)\n")


@pytest.fixture
def launchers() -> Iterator[list]:
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.fixture
def cloud(tmp_path: Path):
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"store_path": str(tmp_path / "lib" / "cloud.db"), "node": "hv1",
                                "state_dir": str(tmp_path / "state"), "runtime_dir": str(tmp_path / "run"),
                                "log_dir": str(tmp_path / "log")}))
    cfg = _hostconfig.load(str(path))
    with HostStore(cfg.store_path) as store:
        yield cfg, store


def _vm(cfg, store: HostStore, name: str, ipv4: str, booted_keys=None, spawned_ago: float = 600.0):
    """A Running VM whose spec lists NEW, with a lease and (``booted_keys``) boot 1's config listing those."""
    vm = store.create_vm("default", name, {"owner": "alice", "vcpus": 1, "memoryMiB": 512, "bootID": 1,
                                           "powerState": "Running", "sshAuthorizedKeys": [NEW]})
    store.put_lease({"ipv4": ipv4, "vm_uid": vm["metadata"]["uid"], "mac": "52:54:00:00:00:01", "tap": f"t-{name}"})
    paths = cfg.launcher_paths("default", name)
    Path(paths.state_dir).mkdir(parents=True)
    Path(paths.runtime_dir).mkdir(parents=True)
    if booted_keys is not None:
        Path(paths.config(1)).write_text(json.dumps({"vm": {"bootID": 1}, "identity": {"sshAuthorizedKeys":
                                                                                       booted_keys}}))
        Path(paths.spawned(1)).write_text(json.dumps({"pid": 1, "time": time.time() - spawned_ago,
                                                      "startedAt": "2026-01-01T00:00:00Z"}))
    return paths


def _keys(cfg, store: HostStore) -> dict:
    return {vm["ipv4"]: vm["keys"] for vm in gateway_vms(cfg, store)}


def test_a_running_boot_keeps_its_keys_on_the_gateway_until_it_ends(cloud, launchers):
    cfg, store = cloud
    paths = _vm(cfg, store, "alice", "10.200.0.2", booted_keys=[OLD])
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, paths.lock, paths.config(1)], stdout=subprocess.PIPE,
                            text=True)
    launchers.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    assert _keys(cfg, store) == {"10.200.0.2": [OLD]}  # the spec says NEW; the guest of boot 1 has OLD
    proc.kill()
    proc.wait()
    Path(paths.result(1)).write_text(json.dumps({"reason": "StopRequested", "exitCode": 0}))
    assert _keys(cfg, store) == {"10.200.0.2": [NEW]}  # boot 1 ended: the keys its next boot gets


def test_a_boot_still_starting_is_granted_its_own_keys(cloud):
    """Spawned a moment ago, its launcher has not taken the lock yet: its config's keys are the guest's."""
    cfg, store = cloud
    _vm(cfg, store, "alice", "10.200.0.2", booted_keys=[OLD], spawned_ago=1.0)
    assert _keys(cfg, store) == {"10.200.0.2": [OLD]}


def test_a_vm_that_never_booted_or_lost_its_launcher_gets_the_specs_keys(cloud):
    cfg, store = cloud
    _vm(cfg, store, "fresh", "10.200.0.2")
    _vm(cfg, store, "lost", "10.200.0.3", booted_keys=[OLD])  # spawned 10 min ago, no lock, no result: gone
    assert _keys(cfg, store) == {"10.200.0.2": [NEW], "10.200.0.3": [NEW]}


def test_the_host_module_says_a_rekey_of_a_running_boot_takes_effect_at_the_next_boot(cloud, launchers):
    """The cloudvm module over the host adapter (cloudvm.lifecycle.Lifecycle + HostCloudVMApi): re-keying a VM whose
    boot 1 runs (its launcher holds the lock) names boot 2 and warns; the guest of boot 1 keeps OLD, as does the
    gateway (the first test), so nothing the task wrote lets NEW in before that boot."""
    from ansible_collections.zjusct.cloud.plugins.module_utils.host import cloudvm as host

    cfg, store = cloud
    store.put_volume({"name": "alice-root", "driver": "file", "location": str(Path(cfg.state_dir) / "alice.raw"),
                      "size_mib": 16, "owner": "alice"})
    paths = _vm(cfg, store, "alice", "10.200.0.2", booted_keys=[OLD])
    store.update_vm("default", "alice", spec=dict(store.get_vm("default", "alice")["spec"], sshAuthorizedKeys=[OLD],
                                                  rootVolumeClaim="alice-root"))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, paths.lock, paths.config(1)], stdout=subprocess.PIPE,
                            text=True)
    launchers.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    params = {"host_config": str(Path(cfg.store_path).parent.parent / "host.json"), "state": "present",
              "name": "alice", "namespace": "default", "owner": "alice", "root_volume_claim": None, "vcpus": None,
              "memory_mib": None, "power_state": None, "restart": False, "ssh_authorized_keys": [NEW],
              "bandwidth": None, "labels": None, "node_selector": None, "image": None, "volume_size_mib": None,
              "delete_volume": False, "wait": True, "wait_timeout": 30}
    rekeyed = host.ensure(params)
    assert (rekeyed["changed"], rekeyed["boot_id"], rekeyed["ssh_authorized_keys_boot_id"]) == (True, 1, 2), rekeyed
    assert rekeyed["cloudvm"]["spec"]["sshAuthorizedKeys"] == [NEW]
    (warning,) = rekeyed["warnings"]
    assert warning.startswith("spec.sshAuthorizedKeys change takes effect at the next boot (bootID 2): boot 1 keeps"
                              " its keys in the guest until it ends")
    assert _keys(cfg, store) == {"10.200.0.2": [OLD]}
    again = host.ensure(params)  # the same keys again: no change, no notice
    assert again["changed"] is False and "ssh_authorized_keys_boot_id" not in again and "warnings" not in again
