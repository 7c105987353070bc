"""tc_netlink.netns_socket on real network namespaces: the socket lives in the namespace named, the caller's
thread stays in its own, and an IPRoute open beside writers made this way keeps answering."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid

import pyroute2
import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc_netlink

pytestmark = pytest.mark.netns

ADDRESS = "198.18.77.1"  # on the namespace's loopback only


@pytest.fixture
def netns():
    name = f"zjt-ns-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", name, "addr", "add", f"{ADDRESS}/32", "dev", "lo"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_the_socket_is_made_in_the_namespace_and_the_caller_stays_in_its_own(netns):
    before = os.readlink("/proc/thread-self/ns/net")
    sock = tc_netlink.netns_socket(netns, socket.AF_INET, socket.SOCK_STREAM, 0)
    try:
        sock.bind((ADDRESS, 0))  # the address exists only inside the namespace
    finally:
        sock.close()
    assert os.readlink("/proc/thread-self/ns/net") == before
    outside = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with pytest.raises(OSError):
        outside.bind((ADDRESS, 0))
    outside.close()


def test_an_iproute_beside_writers_keeps_answering(netns):
    with pyroute2.IPRoute(netns=netns) as ipr:
        for _ in range(20):
            writer = tc_netlink.RtnlWriter(netns)
            writer.close()
            assert ipr.link_lookup(ifname="lo"), "the IPRoute stopped answering"


def test_a_missing_namespace_is_an_oserror_naming_it():
    with pytest.raises(OSError) as err:
        tc_netlink.netns_socket("zjt-no-such-ns", socket.AF_INET, socket.SOCK_DGRAM, 0)
    assert "zjt-no-such-ns" in str(err.value)


def test_netlink_tc_in_a_namespace_forks_no_process(netns):
    """NetlinkTc's IPRoute gets its socket from netns_socket: pyroute2's IPRoute(netns=...) forked a child for it,
    and a child SIGTERMed while it ran went on running the module's code beside its parent."""
    forks = []
    os.register_at_fork(before=lambda: forks.append(1))
    subprocess.run(["ip", "-n", netns, "link", "add", "zjt-d0", "type", "veth", "peer", "name", "zjt-d1"], check=True)
    before = len(forks)
    with tc_netlink.NetlinkTc("zjt-d0", netns) as tc:
        inside = tc.ipr.link_lookup(ifname="zjt-d0")
    assert len(forks) == before, "opening the namespace's IPRoute forked a process"
    assert inside, "the IPRoute does not see the namespace's device"
    with pyroute2.IPRoute() as host:
        assert not host.link_lookup(ifname="zjt-d0"), "the device was looked up in the host's namespace"
