"""host.json's sandbox settings: per-VM VMM ids from the lease, the launcher's hypervisor fields, and the
rejected bases (named with the key and the allowed values)."""

from __future__ import annotations

import json

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import VMM_UID_BASE, HostConfig, load


def test_each_lease_gets_its_own_vmm_id_from_the_address_offset():
    cfg = HostConfig(subnet="10.200.0.0/24")
    assert cfg.vmm_run_as("10.200.0.2") == {"uid": VMM_UID_BASE + 2, "gid": VMM_UID_BASE + 2}
    assert cfg.vmm_run_as("10.200.0.254") == {"uid": VMM_UID_BASE + 254, "gid": VMM_UID_BASE + 254}
    assert HostConfig(vmm_uid_base=0).vmm_run_as("10.200.0.2") is None, "0 = no privilege drop"


def test_hypervisor_fields_for_qemu_and_firecracker():
    qemu = HostConfig(subnet="10.200.0.0/24").hypervisor_sandbox("10.200.0.7")
    assert qemu == {"runAs": {"uid": VMM_UID_BASE + 7, "gid": VMM_UID_BASE + 7}, "seccomp": True}
    fc = HostConfig(hypervisor="firecracker", jailer_chroot_base_dir="/srv/jail").hypervisor_sandbox("10.200.0.7")
    assert fc["jailer"] == {"binary": None, "chrootBaseDir": "/srv/jail"}
    assert HostConfig(vmm_uid_base=0, vmm_seccomp=False).hypervisor_sandbox("10.200.0.7") == \
        {"runAs": None, "seccomp": False}


@pytest.mark.parametrize(("settings", "message"), [
    ({"vmm_uid_base": 1000}, "vmm_uid_base: 1000 is not 0 (no privilege drop) or an integer >= 65536"),
    ({"vmm_uid_base": "1610612736"}, "vmm_uid_base: '1610612736' is not 0"),
    ({"vmm_uid_base": 2**31 - 100, "subnet": "10.0.0.0/16"}, "the 65536 addresses of the subnet exceed"),
])
def test_bad_vmm_uid_base_is_refused(tmp_path, settings, message):
    path = tmp_path / "host.json"
    path.write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="host_config: vmm_uid_base: ") as exc:
        load(str(path))
    assert message in str(exc.value)


def test_bandwidth_capacity_has_one_setting(tmp_path):
    """The node's bandwidth is nic_mbps, admitted by the QoS arbitration alone; physical.bandwidth was a second
    capacity for the same link that placement checked against (the two could disagree), so it is refused."""
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"physical": {"cpu": 4, "bandwidth": 500}, "nic_mbps": 1000}))
    with pytest.raises(ValueError, match=r"host_config: physical.bandwidth: 500 is not used: the node's bandwidth is "
                                         r"nic_mbps \(hypervisor_nic_mbps\)"):
        load(str(path))
    path.write_text(json.dumps({"physical": {"cpu": 4, "bandwidth": 0}, "nic_mbps": 1000}))
    assert load(str(path)).physical == {"cpu": 4, "bandwidth": 0}, "0 (= measure, the role's old default) is fine"
