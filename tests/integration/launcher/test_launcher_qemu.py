"""The launcher with real QEMU/TCG guests (a busybox initrd guest; see busybox_guest.py).

To keep CI time low every guest of this module boots at once (module fixture ``fleet``); each test then drives
its own VM. Each test names the behaviour and checks the result document, the exit code and what is left behind
(runtime files, processes, the lock).
"""

from __future__ import annotations

import glob
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import wait_for
from tests.conftest import require
from tests.integration.launcher import busybox_guest as bg
from tests.integration.launcher.harness import (
    LAUNCHER_DIR,
    PYTHON,
    Launched,
    base_config,
    free_port,
    leftovers,
    wait_dead,
)

pytestmark = [pytest.mark.guest, pytest.mark.slow]

BASE_CMDLINE = "console=ttyS0 panic=-1 quiet"
# name -> (extra cmdline, config overrides)
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "stop": ("zjtest.acpi=1", {}),
    "poweroff": ("", {"hypervisor": {"type": "qemu", "accel": "auto", "allowTCG": True,
                                     "kvmProbeTimeoutSeconds": 5, "tcgTranslationCacheMiB": 32}}),
    "reboot": ("", {}),
    "ignore": ("", {"stopTimeoutSeconds": 5}),
    "latepower": ("", {"stopTimeoutSeconds": 300, "stopRetryIntervalSeconds": 1}),
    "crash": ("", {}),
    "panic": ("", {}),
    "panicserial": ("zjtest.nopvpanic=1", {}),
    "orphan": ("", {}),
    "noready": ("zjtest.nossh=1 zjtest.acpi=1", {"readiness": {"timeoutSeconds": 45}, "stopTimeoutSeconds": 60}),
    "grow": ("zjtest.acpi=1", {"rootDisk": {"sizeMiB": 12}}),  # merged into the rootDisk of the 4 MiB disk
    # its socketPath is made a path in the fleet's own consoles directory (Fleet.consoles)
    "console": ("zjtest.acpi=1 zjtest.console=1", {"serialConsole": {"uid": 65534, "gid": 65534}}),
}
CONSOLE_UID = 65534  # nobody: the console's owner in scenario "console"


class Fleet:
    def __init__(self, root: Path):
        self.root = root
        self.kernel, _ = bg.kernel()
        self.initrd = bg.build_initrd()
        self.vms: dict[str, Launched] = {}
        self.ports: dict[str, int] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        # root's, writable by root alone, outside pytest's 0700 temporary root: others pass through it to a socket
        # of their own
        self.consoles = Path(tempfile.mkdtemp(dir="/run", prefix="zjc-consoles-"))
        self.consoles.chmod(0o711)

    def config(self, name: str, extra_cmdline: str, overrides: dict[str, Any], boot_id: int = 1) -> dict[str, Any]:
        work = self.root / name
        work.mkdir(exist_ok=True)
        disk = work / "disk.raw"
        if not disk.exists():
            bg.make_disk(str(disk))
        port = self.ports.setdefault(name, free_port())
        cfg = base_config(work, f"bb-{name}", kernel=self.kernel, initrd=self.initrd, disk=str(disk),
                          cmdline=f"{BASE_CMDLINE} {extra_cmdline}".strip(), port=port, boot_id=boot_id)
        overrides = dict(overrides)
        cfg["rootDisk"].update(overrides.pop("rootDisk", {}))
        if "serialConsole" in overrides:
            overrides["serialConsole"] = dict(overrides["serialConsole"],
                                              socketPath=str(self.consoles / f"{name}.sock"))
        cfg.update(overrides)
        return cfg

    def start(self, name: str, boot_id: int = 1) -> Launched:
        extra, overrides = SCENARIOS[name]
        cfg = self.config(name, extra, overrides, boot_id)
        self.configs[name] = cfg
        vm = Launched(cfg, self.root / name)
        self.vms[f"{name}#{boot_id}"] = vm
        return vm

    def vm(self, name: str, boot_id: int = 1) -> Launched:
        return self.vms[f"{name}#{boot_id}"]

    def teardown(self) -> None:
        for vm in self.vms.values():
            vm.kill()
        shutil.rmtree(self.consoles, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require("guest", shutil.which("qemu-system-x86_64") is not None, "qemu-system-x86_64 not installed"
            " (qemu-system-x86, hack/install-deps.sh)")
    require("guest", shutil.which("busybox") is not None,
            "busybox not installed (busybox-static, hack/install-deps.sh)")
    require("guest", bool(glob.glob("/boot/vmlinuz-*")), "no /boot/vmlinuz-* (linux-image-amd64, hack/install-deps.sh)")
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        for name in SCENARIOS:
            f.start(name)
        yield f
    finally:
        f.teardown()


def assert_clean(vm: Launched, vmm_pid: int | None) -> None:
    """Case L6: no process, socket, pid file or ready marker is left; the lock is free."""
    from zjusct_launcher import lock

    assert leftovers(vm.runtime_dir) == [], f"left in runtimeDir: {leftovers(vm.runtime_dir)}"
    if vmm_pid is not None:
        assert wait_dead(vmm_pid, 10), f"VMM {vmm_pid} still alive"
    assert not lock.is_held(str(vm.runtime_dir / "launcher.lock"))


def finish(vm: Launched, timeout: float = 300) -> tuple[int, dict[str, Any]]:
    rc, result = vm.wait(timeout)
    assert result is not None, f"no result written (rc {rc}):\n{vm.log_tail()}"
    assert result["exitCode"] == rc
    return rc, result


def test_boot_to_ssh_banner_then_sigterm_is_stop_requested(fleet: Fleet) -> None:
    vm = fleet.vm("stop")
    ready = vm.wait_ready()
    assert ready["banner"].startswith("SSH-2.0-zjtest bb-stop"), "hostname from the config disk reached the guest"
    ident = bg.guest_command(fleet.ports["stop"], "identity")
    assert f"== instance-id\n{vm.cfg['identity']['instanceID']}\n" in ident
    assert "IPV4=10.0.2.15/24" in ident and "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyOnly" in ident
    pid = vm.vmm_pid()
    vm.signal(signal.SIGTERM)
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (0, "StopRequested"), result
    assert result["readyAt"] is not None and result["hypervisorExitStatus"] == 0
    assert_clean(vm, pid)


def test_guest_poweroff_is_guest_shutdown_with_accel_auto_fallback(fleet: Fleet) -> None:
    vm = fleet.vm("poweroff")
    vm.wait_ready()
    probe = [line for line in vm.log_lines() if line.get("msg") == "kvm probe"]
    assert probe, "accel auto ran the bounded KVM probe"
    pid = vm.vmm_pid()
    bg.guest_command(fleet.ports["poweroff"], "poweroff")
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (0, "GuestShutdown"), result
    assert_clean(vm, pid)


def test_guest_reboot_ends_the_run_as_guest_reboot(fleet: Fleet) -> None:
    vm = fleet.vm("reboot")
    vm.wait_ready()
    pid = vm.vmm_pid()
    bg.guest_command(fleet.ports["reboot"], "reboot")
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (0, "GuestReboot"), result
    assert_clean(vm, pid)


def test_case_L4_guest_ignoring_power_button_is_killed_after_stop_timeout(fleet: Fleet) -> None:
    vm = fleet.vm("ignore")
    vm.wait_ready()
    pid = vm.vmm_pid()
    sent = time.time()
    vm.signal(signal.SIGTERM)
    rc, result = finish(vm, timeout=5 + 120)
    assert (rc, result["reason"]) == (1, "StopTimeoutKilled"), result
    assert result["hypervisorExitStatus"] == 128 + signal.SIGKILL
    assert time.time() - sent < 5 + 120, "ended within the stop timeout plus a generous margin"
    assert_clean(vm, pid)


def test_a_power_button_the_guest_missed_is_pressed_again_until_it_shuts_down(fleet: Fleet) -> None:
    """A stop that reaches a guest before its init handles the power button (as one right after a start): the
    launcher repeats the request every stopRetryIntervalSeconds, and once the guest listens it powers off
    gracefully, long before the stop timeout (a single request would end in StopTimeoutKilled)."""
    vm = fleet.vm("latepower")
    vm.wait_ready()
    pid = vm.vmm_pid()
    vm.signal(signal.SIGTERM)
    wait_for(lambda: sum(1 for line in vm.log_lines() if line.get("msg") == "graceful stop sent") >= 2,
             timeout=120, what="the graceful stop request repeated while the guest ignores it")
    assert vm.proc.poll() is None, "the guest (no acpid yet) ignored the requests so far"
    assert "acpid running" in bg.guest_command(fleet.ports["latepower"], "acpid")
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (0, "StopRequested"), result
    sent = [line for line in vm.log_lines() if line.get("msg") == "graceful stop sent"]
    assert [line["attempt"] for line in sent] == list(range(1, len(sent) + 1)), sent
    assert not any(line.get("msg") == "stop timeout passed; killing the VMM" for line in vm.log_lines())
    assert_clean(vm, pid)


def test_kill9_of_qemu_is_hypervisor_crashed_second_launcher_refused_and_synced_data_survives(
        fleet: Fleet) -> None:
    vm = fleet.vm("crash")
    vm.wait_ready()
    port = fleet.ports["crash"]
    assert "written" in bg.guest_command(port, "write zjusct-durable-1234")
    # A second launcher for the same runtimeDir exits 3 and touches no result (its own or the first's).
    second_cfg = json.loads(vm.config_path.read_text())
    second_cfg["result"]["path"] = str(vm.workdir / "second-result.json")
    second = Launched(second_cfg, vm.workdir, tag="-second")
    rc2, res2 = second.wait(60)
    assert rc2 == 3 and res2 is None and not vm.result_path.exists()
    assert any(line.get("reason") == "AlreadyRunning" for line in second.log_lines())
    pid = vm.vmm_pid()
    os.kill(pid, signal.SIGKILL)
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (1, "HypervisorCrashed"), result
    assert result["hypervisorExitStatus"] == 128 + signal.SIGKILL
    assert_clean(vm, pid)
    # A new boot (bootID 2) of the same disk reads what the guest wrote and synced before the kill.
    vm2 = fleet.start("crash", boot_id=2)
    vm2.wait_ready()
    assert bg.guest_command(port, "read").strip() == "zjusct-durable-1234"
    pid2 = vm2.vmm_pid()
    bg.guest_command(port, "poweroff")
    rc, result = finish(vm2)
    assert (rc, result["reason"], result["bootID"]) == (0, "GuestShutdown", 2)
    assert json.loads(vm.result_path.read_text())["reason"] == "HypervisorCrashed", "boot 1's result is kept"
    assert_clean(vm2, pid2)


def test_guest_kernel_panic_with_pvpanic_is_guest_panic(fleet: Fleet) -> None:
    vm = fleet.vm("panic")
    vm.wait_ready()
    pid = vm.vmm_pid()
    bg.guest_command(fleet.ports["panic"], "panic", timeout=5)
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (1, "GuestPanic"), result
    assert "pvpanic" in result["message"]
    assert_clean(vm, pid)


def test_guest_kernel_panic_without_pvpanic_is_seen_on_the_serial_console(fleet: Fleet) -> None:
    vm = fleet.vm("panicserial")
    vm.wait_ready()
    pid = vm.vmm_pid()
    bg.guest_command(fleet.ports["panicserial"], "panic", timeout=5)
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (1, "GuestPanic"), result
    assert "serial console" in result["message"]
    assert_clean(vm, pid)


def test_case_L2_killed_launcher_takes_its_vmm_along_and_leaves_no_result(fleet: Fleet) -> None:
    from zjusct_launcher import lock

    vm = fleet.vm("orphan")
    vm.wait_ready()
    pid = vm.vmm_pid()
    assert lock.is_held(str(vm.runtime_dir / "launcher.lock"))
    vm.proc.kill()
    vm.proc.wait(30)
    assert wait_dead(pid, 30), "PR_SET_PDEATHSIG killed the VMM"
    # The VMM's last threads may still be exiting (and holding the inherited lock) for a moment.
    deadline = time.monotonic() + 30
    while lock.is_held(str(vm.runtime_dir / "launcher.lock")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not lock.is_held(str(vm.runtime_dir / "launcher.lock")), "lock free: nothing of this VM runs"
    assert not vm.result_path.exists(), "lock free and no result = the launcher vanished"


def test_readiness_timeout_stops_the_guest_with_reason_readiness_timeout(fleet: Fleet) -> None:
    vm = fleet.vm("noready")
    rc, result = finish(vm, timeout=400)
    assert (rc, result["reason"]) == (1, "ReadinessTimeout"), result
    assert result["readyAt"] is None
    assert_clean(vm, None)


# -- fast paths (no guest boots) ----------------------------------------------------------------------------------


def _fast_config(tmp_path: Path) -> dict[str, Any]:
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"not really a kernel")
    disk = tmp_path / "disk.raw"
    disk.write_bytes(b"\0" * 4096)
    return base_config(tmp_path, "fast", kernel=str(kernel), initrd=str(kernel), disk=str(disk),
                       cmdline="console=ttyS0")


@pytest.mark.guest
def test_invalid_config_is_config_invalid_exit_2_and_creates_nothing(tmp_path: Path) -> None:
    cfg = _fast_config(tmp_path)
    cfg["machine"]["memoryMiB"] = 8192
    cfg["network"] = {"mode": "tap", "tap": "this-name-is-too-long", "mac": "01:00:5e:00:00:01"}
    vm = Launched(cfg, tmp_path)
    rc, result = vm.wait(60)
    assert rc == 2 and result is not None and result["reason"] == "ConfigInvalid"
    for needle in ("machine.memoryMiB: 8192 is above the maximum 4096", "network.tap:", "network.mac:",
                   "readiness: is required"):
        assert needle in result["message"], result["message"]
    assert not vm.runtime_dir.exists(), "nothing created"
    assert not Path(cfg["serialLogPath"]).exists()


@pytest.mark.guest
def test_missing_hypervisor_binary_is_hypervisor_missing_and_leaves_nothing(tmp_path: Path) -> None:
    cfg = _fast_config(tmp_path)
    cfg["hypervisor"] = {"type": "qemu", "accel": "tcg", "binary": str(tmp_path / "no-such-qemu")}
    vm = Launched(cfg, tmp_path)
    rc, result = vm.wait(60)
    assert rc == 1 and result is not None and result["reason"] == "HypervisorMissing", result
    assert "no-such-qemu" in result["message"]
    assert leftovers(vm.runtime_dir) == []


@pytest.mark.guest
def test_firecracker_missing_is_reported_by_check_and_run(tmp_path: Path) -> None:
    cfg = _fast_config(tmp_path)
    (tmp_path / "vmlinux").write_bytes(b"\x7fELF" + b"\0" * 60)
    cfg["boot"]["kernel"] = str(tmp_path / "vmlinux")
    cfg["hypervisor"] = {"type": "firecracker", "accel": "kvm"}
    path = tmp_path / "fc.json"
    path.write_text(json.dumps(cfg))
    no_binaries = tmp_path / "empty-bin"  # a PATH without firecracker, whatever the host has installed
    no_binaries.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3] / "launcher"), PATH=str(no_binaries))
    check = subprocess.run([PYTHON, "-m", "zjusct_launcher", "check", "--config", str(path)], env=env,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "HypervisorMissing" in check.stdout, check.stdout
    run = subprocess.run([PYTHON, "-m", "zjusct_launcher", "run", "--config", str(path)], env=env,
                         capture_output=True, text=True, timeout=60)
    result = json.loads(Path(cfg["result"]["path"]).read_text())
    assert run.returncode == 1 and result["reason"] == "HypervisorMissing"
    assert "firecracker not found" in result["message"]



def test_a_root_disk_smaller_than_its_size_is_grown_before_the_guest_runs(fleet: Fleet) -> None:
    """rootDisk.sizeMiB 12 on a 4 MiB disk: QEMU starts paused, the launcher block_resizes the root node over QMP,
    then resumes it, so the guest's virtio-blk driver finds a 12 MiB /dev/vda at its first probe; the file grew (a
    sparse extension). The stop is the usual one."""
    vm = fleet.vm("grow")
    vm.wait_ready()
    sectors = bg.guest_command(fleet.ports["grow"], "sh cat /sys/block/vda/size").strip()
    assert sectors.splitlines()[-1] == str(12 * 2048), sectors
    assert (fleet.root / "grow" / "disk.raw").stat().st_size == 12 * 1024 * 1024
    grown = [line for line in vm.log_lines() if line.get("msg") == "root disk grown"]
    assert grown and (grown[0]["from_mib"], grown[0]["to_mib"]) == (4, 12), vm.log_tail()
    pid = vm.vmm_pid()
    vm.signal(signal.SIGTERM)
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (0, "StopRequested"), result
    assert_clean(vm, pid)


def _read_until(proc: subprocess.Popen[bytes], marker: bytes, timeout: float) -> bytes:
    """What ``proc`` wrote on stdout until ``marker`` appeared (AssertionError with what came, after ``timeout``)."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout} s; saw {seen[-2000:]!r}"
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if readable:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"stdout ended before {marker!r}; saw {seen[-2000:]!r}"
            seen += chunk
    return seen


def _connect_as(uid: int, path: str) -> str:
    """Connect to the unix socket ``path`` as ``uid`` (Debian's python3: root's interpreter is not others' to run)."""
    probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect(sys.argv[1]); print('connected')"
             "\nexcept OSError as e:\n print('refused', e.strerror)\n")
    out = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-c",
                          probe, path], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_the_serial_console_is_its_owners_socket_one_session_at_a_time_and_still_logged(fleet: Fleet) -> None:
    """serialConsole: QEMU's console socket is handed to its owner (uid 65534, 0600) while the guest runs; another
    uid cannot connect; ``zjusct-launcher console`` relays a session (a shell command typed, its output read back),
    a second session is refused with a message while the first lasts, Ctrl-] detaches; the serial log still gets
    everything; the socket goes with the run."""
    vm = fleet.vm("console")
    vm.wait_ready()
    path = vm.cfg["serialConsole"]["socketPath"]
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode) and (st.st_uid, st.st_gid) == (CONSOLE_UID, CONSOLE_UID), st
    assert st.st_mode & 0o777 == 0o600, oct(st.st_mode)
    assert _connect_as(CONSOLE_UID + 1, path).startswith("refused Permission denied")
    assert _connect_as(CONSOLE_UID, path) == "connected"
    env = dict(os.environ, PYTHONPATH=str(LAUNCHER_DIR))
    argv = [PYTHON, "-m", "zjusct_launcher", "console", "--socket", path, "--label", "test/bb-console"]
    first = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert first.stdin is not None
        first.stdin.write(b"echo con$((6*7))sole\n")
        first.stdin.flush()
        _read_until(first, b"con42sole", 120)
        second = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                                env=env, check=False)
        assert second.returncode == 1, second
        assert "test/bb-console is in use by another session (one at a time)" in second.stderr, second
        first.stdin.write(b"\x1d")
        first.stdin.flush()
        assert first.wait(timeout=60) == 0
        assert first.stderr is not None and b"detached (test/bb-console)" in first.stderr.read()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert "con42sole" in Path(vm.cfg["serialLogPath"]).read_text(errors="replace")
    pid = vm.vmm_pid()
    vm.signal(signal.SIGTERM)
    rc, result = finish(vm)
    assert (rc, result["reason"]) == (0, "StopRequested"), result
    assert not os.path.lexists(path), "the console socket outlived its run"
    assert_clean(vm, pid)
