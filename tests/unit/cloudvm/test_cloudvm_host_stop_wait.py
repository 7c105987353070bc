"""The host backend's wait for Stopped on a VM whose last boot failed: it ends (the VM is off) with a warning.

The state is what a real launcher leaves behind (docs/launcher-protocol.md): boot-1.json, spawned-1 and the
LauncherResult result-1.json with a failure reason, no process holding the lock; the store is the real SQLite
host store. No guest is needed: the boot has already ended.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm.lifecycle import Lifecycle
from ansible_collections.zjusct.cloud.plugins.module_utils.host import cloudvm as host
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import load
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore


def _cloud_with_a_crashed_boot(tmp_path: Path, reason: str, message: str) -> Path:
    config = {"store_path": str(tmp_path / "cloud.db"), "state_dir": str(tmp_path / "state"),
              "runtime_dir": str(tmp_path / "run"), "log_dir": str(tmp_path / "log"),
              "volumes_dir": str(tmp_path / "volumes"), "images_dir": str(tmp_path / "images"),
              "netns": "", "node": "test-host"}
    path = tmp_path / "host.json"
    path.write_text(json.dumps(config))
    cfg = load(str(path))
    with HostStore(cfg.store_path) as store:
        store.put_volume({"name": "vm1-root", "driver": "file", "location": str(tmp_path / "vm1-root.raw"),
                          "size_mib": 16, "owner": "alice"})
        store.create_vm("default", "vm1", {"owner": "alice", "rootVolumeClaim": "vm1-root", "powerState": "Running",
                                           "bootID": 1}, {})
    state = Path(cfg.vm_state_dir("default", "vm1"))
    state.mkdir(parents=True)
    (state / "boot-1.json").write_text("{}")
    (state / "spawned-1").write_text(json.dumps({"pid": 1, "time": time.time() - 60,
                                                 "startedAt": "2026-01-01T00:00:00Z"}))
    (state / "result-1.json").write_text(json.dumps({
        "apiVersion": "launcher.cloud.zjusct.io/v1", "kind": "LauncherResult", "bootID": 1, "reason": reason,
        "exitCode": 1, "message": message, "hypervisorExitStatus": 139, "startedAt": "2026-01-01T00:00:00Z",
        "readyAt": None, "finishedAt": "2026-01-01T00:01:00Z"}))
    return path


def _params(config: Path, **kw: object) -> dict:
    base = {"host_config": str(config), "state": "present", "name": "vm1", "namespace": "default", "owner": None,
            "root_volume_claim": None, "vcpus": None, "memory_mib": None, "power_state": None, "restart": False,
            "ssh_authorized_keys": None, "bandwidth": None, "labels": None, "node_selector": None, "image": None,
            "volume_size_mib": None, "delete_volume": False, "wait": True, "wait_timeout": 30}
    base.update(kw)
    return base


def test_stop_of_a_vm_whose_boot_crashed_ends_with_a_warning(tmp_path: Path) -> None:
    config = _cloud_with_a_crashed_boot(tmp_path, "HypervisorCrashed", "qemu exited with signal 11")
    result = host.ensure(_params(config, power_state="stopped"))
    assert result["phase"] == "Failed"
    assert result["warnings"] == ["default/vm1 is off, but boot 1 ended in phase Failed (reason HypervisorCrashed):"
                                  " qemu exited with signal 11"]


def test_delete_of_a_vm_whose_boot_crashed_ends_with_a_warning(tmp_path: Path) -> None:
    config = _cloud_with_a_crashed_boot(tmp_path, "GuestPanic", "kernel panic")
    result = host.ensure(_params(config, state="absent"))
    assert result["changed"] is True and "cloudvm" not in result
    assert result["warnings"] == ["default/vm1 is off, but boot 1 ended in phase Failed (reason GuestPanic):"
                                  " kernel panic"]


def test_restart_of_a_stopped_vm_starts_it_and_never_waits_for_stopped(tmp_path: Path, monkeypatch) -> None:
    """Restart of a VM that is off: one start (bootID + 1), waited for until Running, and the wait for Stopped only
    before it (where it ends at once). It used to start the VM and then wait for Stopped, which a booting VM never
    reaches (seen through the AWX restart job: a 900 s timeout "waiting for default/alice to be Stopped: last phase
    Running"). The waits are recorded instead of run (no guest here); tests/e2e/awx/test_awx_jobs.py restarts a
    stopped real guest."""
    config = _cloud_with_a_crashed_boot(tmp_path, "Stopped", "guest powered off")
    cfg = load(str(config))
    with HostStore(cfg.store_path) as store:
        store.update_vm("default", "vm1", spec={"owner": "alice", "rootVolumeClaim": "vm1-root",
                                                "powerState": "Stopped", "bootID": 1},
                        status={"phase": "Stopped", "reason": "Stopped", "bootID": 1})
    waited: list[tuple[str, int]] = []

    def fake_wait(self, ns, name, target, timeout, changed):
        with HostStore(cfg.store_path, read_only=True) as store:
            vm = store.get_vm(ns, name)
        waited.append((target, vm["spec"]["bootID"]))
        return vm

    monkeypatch.setattr(Lifecycle, "wait_for", fake_wait)
    result = host.ensure(_params(config, restart=True, owner="alice"))
    assert waited == [("Stopped", 1), ("Running", 2)]
    assert result["cloudvm"]["spec"]["powerState"] == "Running" and result["cloudvm"]["spec"]["bootID"] == 2
