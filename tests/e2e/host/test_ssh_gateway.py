"""The SSH gateway on real guests: tenants reach their own VMs from outside the host, and only those.

This module's private cloud (the ``cloud`` fixture) gets ``gateway_dir``; ``host_network`` (what site.yml runs)
installs the gateway's files and the test starts its sshd (``sshd -D``) in the namespace standing in for the
host (``uplink_netns``), as the role's systemd unit does on a real host. Clients run in the ``world`` namespace
beyond it: "outside the host", reaching the gateway at 192.0.2.1:2222.

Owners (tagged, so the accounts are this run's own): alice has one guest that boots (``alice``) and one that
only holds its address lease (``alice2``: started without waiting, then stopped; a stopped VM keeps its
address); bob has one such leased VM, so his account exists and his key authenticates. The accounts and the
group are removed afterwards.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host.config import HostConfig
from ansible_collections.zjusct.cloud.plugins.module_utils.network import gateway as gw

from .conftest import REPO, VENV_BIN, Cloud, console_session, listening, type_until

pytestmark = [pytest.mark.guest, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(2700)]

GATEWAY = "192.0.2.1"  # the host stand-in's address on the world side
PORT = 2222
PROHIBITED = "administratively prohibited"  # sshd refused the channel (not in the key's permitopen list)


def _module(cloud: Cloud, module: str, args: dict) -> dict:
    proc = subprocess.run([str(VENV_BIN / "ansible"), "localhost", "-m", module, "-a", json.dumps(args)],
                          cwd=REPO, env=cloud.env(), capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


class Site:
    """The gateway set-up of this module: owners, their keys, client configs, guests' addresses."""

    def __init__(self, cloud: Cloud, tag: str, keys: dict) -> None:
        self.cloud, self.tag, self.keys = cloud, tag, keys
        self.alice, self.bob = f"alice-{tag}", f"bob-{tag}"
        self.addresses: dict = {}

    def client_config(self, key: Path) -> Path:
        path = key.with_suffix(".ssh_config")
        path.write_text(f"Host *\n  IdentityFile {key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
                        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  ConnectTimeout 30\n"
                        "  LogLevel INFO\n")  # INFO: the reason a channel was refused
        return path

    def ssh(self, key: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
        """``ssh -F <config for key> args...`` from the world namespace (outside the host)."""
        return subprocess.run(["ip", "netns", "exec", self.cloud.world_netns, "ssh", "-F",
                               str(self.client_config(key)), *args], capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)

    def open_port(self, key: Path, account: str, ip: str) -> subprocess.CompletedProcess:
        """``ssh -W <ip>:22 <account>@gateway`` (what ProxyJump does), reading the first line (an SSH banner)."""
        return self.ssh(key, "-p", str(PORT), "-o", "ServerAliveInterval=5", "-W", f"{ip}:22",
                        f"{account}@{GATEWAY}", timeout=120)


@pytest.fixture(scope="module")
def site(cloud: Cloud, tmp_path_factory):
    tag = uuid.uuid4().hex[:6]
    gateway_dir = f"/run/zjc-gw-{tag}"  # sshd's StrictModes refuses keys under the world-writable /tmp
    # The gateway accounts' shell runs the launcher's console client as the tenant's account: from a copy of the
    # package its accounts can read (a checkout may sit below root's 0700 home) with Debian's python3, as the role
    # installs it on a hypervisor (/usr/local/lib/zjusct-cloud/launcher, python3 from PATH).
    launcher_copy = f"/run/zjc-gwl-{tag}"
    shutil.copytree(REPO / "launcher" / "zjusct_launcher", f"{launcher_copy}/zjusct_launcher",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for path in (launcher_copy, *(str(p) for p in Path(launcher_copy).rglob("*"))):
        os.chmod(path, 0o755 if os.path.isdir(path) else 0o644)
    cloud.config.update(gateway_dir=gateway_dir, gateway_port=PORT, gateway_host=GATEWAY,
                        accel=os.environ.get("ZJUSCT_E2E_ACCEL", "tcg"), readiness_timeout_seconds=1800,
                        launcher_command=["/usr/bin/python3", "-m", "zjusct_launcher"],
                        launcher_pythonpath=launcher_copy)
    cloud.config_path.write_text(json.dumps(cloud.config))
    keydir = tmp_path_factory.mktemp("gateway-keys")
    keys = {"alice": cloud.key, "bob": keydir / "bob_ed25519"}
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys["bob"])], check=True)
    had_group = gw.existing_group_id() is not None
    made_privsep = not os.path.isdir("/run/sshd")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    s = Site(cloud, tag, keys)
    sshd = None
    try:
        _module(cloud, "zjusct.cloud.host_network", {"host_config": str(cloud.config_path)})
        with open(keydir / "sshd.log", "w", encoding="utf-8") as log:  # the child keeps its own descriptor
            sshd = subprocess.Popen(["ip", "netns", "exec", cloud.config["uplink_netns"], "/usr/sbin/sshd", "-D",
                                     "-e", "-f", f"{gateway_dir}/sshd_config"], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not listening(cloud.config["uplink_netns"], PORT):
            assert sshd.poll() is None, (keydir / "sshd.log").read_text()
            assert time.monotonic() < deadline, "the gateway sshd does not listen"
            time.sleep(0.2)
        # bob's VM and alice2 need only their address leases (taken at a first start), not a booted guest: each
        # is stopped right after its start. A guest still booting misses the power button, so that stop would
        # last the whole stop timeout (a boot's worth of CPU for nothing): these two starts get 5 s.
        cloud.config_path.write_text(json.dumps(dict(cloud.config, stop_timeout_seconds=5)))
        for owner, name, key in ((s.bob, s.bob, keys["bob"]), (s.alice, f"{s.alice}2", keys["alice"])):
            args = {"name": name, "owner": owner, "ssh_authorized_keys": [Path(f"{key}.pub").read_text().strip()]}
            _module(cloud, "zjusct.cloud.cloudvm", dict(args, power_state="running", wait=False))
            _module(cloud, "zjusct.cloud.cloudvm", dict(args, power_state="stopped"))
        cloud.config_path.write_text(json.dumps(cloud.config))
        cloud.playbook("vm_start", f"owner={s.alice}", "wait_timeout=1900", timeout=2000)
        for name in (s.alice, f"{s.alice}2", s.bob):
            s.addresses[name] = cloud.vm(name)["status"]["sshEndpoint"]["host"]
        yield s
    finally:
        if sshd is not None:
            sshd.terminate()
            sshd.wait(timeout=30)
            print("--- gateway sshd log (tail)\n" + (keydir / "sshd.log").read_text(errors="replace")[-3000:])
        for owner in (s.alice, s.bob):
            subprocess.run(["userdel", gw.account_name(owner)], check=False, capture_output=True)
        if not had_group:
            subprocess.run(["groupdel", gw.GROUP], check=False, capture_output=True)
        if made_privsep:
            os.rmdir("/run/sshd")
        subprocess.run(["rm", "-rf", gateway_dir, launcher_copy], check=False)


def test_alice_jumps_into_her_guest_with_the_status_jump_host(site: Site):
    """ssh -J <status.sshJumpHost> root@<status.sshEndpoint.host> from outside the host runs a command."""
    status = site.cloud.vm(site.alice)["status"]
    assert status["sshJumpHost"] == f"{gw.account_name(site.alice)}@{GATEWAY}:{PORT}"
    out = site.ssh(site.keys["alice"], "-J", status["sshJumpHost"], f"root@{status['sshEndpoint']['host']}",
                   "hostname")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == site.alice


def test_the_inventory_from_outside_connects_through_the_gateway(site: Site, tmp_path: Path):
    """The host inventory with use_ssh_gateway gives the ProxyJump; Ansible pings alice's guest from outside, the
    gateway's host key checked strictly against the known_hosts line host_network returns (what site.yml prints
    for tenants); without that line the jump fails on the unknown host key."""
    known = _module(site.cloud, "zjusct.cloud.host_network", {"host_config": str(site.cloud.config_path)})
    line = known["gateway_known_hosts"]
    assert line.startswith(f"[{GATEWAY}]:{PORT} ssh-ed25519 AAAA") and len(line.split()) == 3, line
    src = tmp_path / "outside.cloudvm.yml"
    src.write_text(f"plugin: zjusct.cloud.cloudvm\nsource: host\nhost_config: {site.cloud.config_path}\n"
                   f"use_ssh_gateway: true\nowners: [{site.alice}]\n")

    def ping(known_hosts: str) -> subprocess.CompletedProcess:
        hosts = tmp_path / "known_hosts"
        hosts.write_text(known_hosts)
        config = tmp_path / "strict.ssh_config"  # strict for the gateway; the guest as Ansible's own setting says
        config.write_text(f"Host {GATEWAY}\n  StrictHostKeyChecking yes\n  UserKnownHostsFile {hosts}\n"
                          + site.client_config(site.keys["alice"]).read_text())
        env = dict(site.cloud.env(), ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_STDOUT_CALLBACK="default",
                   ANSIBLE_SSH_ARGS=f"-F {config}")
        return subprocess.run(["ip", "netns", "exec", site.cloud.world_netns, str(VENV_BIN / "ansible"), "-i",
                               str(src), "all", "-m", "ansible.builtin.raw", "-a", "hostname"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600, check=False)

    listed = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(src), "--list"], cwd=REPO,
                            env=site.cloud.env(), capture_output=True, text=True, timeout=300, check=True)
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"][f"{site.alice}.default"]
    args = hostvars["ansible_ssh_common_args"]
    assert (args.get("__ansible_unsafe") if isinstance(args, dict) else args) == \
        f"-o ProxyJump={gw.account_name(site.alice)}@{GATEWAY}:{PORT}"
    unknown = ping("")
    assert unknown.returncode != 0 and "Host key verification failed" in unknown.stdout + unknown.stderr, unknown
    reached = ping(line + "\n")
    assert reached.returncode == 0, reached.stdout[-3000:] + reached.stderr[-2000:]
    assert site.alice in reached.stdout


def test_bobs_key_cannot_open_alices_vm(site: Site):
    """Through his own account sshd refuses the channel; through alice's account his key is not accepted."""
    alice_ip = site.addresses[site.alice]
    own = site.open_port(site.keys["bob"], gw.account_name(site.bob), alice_ip)
    assert own.returncode != 0 and PROHIBITED in own.stderr, own
    assert "SSH-2.0" not in own.stdout
    via_alice = site.open_port(site.keys["bob"], gw.account_name(site.alice), alice_ip)
    assert via_alice.returncode != 0 and "Permission denied" in via_alice.stderr, via_alice
    # -L as well: the local end accepts, but the gateway refuses the channel, so nothing of alice's guest comes back
    world = site.cloud.world_netns
    forward = subprocess.Popen(["ip", "netns", "exec", world, "ssh", "-F", str(site.client_config(site.keys["bob"])),
                                "-N", "-p", str(PORT), "-L", f"127.0.0.1:2201:{alice_ip}:22",
                                f"{gw.account_name(site.bob)}@{GATEWAY}"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not listening(world, 2201):
            assert forward.poll() is None and time.monotonic() < deadline, forward.stderr
            time.sleep(0.2)
        read = subprocess.run(["ip", "netns", "exec", world, "python3", "-c",
                               "import socket; s=socket.create_connection(('127.0.0.1',2201),10); s.settimeout(30);"
                               " print(repr(s.recv(64)))"], capture_output=True, text=True, timeout=60, check=True)
        assert read.stdout.strip() == "b''", read
    finally:
        forward.terminate()
        _, err = forward.communicate(timeout=30)
    assert PROHIBITED in err, err
    # the control: alice's own key through her account gets her guest's banner
    alice = site.open_port(site.keys["alice"], gw.account_name(site.alice), alice_ip)
    assert alice.stdout.startswith("SSH-2.0"), alice


def test_bob_gets_no_shell_on_the_gateway(site: Site):
    """bob's key authenticates, but no command or shell, with or without a terminal: the account's shell runs only
    the console of a VM his key opens (the usage says so)."""
    account = f"{gw.account_name(site.bob)}@{GATEWAY}"
    command = site.ssh(site.keys["bob"], "-p", str(PORT), account, "id; echo shell-ran")
    assert command.returncode != 0 and "shell-ran" not in command.stdout and "uid=" not in command.stdout, command
    assert "Permission denied" not in command.stderr, "the key should authenticate (only the shell is refused)"
    assert "this is the zjusct.cloud SSH gateway" in command.stderr, command
    tty = site.ssh(site.keys["bob"], "-tt", "-p", str(PORT), account)
    assert tty.returncode != 0 and "uid=" not in tty.stdout, tty


def test_host_users_other_than_root_and_the_gateway_cannot_reach_guests(site: Site):
    """On the host (stand-in) a process of another uid/gid cannot open a guest's port 22; root still can."""
    alice_ip = site.addresses[site.alice]
    probe = ("import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1],22),8)\n print(s.recv(64))\n"
             "except OSError as e:\n print('refused',e)\n")
    netns = site.cloud.config["uplink_netns"]
    nobody = subprocess.run(["ip", "netns", "exec", netns, "setpriv", "--reuid=65534", "--regid=65534",
                             "--clear-groups", "python3", "-c", probe, alice_ip], capture_output=True, text=True,
                            timeout=60, check=True)
    assert "refused" in nobody.stdout and "SSH-2.0" not in nobody.stdout, nobody
    root = subprocess.run(["ip", "netns", "exec", netns, "python3", "-c", probe, alice_ip], capture_output=True,
                          text=True, timeout=60, check=True)
    assert "SSH-2.0" in root.stdout, root


def test_guests_cannot_reach_the_gateway_port(site: Site):
    """alice's guest cannot connect to the gateway sshd on the uplink's outer address (the host's services)."""
    outer = site.cloud.config["uplink_cidr"].split("/")[0].rsplit(".", 1)[0] + ".1"
    out = site.cloud.ssh(site.addresses[site.alice],
                         f"python3 -c \"import socket; socket.create_connection(('{outer}', {PORT}), 8)\" "
                         "&& echo connected || echo refused", timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "refused", out


def test_a_deleted_vms_port_is_closed(site: Site):
    """alice2 (alice's, leased, stopped): the gateway lets alice try its port; after vm_delete it refuses at once."""
    name = f"{site.alice}2"
    ip = site.addresses[name]
    account = gw.account_name(site.alice)
    keys_file = Path(site.cloud.config["gateway_dir"]) / "keys" / account
    assert f'permitopen="{ip}:22"' in keys_file.read_text()
    before = site.open_port(site.keys["alice"], account, ip)
    assert PROHIBITED not in before.stderr, before  # allowed by the gateway; the stopped guest does not answer
    site.cloud.playbook("vm_delete", f"owner={site.alice}", f"name={name}", "delete_volume=true")
    assert ip not in keys_file.read_text()
    after = site.open_port(site.keys["alice"], account, ip)
    assert after.returncode != 0 and PROHIBITED in after.stderr, after
    # her running guest is still open to her
    assert site.open_port(site.keys["alice"], account, site.addresses[site.alice]).stdout.startswith("SSH-2.0")



def test_keys_follow_the_vm_spec_at_once(site: Site, tmp_path: Path):
    """A key added to bob's (stopped) VM spec authenticates as zc-bob right away; removed again, it is refused.

    No boot of bob's VM runs, so the gateway grants its spec's keys, the ones its next boot gets (a running VM keeps
    its boot's keys until the next boot: tests/e2e/host/test_gateway_site_layout.py)."""
    extra = tmp_path / "extra_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(extra)], check=True)
    bob_key = Path(f"{site.keys['bob']}.pub").read_text().strip()
    account = f"{gw.account_name(site.bob)}@{GATEWAY}"
    before = site.ssh(extra, "-p", str(PORT), account, "true")
    assert "Permission denied" in before.stderr, before
    try:
        _module(site.cloud, "zjusct.cloud.cloudvm", {"name": site.bob, "owner": site.bob,
                                                     "ssh_authorized_keys": [bob_key, extra.with_suffix(".pub")
                                                                             .read_text().strip()]})
        added = site.ssh(extra, "-p", str(PORT), account, "true")
        assert "Permission denied" not in added.stderr and added.returncode != 0, added  # in, but no shell
    finally:
        _module(site.cloud, "zjusct.cloud.cloudvm", {"name": site.bob, "owner": site.bob,
                                                     "ssh_authorized_keys": [bob_key]})
    removed = site.ssh(extra, "-p", str(PORT), account, "true")
    assert "Permission denied" in removed.stderr, removed


def test_alice_repairs_her_broken_sshd_on_her_serial_console(site: Site):
    """alice stops her guest's sshd (SSH no longer answers), attaches to the guest's serial console through the
    gateway (``ssh -t ... console <vm>``: root is logged in there), starts sshd again, detaches with Ctrl-], and
    SSH answers again. While her session lasts a second one is refused with a message."""
    account, ip = gw.account_name(site.alice), site.addresses[site.alice]
    status = site.cloud.vm(site.alice)["status"]
    site.ssh(site.keys["alice"], "-J", status["sshJumpHost"], f"root@{ip}", "systemctl stop ssh")
    deadline = time.monotonic() + 120
    while site.open_port(site.keys["alice"], account, ip).stdout.startswith("SSH-2.0"):
        assert time.monotonic() < deadline, "the guest's sshd still answers after systemctl stop ssh"
        time.sleep(2)
    session = console_session(site.cloud.world_netns, site.client_config(site.keys["alice"]), "-p", str(PORT),
                              f"{account}@{GATEWAY}", "console", site.alice)
    try:
        type_until(session, b"\r", f"root@{site.alice}".encode())
        second = site.ssh(site.keys["alice"], "-tt", "-p", str(PORT), f"{account}@{GATEWAY}", "console", site.alice)
        assert second.returncode == 1 and "is in use by another session" in second.stdout + second.stderr, second
        type_until(session, b"systemctl start ssh; echo repaired-$((6*7))\r", b"repaired-42")
        out = type_until(session, b"\x1d", b"detached")
        assert session.wait(timeout=60) == 0, out[-2000:]
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    again = site.ssh(site.keys["alice"], "-J", status["sshJumpHost"], f"root@{ip}", "hostname")
    assert again.returncode == 0 and again.stdout.strip() == site.alice, again


def test_bob_cannot_attach_to_alices_console(site: Site):
    """bob's key opens only his VMs' consoles: asking for alice's is refused naming what his key opens; his account
    cannot open her console socket on the host either (hers, 0600), while hers can."""
    refused = site.ssh(site.keys["bob"], "-tt", "-p", str(PORT), f"{gw.account_name(site.bob)}@{GATEWAY}", "console",
                       site.alice)
    text = refused.stdout + refused.stderr
    assert refused.returncode == 2 and f"no console of '{site.alice}' for this key" in text, refused
    assert f"default/{site.bob}" in text and "default/" + site.alice not in text.replace(f"'{site.alice}'", "")
    socket_path = HostConfig(**{k: v for k, v in site.cloud.config.items() if k == "runtime_dir"}) \
        .console_socket("default", site.alice)
    probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect(sys.argv[1]); print('connected')"
             "\nexcept OSError as e:\n print('refused', e.strerror)\n")

    def connect_as(owner: str) -> str:
        entry = pwd.getpwnam(gw.account_name(owner))
        return subprocess.run(["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups",
                               "/usr/bin/python3", "-c", probe, socket_path], capture_output=True, text=True,
                              timeout=60, check=True).stdout.strip()

    assert connect_as(site.bob) == "refused Permission denied"
    assert connect_as(site.alice) == "connected"
