"""The launcher creating its TAP on a bridge inside a network namespace we create, the guest reachable there,
and the TAP removed afterwards (cases L5/L6)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.launcher import busybox_guest as bg
from tests.integration.launcher.harness import Launched, base_config, bridged_netns, ip, leftovers, wait_dead

pytestmark = [pytest.mark.netns, pytest.mark.guest, pytest.mark.slow]



@pytest.fixture
def netns() -> Iterator[str]:
    with bridged_netns(f"zjlt{os.getpid()}", "10.77.0.1/24") as name:
        yield name


def test_tap_created_on_the_bridge_guest_ready_over_it_and_removed_after_stop(netns: str, tmp_path: Path) -> None:
    kernel, _ = bg.kernel()
    disk = bg.make_disk(str(tmp_path / "disk.raw"))
    cfg = base_config(tmp_path, "bb-tap", kernel=kernel, initrd=bg.build_initrd(), disk=disk,
                      cmdline="console=ttyS0 panic=-1 quiet zjtest.acpi=1")
    cfg["network"] = {"mode": "tap", "tap": "zjtap0", "createTap": True, "bridge": "zjbr0",
                      "mac": "52:54:00:aa:bb:01", "ipv4": "10.77.0.5/24", "gateway": "10.77.0.1",
                      "dns": ["10.77.0.1"]}
    cfg["readiness"] = {"timeoutSeconds": 400}
    vm = Launched(cfg, tmp_path, netns=netns)
    try:
        ready = vm.wait_ready()
        assert ready["banner"].startswith("SSH-2.0-zjtest bb-tap"), "banner read over the TAP from 10.77.0.5"
        link = ip("-n", netns, "-j", "link", "show", "zjtap0")
        info = json.loads(link.stdout)[0]
        assert info.get("master") == "zjbr0" and info["ifname"] == "zjtap0"
        assert ip("link", "show", "zjtap0", check=False).returncode != 0, "nothing in the root namespace"
        pid = vm.vmm_pid()
        vm.signal(signal.SIGTERM)
        rc, result = vm.wait(300)
        assert result is not None and (rc, result["reason"]) == (0, "StopRequested"), result
        assert wait_dead(pid, 10)
        assert ip("-n", netns, "link", "show", "zjtap0", check=False).returncode != 0, "TAP removed"
        assert leftovers(vm.runtime_dir) == []
    finally:
        vm.kill()
        ip("-n", netns, "link", "del", "zjtap0", check=False)


def test_tap_that_does_not_exist_and_is_not_to_be_created_is_config_invalid(tmp_path: Path) -> None:
    kernel, _ = bg.kernel()
    disk = bg.make_disk(str(tmp_path / "disk.raw"))
    cfg = base_config(tmp_path, "bb-notap", kernel=kernel, initrd=kernel, disk=disk, cmdline="console=ttyS0")
    cfg["network"] = {"mode": "tap", "tap": "zjnotap9", "mac": "52:54:00:aa:bb:02"}
    cfg["readiness"] = {"host": "10.77.0.9", "timeoutSeconds": 10}
    vm = Launched(cfg, tmp_path)
    rc, result = vm.wait(60)
    assert rc == 2 and result is not None and "network.tap: 'zjnotap9' does not exist" in result["message"]
    assert not vm.runtime_dir.exists()
