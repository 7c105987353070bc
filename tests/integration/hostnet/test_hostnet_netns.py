"""The host backend's guest network on real namespaces, bridges, veths and nftables (no QEMU).

Each "guest" is a network namespace whose veth peer is enslaved to the cloud's bridge under a
TAP-style name, so the isolation rules and the NAT uplink are exercised exactly as for a QEMU
guest's TAP, in milliseconds. The uplink's outer end goes into a namespace standing in for the
host (``outside``), which routes to a "world" namespace holding 198.51.100.1.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.network import hostnet as net

from . import isolation_checks as chk

pytestmark = pytest.mark.netns

SUBNET = "10.217.0.0/24"
UPLINK = "100.64.217.0/30"
OUTSIDE_LINK = ("192.0.2.1", "192.0.2.2")  # outside (host stand-in) <-> world
WORLD = "198.51.100.1"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=check)


class Topology:
    def __init__(self, tag: str):
        self.cloud, self.outside, self.world = f"zjc-nt-{tag}", f"zjc-no-{tag}", f"zjc-nw-{tag}"
        self.guests: dict = {}

    def guest(self, owner: str, tap: str, ip: str) -> chk.Guest:
        """A namespace standing in for a guest, attached to the bridge through a veth named like a TAP."""
        ns = f"{self.cloud}-{tap}"
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", self.cloud, "link", "add", tap, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "-n", self.cloud, "link", "set", tap, "master", "zjbr0", "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", net.gateway(SUBNET))
        mac = sh("ip", "netns", "exec", ns, "cat", "/sys/class/net/eth0/address").stdout.strip()

        def probe(*args: str) -> dict:
            proc = sh("ip", "netns", "exec", ns, sys.executable, str(chk.PROBE), *args)
            return chk.json.loads(proc.stdout.strip().splitlines()[-1])

        def shell(command: str) -> subprocess.CompletedProcess:
            return sh("ip", "netns", "exec", ns, "sh", "-c", command, check=False)

        g = chk.Guest(f"{owner}:{tap}", ip, mac, tap, probe, shell)
        self.guests[tap] = (owner, g, ns)
        return g

    def groups(self) -> dict:
        out: dict = {}
        for owner, g, _ in self.guests.values():
            out.setdefault(owner, []).append({"tap": g.tap, "mac": g.mac, "ipv4": g.ip})
        return out

    def view(self) -> chk.Cloud:
        return chk.Cloud(self.cloud, "zjbr0", net.gateway(SUBNET), self.outside,
                         (str(net._network(UPLINK)[1]), OUTSIDE_LINK[0]))


@pytest.fixture
def topology():
    topo = Topology(uuid.uuid4().hex[:6])
    for ns in (topo.outside, topo.world):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", topo.world, "addr", "add", f"{WORLD}/32", "dev", "lo")
    sh("ip", "-n", topo.outside, "link", "add", "zjw0", "type", "veth", "peer", "name", "eth0", "netns", topo.world)
    sh("ip", "-n", topo.outside, "addr", "add", f"{OUTSIDE_LINK[0]}/24", "dev", "zjw0")
    sh("ip", "-n", topo.world, "addr", "add", f"{OUTSIDE_LINK[1]}/24", "dev", "eth0")
    for ns, dev in ((topo.outside, "zjw0"), (topo.world, "eth0")):
        sh("ip", "-n", ns, "link", "set", dev, "up")
    sh("ip", "-n", topo.outside, "route", "add", f"{WORLD}/32", "via", OUTSIDE_LINK[1])
    try:
        yield topo
    finally:
        for ns in (topo.cloud, topo.outside, topo.world, *(ns for _, _, ns in topo.guests.values())):
            sh("ip", "netns", "del", ns, check=False)


GATEWAY_GID = 4242  # the SSH gateway group's gid in the rules (no group of that id needs to exist)


@pytest.fixture(params=["no-gateway", "gateway"])
def guests(topology, request):
    """The cloud with forwarding opted in on the outside; alice (two guests) and bob (one). Once without and once
    with the SSH gateway's rules (docs/security.md): every isolation check must hold in both."""
    gateway = request.param == "gateway"
    net.ensure_bridge(topology.cloud, "zjbr0", SUBNET,
                      gateway_source=str(net._network(UPLINK)[1]) if gateway else None)
    net.ensure_uplink(topology.cloud, SUBNET, UPLINK, topology.outside, ip_forward=True,
                      gateway_gid=GATEWAY_GID if gateway else None)
    a1 = topology.guest("alice", "zjtaaaa0001", "10.217.0.2")
    a2 = topology.guest("alice", "zjtaaaa0002", "10.217.0.3")
    b1 = topology.guest("bob", "zjtbbbb0001", "10.217.0.4")
    net.apply_isolation(topology.cloud, topology.groups())
    return topology, a1, a2, b1


def test_bridge_and_uplink_are_idempotent(topology):
    assert net.ensure_bridge(topology.cloud, "zjbr0", SUBNET) is True
    assert net.ensure_uplink(topology.cloud, SUBNET, UPLINK, topology.outside) is True
    assert net.ensure_bridge(topology.cloud, "zjbr0", SUBNET) is False
    assert net.ensure_uplink(topology.cloud, SUBNET, UPLINK, topology.outside) is False
    assert "10.217.0.1/24" in sh("ip", "-n", topology.cloud, "-o", "addr", "show", "dev", "zjbr0").stdout
    assert net.apply_isolation(topology.cloud, {}) is True
    assert net.apply_isolation(topology.cloud, {}) is False


def test_bringing_the_network_up_changes_no_sysctl_outside_the_cloud_namespace(topology):
    """The host's ip_forward and the uplink's outer side's (the host's stand-in) stay as they were,
    unless the operator opted in (uplink_ip_forward); inside the cloud's namespace forwarding is on."""
    # a new namespace inherits the host's current value: start the host's stand-in from "off"
    sh("ip", "netns", "exec", topology.outside, "sysctl", "-q", "-w", "net.ipv4.ip_forward=0")
    host_before = open("/proc/sys/net/ipv4/ip_forward", encoding="ascii").read()
    outside_before = net.read_sysctl(topology.outside, "net.ipv4.ip_forward")
    assert outside_before == "0"
    net.ensure_bridge(topology.cloud, "zjbr0", SUBNET)
    net.ensure_uplink(topology.cloud, SUBNET, UPLINK, topology.outside)
    assert net.read_sysctl(topology.outside, "net.ipv4.ip_forward") == outside_before
    assert net.uplink_forwarding(topology.outside) is False
    assert open("/proc/sys/net/ipv4/ip_forward", encoding="ascii").read() == host_before
    assert net.read_sysctl(topology.cloud, "net.ipv4.ip_forward") == "1"
    assert net.read_sysctl(topology.cloud, "net.bridge.bridge-nf-call-iptables") in ("0", None)
    # the explicit opt-in, and only it, turns forwarding on in the outer namespace
    assert net.ensure_uplink(topology.cloud, SUBNET, UPLINK, topology.outside, ip_forward=True) is True
    assert net.uplink_forwarding(topology.outside) is True
    assert open("/proc/sys/net/ipv4/ip_forward", encoding="ascii").read() == host_before


def test_allowed_traffic_passes(guests):
    topo, a1, a2, b1 = guests
    cloud = topo.view()
    chk.check_gateway_answers_ping(b1, cloud)
    assert chk.check_outside_reachable(b1, topo.world, WORLD, 2204) == OUTSIDE_LINK[0]  # NAT'd twice
    assert chk.check_outside_reachable(a2, topo.world, WORLD, 2205) == OUTSIDE_LINK[0]
    # same owner, directly on the bridge
    obs = chk.Observer(f"{topo.cloud}-{a2.tap}", "listen", "--host", a2.ip,
                       "--port", "2202", "--until", "never", "--timeout", "30", "--once")
    try:
        got = a1.probe("routed", "--dst-ip", a2.ip, "--tcp-port", "2202", "--count", "0", "--marker", "x")
        heard = obs.result()
    finally:
        obs.stop()
    assert got.get("tcp") == "hello" and heard["tcp_peers"] == [a1.ip], (got, heard)
    # the cloud's namespace opens connections to guests (SSH, readiness probes)
    obs = chk.Observer(f"{topo.cloud}-{b1.tap}", "listen", "--host", b1.ip, "--port", "2222", "--until", "never",
                       "--timeout", "30", "--once")
    try:
        code = f"import socket; print(socket.create_connection(('{b1.ip}', 2222), timeout=5).recv(5).decode())"
        out = chk.run_in(topo.cloud, [sys.executable, "-c", code]).stdout.strip()
        obs.result()
    finally:
        obs.stop()
    assert out == "hello"
    # the cloud's namespace itself (launchers, QEMU reaching Ceph) still reaches the host's services
    outer_ip = str(net._network(UPLINK)[1])
    obs = chk.Observer(topo.outside, "listen", "--host", outer_ip, "--port", "2223", "--until", "never",
                       "--timeout", "30", "--once")
    try:
        code = f"import socket; print(socket.create_connection(('{outer_ip}', 2223), timeout=5).recv(5).decode())"
        out = chk.run_in(topo.cloud, [sys.executable, "-c", code]).stdout.strip()
        obs.result()
    finally:
        obs.stop()
    assert out == "hello"


def test_routed_guest_to_guest_of_another_owner_is_dropped(guests):
    topo, a1, _, b1 = guests
    chk.check_routed_to_other_owner_dropped(topo.view(), b1, a1)


def test_spoofed_source_mac_is_dropped(guests):
    topo, a1, _, b1 = guests
    chk.check_spoofed_mac_dropped(topo.view(), b1, a1)


def test_spoofed_source_ip_is_dropped(guests):
    topo, a1, _, b1 = guests
    chk.check_spoofed_ip_dropped(topo.view(), b1, a1, "10.217.0.250")


def test_arp_poisoning_is_dropped(guests):
    topo, a1, _, b1 = guests
    chk.check_arp_poisoning_dropped(topo.view(), b1, a1)


def test_guests_reach_no_service_of_the_cloud_namespace_or_the_host(guests):
    topo, _, _, b1 = guests
    chk.check_no_service_beyond_provided(topo.view(), b1, 2207)


def test_starting_and_deleting_guests_changes_set_elements_not_rules(topology):
    net.ensure_bridge(topology.cloud, "zjbr0", SUBNET)
    a1 = topology.guest("alice", "zjtaaaa0001", "10.217.0.2")
    assert net.apply_isolation(topology.cloud, topology.groups()) is True

    def rules() -> list:
        listing = sh("ip", "netns", "exec", topology.cloud, "nft", "-a", "list", "table", "bridge",
                     net.NFT_TABLE).stdout
        return [line.strip() for line in listing.splitlines() if "# handle" in line and "elements" not in line]

    before = rules()
    a2 = topology.guest("alice", "zjtaaaa0002", "10.217.0.3")
    topology.guest("bob", "zjtbbbb0001", "10.217.0.4")
    assert net.apply_isolation(topology.cloud, topology.groups()) is True
    assert rules() == before  # same rules, same handles: only elements were added
    listing = sh("ip", "netns", "exec", topology.cloud, "nft", "list", "table", "bridge", net.NFT_TABLE).stdout
    assert '"zjtaaaa0001" . "zjtaaaa0002"' in listing and f'"zjtaaaa0002" . {a2.mac}' in listing
    assert '"zjtaaaa0001" . "zjtbbbb0001"' not in listing
    assert net.apply_isolation(topology.cloud, {"alice": [{"tap": a1.tap, "mac": a1.mac, "ipv4": a1.ip}]}) is True
    listing = sh("ip", "netns", "exec", topology.cloud, "nft", "list", "table", "bridge", net.NFT_TABLE).stdout
    assert "zjtbbbb0001" not in listing and "zjtaaaa0002" not in listing and "10.217.0.4" not in listing
    assert rules() == before
    assert net.apply_isolation(topology.cloud, {}) is True
    listing = sh("ip", "netns", "exec", topology.cloud, "nft", "list", "table", "bridge", net.NFT_TABLE).stdout
    assert "elements" not in listing  # nothing left behind


def test_tap_lifecycle_and_orphan_listing(topology):
    cloud = topology.cloud
    net.ensure_bridge(cloud, "zjbr0", SUBNET)
    assert net.ensure_tap(cloud, "zjbr0", "zjt0123456789") is True
    assert net.ensure_tap(cloud, "zjbr0", "zjt0123456789") is False
    assert "master zjbr0" in sh("ip", "-n", cloud, "link", "show", "dev", "zjt0123456789").stdout
    assert net.list_taps(cloud) == ["zjt0123456789"]
    assert net.remove_tap(cloud, "zjt0123456789") is True
    assert net.remove_tap(cloud, "zjt0123456789") is False
    assert net.list_taps(cloud) == []


def test_tap_is_created_for_the_vmm_uid_and_recreated_when_recorded_for_another(topology):
    cloud = topology.cloud
    net.ensure_bridge(cloud, "zjbr0", SUBNET)
    vmm = {"uid": 1610612741, "gid": 1610612741}
    assert net.ensure_tap(cloud, "zjbr0", "zjt0123456789", vmm) is True
    assert net.tap_owner(cloud, "zjt0123456789") == (1610612741, 1610612741)
    assert net.ensure_tap(cloud, "zjbr0", "zjt0123456789", vmm) is False, "same owner: left alone"
    # a TAP left by an earlier boot without a privilege drop (or for another uid) is made anew for this one
    assert net.ensure_tap(cloud, "zjbr0", "zjt0123456789") is True
    assert net.tap_owner(cloud, "zjt0123456789") is None
    assert net.ensure_tap(cloud, "zjbr0", "zjt0123456789", vmm) is True
    assert net.tap_owner(cloud, "zjt0123456789") == (1610612741, 1610612741)
    assert "master zjbr0" in sh("ip", "-n", cloud, "link", "show", "dev", "zjt0123456789").stdout
    net.remove_tap(cloud, "zjt0123456789")


def _connect(netns: str, ip: str, port: int, ids: tuple = ()) -> str:
    """Connect from ``netns`` (as uid/gid ``ids`` if given, else root); the first 5 bytes or ``failed``."""
    code = (f"import socket\ntry:\n print(socket.create_connection(('{ip}', {port}), timeout=3).recv(5).decode())\n"
            "except OSError as exc:\n print('failed', type(exc).__name__)")
    drop = ["setpriv", f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups"] if ids else []
    return chk.run_in(netns, [*drop, sys.executable, "-c", code]).stdout.strip()


@pytest.mark.parametrize("guests", ["gateway"], indirect=True)
def test_gateway_path_opens_only_port_22_only_for_root_and_the_gateway_group(guests):
    """From the host (stand-in), new connections to a guest: the gateway group's processes and root reach port 22;
    another uid/gid, anything the host forwards (from the world) and other ports are dropped."""
    topo, a1, _, _ = guests
    outer_ip = str(net._network(UPLINK)[1])
    obs = chk.Observer(f"{topo.cloud}-{a1.tap}", "listen", "--host", a1.ip, "--port", "22", "--until", "never",
                       "--timeout", "60", "--once")
    try:
        assert _connect(topo.outside, a1.ip, 22, (65534, 65534)).startswith("failed")  # another user on the host
        assert _connect(topo.world, a1.ip, 22).startswith("failed")  # forwarded by the host
        assert _connect(topo.outside, a1.ip, 22, (65534, GATEWAY_GID)) == "hello"  # the gateway's forwarding
        heard = obs.result()
    finally:
        obs.stop()
    assert heard["tcp_peers"] == [outer_ip], heard
    assert _connect(topo.outside, a1.ip, 22) == "failed ConnectionRefusedError"  # root: reaches the guest (closed)
    obs = chk.Observer(f"{topo.cloud}-{a1.tap}", "listen", "--host", a1.ip, "--port", "2200", "--until", "never",
                       "--timeout", "60", "--once")
    try:
        assert _connect(topo.outside, a1.ip, 2200).startswith("failed")  # root, but not port 22
        assert _connect(topo.outside, a1.ip, 2200, (65534, GATEWAY_GID)).startswith("failed")
        assert _connect(topo.cloud, a1.ip, 2200) == "hello"  # the control: from the cloud's namespace
        heard = obs.result()
    finally:
        obs.stop()
    assert heard["tcp_peers"] == [net.gateway(SUBNET)], heard


@pytest.mark.parametrize("guests", ["no-gateway"], indirect=True)
def test_without_the_gateway_nothing_on_the_host_opens_a_guest_port(guests):
    topo, a1, _, _ = guests
    obs = chk.Observer(f"{topo.cloud}-{a1.tap}", "listen", "--host", a1.ip, "--port", "22", "--until", "never",
                       "--timeout", "60", "--once")
    try:
        assert _connect(topo.outside, a1.ip, 22).startswith("failed")
        assert _connect(topo.outside, a1.ip, 22, (65534, GATEWAY_GID)).startswith("failed")
        assert _connect(topo.cloud, a1.ip, 22) == "hello"
        heard = obs.result()
    finally:
        obs.stop()
    assert heard["tcp_peers"] == [net.gateway(SUBNET)], heard
