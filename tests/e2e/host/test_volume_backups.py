"""Backups of the embedded default's volumes end to end: the quickstart's ``file`` driver (and a restore as qcow2),
``vm_backup.yml`` and ``vm_restore.yml`` through ``ansible-playbook`` with a real guest (QEMU/TCG), on the
private host config of tests/e2e/host/conftest.py (its own volumes, store and backup directory; nothing under
/var/lib/zjusct-cloud is touched).

One journey, two guest boots (boots are what costs here): alice writes a file in her VM (a ``file`` volume); the
backup of the running VM is refused, then ``stop_if_running`` stops it and takes a full backup without starting it
again; the stopped volume is changed offline (debugfs, to save a boot) and the next backup is incremental and small
(block checksums compared). The incremental one is restored as a qcow2 volume of a new VM (another driver than the
backup's), backed up before its first boot (full: a dirty bitmap is added), booted (the second boot: the changed
file is there), written to by its guest, stopped and backed up again: incremental, reading only the blocks the real
QEMU marked in the bitmap. That backup is restored into a ``file`` volume, not booted, and read with debugfs: both
files are there. Refusals: bob can neither back up alice's VM nor receive her backup; a damaged backup is refused
naming the block and creates nothing. The audit trail holds every backup, restore and registration.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.playbook_results import failure, task_result

from .conftest import Cloud

pytestmark = [pytest.mark.guest, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(3600)]

START = "Start the VM and wait until its SSH answers"
BACKUP = "Back up the root volume (refused while it is in use)"
RESTORE = "Restore the backup into a new volume and verify every block"
CREATE = "Create the VM on the restored volume and start it"


def volume(cloud: Cloud, name: str) -> dict:
    with sqlite3.connect(cloud.config["store_path"]) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM volumes WHERE name = ?", (name,)).fetchone()
    return dict(row) if row else {}


def debugfs(image: Path, request: str, write: bool = False) -> str:
    argv = ["debugfs", *(["-w"] if write else []), "-R", request, str(image)]
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout


def file_in(path: str, fmt: str, inside: str, work: Path) -> str:
    """Read ``inside`` from the ext4 root file system of a volume file, without a guest."""
    if fmt == "raw":
        return debugfs(Path(path), f"cat {inside}")
    raw = work / "seen.raw"
    subprocess.run(["qemu-img", "convert", "-f", fmt, "-O", "raw", path, str(raw)], check=True, timeout=600)
    try:
        return debugfs(raw, f"cat {inside}")
    finally:
        raw.unlink()


def bitmaps(path: str) -> list:
    """The persistent dirty bitmaps of a qcow2 file (qemu-img info)."""
    info = json.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", path], check=True,
                                     capture_output=True, text=True, timeout=120).stdout)
    return [b["name"] for b in info.get("format-specific", {}).get("data", {}).get("bitmaps", [])]


def ssh_ok(cloud: Cloud, ip: str, command: str) -> str:
    out = cloud.ssh(ip, command, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_file_volume_backup_incremental_restore_as_file_and_qcow2_journey(cloud: Cloud, tmp_path: Path):
    backups = str(tmp_path / "backups")
    for name in ("alice", "alice-r1", "alice-r2", "alice-r3"):  # a clean slate when run again in the same cloud
        cloud.playbook("vm_delete", "owner=alice", f"name={name}", "delete_volume=true", check=False)
    vm = task_result(cloud.playbook("vm_start", "owner=alice"), START)
    assert vm["phase"] == "Running", vm
    boot = vm["boot_id"]
    ip = vm["cloudvm"]["status"]["sshEndpoint"]["host"]
    record = volume(cloud, "alice-root")
    assert record["driver"] == "file" and record["location"].endswith("/alice-root.raw")
    ssh_ok(cloud, ip, "echo original-content > /root/marker && sync")

    # a running VM is refused without stop_if_running, and nothing is written
    refused = cloud.playbook("vm_backup", "owner=alice", f"backup_dir={backups}", check=False)
    assert refused["rc"] != 0 and "stop_if_running=true" in failure(refused), failure(refused)
    assert not os.path.exists(backups)

    # stop_if_running: stopped through cloudvm, then a full backup; the VM stays stopped (never started again)
    doc = cloud.playbook("vm_backup", "owner=alice", f"backup_dir={backups}", "stop_if_running=true")
    full = task_result(doc, BACKUP)
    assert (full["type"], full["driver"], full["volume"]) == ("full", "file", "alice-root"), full
    assert full["image_size_bytes"] == os.path.getsize(record["location"])
    status = cloud.vm("alice")
    assert status["status"]["phase"] == "Stopped" and int(status["spec"]["bootID"]) == boot
    assert os.path.isdir(Path(backups) / "default_alice" / full["backup_id"])

    # change the stopped volume offline, as a boot would (debugfs: the second boot is saved for the restore)
    change = tmp_path / "marker"
    change.write_text("changed-content\n")
    debugfs(Path(record["location"]), "rm /root/marker", write=True)
    debugfs(Path(record["location"]), f"write {change} /root/marker", write=True)
    inc = task_result(cloud.playbook("vm_backup", "owner=alice", f"backup_dir={backups}"), BACKUP)
    assert inc["type"] == "diff" and inc["chain"] == [full["backup_id"], inc["backup_id"]], inc
    assert 0 < inc["data_bytes"] <= full["data_bytes"] // 10, (inc["data_bytes"], full["data_bytes"])
    assert int(cloud.vm("alice")["spec"]["bootID"]) == boot  # a backup of a stopped VM never starts it

    # ownership: bob can neither back up alice's VM nor receive her backup
    refused = cloud.playbook("vm_backup", "owner=bob", "name=alice", f"backup_dir={backups}", check=False)
    assert refused["rc"] != 0
    assert "owner: 'bob' may not act on CloudVM default/alice, which belongs to owner 'alice'" in failure(refused)
    refused = cloud.playbook("vm_restore", f"backup={inc['backup_id']}", f"backup_dir={backups}", "owner=bob",
                             check=False)
    assert refused["rc"] != 0 and "is not the owner alice of backup" in failure(refused), failure(refused)
    assert volume(cloud, "bob-restored-root") == {}

    # the incremental backup restored as a qcow2 volume (not the backup's driver) of a new VM; backed up before its
    # first boot (full, and a dirty bitmap added), it boots and shows the changed file; the guest writes a file
    doc = cloud.playbook("vm_restore", f"backup={inc['backup_id']}", f"backup_dir={backups}", "name=alice-r1",
                         "volume_driver=qcow2", "start=false")
    restored = task_result(doc, RESTORE)
    assert (restored["driver"], restored["backup_id"]) == ("qcow2", inc["backup_id"]), restored
    assert restored["verified_blocks"] == full["image_size_bytes"] // (4 * 1024 * 1024)
    r1_volume = volume(cloud, "alice-r1-root")
    assert (r1_volume["driver"], r1_volume["owner"]) == ("qcow2", "alice")
    assert r1_volume["location"].endswith("/alice-r1-root.qcow2")
    r1_full = task_result(cloud.playbook("vm_backup", "owner=alice", "name=alice-r1", f"backup_dir={backups}"),
                          BACKUP)
    assert (r1_full["type"], r1_full["driver"]) == ("full", "qcow2"), r1_full
    assert bitmaps(r1_volume["location"]) == [r1_full["snapshot"]]
    r1 = task_result(cloud.playbook("vm_start", "owner=alice", "name=alice-r1"), START)
    assert r1["phase"] == "Running" and r1["cloudvm"]["spec"]["owner"] == "alice"
    r1_ip = r1["cloudvm"]["status"]["sshEndpoint"]["host"]
    assert ssh_ok(cloud, r1_ip, "cat /root/marker").strip() == "changed-content"
    ssh_ok(cloud, r1_ip, "echo written-on-qcow2 > /root/marker2 && sync")

    # stopped and backed up again: incremental, only the blocks QEMU's dirty bitmap marks are read
    doc = cloud.playbook("vm_backup", "owner=alice", "name=alice-r1", f"backup_dir={backups}", "stop_if_running=true")
    r1_inc = task_result(doc, BACKUP)
    assert r1_inc["type"] == "diff" and "dirty bitmap marks" in r1_inc["reason"], r1_inc
    all_blocks = r1_full["image_size_bytes"] // (4 * 1024 * 1024)
    assert 0 < r1_inc["read_blocks"] < all_blocks // 2, (r1_inc["read_blocks"], all_blocks)
    assert bitmaps(r1_volume["location"]) == [r1_inc["snapshot"]]  # the previous base is removed

    # that incremental restored into the host's driver (file), not booted: both files are there
    doc = cloud.playbook("vm_restore", f"backup={r1_inc['backup_id']}", f"backup_dir={backups}", "name=alice-r2",
                         "start=false")
    assert task_result(doc, CREATE)["phase"] == "Stopped"
    r2_volume = volume(cloud, "alice-r2-root")
    assert r2_volume["driver"] == "file" and r2_volume["location"].endswith("/alice-r2-root.raw")
    assert file_in(r2_volume["location"], "raw", "/root/marker", tmp_path).strip() == "changed-content"
    assert file_in(r2_volume["location"], "raw", "/root/marker2", tmp_path).strip() == "written-on-qcow2"

    # a damaged backup: the restore names the damaged block and creates nothing
    data = Path(backups) / "default_alice" / full["backup_id"] / "data.rbdiff"
    with open(data, "r+b") as fh:
        fh.seek(data.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    bad = cloud.playbook("vm_restore", f"backup={inc['backup_id']}", f"backup_dir={backups}", "name=alice-r3",
                         check=False)
    assert bad["rc"] != 0 and "block" in failure(bad), failure(bad)
    assert volume(cloud, "alice-r3-root") == {} and cloud.vm("alice-r3") == {}
    assert not [p for p in Path(cloud.config["volumes_dir"]).iterdir() if p.name.startswith("alice-r3")]

    # the audit trail: every backup, restore and registration that reached the module, refusals included
    doc = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-m", "zjusct.cloud.audit_info", "-a",
         json.dumps({"owner": "alice"})], cwd=Path(__file__).resolve().parents[3], env=cloud.env(), check=True,
        capture_output=True, text=True, timeout=300).stdout)
    records = [(r["action"], r["subject"], r["result"])
               for r in doc["plays"][0]["tasks"][0]["hosts"]["localhost"]["records"]
               if r["action"] in ("backup", "restore", "volume-register")]
    assert records[-10:] == [
        ("backup", "volume/alice-root", "succeeded"),
        ("backup", "volume/alice-root", "succeeded"),
        ("backup", "default/alice", "refused"),  # bob's, refused by the playbook's lookup
        ("restore", "volume/alice-r1-root", "succeeded"),
        ("volume-register", "volume/alice-r1-root", "succeeded"),
        ("backup", "volume/alice-r1-root", "succeeded"),
        ("backup", "volume/alice-r1-root", "succeeded"),
        ("restore", "volume/alice-r2-root", "succeeded"),
        ("volume-register", "volume/alice-r2-root", "succeeded"),
        ("restore", "volume/alice-r3-root", "failed"),
    ], records
