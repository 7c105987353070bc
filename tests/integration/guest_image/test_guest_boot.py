"""Real boots of the default image set under QEMU/TCG: three in all, whatever the test order — alice and bob in
parallel, and alice once more after her reboot.

alice stays up for every test but her reboot's (which boots her again and leaves her running). bob is powered off
by the powerdown test, so what the other tests need of him (his hostname, his host key) is read once, as soon as
he answers SSH, and those tests compare it with alice's live answers: no test waits for a boot an earlier test
made necessary.

Proves the guest side of notes/CONTRACT-guest.md: SSH as root with a key injected through the config disk, the
hostname from the config disk, per-VM SSH host keys, host keys kept across boots of the same VM, a guest reboot
makes QEMU (-no-reboot) exit, and QMP system_powerdown makes QEMU exit cleanly within a bound.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import TEST_BOOT_SLOTS, boot_slots
from tests.guest_image_fixture import GuestImage
from tests.integration.guest_image.qemu_vm import Vm, make_key

pytestmark = [pytest.mark.guest, pytest.mark.slow, pytest.mark.timeout(1500)]

ROLE_DEFAULTS = Path(__file__).resolve().parents[3] / "roles" / "guest_image" / "defaults" / "main.yml"
BOOT_TIMEOUT_S = 600  # a 2-core host shared with other guests: boots take 1-6 min under TCG
POWERDOWN_BOUND_S = 90


@dataclass
class Pair:
    key: Path
    a: Vm
    b: Vm
    b_hostname: str  # bob's answers to `hostname` and his host key fingerprint, read as soon as he answered SSH
    b_fingerprint: str


@pytest.fixture(scope="module")
def booted_pair(guest_image: GuestImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two VMs from the same image, booted in parallel, each with its own rootfs copy and config disk."""
    work = tmp_path_factory.mktemp("guest-pair")
    key, pub = make_key(work)
    a = Vm(guest_image, work / "alice", "alice", "0b6e5e1c-0000-4000-8000-00000000000a", [pub],
           mac="52:54:00:00:00:0a", boot_slots=boot_slots())
    b = Vm(guest_image, work / "bob", "bob", "0b6e5e1c-0000-4000-8000-00000000000b", [pub], mac="52:54:00:00:00:0b",
           boot_slots=boot_slots())
    try:
        a.start()
        if TEST_BOOT_SLOTS < 2:  # b's start waits for a slot: a must get to SSH (and free its slot) first
            a.wait_ssh_banner(BOOT_TIMEOUT_S)
        b.start()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda vm: vm.wait_ssh_banner(BOOT_TIMEOUT_S), (a, b)))
        yield Pair(key, a, b, b.ssh(key, "hostname").strip(), b.host_key_fingerprint())
    finally:
        a.close()
        b.close()


@pytest.fixture
def pair(booted_pair: Pair) -> Pair:
    """The module's two VMs; alice running (every test leaves her so: she is booted again here only after a test
    failed half-way), bob perhaps powered off."""
    a = booted_pair.a
    if a.proc is None or a.proc.poll() is not None:
        a.start()
        a.wait_ssh_banner(BOOT_TIMEOUT_S)
    return booted_pair


def test_ssh_with_injected_key_reports_config_disk_hostname(pair: Pair) -> None:
    assert pair.a.ssh(pair.key, "hostname").strip() == "alice"
    assert pair.b_hostname == "bob"


def test_password_login_is_refused(pair: Pair) -> None:
    out = subprocess.run(["ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                          "-o", "BatchMode=yes", "-o", "PreferredAuthentications=password,keyboard-interactive",
                          "-p", str(pair.a.port), "root@127.0.0.1", "true"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 255
    assert "Permission denied" in out.stderr


def test_guest_network_is_configured_from_config_disk(pair: Pair) -> None:
    out = pair.a.ssh(pair.key, "ip -4 -o addr show dev eth0; ip -4 route show default; cat /etc/resolv.conf")
    assert "10.0.2.15/24" in out
    assert "default via 10.0.2.2" in out
    assert "nameserver 10.0.2.3" in out


def test_the_units_a_vm_does_not_use_are_masked_and_no_unit_failed(pair: Pair) -> None:
    """The role's guest_image_masked_units are masked in the booted guest, getty@tty1 (no display) and
    systemd-pstore do not run, and the boot left no failed unit (nothing needed what was masked)."""
    masked = yaml.safe_load(ROLE_DEFAULTS.read_text())["guest_image_masked_units"]
    out = pair.a.ssh(pair.key, f"systemctl is-enabled {' '.join(masked)}; echo ==; systemctl is-active"
                               " getty@tty1.service systemd-pstore.service; echo ==;"
                               " systemctl list-units --failed --plain --no-legend")
    enabled, active, failed = (part.split() for part in out.split("=="))
    assert enabled == ["masked"] * len(masked), out
    assert active == ["inactive", "inactive"], out
    assert failed == [], out


def test_two_vms_from_one_image_have_different_host_keys(pair: Pair) -> None:
    alice = pair.a.host_key_fingerprint()
    assert alice.startswith("SHA256:") and pair.b_fingerprint.startswith("SHA256:")
    assert alice != pair.b_fingerprint


def test_qmp_system_powerdown_stops_qemu_cleanly(pair: Pair) -> None:
    """ACPI power button (needs dbus + logind in the guest) -> poweroff -> QEMU exits 0 within the bound."""
    assert pair.b.proc is not None and pair.b.proc.poll() is None, "bob is running (no other test stops him)"
    assert "return" in pair.b.qmp("system_powerdown")
    assert pair.b.wait_exit(POWERDOWN_BOUND_S) == 0
    assert "reboot: Power down" in pair.b.serial_log.read_text(errors="replace")


def test_guest_reboot_exits_qemu_and_next_boot_keeps_host_key(pair: Pair) -> None:
    """A guest reboot makes QEMU (-no-reboot) exit; booting the same VM again (same instance-id) keeps its key."""
    before = pair.a.host_key_fingerprint()
    subprocess.run(["ssh", "-i", str(pair.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                    "-o", "BatchMode=yes", "-p", str(pair.a.port), "root@127.0.0.1", "systemctl reboot"],
                   capture_output=True, timeout=60, check=False)
    assert pair.a.wait_exit(POWERDOWN_BOUND_S) == 0
    pair.a.start()  # left running: the other tests need alice up
    pair.a.wait_ssh_banner(BOOT_TIMEOUT_S)
    assert pair.a.host_key_fingerprint() == before
    assert pair.a.ssh(pair.key, "hostname").strip() == "alice"
