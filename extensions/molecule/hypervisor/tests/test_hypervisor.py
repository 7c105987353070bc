"""Verify of the Molecule scenario ``hypervisor``: what roles/hypervisor promises (meta/argument_specs.yml, defaults).

Runs under pytest-testinfra against the scenario's inventory (``--connection=ansible``, group ``hypervisors``: the
throwaway Debian host, a system container, that converge made a hypervisor). Expected values are read from the
role's defaults and the scenario's converge.yml, so a changed default is checked as it is, not as it was.

Every ``host.run`` is one Ansible call over SSH (seconds on the loaded CI machine): the host's state is therefore
read once per module by one Python script run there (``observed``: command outputs, file metadata and digests as
JSON), and the tests assert on that record. The store's schema is checked with the collection's own ``host_store``
module in check mode (one more call).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[4]))
DEFAULTS = yaml.safe_load((REPO / "roles/hypervisor/defaults/main.yml").read_text())
CONVERGE_VARS = yaml.safe_load((Path(__file__).resolve().parents[1] / "converge.yml").read_text())[0]["roles"][0][
    "vars"]
STATE = DEFAULTS["hypervisor_state_dir"]
CONFIG = DEFAULTS["hypervisor_config_path"]
LAUNCHER_DIR = DEFAULTS["hypervisor_launcher_dir"]
NETNS = DEFAULTS["hypervisor_netns"]
BRIDGE = DEFAULTS["hypervisor_bridge"]
DIRS = [STATE, f"{STATE}/images", f"{STATE}/volumes", DEFAULTS["hypervisor_log_dir"], str(Path(CONFIG).parent),
        LAUNCHER_DIR, str(Path(LAUNCHER_DIR).parent)]
# root 0755: the SSH gateway's accounts run the launcher's console client from there (docs/security.md)
READABLE_DIRS = (LAUNCHER_DIR, str(Path(LAUNCHER_DIR).parent))
GATEWAY_UNIT = "/etc/systemd/system/zjusct-cloud-gateway.service"

# Run on the host with its python3: reads, changes nothing (the launcher's `version` prints and exits).
PROBE = r"""
import hashlib, json, os, sqlite3, subprocess, sys
args = json.loads(sys.argv[1])

def run(*argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}

def meta(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"dir": os.path.isdir(path), "uid": st.st_uid, "gid": st.st_gid, "mode": st.st_mode & 0o7777}

rec = {"packages": run("dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", *args["packages"]),
       "dirs": {d: meta(d) for d in args["dirs"]},
       "launcher_cmd": meta("/usr/local/bin/zjusct-launcher"),
       "launcher_version": run("/usr/local/bin/zjusct-launcher", "version"),
       "config": meta(args["config"]), "gateway_unit": meta(args["gateway_unit"])}
files = {}
root = args["launcher_dir"]
for base, dirs, names in os.walk(os.path.join(root, "zjusct_launcher")):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in names:
        path = os.path.join(base, name)
        with open(path, "rb") as fh:
            files[os.path.relpath(path, root)] = {"sha256": hashlib.sha256(fh.read()).hexdigest(),
                                                 **meta(path)}
rec["launcher_files"] = files
with open(args["config"]) as fh:
    rec["config_doc"] = json.load(fh)
store = rec["config_doc"]["store_path"]
rec["store"] = meta(store)
con = sqlite3.connect("file:%s?mode=ro" % store, uri=True)
rec["quotas"] = con.execute(
    "SELECT owner, vms, vcpus, memory_mib, disk_mib, bandwidth_mbps FROM quotas ORDER BY owner").fetchall()
ns, br = args["netns"], args["bridge"]
rec["netns_list"] = run("ip", "netns", "list")
rec["bridge"] = run("ip", "-n", ns, "-j", "addr", "show", "dev", br)
rec["inner"] = run("ip", "-n", ns, "-j", "addr", "show", "dev", "zjup1")
rec["inner_default"] = run("ip", "-n", ns, "route", "show", "default")
rec["outer"] = run("ip", "-j", "addr", "show", "dev", "zjup0")
rec["outer_route"] = run("ip", "route", "show", args["subnet"])
rec["inner_nft"] = run("ip", "netns", "exec", ns, "nft", "list", "tables")
rec["outer_nft"] = run("nft", "list", "tables")
rec["forward_inside"] = run("ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.ip_forward")
rec["forward_outside"] = run("sysctl", "-n", "net.ipv4.ip_forward")
rec["listening"] = run("ss", "-Hltn")
print(json.dumps(rec))
"""


@pytest.fixture(scope="module")
def observed(host) -> dict:
    """The host's state as the probe script records it (one Ansible call)."""
    args = {"packages": DEFAULTS["hypervisor_packages"], "dirs": DIRS, "config": CONFIG, "gateway_unit": GATEWAY_UNIT,
            "launcher_dir": LAUNCHER_DIR, "netns": NETNS, "bridge": BRIDGE, "subnet": DEFAULTS["hypervisor_subnet"]}
    # one line through the shell module: the script travels base64-encoded
    loader = f"import base64; exec(base64.b64decode({base64.b64encode(PROBE.encode()).decode()!r}))"
    out = host.run("python3 -c %s %s", loader, json.dumps(args))
    assert out.rc == 0, f"probe failed: {out.stdout}\n{out.stderr}"
    return json.loads(out.stdout)


def ok(result: dict) -> str:
    """stdout of a probe command that must have succeeded."""
    assert result["rc"] == 0, result
    return result["out"]


def addresses(result: dict) -> list[str]:
    """``address/prefix`` of each IPv4 address in ``ip -j addr show`` output."""
    return [f"{a['local']}/{a['prefixlen']}" for link in json.loads(ok(result)) for a in link["addr_info"]
            if a["family"] == "inet"]


def test_packages_installed(observed) -> None:
    status = dict(line.split() for line in ok(observed["packages"]).splitlines())
    packages = DEFAULTS["hypervisor_packages"]
    assert {p: status.get(p) for p in packages} == {p: "installed" for p in packages}


def test_directories_root_only(observed) -> None:
    """State, images, volumes, logs and the config's directory: root:root 0700; the launcher's and its parent: root
    0755 (code only, which the gateway's accounts run)."""
    assert observed["dirs"] == {d: {"dir": True, "uid": 0, "gid": 0, "mode": 0o755 if d in READABLE_DIRS else 0o700}
                                for d in DIRS}


def test_launcher_is_this_checkouts(observed) -> None:
    """Every source file of launcher/zjusct_launcher is on the host, byte for byte, root 0644."""
    local = {}
    for path in sorted((REPO / "launcher/zjusct_launcher").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            local[str(path.relative_to(REPO / "launcher"))] = {
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "dir": False, "uid": 0, "gid": 0,
                "mode": 0o644}
    assert observed["launcher_files"] == local


def test_launcher_command_runs(observed) -> None:
    """/usr/local/bin/zjusct-launcher (0755 root) starts the installed launcher with the host's python3."""
    assert observed["launcher_cmd"] == {"dir": False, "uid": 0, "gid": 0, "mode": 0o755}
    version = json.loads(ok(observed["launcher_version"]))
    assert version["version"] and version["protocols"]


def test_host_config(observed) -> None:
    assert observed["config"] == {"dir": False, "uid": 0, "gid": 0, "mode": 0o644}
    cfg = observed["config_doc"]
    assert cfg["node"] == "hv-host"  # the inventory name
    assert cfg["store_path"] == DEFAULTS["hypervisor_state_dir"] + "/cloud.db"
    network = (NETNS, BRIDGE, DEFAULTS["hypervisor_subnet"])
    assert (cfg["netns"], cfg["bridge"], cfg["subnet"]) == network
    assert cfg["accel"] == CONVERGE_VARS["hypervisor_accel"] and cfg["allow_tcg"] is True
    assert cfg["hypervisor"] == "qemu" and cfg["volume_driver"] == "file"
    assert cfg["nat"] is True and cfg["uplink_ip_forward"] is False
    assert cfg["launcher_command"] == ["python3", "-m", "zjusct_launcher"]
    assert cfg["launcher_pythonpath"] == LAUNCHER_DIR
    assert cfg["vmm_uid_base"] == DEFAULTS["hypervisor_vmm_uid_base"] and cfg["vmm_seccomp"] is True
    assert cfg["gateway_dir"] == ""  # the SSH gateway is off by default


def test_store_quota(observed) -> None:
    """The host store is a root-owned file holding converge's quota (the only owner given one)."""
    assert observed["store"] is not None and observed["store"]["uid"] == 0 and not observed["store"]["dir"]
    alice = CONVERGE_VARS["hypervisor_owner_quotas"]["alice"]
    assert observed["quotas"] == [["alice", alice["vms"], alice["vcpus"], alice["memory_mib"], None, None]]


def test_store_schema_current(host) -> None:
    """zjusct.cloud.host_store in check mode: the store is at this collection's schema, nothing to migrate."""
    result = host.ansible("zjusct.cloud.host_store", f"host_config={CONFIG}", check=True)
    assert result["changed"] is False and result["previous_schema_version"] == result["schema_version"] > 0


def test_guest_network(observed) -> None:
    """The bridge with the gateway address in its namespace, the uplink veth and its routes, the nft tables."""
    assert NETNS in [line.split()[0] for line in ok(observed["netns_list"]).splitlines()]
    bridge = json.loads(ok(observed["bridge"]))[0]
    assert "UP" in bridge["flags"] and addresses(observed["bridge"]) == ["10.200.0.1/24"]
    assert addresses(observed["inner"]) == ["100.64.255.2/30"]
    assert "default via 100.64.255.1 dev zjup1" in ok(observed["inner_default"])
    assert addresses(observed["outer"]) == ["100.64.255.1/30"]
    assert "10.200.0.0/24 via 100.64.255.2 dev zjup0" in ok(observed["outer_route"])
    assert "table inet zjusct_guard" in ok(observed["inner_nft"])
    assert "table ip zjusct_nat" in ok(observed["outer_nft"])


def test_sysctls(observed) -> None:
    """Forwarding on in the cloud's namespace; the host's own namespace untouched (uplink_ip_forward false)."""
    assert (ok(observed["forward_inside"]).strip(), ok(observed["forward_outside"]).strip()) == ("1", "0")


def test_no_gateway(observed) -> None:
    """With hypervisor_ssh_gateway false no gateway unit is installed and nothing listens on its port."""
    assert observed["gateway_unit"] is None
    port = DEFAULTS["hypervisor_ssh_gateway_port"]
    assert not [line for line in ok(observed["listening"]).splitlines() if line.split()[3].endswith(f":{port}")]
