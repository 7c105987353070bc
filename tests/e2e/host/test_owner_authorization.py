"""Owner authorization on the single-host backend: the vm_* playbooks act only on the caller's own VMs.

The attacks are the ones reported against the playbooks (docs/security.md): another owner deleting a VM and
its volume, stopping or restarting it, replacing its SSH keys through vm_start, backing it up; an AWX user
naming another owner. Each runs the real playbook against a private host store with real root volumes; the
VMs stay Stopped (the refusals happen before any boot), so no guest needs to boot here.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume import volume_path

from tests.e2e.playbook_results import failure

from .conftest import REPO, VENV_BIN, Cloud

pytestmark = [pytest.mark.netns, pytest.mark.timeout(1200)]

BOB_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE1qBq5mUL3Tj8Yo3Gc0wLkqj0ZC1S4Kk5uGq2pX3cQh bob@laptop"
EVE_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG8T6bYx0Zg3eQ3q0pVn4m1JwqfQ8H7c2Ck1r5uXo9Zt eve@attacker"


def _create_stopped(cloud: Cloud, name: str, owner: str, keys: list[str]) -> dict:
    """Create a CloudVM (and its root volume) without starting it, with the cloudvm module."""
    args = json.dumps({"name": name, "owner": owner, "ssh_authorized_keys": keys})
    proc = subprocess.run([str(VENV_BIN / "ansible"), "localhost", "-m", "zjusct.cloud.cloudvm", "-a", args],
                          cwd=REPO, env=cloud.env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return cloud.vm(name)



@pytest.fixture
def bob(cloud: Cloud) -> Iterator[dict]:
    """bob's VM, Stopped, with his own key; deleted with its volume afterwards."""
    vm = cloud.vm("bob") or _create_stopped(cloud, "bob", "bob", [BOB_KEY])
    yield vm
    cloud.playbook("vm_delete", "owner=bob", "name=bob", "delete_volume=true", check=False)


def _unchanged(cloud: Cloud, before: dict) -> None:
    after = cloud.vm("bob")
    assert after, "bob's VM is gone"
    assert after["spec"] == before["spec"], (before["spec"], after["spec"])
    assert _volume_file(cloud, before).exists()


def _volume_file(cloud: Cloud, vm: dict) -> Path:
    return Path(volume_path(cloud.config["volumes_dir"], vm["spec"]["rootVolumeClaim"]))


def test_another_owner_cannot_delete_stop_restart_rekey_or_back_up(cloud: Cloud, bob: dict) -> None:
    refused = {
        "vm_delete": failure(cloud.playbook("vm_delete", "owner=alice", "name=bob", "delete_volume=true",
                                             check=False)),
        "vm_start": failure(cloud.playbook("vm_start", "owner=alice", "name=bob", f"ssh_public_key={EVE_KEY}",
                                            check=False)),
        "vm_stop": failure(cloud.playbook("vm_stop", "owner=alice", "name=bob", check=False)),
        "vm_restart": failure(cloud.playbook("vm_restart", "owner=alice", "name=bob", check=False)),
        "vm_backup": failure(cloud.playbook("vm_backup", "owner=alice", "name=bob", check=False)),
    }
    # vm_delete and vm_start: refused by the cloudvm module itself; vm_stop, vm_restart and vm_backup: by the
    # playbooks' lookup before acting (cloudvm_info's authorize), with the same message
    for playbook in refused:
        assert "owner: 'alice' may not act on CloudVM default/bob, which belongs to owner 'bob'" in refused[playbook], \
            (playbook, refused[playbook])
    _unchanged(cloud, bob)
    assert cloud.vm("bob")["spec"]["sshAuthorizedKeys"] == [BOB_KEY]


def test_awx_user_acts_only_as_herself(cloud: Cloud, bob: dict) -> None:
    named = failure(cloud.playbook("vm_stop", "awx_user_name=alice", "owner=bob", "name=bob", check=False))
    assert "owner: bob is not the launching user alice" in named, named
    implied = failure(cloud.playbook("vm_delete", "awx_user_name=alice", "name=bob", check=False))
    assert "owner: 'alice' may not act on CloudVM default/bob" in implied, implied
    _unchanged(cloud, bob)
    own = cloud.playbook("vm_stop", "awx_user_name=bob", "name=bob")
    assert own["rc"] == 0


def test_operator_switch_acts_on_any_vm(cloud: Cloud, bob: dict) -> None:
    stopped = cloud.playbook("vm_stop", "owner=ops", "name=bob", "operator=true")
    assert stopped["rc"] == 0
    assert _volume_file(cloud, bob).exists()
    deleted = cloud.playbook("vm_delete", "owner=ops", "name=bob", "operator=true", "delete_volume=true")
    assert deleted["rc"] == 0
    assert cloud.vm("bob") == {}
    assert not _volume_file(cloud, bob).exists()
