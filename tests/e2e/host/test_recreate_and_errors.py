"""Re-creating a VM on its kept volume, refusals at create, and error texts in the user's words.

Real playbooks (``ansible-playbook playbooks/vm_*.yml``) against real QEMU guests in the private
netns cloud of :mod:`.conftest`. Each test sets up what it needs (its own owners), so it passes
alone and in any order.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.e2e.playbook_results import failure, task_result

from .conftest import REPO, Cloud, launcher_pids

pytestmark = [pytest.mark.guest, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(7200)]

START = "Start the VM and wait until its SSH answers"
WAIT = "wait_timeout=2400"  # a loaded host's TCG boot can take long; the launcher's readiness timeout is 1800 s
SHOW = "Show the VM"




def records(cloud: Cloud) -> list[tuple]:
    """(namespace, name, owner) of every CloudVM in the host store."""
    path = cloud.config["store_path"]
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute("SELECT namespace, name, owner FROM cloudvms").fetchall())
    except sqlite3.OperationalError:  # the store was never opened: no table yet
        return []
    finally:
        conn.close()


def volume(cloud: Cloud, name: str) -> dict:
    conn = sqlite3.connect(cloud.config["store_path"])
    conn.row_factory = sqlite3.Row
    try:
        row = conn.execute("SELECT * FROM volumes WHERE name = ?", (name,)).fetchone()
        return dict(row) if row else {}
    finally:
        conn.close()


def module(cloud: Cloud, name: str, args: dict) -> subprocess.CompletedProcess:
    """Run one module ad hoc (``ansible localhost -m``) with JSON arguments."""
    return subprocess.run([str(Path(cloud.env()["PATH"].split(":")[0]) / "ansible"), "localhost", "-m", name,
                           "-a", json.dumps(args)], cwd=REPO, env=cloud.env(), capture_output=True, text=True,
                          timeout=600, check=False)


def test_start_delete_start_again_keeps_the_file_he_wrote(cloud: Cloud):
    """Issue item 1: vm_start, vm_delete (volume kept), vm_start of the same owner works on the same volume."""
    first = task_result(cloud.playbook("vm_start", "owner=bob", WAIT, timeout=2700), START)
    assert first["phase"] == "Running", first
    old_uid = first["cloudvm"]["metadata"]["uid"]
    out = cloud.ssh(first["cloudvm"]["status"]["sshEndpoint"]["host"], "echo bobs-file > /root/mine && sync")
    assert out.returncode == 0, out.stderr

    cloud.playbook("vm_delete", "owner=bob")
    assert volume(cloud, "bob-root")["claimed_by"] == old_uid  # the claim outlives the CloudVM
    assert launcher_pids(cloud, "bob") == []

    again = cloud.playbook("vm_start", "owner=bob", WAIT, timeout=2700)
    second = task_result(again, START)
    assert second["phase"] == "Running" and second["changed"] is True, second
    new_uid = second["cloudvm"]["metadata"]["uid"]
    assert new_uid != old_uid
    assert volume(cloud, "bob-root")["claimed_by"] == new_uid
    out = cloud.ssh(second["cloudvm"]["status"]["sshEndpoint"]["host"], "cat /root/mine")
    assert out.stdout.strip() == "bobs-file", out.stderr

    # the summary is human text: phase, boot, and the SSH endpoint as host:port (no dict repr)
    lines = task_result(again, SHOW)["msg"]
    assert lines[0] == "VM default/bob (owner bob): Running, bootID 1", lines
    assert lines[1] == f"SSH: {second['cloudvm']['status']['sshEndpoint']['host']}:22", lines
    assert all("{" not in line for line in lines), lines

    # a live claim refuses a create elsewhere (same volume name in another namespace), naming the holder,
    # and leaves no record behind
    refused = cloud.playbook("vm_start", "owner=bob", "vm_namespace=other", check=False)
    assert refused["rc"] != 0
    message = failure(refused)
    assert "bob-root" in message and "CloudVM default/bob" in message and "docs/runbooks.md" in message, message
    assert [r for r in records(cloud) if r[0] == "other"] == []
    assert ("default", "bob", "bob") in records(cloud)
    assert volume(cloud, "bob-root")["claimed_by"] == new_uid

    # check mode on the running VM prints the same clean summary and changes nothing
    checked = cloud.playbook("vm_start", "owner=bob", options=("--check",))
    lines = task_result(checked, SHOW)["msg"]
    assert lines[0] == "VM default/bob (owner bob): Running, bootID 1", lines
    assert lines[1].startswith("SSH: 10.213.0.") and lines[1].endswith(":22"), lines
    cloud.playbook("vm_delete", "owner=bob")


def test_refused_create_leaves_no_cloudvm_record(cloud: Cloud):
    """A create on a volume that another CloudVM holds, or that belongs to another owner, writes nothing."""
    made = module(cloud, "zjusct.cloud.cloudvm", {"name": "dave", "owner": "dave", "wait": False})
    assert made.returncode == 0, made.stdout + made.stderr
    assert ("default", "dave", "dave") in records(cloud)
    before = records(cloud)

    same_owner = cloud.playbook("vm_start", "owner=dave", "vm_namespace=other", check=False)
    assert same_owner["rc"] != 0
    message = failure(same_owner)
    assert "'dave-root'" in message and "CloudVM default/dave" in message, message

    other_owner = cloud.playbook("vm_start", "owner=erin", "name=dave", "vm_namespace=other", check=False)
    assert other_owner["rc"] != 0
    message = failure(other_owner)
    assert "belongs to owner 'dave'" in message and "'erin'" in message, message

    assert records(cloud) == before
    assert launcher_pids(cloud, "dave", "other") == []
    cloud.playbook("vm_delete", "owner=dave", "delete_volume=true")


def test_delete_volume_after_a_plain_delete_deletes_the_kept_volume_of_its_owner_only(cloud: Cloud):
    """vm_delete keeps the root volume; a later vm_delete -e delete_volume=true (the VM gone) deletes that kept
    volume - its owner's only, predicted by check mode - and a third run changes nothing."""
    made = module(cloud, "zjusct.cloud.cloudvm", {"name": "gina", "owner": "gina", "wait": False})
    assert made.returncode == 0, made.stdout + made.stderr
    kept = volume(cloud, "gina-root")
    data = Path(kept["location"])
    cloud.playbook("vm_delete", "owner=gina")
    assert [r for r in records(cloud) if r[1] == "gina"] == [] and volume(cloud, "gina-root") and data.exists()

    other = cloud.playbook("vm_delete", "owner=hank", "name=gina", "delete_volume=true", check=False)
    assert other["rc"] != 0
    message = failure(other)
    assert "delete_volume" in message and "belongs to owner 'gina', not 'hank'" in message, message
    checked = cloud.playbook("vm_delete", "owner=gina", "delete_volume=true", options=("--check",))
    assert task_result(checked, "Delete the VM")["volume_deleted"] == "gina-root"
    assert volume(cloud, "gina-root") and data.exists()

    deleted = cloud.playbook("vm_delete", "owner=gina", "delete_volume=true")
    result = task_result(deleted, "Delete the VM")
    assert result["changed"] is True and result["volume_deleted"] == "gina-root", result
    assert task_result(deleted, "Show the outcome")["msg"] == (
        "VM default/gina: absent; the root volume gina-root it kept deleted")
    assert volume(cloud, "gina-root") == {} and not data.exists()
    again = task_result(cloud.playbook("vm_delete", "owner=gina", "delete_volume=true"), "Delete the VM")
    assert again["changed"] is False and "volume_deleted" not in again, again


@pytest.mark.parametrize(("extra", "expected"), [
    (("owner=carol", "memory_mib=4097"),
     ("memory_mib", "spec.memoryMiB", "4097", "above the maximum 4096", "128 to 4096")),
    (("owner=carol", "vcpus=0"), ("vcpus", "spec.vcpus", "0", "below the minimum 1", "1 to 4")),
    (("owner=Alice",), ("owner", "spec.owner", "'Alice'", "derived from owner", "RFC 1123",
                        "lower-case letters, digits and '-'", "at most 63", "start and end")),
    (("owner=carol", "name=Bad_Name"), ("name", "metadata.name", "'Bad_Name'", "RFC 1123")),
    (("owner=carol", "guaranteed_mbps=20", "bandwidth_pool=Pool_1"),
     ("bandwidth_pool", "spec.network.bandwidth.pool", "'Pool_1'", "RFC 1123")),
    (("owner=carol", "guaranteed_mbps=20", "ceil_mbps=10"),
     ("ceil_mbps", "spec.network.bandwidth.ceilMbps", "allowed guaranteed_mbps to", "10 is below guaranteedMbps 20")),
    (("owner=carol", "ssh_public_key=not-a-key"),
     ("ssh_public_key", "spec.sshAuthorizedKeys[0]", "'not-a-key'", "OpenSSH public key")),
    # a typo in a number is refused by name, not turned into 0 (guaranteed_mbps | int) or a bare type error
    (("owner=carol", "memory_mib=lots"), ("memory_mib", "spec.memoryMiB", "'lots'", "not a whole number",
                                          "128 to 4096 MiB")),
    (("owner=carol", "guaranteed_mbps=20M"), ("guaranteed_mbps", "spec.network.bandwidth.guaranteedMbps", "'20M'",
                                              "not a whole number", "0 to 100000 Mbit/s")),
])
def test_bad_input_names_the_variable_the_field_the_value_and_the_rule(cloud: Cloud, extra, expected):
    """Issue item 9: each refusal names the playbook variable typed, the API field, the value and the rule."""
    doc = cloud.playbook("vm_start", *extra, check=False)
    assert doc["rc"] != 0
    message = failure(doc)
    for part in expected:
        assert part in message, f"{part!r} missing in: {message}"
    assert [r for r in records(cloud) if r[2] == "carol"] == []
    assert not Path(cloud.config["volumes_dir"], "carol-root.raw").exists()


def test_check_mode_summary_of_a_new_vm_is_clean_text(cloud: Cloud):
    doc = cloud.playbook("vm_start", "owner=frank", options=("--check",))
    lines = task_result(doc, SHOW)["msg"]
    assert lines == ["VM default/frank (owner frank): would be created and started (check mode), bootID 1"], lines
    assert [r for r in records(cloud) if r[1] == "frank"] == []
