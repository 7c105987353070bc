"""Verify of the Molecule scenario ``hypervisor``: what roles/hypervisor promises (meta/argument_specs.yml, defaults).

Runs under pytest-testinfra against the scenario's inventory (``--connection=ansible``, group ``guests``: the
throwaway Debian guest converge made a hypervisor). Expected values are read from the role's defaults and the
scenario's converge.yml, so a changed default is checked as it is, not as it was. Each ``host.run`` is one Ansible
call over SSH (seconds under load): the checks batch their commands.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path

import yaml

REPO = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[4]))
DEFAULTS = yaml.safe_load((REPO / "roles/hypervisor/defaults/main.yml").read_text())
CONVERGE_VARS = yaml.safe_load((Path(__file__).resolve().parents[1] / "converge.yml").read_text())[0]["roles"][0][
    "vars"]
STATE = DEFAULTS["hypervisor_state_dir"]
CONFIG = DEFAULTS["hypervisor_config_path"]
LAUNCHER_DIR = DEFAULTS["hypervisor_launcher_dir"]
NETNS = DEFAULTS["hypervisor_netns"]


def sh(host, command: str) -> str:
    """Run ``command`` in the guest; it must succeed. Returns its stdout."""
    out = host.run(command)
    assert out.rc == 0, f"{command}: rc={out.rc}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def host_config(host) -> dict:
    return json.loads(host.file(CONFIG).content_string)


def test_packages_installed(host) -> None:
    packages = DEFAULTS["hypervisor_packages"]
    out = sh(host, "dpkg-query -W -f '${Package} ${db:Status-Status}\\n' " + " ".join(map(shlex.quote, packages)))
    status = dict(line.split() for line in out.splitlines())
    assert {p: status.get(p) for p in packages} == {p: "installed" for p in packages}


def test_directories_root_only(host) -> None:
    """State, images, volumes, logs, the config's and the launcher's directories: root:root 0700."""
    dirs = [STATE, f"{STATE}/images", f"{STATE}/volumes", DEFAULTS["hypervisor_log_dir"], str(Path(CONFIG).parent),
            LAUNCHER_DIR]
    out = sh(host, "stat -c '%n %F %U %G %a' " + " ".join(map(shlex.quote, dirs)))
    assert out.split("\n")[:-1] == [f"{d} directory root root 700" for d in dirs]


def test_launcher_is_this_checkouts(host) -> None:
    """Every source file of launcher/zjusct_launcher is in the guest, byte for byte, readable by all."""
    local = {}
    for path in sorted((REPO / "launcher/zjusct_launcher").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            local[str(path.relative_to(REPO / "launcher"))] = hashlib.sha256(path.read_bytes()).hexdigest()
    out = sh(host, f"cd {shlex.quote(LAUNCHER_DIR)} && find zjusct_launcher -type f ! -path '*/__pycache__/*' "
                   "-printf '%m ' -exec sha256sum {} +")
    remote = {}
    for line in out.splitlines():
        mode, digest, name = line.split()
        assert mode == "644", line
        remote[name] = digest
    assert remote == local


def test_launcher_command_runs(host) -> None:
    """/usr/local/bin/zjusct-launcher (0755 root) starts the installed launcher with the guest's python3."""
    f = host.file("/usr/local/bin/zjusct-launcher")
    assert f.user == "root" and f.mode == 0o755
    version = json.loads(sh(host, "/usr/local/bin/zjusct-launcher version"))
    assert version["version"] and version["protocols"]


def test_host_config(host) -> None:
    f = host.file(CONFIG)
    assert f.user == "root" and f.group == "root" and f.mode == 0o644
    cfg = host_config(host)
    assert cfg["node"] == "hv-guest"  # the inventory name
    assert cfg["store_path"] == DEFAULTS["hypervisor_state_dir"] + "/cloud.db"
    network = (NETNS, DEFAULTS["hypervisor_bridge"], DEFAULTS["hypervisor_subnet"])
    assert (cfg["netns"], cfg["bridge"], cfg["subnet"]) == network
    assert cfg["accel"] == CONVERGE_VARS["hypervisor_accel"] and cfg["allow_tcg"] is True
    assert cfg["hypervisor"] == "qemu" and cfg["volume_driver"] == "file"
    assert cfg["nat"] is True and cfg["uplink_ip_forward"] is False
    assert cfg["launcher_command"] == ["python3", "-m", "zjusct_launcher"]
    assert cfg["launcher_pythonpath"] == LAUNCHER_DIR
    assert cfg["vmm_uid_base"] == DEFAULTS["hypervisor_vmm_uid_base"] and cfg["vmm_seccomp"] is True
    assert cfg["gateway_dir"] == ""  # the SSH gateway is off by default


def test_store_schema_and_quota(host) -> None:
    """The host store exists (in the 0700 state directory), migrated to this collection's schema, with the quota."""
    path = host_config(host)["store_path"]
    f = host.file(path)
    assert f.is_file and f.user == "root"
    # zjusct.cloud.host_store in check mode: the schema version it reads, and nothing left to migrate
    result = host.ansible("zjusct.cloud.host_store", f"host_config={CONFIG}", check=True)
    assert result["changed"] is False and result["previous_schema_version"] == result["schema_version"] > 0
    query = "SELECT owner, vms, vcpus, memory_mib, disk_mib, bandwidth_mbps FROM quotas"
    script = (f"import json, sqlite3; c = sqlite3.connect('file:{path}?mode=ro', uri=True); "
              f"print(json.dumps(c.execute({query!r}).fetchall()))")
    quotas = json.loads(sh(host, f"python3 -c {shlex.quote(script)}"))
    alice = CONVERGE_VARS["hypervisor_owner_quotas"]["alice"]
    assert quotas == [["alice", alice["vms"], alice["vcpus"], alice["memory_mib"], None, None]]


def test_guest_network(host) -> None:
    """The bridge with the gateway address in its namespace, the uplink veth and its routes, the nft tables."""
    bridge = DEFAULTS["hypervisor_bridge"]
    out = sh(host, "ip netns list; echo ==; "
                   f"ip -n {NETNS} -br addr show dev {bridge}; ip -n {NETNS} -br addr show dev zjup1; "
                   f"ip -n {NETNS} route show default; echo ==; ip -br addr show dev zjup0; "
                   f"ip route show {DEFAULTS['hypervisor_subnet']}; echo ==; "
                   f"ip netns exec {NETNS} nft list tables; echo ==; nft list tables")
    netns_list, inner, outer, inner_nft, outer_nft = out.split("==\n")
    assert NETNS in [line.split()[0] for line in netns_list.splitlines()]
    assert f"{bridge}" in inner and "UP" in inner.splitlines()[0] and "10.200.0.1/24" in inner.splitlines()[0]
    assert "100.64.255.2/30" in inner and "default via 100.64.255.1 dev zjup1" in inner
    assert "100.64.255.1/30" in outer and "10.200.0.0/24 via 100.64.255.2 dev zjup0" in outer
    assert "table inet zjusct_guard" in inner_nft
    assert "table ip zjusct_nat" in outer_nft


def test_sysctls(host) -> None:
    """Forwarding on in the cloud's namespace; the guest's own namespace untouched (uplink_ip_forward false)."""
    inside = sh(host, f"ip netns exec {NETNS} sysctl -n net.ipv4.ip_forward").strip()
    outside = sh(host, "sysctl -n net.ipv4.ip_forward").strip()
    assert (inside, outside) == ("1", "0")


def test_no_gateway_unit(host) -> None:
    """With hypervisor_ssh_gateway false no gateway unit is installed and nothing listens on its port."""
    assert not host.file("/etc/systemd/system/zjusct-cloud-gateway.service").exists
    assert not host.socket(f"tcp://0.0.0.0:{DEFAULTS['hypervisor_ssh_gateway_port']}").is_listening
