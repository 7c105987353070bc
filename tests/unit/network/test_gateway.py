"""The SSH gateway's pure parts: account names, which key opens which guest, the keys in effect, authorized_keys and
sshd_config, the directories sshd can read keys below, the guard rules that let the gateway (and only it) open
guests' port 22, and the host config's gateway keys."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import config as _hostconfig
from ansible_collections.zjusct.cloud.plugins.module_utils.network import gateway as gw
from ansible_collections.zjusct.cloud.plugins.module_utils.network.hostnet import guard_ruleset, uplink_outer_ruleset

REPO = Path(__file__).resolve().parents[3]
ALICE1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAlice1111111111111111111111111111111111111 alice@laptop"
ALICE2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAlice2222222222222222222222222222222222222 alice@desk"
BOB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBob33333333333333333333333333333333333333333 bob@laptop"


def test_account_names_follow_the_naming_rule():
    assert gw.account_name("alice") == "zc-alice"
    long = gw.account_name("a" * 63)
    assert len(long) == gw.ACCOUNT_NAME_MAX and long.startswith("zc-aaaa")
    assert gw.account_name("a" * 63) != gw.account_name("a" * 62 + "b")


def test_a_key_opens_exactly_the_vms_of_its_owner_that_list_it_and_their_consoles():
    vms = [{"owner": "alice", "ipv4": "10.200.0.3", "keys": [ALICE1, ALICE2],
            "console": ["default/web", "/run/zjusct-cloud/consoles/default_web.sock"]},
           {"owner": "alice", "ipv4": "10.200.0.2", "keys": [ALICE1.replace("alice@laptop", "other comment")],
            "console": ["team/db", "/run/zjusct-cloud/consoles/team_db.sock"]},
           {"owner": "bob", "ipv4": "10.200.0.4", "keys": [BOB, "not a key"],
            "console": ["default/bob", "/run/zjusct-cloud/consoles/default_bob.sock"]}]
    grants = gw.key_grants(vms)
    a1, a2, b = (gw.key_identity(k) for k in (ALICE1, ALICE2, BOB))
    web = "default/web=/run/zjusct-cloud/consoles/default_web.sock"
    db = "team/db=/run/zjusct-cloud/consoles/team_db.sock"
    assert grants == {
        "zc-alice": {a1: {"ipv4": ["10.200.0.2", "10.200.0.3"],
                          "consoles": {"default/web": web.split("=")[1], "team/db": db.split("=")[1]}},
                     a2: {"ipv4": ["10.200.0.3"], "consoles": {"default/web": web.split("=")[1]}}},
        "zc-bob": {b: {"ipv4": ["10.200.0.4"],
                       "consoles": {"default/bob": "/run/zjusct-cloud/consoles/default_bob.sock"}}}}
    text = gw.authorized_keys(grants["zc-alice"])
    assert text.splitlines() == sorted([
        f'restrict,pty,port-forwarding,permitopen="10.200.0.2:22",permitopen="10.200.0.3:22",command="{web} {db}" {a1}',
        f'restrict,pty,port-forwarding,permitopen="10.200.0.3:22",command="{web}" {a2}'])
    assert "bob" not in text and "10.200.0.4" not in text
    assert gw.authorized_keys({}) == ""


def test_the_accounts_shell_runs_only_the_launchers_gateway_with_its_arguments_unread_by_sh():
    text = gw.shell_script(("python3", "-m", "zjusct_launcher"), "/usr/local/lib/zjusct-cloud/launcher")
    assert text.splitlines()[0] == "#!/bin/sh"
    assert text.splitlines()[-1] == ("PYTHONPATH=/usr/local/lib/zjusct-cloud/launcher exec python3 -m zjusct_launcher"
                                     ' gateway "$@"')
    assert "PYTHONPATH='/a b' exec '/opt/my venv/python'" in gw.shell_script(("/opt/my venv/python",), "/a b")


@pytest.mark.parametrize("line", [
    'command="sh" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIxxx',  # options are never copied
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIxxx\nrestrict ssh-rsa AAAAB3",  # no second line
    "ssh-dss AAAAB3NzaC1kc3MAAACB",
])
def test_lines_that_are_not_plain_public_keys_grant_nothing(line):
    assert gw.key_identity(line) is None
    assert gw.key_grants([{"owner": "eve", "ipv4": "10.200.0.9", "keys": [line],
                           "console": ["default/eve", "/run/c/default_eve.sock"]}]) == {"zc-eve": {}}


def test_sshd_config_allows_only_local_forwarding_to_port_22_for_the_gateway_group():
    text = gw.sshd_config("/etc/zjusct-cloud/gateway", 2222)
    options = dict(line.split(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert options["Port"] == "2222"
    assert options["AuthorizedKeysFile"] == "/etc/zjusct-cloud/gateway/keys/%u"
    assert options["AllowGroups"] == gw.GROUP
    assert options["PermitOpen"] == "*:22"
    assert options["AllowTcpForwarding"] == "local"
    for key in ("PasswordAuthentication", "KbdInteractiveAuthentication", "X11Forwarding",
                "AllowAgentForwarding", "AllowStreamLocalForwarding", "PermitTunnel", "PermitRootLogin",
                "PermitUserRC"):
        assert options[key] == "no", key
    assert options["PermitListen"] == "none"
    # a terminal for the console only: each key's forced command runs the accounts' shell, never a command shell
    assert options["PermitTTY"] == "yes" and "ForceCommand" not in options


def test_guard_lets_only_the_gateway_address_open_guests_port_22():
    without = guard_ruleset("zjbr0", "zjup1")
    assert not any("ct state new" in rule for rule in without)
    rules = guard_ruleset("zjbr0", "zjup1", gateway_source="100.64.255.1")
    (rule,) = [r for r in rules if "ct state new" in r]
    assert rule.strip() == 'iifname "zjup1" oifname "zjbr0" ip saddr 100.64.255.1 tcp dport 22 ct state new accept'
    assert rules.index(rule) < rules.index('  oifname "zjbr0" drop')
    assert not any("ct state new" in r for r in guard_ruleset("zjbr0", "zjup1", forward=False,
                                                              gateway_source="100.64.255.1"))


def test_outer_side_opens_guest_connections_only_for_root_and_the_gateway_group():
    assert uplink_outer_ruleset("10.200.0.0/24", "100.64.255.0/30") == \
        uplink_outer_ruleset("10.200.0.0/24", "100.64.255.0/30", None)
    rules = uplink_outer_ruleset("10.200.0.0/24", "100.64.255.0/30", gateway_gid=997)
    assert '  oifname "zjup0" ip daddr 10.200.0.0/24 ct state new meta skuid 0 accept' in rules
    assert '  oifname "zjup0" ip daddr 10.200.0.0/24 ct state new meta skgid 997 tcp dport 22 accept' in rules
    assert rules.count('  oifname "zjup0" ip daddr 10.200.0.0/24 ct state new drop') == 2  # output and forward


def test_host_config_gateway_keys(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"node": "hv1", "gateway_dir": "/etc/zjusct-cloud/gateway",
                                "uplink_cidr": "100.64.9.0/30"}))
    cfg = _hostconfig.load(str(path))
    assert cfg.gateway_source() == "100.64.9.1"
    assert cfg.gateway_jump("zc-alice") == "zc-alice@hv1:2222"
    assert _hostconfig.HostConfig().gateway_jump("zc-alice") is None
    for bad, named in (({"gateway_port": 0}, "gateway_port: 0"), ({"gateway_port": "22"}, "gateway_port: '22'"),
                       ({"gateway_dir": "/g", "nat": False}, "needs nat: true"),
                       ({"gateway_dir": "/g", "netns": ""}, "needs nat: true"),
                       ({"gateway_dir": "gw"}, "not an absolute path")):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=named):
            _hostconfig.load(str(path))


def test_keys_in_effect_are_the_running_boots_else_the_specs():
    assert gw.keys_in_effect([ALICE2], [ALICE1]) == [ALICE1]  # a boot runs: its keys, not the newer spec's
    assert gw.keys_in_effect([ALICE2], None) == [ALICE2]  # none runs: the keys its next boot gets
    assert gw.keys_in_effect(None, None) == []
    assert gw.keys_in_effect([ALICE2], []) == []  # a boot without keys grants none, whatever the spec says now


GID = 997  # the gateway group's gid in these cases


@pytest.mark.parametrize(("uid", "gid", "mode", "wrong"), [
    (0, 0, 0o700, "cannot pass through it"),  # the hypervisor role's config directory on main
    (0, 0, 0o750, "cannot pass through it"),  # the group may pass, but it is root's, not the gateway's
    (0, GID, 0o700, "cannot pass through it"),
    (0, 0, 0o1777, "group or world writable"),  # /tmp
    (0, GID, 0o770, "group or world writable"),
    (1000, 0, 0o755, "owned by root"),
])
def test_path_problems_name_a_directory_sshd_cannot_read_keys_below(uid, gid, mode, wrong):
    (problem,) = gw.path_problems([("/", 0, 0, 0o755), ("/etc/zc", uid, gid, mode)], GID)
    assert problem.startswith(f"/etc/zc (uid {uid}, gid {gid}, mode {mode:04o}): ") and wrong in problem


@pytest.mark.parametrize(("gid", "mode"), [(0, 0o711), (0, 0o755), (GID, 0o710), (GID, 0o750)])
def test_path_problems_accept_what_the_gateway_group_may_pass(gid, mode):
    assert gw.path_problems([("/", 0, 0, 0o755), ("/etc/zc", 0, gid, mode)], GID) == []


def test_path_problems_without_the_group_count_only_other_bits():
    assert gw.path_problems([("/etc/zc", 0, GID, 0o710)], None) != []
    assert gw.path_problems([("/etc/zc", 0, GID, 0o711)], None) == []


def test_the_roles_gateway_group_is_the_modules():
    """roles/hypervisor gives its config directory to the group the host_network module makes its accounts in."""
    import yaml

    role_vars = yaml.safe_load((REPO / "roles" / "hypervisor" / "vars" / "main.yml").read_text())
    assert role_vars["hypervisor_ssh_gateway_group"] == gw.GROUP


def test_ensure_gateway_refuses_a_parent_the_accounts_cannot_pass_and_writes_nothing(tmp_path, monkeypatch):
    """A gateway_dir under a root-only directory (the role's 0700 config directory) fails naming that directory;
    none of the gateway's files is written. (The group lookup is stubbed: no host group is made here.)"""
    monkeypatch.setattr(gw, "group_id", lambda: GID)
    parent = tmp_path / "etc"
    parent.mkdir(mode=0o700)
    parent.chmod(0o700)
    directory = parent / "gateway"
    with pytest.raises(gw.GatewayError) as caught:
        gw.ensure_gateway(str(directory), 2222, "#!/bin/sh\n")
    message = str(caught.value)
    assert message.startswith(f"gateway_dir (hypervisor_ssh_gateway_dir): {directory}: ")
    assert (f"{parent} (uid {os.getuid()}, gid {os.getgid()}, mode 0700): the gateway's accounts (group"
            " zjusct-gateway) cannot pass through it") in message
    assert "none of the gateway's files was written" in message
    assert not directory.exists()
    # check mode predicts, never raises
    assert gw.ensure_gateway(str(directory), 2222, "#!/bin/sh\n", check_mode=True) is True
    assert not directory.exists()


def test_known_hosts_line_names_the_port_in_brackets_and_drops_the_comment(tmp_path):
    assert gw.known_hosts_line(str(tmp_path), "hv1", 2222) is None  # no host key yet
    pub = tmp_path / "ssh_host_ed25519_key.pub"
    pub.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey zjusct-cloud-gateway\n")
    assert gw.known_hosts_line(str(tmp_path), "hv1", 2222) == "[hv1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey"
    assert gw.known_hosts_line(str(tmp_path), "192.0.2.1", 22) == "192.0.2.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey"
    pub.write_text("garbage\n")
    with pytest.raises(gw.GatewayError, match="is not an OpenSSH public key"):
        gw.known_hosts_line(str(tmp_path), "hv1", 2222)


def test_launcher_problems_name_each_directory_the_accounts_cannot_pass_or_read(tmp_path: Path):
    """The gateway's accounts run the console client from launcher_pythonpath as themselves."""
    top = tmp_path / "lib"
    launcher = top / "launcher"
    launcher.mkdir(parents=True)
    open_path = [(str(p), p.stat().st_mode & 0o7777) for p in (top, launcher)]
    try:
        top.chmod(0o700)
        launcher.chmod(0o750)
        problems = gw.launcher_problems(str(launcher))
        assert f"{top} (mode 0700) is not passable by others" in problems
        assert f"{launcher} (mode 0750) is not readable and passable by others" in problems
        top.chmod(0o711)
        launcher.chmod(0o755)
        assert [p for p in gw.launcher_problems(str(launcher)) if str(tmp_path) in p and str(top) in p] == []
        assert gw.launcher_problems(str(tmp_path / "missing"))[-1] == f"{tmp_path / 'missing'} does not exist"
        assert gw.launcher_problems("") == []
    finally:
        for path, mode in open_path:
            os.chmod(path, mode)


def test_console_sockets_fit_a_unix_socket_path_and_a_runtime_dir_that_leaves_no_room_is_refused(tmp_path: Path):
    cfg = _hostconfig.HostConfig(runtime_dir="/run/zjusct-cloud")
    assert cfg.console_socket("default", "alice") == "/run/zjusct-cloud/consoles/default_alice.sock"
    longest = _hostconfig.HostConfig(runtime_dir="/r" * 40).console_socket("n" * 63, "v" * 63)
    assert len(longest) <= 107 and longest.startswith("/r" * 40 + "/consoles/nnn") and longest.endswith(".sock")
    assert longest != _hostconfig.HostConfig(runtime_dir="/r" * 40).console_socket("n" * 63, "v" * 62 + "w")
    config = tmp_path / "host.json"
    for bad in ("/r" * 41, "/run/zjusct cloud", "run/zjusct-cloud"):
        config.write_text(json.dumps({"runtime_dir": bad}))
        with pytest.raises(ValueError, match=r"runtime_dir: .* is not an absolute path of at most 80 characters"):
            _hostconfig.load(str(config))


def test_the_console_directory_is_roots_alone_check_mode_predicts_and_a_non_directory_is_refused(tmp_path: Path):
    from ansible_collections.zjusct.cloud.plugins.module_utils.host.network import ensure_console_dir

    cfg = _hostconfig.HostConfig(runtime_dir=str(tmp_path / "run"))  # no gateway: root 0700
    assert ensure_console_dir(cfg, check_mode=True) is True and not os.path.exists(cfg.console_dir)
    assert ensure_console_dir(cfg) is True
    st = os.lstat(cfg.console_dir)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (os.geteuid(), 0, 0o700)
    assert ensure_console_dir(cfg, check_mode=True) is False and ensure_console_dir(cfg) is False
    os.chmod(cfg.console_dir, 0o755)
    assert ensure_console_dir(cfg, check_mode=True) is True and ensure_console_dir(cfg) is True
    assert os.lstat(cfg.console_dir).st_mode & 0o7777 == 0o700
    os.rmdir(cfg.console_dir)
    os.symlink("/tmp", cfg.console_dir)
    with pytest.raises(gw.GatewayError, match="consoles is not a directory"):
        ensure_console_dir(cfg)
