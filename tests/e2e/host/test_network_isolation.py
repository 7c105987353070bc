"""Network isolation on real QEMU guests: each attack from inside bob's guest is dropped, allowed traffic passes.

Two guests of different owners (alice, bob) boot once for the module through the operator's
playbook; every test uses them without relying on another test having run. The attacks and their
observers are shared with the namespace-based tests (tests/integration/hostnet/isolation_checks.py):
captures on the TAPs and the bridge inside the cloud's namespace, listeners on the gateway and on the
uplink's outer side (the host's stand-in), each stopped by a control that follows the attack.
"""

from __future__ import annotations

import shlex
import sqlite3
import subprocess

import pytest

from tests.integration.hostnet import isolation_checks as chk

from .conftest import Cloud

pytestmark = [pytest.mark.guest, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(2400)]

START = "Start the VM and wait until its SSH answers"
PROBE_SOURCE = chk.PROBE.read_text()


def guest(cloud: Cloud, owner: str) -> chk.Guest:
    vm = cloud.vm(owner)
    ip = vm["status"]["sshEndpoint"]["host"]
    tap, mac = sqlite3.connect(cloud.config["store_path"]).execute(
        "SELECT tap, mac FROM leases WHERE vm_uid = ?", (vm["metadata"]["uid"],)).fetchone()

    def probe(*args: str) -> dict:
        out = cloud.ssh(ip, "python3 - " + " ".join(shlex.quote(a) for a in args), timeout=120, stdin=PROBE_SOURCE)
        assert out.returncode == 0, f"netprobe {args} in {owner}'s guest: {out.stderr}"
        return chk.json.loads(out.stdout.strip().splitlines()[-1])

    def shell(command: str) -> subprocess.CompletedProcess:
        return cloud.ssh(ip, command, timeout=120)

    return chk.Guest(owner, ip, mac, tap, probe, shell)


@pytest.fixture(scope="module")
def pair(cloud: Cloud):
    """alice's and bob's guests, booted once; the host's ip_forward read before the network came up."""
    with open("/proc/sys/net/ipv4/ip_forward", encoding="ascii") as fh:
        host_forward = fh.read()
    for owner in ("alice", "bob"):
        cloud.playbook("vm_start", f"owner={owner}")
    uplink = cloud.config["uplink_cidr"].split("/")[0].rsplit(".", 1)[0]
    view = chk.Cloud(cloud.config["netns"], cloud.config["bridge"], cloud.config["subnet"].rsplit(".", 1)[0] + ".1",
                     cloud.config["uplink_netns"], (f"{uplink}.1", "192.0.2.1"))
    return view, guest(cloud, "alice"), guest(cloud, "bob"), host_forward


def test_routed_traffic_to_another_owner_is_dropped(pair):
    """bob: ip route add <alice>/32 via <gateway>; ICMP, UDP and TCP never reach alice's TAP."""
    view, alice, bob, _ = pair
    chk.check_routed_to_other_owner_dropped(view, bob, alice)


def test_spoofed_source_mac_is_dropped(pair):
    view, alice, bob, _ = pair
    chk.check_spoofed_mac_dropped(view, bob, alice)


def test_spoofed_source_ip_is_dropped(pair):
    view, alice, bob, _ = pair
    chk.check_spoofed_ip_dropped(view, bob, alice, view.gateway.rsplit(".", 1)[0] + ".250")


def test_arp_poisoning_is_dropped(pair):
    """Gratuitous ARP from bob claiming alice's and the gateway's address: both caches keep the truth."""
    view, alice, bob, _ = pair
    chk.check_arp_poisoning_dropped(view, bob, alice)


def test_guest_reaches_no_service_of_the_gateway_or_the_host(pair):
    """TCP/UDP from bob to a listener on the gateway address and on the host's (stand-in's) addresses."""
    view, _, bob, _ = pair
    chk.check_no_service_beyond_provided(view, bob, 8025)


def test_allowed_traffic_still_passes(pair, cloud: Cloud):
    """Ping to the gateway, TCP beyond the uplink (NAT) for both guests, SSH from the cloud's namespace."""
    view, alice, bob, _ = pair
    for g, port in ((bob, 8026), (alice, 8027)):
        chk.check_gateway_answers_ping(g, view)
        assert chk.check_outside_reachable(g, cloud.world_netns, "198.51.100.1", port) == "192.0.2.1"
        assert g.shell("hostname").stdout.strip() == g.name


def test_host_ip_forward_is_untouched(pair):
    """Bringing the network up (and two guests) left the host's own net.ipv4.ip_forward as it was."""
    with open("/proc/sys/net/ipv4/ip_forward", encoding="ascii") as fh:
        assert fh.read() == pair[3]
