"""The issue-10 journey with a real guest on RBD: QEMU (TCG) opens the root disk through librbd via the launcher
(``rootDisk.rbd``); the tiny busybox guest of tests/integration/launcher writes and reads its /dev/vda.

Write in the guest, stop, full backup, start, change, stop, incremental backup; restore each into a new image and
read the content back from a guest booted on the restored image. While the guest runs, QEMU is a real watcher:
backup and delete are refused naming it (case V2).
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_io as bio
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd import ImageRef
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.rbd_volume_module import VolumeRefused, run_volume

from tests.integration.launcher import busybox_guest as bg
from tests.integration.launcher.harness import Launched, base_config, free_port

pytestmark = [pytest.mark.ceph, pytest.mark.guest, pytest.mark.slow]
RBD_VMM_ID = 1610612821


def volume_params(name: str, **kw):
    base = {"pool": "rbd", "name": name, "state": "present", "size_mib": None, "allow_shrink": False,
            "clone_from": None, "snapshot": None, "snapshot_state": "present", "owner": None, "claimed_by": None,
            "release_claim": False, "purge_snapshots": False}
    base.update(kw)
    return base


class Guest:
    """Boots the busybox guest on an RBD image through the real launcher."""

    def __init__(self, ceph_cluster, root: Path):
        self.ceph = ceph_cluster
        self.root = root
        self.kernel, _ = bg.kernel()
        self.initrd = bg.build_initrd()
        self.running: list[Launched] = []

    def boot(self, image: str, boot_id: int) -> tuple[Launched, int]:
        work = self.root / f"{len(self.running)}"
        work.mkdir(parents=True)
        port = free_port()
        cfg = base_config(work, "rbdvm", kernel=self.kernel, initrd=self.initrd, disk="/unused",
                          cmdline="console=ttyS0 panic=-1 quiet zjtest.acpi=1", port=port, boot_id=boot_id)
        cfg["rootDisk"] = {"rbd": {"pool": "rbd", "image": image, "conf": str(self.ceph.conf), "user": "admin",
                                   "keyringPath": str(self.ceph.keyring)}, "cache": "Writeback"}
        # sandboxed as the host backend runs it: librbd connects while QEMU is root, then QEMU drops to this
        # uid (which cannot read the keyring) and keeps doing I/O through librbd (docs/security.md)
        cfg["hypervisor"]["runAs"] = {"uid": RBD_VMM_ID, "gid": RBD_VMM_ID}
        vm = Launched(cfg, work)
        self.running.append(vm)
        vm.wait_ready(timeout=600)
        status = dict(line.split(":", 1) for line in Path(f"/proc/{vm.vmm_pid()}/status").read_text().splitlines())
        assert status["Uid"].split() == [str(RBD_VMM_ID)] * 4 and status["Seccomp"].strip() == "2", status["Uid"]
        return vm, port

    def stop(self, vm: Launched) -> dict:
        vm.signal(signal.SIGTERM)
        _rc, result = vm.wait(timeout=300)
        assert result is not None, vm.log_tail()
        return result

    def cleanup(self) -> None:
        for vm in self.running:
            vm.kill()


@pytest.fixture
def guest(ceph_cluster):
    root = Path(tempfile.mkdtemp(prefix="zrg-"))  # short: the launcher's socket paths must fit 107 bytes
    g = Guest(ceph_cluster, root)
    try:
        yield g
    finally:
        g.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def test_guest_on_rbd_backup_full_and_incremental_then_restore_into_new_images(rbd, guest, image_name, tmp_path):
    dest = str(tmp_path / "backups")
    ref = ImageRef("rbd", image_name)
    run_volume(volume_params(image_name, size_mib=8, owner="alice", claimed_by="uid-alice"), rbd)

    vm, port = guest.boot(image_name, 1)
    assert bg.guest_command(port, "write original-content").strip() == "written"
    # QEMU holds the image open through librbd: a real watcher (case V2)
    watchers = rbd.status(ref)
    assert len(watchers) == 1
    named = f"{watchers[0]['address']} (client.{watchers[0]['client']})"
    with pytest.raises(bio.BackupError, match=named.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        bio.backup(rbd, ref, dest, vm="alice")
    with pytest.raises(VolumeRefused, match="has watchers"):
        run_volume(volume_params(image_name, state="absent", release_claim=True, claimed_by="uid-alice"), rbd)
    assert guest.stop(vm)["reason"] == "StopRequested"
    assert rbd.status(ref) == []

    full = bio.backup(rbd, ref, dest, vm="alice")
    assert full["plan"]["type"] == "full" and full["backup"]["owner"] == "alice"

    vm, port = guest.boot(image_name, 2)  # the source VM still starts after a backup
    assert bg.guest_command(port, "read").strip() == "original-content"
    assert bg.guest_command(port, "write changed-content").strip() == "written"
    guest.stop(vm)
    inc = bio.backup(rbd, ref, dest, vm="alice")
    assert inc["plan"]["type"] == "diff" and inc["backup"]["dataBytes"] == 4 * 1024 * 1024

    for backup, new, want in ((full, "r-full", "original-content"), (inc, "r-inc", "changed-content")):
        target = ImageRef("rbd", f"{image_name}-{new}")
        res = bio.restore(rbd, dest, target, backup["backup"]["id"])
        assert res["verified_blocks"] == 2
        assert rbd.meta(target).get("cloud.zjusct.io/claimed-by") is None  # a restore claims nothing
        vm, port = guest.boot(target.image, 1)
        assert bg.guest_command(port, "read").strip() == want
        guest.stop(vm)
