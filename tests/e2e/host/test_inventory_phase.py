"""The host inventory and cloudvm_info agree on a real guest's phase, and listing takes no write lock.

One real QEMU guest (``dave``) on this module's own private cloud (the ``cloud`` fixture: its own
netns, store and state); the test starts it with the vm_start playbook, kills its launcher with
SIGKILL and waits until cloudvm_info no longer says Running. The inventory (host source, the
shipped ``inventory/cloudvm.yml``) must then show the very same phase and reason, and no longer make
the VM a host.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from tests.integration.inventory_host.inventory_host_helpers import list_via_inventory

from .conftest import Cloud, launcher_pids

pytestmark = [pytest.mark.guest, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(2700)]

START = "Start the VM and wait until its SSH answers"


def inventory_status(cloud: Cloud, tmp_path: Path) -> dict[str, tuple[str, str]]:
    """``name`` -> (cloudvm_phase, cloudvm_reason) of every VM the inventory lists (include_all)."""
    src = tmp_path / "all.cloudvm.yml"
    src.write_text(f"plugin: zjusct.cloud.cloudvm\nsource: host\nhost_config: {cloud.config_path}\n"
                   "include_all: true\n")
    hostvars = list_via_inventory(cloud.config_path, cloud.env(), inventory=src)["_meta"]["hostvars"]
    return {hv["cloudvm_name"]: (hv["cloudvm_phase"], hv["cloudvm_reason"]) for hv in hostvars.values()}


def test_killed_launcher_gives_the_same_phase_in_cloudvm_info_and_the_inventory(cloud: Cloud, tmp_path: Path):
    # TCG: on hosts with nested virtualisation /dev/kvm can pass the launcher's probe while a full guest never
    # boots under it (no serial output); this test is about the phase, not the accelerator
    # (a TCG boot takes 10-25 min while the 2 cores are shared with other jobs: wait for it generously)
    cloud.config.update(accel=os.environ.get("ZJUSCT_E2E_ACCEL", "tcg"), readiness_timeout_seconds=1800)
    cloud.config_path.write_text(json.dumps(cloud.config))
    doc = cloud.playbook("vm_start", "owner=dave", "wait_timeout=1900", timeout=2000)
    started = next(task["hosts"]["localhost"] for play in doc["plays"] for task in play["tasks"]
                   if task["task"]["name"] == START)
    assert started["phase"] == "Running", started

    # listing while another process holds the store's write transaction (cloudvm_info and the inventory)
    writer = sqlite3.connect(cloud.config["store_path"], isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE cloudvms SET labels = ?", (json.dumps({"held": "yes"}),))
        assert set(list_via_inventory(cloud.config_path, cloud.env())["_meta"]["hostvars"]) == {"dave.default"}
        assert cloud.vm("dave")["status"]["phase"] == "Running"
    finally:
        writer.execute("ROLLBACK")
        writer.close()

    pids = launcher_pids(cloud, "dave")
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 120
    status = cloud.vm("dave")["status"]
    while status["phase"] in ("Running", "Pending"):  # Pending: within the launcher's spawn grace
        assert time.monotonic() < deadline, f"cloudvm_info still says {status}"
        time.sleep(1)
        status = cloud.vm("dave")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "LauncherLost"), status
    assert inventory_status(cloud, tmp_path) == {"dave": ("Failed", "LauncherLost")}
    assert list_via_inventory(cloud.config_path, cloud.env())["_meta"]["hostvars"] == {}, \
        "a VM whose launcher is gone is no host"
