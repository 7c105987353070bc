"""Issue 10 end to end: RBD root volumes on the host backend, vm_backup.yml and vm_restore.yml on a real Ceph
cluster with real QEMU guests (TCG), everything through ``ansible-playbook``.

One journey (guest boots are expensive here: three in total): alice's VM starts on an RBD clone, a file written
in the guest survives a full backup; after a change an incremental one; the full backup is restored into a new VM
that boots and shows the original content; the incremental one is restored into a new (not booted) VM whose image
shows the changed content (read with debugfs from an ``rbd export``, to save a boot). Refusals: a running VM
without ``stop_if_running``, a stale watcher (start Blocked/VolumeInUse naming it, no launcher;
backup refused naming it), a corrupted backup (restore names the block; no image, volume or VM is created). A file
volume (another owner's, never booted) is backed up by the same playbook and its backup restored as an RBD image.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ceph import Cluster
from tests.e2e.host.conftest import Cloud, launcher_pids
from tests.e2e.playbook_results import failure, task_result

from .conftest import WATCHER_RE, file_at

pytestmark = [pytest.mark.ceph, pytest.mark.guest, pytest.mark.netns, pytest.mark.slow]

BACKUP_TASK = "Back up the root volume (refused while it is in use)"




def rbd(cluster: Cluster, *args: str) -> str:
    return subprocess.run(["rbd", "-c", str(cluster.conf), *args], check=True, capture_output=True, text=True,
                          timeout=120, env=cluster.env()).stdout


def ssh_ok(cloud: Cloud, ip: str, command: str) -> str:
    out = cloud.ssh(ip, command, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def volumes(cloud: Cloud) -> dict:
    import sqlite3

    with sqlite3.connect(cloud.config["store_path"]) as conn:
        conn.row_factory = sqlite3.Row
        return {r["name"]: dict(r) for r in conn.execute("SELECT * FROM volumes")}


@pytest.mark.timeout(5400)
def test_backup_restore_journey_on_rbd(rbd_cloud: Cloud, ceph_cluster: Cluster, tmp_path: Path):
    cloud, backups = rbd_cloud, str(tmp_path / "backups")
    start = cloud.playbook("vm_start", "owner=alice")
    vm = task_result(start, "Start the VM and wait until its SSH answers")
    assert vm["phase"] == "Running", failure(start)
    ip = vm["cloudvm"]["status"]["sshEndpoint"]["host"]
    uid = vm["cloudvm"]["metadata"]["uid"]
    # the root volume is an RBD clone of the image set's template, marked with owner and claim
    record = volumes(cloud)["alice-root"]
    assert (record["driver"], record["location"], record["claimed_by"]) == ("rbd", "rbd/alice-root", uid)
    info = json.loads(rbd(ceph_cluster, "info", "rbd/alice-root", "--format", "json"))
    assert info["parent"]["image"].startswith("tmpl-") and info["parent"]["snapshot"] == "base"
    marks = json.loads(rbd(ceph_cluster, "image-meta", "list", "rbd/alice-root", "--format", "json"))
    assert marks == {"cloud.zjusct.io/owner": "alice", "cloud.zjusct.io/claimed-by": uid}
    ssh_ok(cloud, ip, "echo original-content > /root/marker && sync")

    # a running VM is refused without stop_if_running, and nothing is written
    refused = cloud.playbook("vm_backup", "owner=alice", f"backup_dir={backups}", check=False)
    assert refused["rc"] != 0 and "stop_if_running=true" in failure(refused), failure(refused)
    assert not os.path.exists(backups)

    cloud.playbook("vm_stop", "owner=alice")
    print("watchers right after the stop:", rbd(ceph_cluster, "status", "rbd/alice-root", "--format", "json"))
    full = task_result(cloud.playbook("vm_backup", "owner=alice", f"backup_dir={backups}"), BACKUP_TASK)
    assert full["type"] == "full" and full["image_size_bytes"] == 2048 * 1024 * 1024

    vm2 = task_result(cloud.playbook("vm_start", "owner=alice"), "Start the VM and wait until its SSH answers")
    assert vm2["boot_id"] == 2
    assert ssh_ok(cloud, ip, "cat /root/marker").strip() == "original-content"
    ssh_ok(cloud, ip, "echo changed-content > /root/marker && sync")
    # stop_if_running stops it through cloudvm, then backs up incrementally
    doc = cloud.playbook("vm_backup", "owner=alice", f"backup_dir={backups}", "stop_if_running=true")
    inc = task_result(doc, BACKUP_TASK)
    assert inc["type"] == "diff" and inc["chain"] == [full["backup_id"], inc["backup_id"]]
    assert inc["data_bytes"] < full["data_bytes"]
    assert task_result(doc, "Stop the VM and wait until it is Stopped")["phase"] == "Stopped"

    # ownership: bob can neither back up alice's VM nor receive her backup (unless explicitly allowed)
    refused = cloud.playbook("vm_backup", "owner=bob", "name=alice", f"backup_dir={backups}", check=False)
    assert refused["rc"] != 0, refused.get("raw", "")[-2000:]
    assert "owner: 'bob' may not act on CloudVM default/alice, which belongs to owner 'alice'" in failure(refused)
    refused = cloud.playbook("vm_restore", f"backup={full['backup_id']}", f"backup_dir={backups}", "owner=bob",
                             check=False)
    assert refused["rc"] != 0 and "is not the owner alice of backup" in failure(refused), failure(refused)
    assert "bob-restored-root" not in rbd(ceph_cluster, "ls", "rbd")

    # restore the full backup into a new VM: it boots and shows the original content
    doc = cloud.playbook("vm_restore", f"backup={full['backup_id']}", f"backup_dir={backups}", "name=alice-r1")
    r1 = task_result(doc, "Create the VM on the restored volume and start it")
    assert r1["phase"] == "Running" and r1["cloudvm"]["spec"]["owner"] == "alice"
    assert task_result(doc, "Restore the backup into a new volume and verify every block")["verified_blocks"] > 0
    assert ssh_ok(cloud, r1["cloudvm"]["status"]["sshEndpoint"]["host"], "cat /root/marker").strip() == \
        "original-content"
    marks = json.loads(rbd(ceph_cluster, "image-meta", "list", "rbd/alice-r1-root", "--format", "json"))
    assert marks["cloud.zjusct.io/restored-from"] == full["backup_id"]
    assert marks["cloud.zjusct.io/claimed-by"] == r1["cloudvm"]["metadata"]["uid"]
    cloud.playbook("vm_stop", "owner=alice", "name=alice-r1")

    # restore the incremental backup without booting it: its image holds the changed content
    doc = cloud.playbook("vm_restore", f"backup={inc['backup_id']}", f"backup_dir={backups}", "name=alice-r2",
                         "start=false")
    assert task_result(doc, "Create the VM on the restored volume and start it")["phase"] == "Stopped"
    assert file_at(ceph_cluster, "alice-r2-root", "/root/marker", tmp_path).strip() == "changed-content"

    # every driver is backed up: a file volume too (carol's, made by a file-driver host config sharing the store,
    # never started), and its backup restores as an RBD image of this host's driver (across drivers), no boot
    file_cfg = tmp_path / "file-host.json"
    file_cfg.write_text(json.dumps(dict(cloud.config, volume_driver="file")))
    env = dict(cloud.env(), ZJUSCT_CLOUD_CONFIG=str(file_cfg))
    subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-m", "zjusct.cloud.cloudvm",
                    "-a", "name=carol owner=carol"], cwd=Path(__file__).resolve().parents[3], env=env, check=True,
                   capture_output=True, timeout=300)
    carol = task_result(cloud.playbook("vm_backup", "owner=carol", f"backup_dir={backups}"), BACKUP_TASK)
    assert (carol["driver"], carol["type"], carol["volume"]) == ("file", "full", "carol-root"), carol
    doc = cloud.playbook("vm_restore", f"backup={carol['backup_id']}", f"backup_dir={backups}", "name=carol-moved",
                         "start=false")
    moved = task_result(doc, "Restore the backup into a new volume and verify every block")
    assert (moved["driver"], moved["location"]) == ("rbd", "rbd/carol-moved-root"), moved
    assert volumes(cloud)["carol-moved-root"]["driver"] == "rbd"
    assert file_at(ceph_cluster, "carol-moved-root", "/etc/debian_version", tmp_path).startswith("12.")
    assert json.loads(rbd(ceph_cluster, "image-meta", "list", "rbd/carol-moved-root", "--format", "json"))[
        "cloud.zjusct.io/owner"] == "carol"

    # case V2: a stale watcher blocks the start (named, no launcher) and the backup (named)
    watch = subprocess.Popen(["rbd", "-c", str(ceph_cluster.conf), "watch", "rbd/alice-root"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=ceph_cluster.env())
    try:
        for _ in range(300):
            if json.loads(rbd(ceph_cluster, "status", "rbd/alice-root", "--format", "json"))["watchers"]:
                break
        blocked = cloud.playbook("vm_start", "owner=alice", check=False)
        assert blocked["rc"] != 0 and "VolumeInUse" in failure(blocked), failure(blocked)
        named = WATCHER_RE.search(failure(blocked))
        assert named, failure(blocked)
        status = cloud.vm("alice")["status"]
        assert (status["phase"], status["reason"]) == ("Blocked", "VolumeInUse")
        assert named.group(0) in status["message"]
        assert launcher_pids(cloud, "alice") == []
        refused = cloud.playbook("vm_backup", "owner=alice", f"backup_dir={backups}", check=False)
        assert refused["rc"] != 0 and named.group(0) in failure(refused), failure(refused)  # Blocked, named
        # stopped first, the backup itself is refused by rbd_backup naming the watcher
        refused = cloud.playbook("vm_backup", "owner=alice", f"backup_dir={backups}", "stop_if_running=true",
                                 check=False)
        assert refused["rc"] != 0 and "watchers" in failure(refused), failure(refused)
        assert named.group(0) in failure(refused), failure(refused)
        assert cloud.vm("alice")["status"]["phase"] == "Stopped"
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.wait(30)

    # a corrupted backup: the restore names the damaged block and creates nothing
    data = Path(backups) / "default_alice" / full["backup_id"] / "data.rbdiff"
    with open(data, "r+b") as fh:
        fh.seek(data.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    bad = cloud.playbook("vm_restore", f"backup={inc['backup_id']}", f"backup_dir={backups}", "name=alice-r3",
                         check=False)
    assert bad["rc"] != 0 and "block" in failure(bad), failure(bad)
    assert "alice-r3-root" not in rbd(ceph_cluster, "ls", "rbd")
    assert "alice-r3-root" not in volumes(cloud)
    assert cloud.vm("alice-r3") == {}

    # the audit trail (docs/security.md, "Audit"): every backup, restore and volume registration above that
    # reached the module, with actor, owner and result; the refusals of the playbooks' own checks never got there
    doc = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-m", "zjusct.cloud.audit_info", "-a",
         json.dumps({"owner": "alice"})], cwd=Path(__file__).resolve().parents[3], env=cloud.env(), check=True,
        capture_output=True, text=True, timeout=300).stdout)
    records = [r for r in doc["plays"][0]["tasks"][0]["hosts"]["localhost"]["records"]
               if r["action"] in ("backup", "restore", "volume-register")]
    assert [(r["action"], r["subject"], r["result"]) for r in records] == [
        ("backup", "rbd/rbd/alice-root", "succeeded"),
        ("backup", "rbd/rbd/alice-root", "succeeded"),
        ("backup", "default/alice", "refused"),  # bob's, refused by the playbook's lookup
        ("restore", "rbd/rbd/alice-r1-root", "succeeded"),
        ("volume-register", "volume/alice-r1-root", "succeeded"),
        ("restore", "rbd/rbd/alice-r2-root", "succeeded"),
        ("volume-register", "volume/alice-r2-root", "succeeded"),
        ("backup", "rbd/rbd/alice-root", "failed"),  # the watcher
        ("restore", "rbd/rbd/alice-r3-root", "failed"),  # the damaged block
    ], records
    assert {(r["actor"], r["owner"], r["operator"]) for r in records if r["result"] != "refused"} == \
        {("alice", "alice", False)}
    assert records[2]["actor"] == "bob"
    done = [r for r in records if r["result"] == "succeeded" and r["action"] != "volume-register"]
    assert [r["data"]["backup_id"] for r in done] == [full["backup_id"], inc["backup_id"]] * 2
    assert records[1]["data"]["type"] == "diff" and records[1]["data"]["vm"] == "default/alice"
    assert "watchers" in records[7]["message"] and records[7]["reason"] == "BackupError"
    assert "block" in records[8]["message"]
    assert not {"ceph_key", "ceph_keyring", "keyring_path", "rbd"} & {k for r in records for k in r["data"]}
