"""The launcher with the real guest image (systemd, sshd, zjusct-identity) under QEMU/TCG, over real SSH.

Four Debian boots, two at a time (a systemd guest under TCG on a shared 2-core machine is slow enough already):
the module fixture starts "data" and "reboot", the panic test starts "panic". Each test drives its own guest: SSH
login with the config-disk key and hostname from a VMM that is not root, data synced before a kill -9 of QEMU read
back by the next boot, SIGTERM -> StopRequested (ACPI power button through logind), reboot -> GuestReboot, kernel
panic -> GuestPanic. (A poweroff from inside a Debian guest, GuestShutdown, is the real node's
test_cloudvm_module_power.py; the busybox guests of test_launcher_qemu.py run every outcome.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import boot_slots
from tests.integration.launcher.harness import Launched, base_config, free_port, leftovers, wait_dead

pytestmark = [pytest.mark.guest, pytest.mark.slow, pytest.mark.timeout(2400)]
SSH_TIMEOUT = 120
REAL_VMM_ID_BASE = 1610612900
NAMES = ("data", "reboot", "panic")


class RealFleet:
    def __init__(self, root: Path, image: Any):
        self.root, self.image = root, image
        key = root / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
        self.key = key
        self.pubkey = (root / "id_ed25519.pub").read_text().strip()
        self.vms: dict[str, Launched] = {}
        self.ports: dict[str, int] = {}

    def ensure(self, *names: str) -> None:
        """Start these guests (together) unless already started."""
        for name in names:
            if f"{name}#1" not in self.vms:
                self.start(name)

    def start(self, name: str, boot_id: int = 1) -> Launched:
        work = self.root / name
        work.mkdir(exist_ok=True)
        disk = work / "root.raw"
        if not disk.exists():
            subprocess.run(["cp", "--sparse=always", "--reflink=auto", str(self.image.rootfs), str(disk)],
                           check=True, timeout=600)
            os.chmod(disk, 0o644)
        port = self.ports.setdefault(name, free_port())
        cfg = base_config(work, f"real-{name}", kernel=str(self.image.vmlinuz), initrd=str(self.image.initrd),
                          disk=str(disk), cmdline=self.image.default_cmdline, port=port, boot_id=boot_id,
                          memory_mib=512)
        cfg["identity"]["sshAuthorizedKeys"] = [self.pubkey]
        cfg["hypervisor"]["tcgTranslationCacheMiB"] = 128
        # sandboxed like the host backend's guests: own uid/gid (0x60000000 + n, no passwd entry) and seccomp
        vmm_id = REAL_VMM_ID_BASE + sorted(NAMES).index(name)
        cfg["hypervisor"]["runAs"] = {"uid": vmm_id, "gid": vmm_id}
        cfg["readiness"] = {"timeoutSeconds": 1500}
        cfg["bootSlots"] = boot_slots()  # Debian boots take the machine's slots; the tiny busybox guests do not
        cfg["stopTimeoutSeconds"] = 120
        vm = Launched(cfg, work)
        self.vms[f"{name}#{boot_id}"] = vm
        return vm

    def ssh(self, name: str, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["ssh", "-i", str(self.key), "-p", str(self.ports[name]), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=60",
                "-o", "LogLevel=ERROR", "root@127.0.0.1", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=SSH_TIMEOUT, check=check)

    def ssh_retry(self, name: str, command: str, attempts: int = 5) -> subprocess.CompletedProcess[str]:
        """sshd answers its banner slightly before it accepts logins under heavy load."""
        last: subprocess.CompletedProcess[str] | None = None
        for _ in range(attempts):
            last = self.ssh(name, command, check=False)
            if last.returncode == 0:
                return last
            time.sleep(5)
        assert last is not None
        raise AssertionError(f"ssh {command!r} failed: {last.returncode} {last.stderr}")

    def teardown(self) -> None:
        for vm in self.vms.values():
            vm.kill()


@pytest.fixture(scope="module")
def real(guest_image: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFleet]:
    fleet = RealFleet(tmp_path_factory.mktemp("real"), guest_image)
    try:
        fleet.ensure("data", "reboot")
        yield fleet
    finally:
        fleet.teardown()


def finish(vm: Launched, timeout: float = 400) -> tuple[int, dict[str, Any]]:
    rc, result = vm.wait(timeout)
    assert result is not None, f"no result (rc {rc}):\n{vm.log_tail()}"
    return rc, result


def clean(vm: Launched, pid: int) -> None:
    assert wait_dead(pid, 10)
    assert leftovers(vm.runtime_dir) == []


def test_real_guest_login_from_an_unprivileged_vmm_synced_data_survives_kill9_and_sigterm_stops_it(
        real: RealFleet) -> None:
    vm = real.vms["data#1"]
    ready = vm.wait_ready(1500)
    assert ready["banner"].startswith("SSH-2.0-OpenSSH")
    out = real.ssh_retry("data", "hostname; cat /var/lib/zjusct/instance-id; ip -4 -o addr show dev eth0")
    lines = out.stdout.splitlines()
    assert lines[0] == "real-data" and lines[1] == vm.cfg["identity"]["instanceID"]
    assert "10.0.2.15/24" in lines[2]
    # the launcher's trimmed q35 (qemu.MACHINE): no AHCI (PCI class 0x010601) or SMBus (0x0c0500) function, no
    # PS/2 port on the serio bus, no ATA port; the virtio disks and NIC are there
    out = real.ssh("data", "cat /sys/bus/pci/devices/*/class; echo serio $(ls /sys/bus/serio/devices | wc -l); "
                           "echo ata $(ls /sys/class/ata_port 2>/dev/null | wc -l)")
    classes = set(out.stdout.split()[:-4])
    assert not {"0x010601", "0x0c0500"} & classes and {"0x010000", "0x020000"} <= classes, out.stdout
    assert out.stdout.split()[-4:] == ["serio", "0", "ata", "0"], out.stdout
    pid = vm.vmm_pid()
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    vmm_id = str(vm.cfg["hypervisor"]["runAs"]["uid"])
    assert status["Uid"].split() == [vmm_id] * 4, "the VMM serving this SSH session is not root"
    assert (status["Seccomp"].strip(), status["NoNewPrivs"].strip()) == ("2", "1")
    real.ssh("data", "echo zjusct-durable-42 > /root/durable && sync")
    os.kill(pid, signal.SIGKILL)
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (1, "HypervisorCrashed"), result
    clean(vm, pid)
    vm2 = real.start("data", boot_id=2)
    vm2.wait_ready(1500)
    assert real.ssh_retry("data", "cat /root/durable").stdout.strip() == "zjusct-durable-42"
    pid2 = vm2.vmm_pid()
    vm2.signal(signal.SIGTERM)
    rc, result = finish(vm2)
    assert (rc, result["reason"], result["bootID"]) == (0, "StopRequested", 2), result
    clean(vm2, pid2)


def test_real_guest_reboot_ends_the_run_as_guest_reboot(real: RealFleet) -> None:
    vm = real.vms["reboot#1"]
    vm.wait_ready(1500)
    real.ssh_retry("reboot", "true")
    pid = vm.vmm_pid()
    real.ssh("reboot", "nohup sh -c 'sleep 1; reboot' >/dev/null 2>&1 &", check=False)
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (0, "GuestReboot"), result
    clean(vm, pid)


def test_real_guest_kernel_panic_is_guest_panic(real: RealFleet) -> None:
    real.ensure("panic")
    vm = real.vms["panic#1"]
    vm.wait_ready(1500)
    real.ssh_retry("panic", "true")
    pid = vm.vmm_pid()
    real.ssh("panic", "nohup sh -c 'sleep 1; echo c > /proc/sysrq-trigger' >/dev/null 2>&1 &", check=False)
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (1, "GuestPanic"), result
    clean(vm, pid)
