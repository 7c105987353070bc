"""Boot slots (launcher ``bootSlots``) with real QEMU/TCG busybox guests.

The test itself holds the only slot (an flock on ``slot-0.lock``, as another booting launcher would), so what the
launcher waits for is exact: no VMM while the slot is held, the boot as soon as it is free, the slot free again
once the guest is ready (while the guest runs on), and a stop that arrives while waiting starts nothing.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from zjusct_launcher import lock

from tests.cluster import wait_for
from tests.conftest import require
from tests.integration.launcher import busybox_guest as bg
from tests.integration.launcher.harness import GUEST_STOP_TIMEOUT, Launched, base_config, free_port, leftovers

pytestmark = [pytest.mark.guest]


def start(tmp_path: Path, slots: Path) -> Launched:
    require("guest", shutil.which("qemu-system-x86_64") is not None, "qemu-system-x86_64 not installed"
            " (qemu-system-x86, hack/install-deps.sh)")
    require("guest", shutil.which("busybox") is not None, "busybox not installed (busybox-static)")
    require("guest", bool(glob.glob("/boot/vmlinuz-*")), "no /boot/vmlinuz-* (linux-image-amd64)")
    kernel, _ = bg.kernel()
    work = tmp_path / "vm"
    work.mkdir()
    bg.make_disk(str(work / "disk.raw"))
    cfg = base_config(work, "bb-slots", kernel=kernel, initrd=bg.build_initrd(), disk=str(work / "disk.raw"),
                      cmdline="console=ttyS0 panic=-1 quiet zjtest.acpi=1", port=free_port())
    cfg["bootSlots"] = {"directory": str(slots), "count": 1}
    return Launched(cfg, work)


def logged(vm: Launched, msg: str) -> dict[str, Any] | None:
    return next((line for line in vm.log_lines() if line.get("msg") == msg), None)


def test_a_launcher_boots_only_when_a_slot_frees_and_frees_it_when_the_guest_is_ready(tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    held = lock.try_boot_slot(str(slots), 1)
    assert held is not None and held[1] == 0
    vm = start(tmp_path, slots)
    try:
        wait_for(lambda: logged(vm, "waiting for a boot slot"), 120, "the launcher waiting for a boot slot", 0.1)
        time.sleep(2.0)  # the launcher polls every 0.2 s: ten tries, all refused
        assert logged(vm, "vmm started") is None and not (vm.runtime_dir / "vmm.pid").exists()
        assert vm.proc.poll() is None
        os.close(held[0])
        released_at = time.monotonic()
        ready = vm.wait_ready()
        assert ready["banner"].startswith("SSH-2.0-zjtest bb-slots")
        acquired = logged(vm, "boot slot acquired")
        assert acquired is not None and acquired["slot"] == 0 and acquired["waitedSeconds"] >= 2.0
        # the guest is ready: its slot is free for the next boot while the guest runs on
        again = wait_for(lambda: lock.try_boot_slot(str(slots), 1), 30,
                         "the slot free again after the guest became ready", 0.1)
        os.close(again[0])
        assert logged(vm, "boot slot released")["cause"] == "guest ready"
        assert vm.proc.poll() is None and time.monotonic() - released_at < 400
        vm.signal(signal.SIGTERM)
        rc, result = vm.wait(GUEST_STOP_TIMEOUT + 60)
        # reason and message first: a CI summary keeps only the start of an assertion's text
        assert (rc, result and result["reason"]) == (0, "StopRequested"), \
            (result and (result["reason"], result["message"]), vm.log_lines()[-8:])
    finally:
        vm.kill()


def test_a_stop_while_waiting_for_a_slot_starts_nothing(tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    held = lock.try_boot_slot(str(slots), 1)
    assert held is not None
    vm = start(tmp_path, slots)
    try:
        wait_for(lambda: logged(vm, "waiting for a boot slot"), 120, "the launcher waiting for a boot slot", 0.1)
        vm.signal(signal.SIGTERM)
        rc, result = vm.wait(60)
        assert result is not None and (rc, result["reason"]) == (0, "StopRequested"), result
        assert "while waiting for a boot slot" in result["message"]
        assert result["readyAt"] is None and result.get("hypervisorExitStatus") is None
        assert logged(vm, "vmm started") is None
        assert not Path(vm.cfg["serialLogPath"]).exists()
        assert leftovers(vm.runtime_dir) == []
    finally:
        os.close(held[0])
        vm.kill()
