"""The guest sandbox with a real QEMU guest: the VMM drops to hypervisor.runAs under seccomp, the guest still
boots and answers over a TAP owned by that uid, the VMM's credentials cannot open another VM's volume (nor its
own by path), and a SIGKILLed launcher still takes its unprivileged VMM along (the watchdog; PR_SET_PDEATHSIG is
cleared by the VMM's uid change)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.launcher import busybox_guest as bg
from tests.integration.launcher.harness import (
    Launched,
    base_config,
    bridged_netns,
    free_port,
    ip,
    leftovers,
    wait_dead,
)

pytestmark = [pytest.mark.guest, pytest.mark.slow]
VMM_ID = 1610612801  # inside the host backend's default range (vmm_uid_base 0x60000000), no passwd entry



def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def open_as(creds: dict[str, str], path: str, flags: str) -> int:
    """errno (0 = success) of open(path, flags) by a process with the VMM's uid, gid and groups as /proc shows
    them (the kernel's permission checks look at these credentials only)."""
    uid, gid = creds["Uid"].split()[1], creds["Gid"].split()[1]
    groups = ",".join(creds["Groups"].split()) or gid
    code = f"import os,sys\ntry:\n os.close(os.open(sys.argv[1], {flags}))\nexcept OSError as e:\n sys.exit(e.errno)"
    run = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={groups}",
                          "/usr/bin/python3", "-c", code, path], capture_output=True, text=True, timeout=30)
    return run.returncode


@pytest.fixture
def volumes() -> Iterator[Path]:
    """Two VMs' volumes as the hypervisor role keeps them: root-owned 0600 files. The directory is 0755 here so
    that the check below is about the files themselves (the role's volumes directory is 0700 on top)."""
    root = Path(tempfile.mkdtemp(prefix="zjvol", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def netns() -> Iterator[str]:
    with bridged_netns(f"zjsb{os.getpid()}", "10.78.0.1/24") as name:
        yield name


@pytest.mark.netns
def test_vmm_runs_unprivileged_under_seccomp_boots_over_its_tap_and_cannot_open_other_volumes(
        netns: str, volumes: Path, tmp_path: Path) -> None:
    kernel, _ = bg.kernel()
    mine = bg.make_disk(str(volumes / "mine.raw"))
    other = bg.make_disk(str(volumes / "other.raw"))
    for disk in (mine, other):
        os.chmod(disk, 0o600)
    cfg = base_config(tmp_path, "bb-sandbox", kernel=kernel, initrd=bg.build_initrd(), disk=mine,
                      cmdline="console=ttyS0 panic=-1 quiet zjtest.acpi=1")
    cfg["network"] = {"mode": "tap", "tap": "zjsbtap0", "createTap": True, "bridge": "zjbr0",
                      "mac": "52:54:00:aa:bc:01", "ipv4": "10.78.0.5/24", "gateway": "10.78.0.1"}
    cfg["readiness"] = {"timeoutSeconds": 400}
    cfg["hypervisor"]["runAs"] = {"uid": VMM_ID, "gid": VMM_ID}
    vm = Launched(cfg, tmp_path, netns=netns)
    try:
        ready = vm.wait_ready()
        assert ready["banner"].startswith("SSH-2.0-zjtest bb-sandbox"), "the guest answers over its TAP"
        pid = vm.vmm_pid()
        st = status(pid)
        assert st["Uid"].split() == [str(VMM_ID)] * 4 and st["Gid"].split() == [str(VMM_ID)] * 4, st
        assert st["Groups"].split() == [str(VMM_ID)], "root's supplementary groups dropped"
        assert (st["Seccomp"], st["NoNewPrivs"]) == ("2", "1"), st
        assert st["CapEff"] == "0000000000000000", st
        link = json.loads(ip("-n", netns, "-d", "-j", "link", "show", "zjsbtap0").stdout)[0]
        assert (link["linkinfo"]["info_data"].get("user"), link["linkinfo"]["info_data"].get("group")) == \
            (VMM_ID, VMM_ID), "TAP created for the VMM's uid/gid"
        assert open_as(st, other, "os.O_RDWR") == errno.EACCES, "another VM's volume"
        assert open_as(st, other, "os.O_RDONLY") == errno.EACCES
        assert open_as(st, mine, "os.O_RDWR") == errno.EACCES, "even its own volume by path: only the open fd"
        assert open_as(st, f"/proc/{pid}/fd/0", "os.O_RDONLY") == errno.EACCES, \
            "a VMM's fds are out of reach of its own uid (not dumpable after the drop)"
        vm.signal(signal.SIGTERM)
        rc, result = vm.wait(300)
        assert result is not None and (rc, result["reason"]) == (0, "StopRequested"), result
        assert wait_dead(pid, 10)
        assert ip("-n", netns, "link", "show", "zjsbtap0", check=False).returncode != 0, "TAP removed"
        assert leftovers(vm.runtime_dir) == []
        assert (os.stat(mine).st_uid, os.stat(mine).st_mode & 0o777) == (0, 0o600), "volume left as it was"
    finally:
        vm.kill()
        ip("-n", netns, "link", "del", "zjsbtap0", check=False)


def test_killed_launcher_takes_its_unprivileged_vmm_along(tmp_path: Path) -> None:
    """Case L2 under runAs: the VMM's uid change cleared its PR_SET_PDEATHSIG; the watchdog kills it."""
    from zjusct_launcher import lock

    kernel, _ = bg.kernel()
    disk = bg.make_disk(str(tmp_path / "disk.raw"))
    cfg = base_config(tmp_path, "bb-orphan-ro", kernel=kernel, initrd=bg.build_initrd(), disk=disk,
                      cmdline="console=ttyS0 panic=-1 quiet", port=free_port())
    cfg["hypervisor"]["runAs"] = {"uid": VMM_ID + 1, "gid": VMM_ID + 1}
    vm = Launched(cfg, tmp_path)
    try:
        vm.wait_ready()
        pid = vm.vmm_pid()
        assert status(pid)["Uid"].split()[0] == str(VMM_ID + 1)
        vm.proc.kill()
        vm.proc.wait(30)
        assert wait_dead(pid, 30), "the unprivileged VMM outlived its SIGKILLed launcher"
        deadline = time.monotonic() + 30
        while lock.is_held(str(vm.runtime_dir / "launcher.lock")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not lock.is_held(str(vm.runtime_dir / "launcher.lock")), "lock free: nothing of this VM runs"
        assert not vm.result_path.exists()
    finally:
        vm.kill()
