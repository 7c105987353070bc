"""The ``qcow2`` volume driver end to end: real playbooks, real QEMU guests on qcow2 overlays of one base.

The module's cloud (tests/e2e/host/conftest.py) is switched to ``volume_driver: qcow2``; two VMs are made from
the same image set, so their overlays share one read-only base. The journey: create from the base, boot, write
a file and sync, a second VM on the same base that does not see it (and whose write the first does not see),
stop, start, the data kept, delete with the volume: the overlay removed, the base intact and still serving the
other VM.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.driver_qcow2 import base_path

from tests.e2e.playbook_results import task_result

from .conftest import Cloud, launcher_pids

pytestmark = [pytest.mark.guest, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(3600)]

START = "Start the VM and wait until its SSH answers"
STOP = "Stop the VM and wait until it is Stopped"


@pytest.fixture(scope="module")
def qcloud(cloud: Cloud) -> Cloud:
    """The module's cloud with ``volume_driver: qcow2`` (new volumes are overlays)."""
    cloud.config = dict(cloud.config, volume_driver="qcow2")
    cloud.config_path.write_text(json.dumps(cloud.config))
    return cloud


def volume(cloud: Cloud, name: str) -> dict:
    conn = sqlite3.connect(cloud.config["store_path"])
    conn.row_factory = sqlite3.Row
    row = conn.execute("SELECT * FROM volumes WHERE name = ?", (name,)).fetchone()
    conn.close()
    return dict(row) if row else {}


def backing(path: str) -> tuple:
    info = json.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", path], capture_output=True,
                                     text=True, check=True).stdout)
    return info["format"], info.get("backing-filename"), info.get("backing-filename-format")


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def start(cloud: Cloud, owner: str) -> dict:
    vm = task_result(cloud.playbook("vm_start", f"owner={owner}"), START)
    assert vm["phase"] == "Running", vm
    return vm


def test_overlays_on_one_base_boot_keep_data_stay_independent_and_delete_leaves_the_base(qcloud: Cloud):
    cloud = qcloud
    for owner in ("qa", "qb"):  # a clean slate when run again in the same cloud
        cloud.playbook("vm_delete", f"owner={owner}", "delete_volume=true", check=False)
    volumes_dir = Path(cloud.config["volumes_dir"])

    qa = start(cloud, "qa")
    record = volume(cloud, "qa-root")
    base = base_path(str(volumes_dir), record["image"])
    assert (record["driver"], record["location"]) == ("qcow2", str(volumes_dir / "qa-root.qcow2"))
    assert backing(record["location"]) == ("qcow2", base, "qcow2")
    assert Path(base).stat().st_mode & 0o777 == 0o444
    base_digest = sha256(base)
    ip_a = qa["cloudvm"]["status"]["sshEndpoint"]["host"]
    out = cloud.ssh(ip_a, "echo written-by-qa > /root/marker && sync && cat /root/marker")
    assert out.returncode == 0 and out.stdout.strip() == "written-by-qa", out.stderr

    qb = start(cloud, "qb")  # a second overlay on the same base
    assert backing(volume(cloud, "qb-root")["location"]) == ("qcow2", base, "qcow2")
    ip_b = qb["cloudvm"]["status"]["sshEndpoint"]["host"]
    out = cloud.ssh(ip_b, "cat /root/marker; echo written-by-qb > /root/marker && sync && cat /root/marker")
    assert out.stdout.strip() == "written-by-qb" and "No such file" in out.stderr, (out.stdout, out.stderr)
    out = cloud.ssh(ip_a, "cat /root/marker")
    assert out.stdout.strip() == "written-by-qa", out.stderr  # qb's write is not visible in qa

    boot = qa["boot_id"]
    assert task_result(cloud.playbook("vm_stop", "owner=qa"), STOP)["phase"] == "Stopped"
    assert launcher_pids(cloud, "qa") == []
    again = start(cloud, "qa")
    assert again["boot_id"] == boot + 1
    out = cloud.ssh(again["cloudvm"]["status"]["sshEndpoint"]["host"], "cat /root/marker")
    assert out.stdout.strip() == "written-by-qa", out.stderr  # kept across stop/start

    deleted = cloud.playbook("vm_delete", "owner=qa", "delete_volume=true")
    assert task_result(deleted, "Delete the VM")["changed"] is True
    assert volume(cloud, "qa-root") == {} and not (volumes_dir / "qa-root.qcow2").exists()
    assert sha256(base) == base_digest  # the base is intact and still serves qb
    out = cloud.ssh(ip_b, "cat /root/marker")
    assert out.stdout.strip() == "written-by-qb", out.stderr

    cloud.playbook("vm_delete", "owner=qb", "delete_volume=true")
    assert not (volumes_dir / "qb-root.qcow2").exists()
    assert Path(base).exists() and sha256(base) == base_digest  # bases are never removed automatically
