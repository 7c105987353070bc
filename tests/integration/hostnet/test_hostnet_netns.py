"""The host backend's guest network on real namespaces, bridges, veths and nftables (no QEMU).

Each "guest" is a network namespace whose veth peer is enslaved to the cloud's bridge under a
TAP-style name, so the owner isolation rules and the NAT uplink are exercised exactly as for a
QEMU guest's TAP, in milliseconds.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils import _hostnet as net

pytestmark = pytest.mark.netns

SUBNET = "10.217.0.0/24"
UPLINK = "100.64.217.0/30"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def topology():
    tag = uuid.uuid4().hex[:6]
    cloud, outside = f"zjc-nt-{tag}", f"zjc-no-{tag}"
    guests = {}
    sh("ip", "netns", "add", outside)
    sh("ip", "-n", outside, "link", "set", "lo", "up")
    sh("ip", "-n", outside, "addr", "add", "198.51.100.1/32", "dev", "lo")
    try:
        yield cloud, outside, guests
    finally:
        for ns in (cloud, outside, *guests.values()):
            sh("ip", "netns", "del", ns, check=False)


def add_guest(cloud: str, guests: dict, tap: str, ip: str) -> str:
    """A namespace standing in for a guest, attached to the bridge through a veth named like a TAP."""
    ns = f"{cloud}-{tap}"
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", cloud, "link", "add", tap, "type", "veth", "peer", "name", "eth0", "netns", ns)
    sh("ip", "-n", cloud, "link", "set", tap, "master", "zjbr0", "up")
    sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
    sh("ip", "-n", ns, "link", "set", "eth0", "up")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns, "route", "add", "default", "via", net.gateway(SUBNET))
    guests[tap] = ns
    return ns


def connect(ns: str, host: str, port: int) -> str:
    """Connect from namespace ``ns``; returns what the server sent, or "" on failure."""
    code = (f"import socket; s = socket.create_connection(('{host}', {port}), timeout=3); "
            "print(s.recv(64).decode())")
    proc = sh("ip", "netns", "exec", ns, sys.executable, "-c", code, check=False)
    return proc.stdout.strip()


def serve(ns: str, host: str, port: int) -> subprocess.Popen:
    """A one-shot TCP server in ``ns`` that sends the client's address back."""
    code = (f"import socket; s = socket.create_server(('{host}', {port})); c, a = s.accept(); "
            "c.sendall(a[0].encode()); c.close()")
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code])
    for _ in range(50):
        if f":{port}" in sh("ip", "netns", "exec", ns, "ss", "-ltn", check=False).stdout:
            break
        subprocess.run(["sleep", "0.1"], check=True)
    return proc


def test_bridge_and_uplink_are_idempotent(topology):
    cloud, outside, _ = topology
    assert net.ensure_bridge(cloud, "zjbr0", SUBNET) is True
    assert net.ensure_uplink(cloud, SUBNET, UPLINK, outside) is True
    assert net.ensure_bridge(cloud, "zjbr0", SUBNET) is False
    assert net.ensure_uplink(cloud, SUBNET, UPLINK, outside) is False
    assert "10.217.0.1/24" in sh("ip", "-n", cloud, "-o", "addr", "show", "dev", "zjbr0").stdout


def test_owners_cannot_reach_each_other_but_reach_gateway_and_outside(topology):
    cloud, outside, guests = topology
    net.ensure_bridge(cloud, "zjbr0", SUBNET)
    net.ensure_uplink(cloud, SUBNET, UPLINK, outside)
    a1 = add_guest(cloud, guests, "zjtaaaa0001", "10.217.0.2")
    a2 = add_guest(cloud, guests, "zjtaaaa0002", "10.217.0.3")
    b1 = add_guest(cloud, guests, "zjtbbbb0001", "10.217.0.4")
    net.apply_isolation(cloud, {"alice": ["zjtaaaa0001", "zjtaaaa0002"], "bob": ["zjtbbbb0001"]})

    server = serve(b1, "10.217.0.4", 2201)
    try:
        assert connect(a1, "10.217.0.4", 2201) == ""  # alice -> bob: dropped
    finally:
        server.kill()
        server.wait()
    server = serve(a2, "10.217.0.3", 2202)
    try:
        assert connect(a1, "10.217.0.3", 2202) == "10.217.0.2"  # alice -> alice: allowed
    finally:
        server.wait(timeout=10)
    server = serve(cloud, net.gateway(SUBNET), 2203)
    try:
        assert connect(b1, net.gateway(SUBNET), 2203) == "10.217.0.4"  # bob -> host side of the bridge
    finally:
        server.wait(timeout=10)
    server = serve(outside, "198.51.100.1", 2204)
    try:
        assert connect(b1, "198.51.100.1", 2204) == "100.64.217.2"  # outside sees the masqueraded uplink
    finally:
        server.wait(timeout=10)


def test_tap_lifecycle_and_orphan_listing(topology):
    cloud, _, _ = topology
    net.ensure_bridge(cloud, "zjbr0", SUBNET)
    assert net.ensure_tap(cloud, "zjbr0", "zjt0123456789") is True
    assert net.ensure_tap(cloud, "zjbr0", "zjt0123456789") is False
    assert "master zjbr0" in sh("ip", "-n", cloud, "link", "show", "dev", "zjt0123456789").stdout
    assert net.list_taps(cloud) == ["zjt0123456789"]
    assert net.remove_tap(cloud, "zjt0123456789") is True
    assert net.remove_tap(cloud, "zjt0123456789") is False
    assert net.list_taps(cloud) == []


def test_tap_is_created_for_the_vmm_uid_and_recreated_when_recorded_for_another(topology):
    cloud, _, _ = topology
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
