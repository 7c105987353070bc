"""The network isolation attacks and the allowed traffic, written once for two kinds of guests.

tests/integration/hostnet runs them with namespaces standing in for guests (milliseconds);
tests/e2e/host runs them from real QEMU guests over SSH. Each check starts its own observers in
the cloud's namespace (a frame capture on TAPs and the bridge, or a listener), lets the attacker
guest try, then sends a control that must arrive after the attack (the observers stop on it), so a
dropped attack is asserted after a bounded wait, not after a sleep. The bounds (300 s) are generous
because each step in a real guest is an SSH session, slow on a loaded TCG host; a passing check
returns as soon as its control arrives.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PROBE = Path(__file__).with_name("netprobe.py")


@dataclass
class Guest:
    """A guest as the checks see it: addresses, its TAP, and how to run things inside it."""

    name: str
    ip: str
    mac: str
    tap: str
    probe: Callable[..., dict]  # probe("udp", "--dst-ip", ...) runs netprobe.py in the guest -> its JSON
    shell: Callable[[str], subprocess.CompletedProcess]  # a shell command line in the guest


@dataclass
class Cloud:
    """The cloud's namespace (bridge, gateway) and the uplink's outer namespace (the host or its stand-in)."""

    netns: str
    bridge: str
    gateway: str
    outer_netns: str = ""
    outer_addresses: tuple = ()

    def gateway_mac(self) -> str:
        return Path(f"/sys/class/net/{self.bridge}/address").read_text().strip() if not self.netns else \
            run_in(self.netns, ["cat", f"/sys/class/net/{self.bridge}/address"]).stdout.strip()


def run_in(netns: str, argv: list, check: bool = True, timeout: int = 60) -> subprocess.CompletedProcess:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=timeout, check=check)


def marker(kind: str) -> str:
    return f"zjmark-{kind}-{uuid.uuid4().hex[:10]}"


class Observer:
    """netprobe.py ``capture`` or ``listen`` running in a namespace; :meth:`result` waits for its JSON."""

    def __init__(self, netns: str, *args: str):
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self.proc = subprocess.Popen([*prefix, sys.executable, str(PROBE), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            self.proc.kill()
            raise AssertionError(f"observer did not start: {line!r} {self.proc.communicate()[1]}")

    def result(self, timeout: float = 400) -> dict:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def capture(cloud: Cloud, ifaces: list, markers: list, until: str, pairs: tuple = (), timeout: float = 300,
            arp: bool = False) -> Observer:
    args = ["capture", "--until", until, "--timeout", str(timeout)]
    for iface in ifaces:
        args += ["--iface", iface]
    for m in markers:
        args += ["--marker", m]
    for p in pairs:
        args += ["--pair", p]
    if arp:
        args.append("--arp")
    return Observer(cloud.netns, *args)


def send_control(cloud: Cloud, to_ip: str, control: str) -> None:
    """A UDP datagram from the cloud's namespace (the gateway) to ``to_ip`` carrying ``control``."""
    code = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            "[s.sendto(sys.argv[2].encode(), (sys.argv[1], 9)) for _ in range(3)]")
    run_in(cloud.netns, [sys.executable, "-c", code, to_ip, control])


def neighbour(netns: str, ip: str, dev: str) -> Optional[str]:
    """The link-layer address ``ip`` has in ``netns``'s neighbour table on ``dev`` (None if none)."""
    words = run_in(netns, ["ip", "neigh", "show", ip, "dev", dev]).stdout.split()
    return words[words.index("lladdr") + 1] if "lladdr" in words else None


# --- attacks -----------------------------------------------------------------------------------------
def check_routed_to_other_owner_dropped(cloud: Cloud, attacker: Guest, victim: Guest) -> None:
    """Attacker routes the victim's /32 via the gateway: ICMP, UDP and TCP never reach the victim's TAP."""
    mark, control = marker("routed"), marker("control")
    pair = f"{attacker.ip}>{victim.ip}"
    obs = capture(cloud, [attacker.tap, victim.tap], [mark], control, pairs=(pair,))
    try:
        route = attacker.shell(f"ip route replace {victim.ip}/32 via {cloud.gateway}")
        assert route.returncode == 0, route.stderr
        got = attacker.probe("routed", "--dst-ip", victim.ip, "--marker", mark, "--tcp-port", "22")
        assert "tcp" not in got, f"TCP from {attacker.name} reached {victim.name}: {got}"
        send_control(cloud, victim.ip, control)
        seen = obs.result()
    finally:
        obs.stop()
        attacker.shell(f"ip route del {victim.ip}/32")
    assert seen["until_seen"], seen  # the capture on the victim's TAP works and saw everything before it
    assert attacker.tap in seen["seen"].get(mark, {}), f"the attack never left {attacker.name}: {seen}"
    assert victim.tap not in seen["seen"].get(mark, {}), f"routed ICMP/UDP reached {victim.name}: {seen}"
    assert victim.tap not in seen["seen"].get(pair, {}), f"routed packets reached {victim.name}: {seen}"


def check_spoofed_mac_dropped(cloud: Cloud, attacker: Guest, victim: Guest) -> None:
    """Frames with the victim's (or any foreign) source MAC never pass the bridge nor teach it the MAC."""
    as_victim, as_other, control = marker("mac-victim"), marker("mac-other"), marker("control")
    gw_mac = cloud.gateway_mac()
    obs = capture(cloud, [attacker.tap, cloud.bridge, victim.tap], [as_victim, as_other], control)
    try:
        for src_mac, mark in ((victim.mac, as_victim), ("02:de:ad:be:ef:01", as_other)):
            attacker.probe("udp", "--own-mac", attacker.mac, "--src-mac", src_mac, "--dst-mac", gw_mac,
                           "--src-ip", attacker.ip, "--dst-ip", cloud.gateway, "--marker", mark, "--count", "4")
        attacker.probe("udp", "--own-mac", attacker.mac, "--dst-mac", gw_mac, "--src-ip", attacker.ip,
                       "--dst-ip", cloud.gateway, "--marker", control, "--count", "2")
        seen = obs.result()
    finally:
        obs.stop()
    assert seen["until_seen"], seen  # the attacker's own, well-formed frame passed
    for mark in (as_victim, as_other):
        assert attacker.tap in seen["seen"].get(mark, {}), f"{mark} never left {attacker.name}: {seen}"
        assert set(seen["seen"][mark]) == {attacker.tap}, f"a spoofed-MAC frame passed the bridge: {seen}"
    fdb = run_in(cloud.netns, ["bridge", "fdb", "show", "br", cloud.bridge]).stdout.lower()
    learned = [line for line in fdb.splitlines() if line.startswith(victim.mac) and f"dev {attacker.tap}" in line]
    assert not learned, f"the bridge learned {victim.name}'s MAC on {attacker.name}'s port: {learned}"


def check_spoofed_ip_dropped(cloud: Cloud, attacker: Guest, victim: Guest, unused_ip: str) -> None:
    """IPv4 from the victim's (or an unused) address never passes the bridge, toward the gateway or beyond."""
    as_victim, as_unused, control = marker("ip-victim"), marker("ip-unused"), marker("control")
    gw_mac = cloud.gateway_mac()
    obs = capture(cloud, [attacker.tap, cloud.bridge], [as_victim, as_unused], control)
    try:
        for src_ip, mark in ((victim.ip, as_victim), (unused_ip, as_unused)):
            for dst in (cloud.gateway, *cloud.outer_addresses[:1]):
                attacker.probe("udp", "--own-mac", attacker.mac, "--dst-mac", gw_mac, "--src-ip", src_ip,
                               "--dst-ip", dst, "--marker", mark, "--count", "3")
        attacker.probe("udp", "--own-mac", attacker.mac, "--dst-mac", gw_mac, "--src-ip", attacker.ip,
                       "--dst-ip", cloud.gateway, "--marker", control, "--count", "2")
        seen = obs.result()
    finally:
        obs.stop()
    assert seen["until_seen"], seen
    for mark in (as_victim, as_unused):
        assert attacker.tap in seen["seen"].get(mark, {}), f"{mark} never left {attacker.name}: {seen}"
        assert set(seen["seen"][mark]) == {attacker.tap}, f"a spoofed-IP packet passed the bridge: {seen}"


def check_arp_poisoning_dropped(cloud: Cloud, attacker: Guest, victim: Guest) -> None:
    """Gratuitous ARP (reply and request) claiming the victim's or the gateway's address changes no cache."""
    gw_mac = cloud.gateway_mac()
    warm = victim.shell(f"python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                        f".sendto(b'x', ('{cloud.gateway}', 9))\"; for i in $(seq 100); do"
                        f" ip neigh show {cloud.gateway} | grep -q lladdr && break; sleep 0.1; done;"
                        f" ip neigh show {cloud.gateway}")
    assert gw_mac in warm.stdout.lower(), f"{victim.name} did not resolve the gateway: {warm}"
    for _ in range(100):  # the gateway resolves the victim (bounded wait for that very entry)
        send_control(cloud, victim.ip, marker("warm"))
        if neighbour(cloud.netns, victim.ip, cloud.bridge) == victim.mac:
            break
    assert neighbour(cloud.netns, victim.ip, cloud.bridge) == victim.mac
    control = marker("control")
    obs = capture(cloud, [attacker.tap, victim.tap, cloud.bridge], [], control, arp=True)
    try:
        for claimed in (victim.ip, cloud.gateway):
            # count 8 at 0.4 s: past the neighbour table's 1 s locktime, as a real poisoner would
            attacker.probe("arp", "--own-mac", attacker.mac, "--op", "2", "--op", "1", "--spa", claimed,
                           "--tpa", cloud.gateway if claimed == victim.ip else victim.ip, "--count", "8",
                           "--interval", "0.4")
        send_control(cloud, victim.ip, control)
        seen = obs.result()
    finally:
        obs.stop()
    assert seen["until_seen"], seen
    for claimed in (victim.ip, cloud.gateway):
        key = f"arp {claimed} {attacker.mac}"
        assert attacker.tap in seen["seen"].get(key, {}), f"the ARP attack never left {attacker.name}: {seen}"
        assert set(seen["seen"][key]) == {attacker.tap}, f"poisoning ARP passed the bridge: {seen}"
    assert neighbour(cloud.netns, victim.ip, cloud.bridge) == victim.mac, "the gateway's ARP cache was poisoned"
    got = victim.shell(f"ip neigh show {cloud.gateway}")
    assert gw_mac in got.stdout.lower(), f"{victim.name}'s ARP cache was poisoned: {got.stdout}"


def check_no_service_beyond_provided(cloud: Cloud, attacker: Guest, port: int) -> None:
    """TCP and UDP to a listener on the gateway address (cloud namespace) and on the uplink's outer
    namespace's own addresses (the host) never arrive; the listeners' own control arrives."""
    places = [(cloud.netns, [cloud.gateway])]
    if cloud.outer_addresses:
        places.append((cloud.outer_netns, list(cloud.outer_addresses)))
    for netns, addresses in places:
        control = marker("control")
        obs = Observer(netns, "listen", "--host", "0.0.0.0", "--port", str(port), "--until", control,
                       "--timeout", "300")
        try:
            for address in addresses:
                got = attacker.probe("routed", "--dst-ip", address, "--dport", str(port), "--tcp-port", str(port),
                                     "--marker", marker("svc"), "--count", "2")
                assert "tcp" not in got, f"{attacker.name} connected to {address}:{port}: {got}"
            code = ("import socket, sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                    ".sendto(sys.argv[1].encode(), ('127.0.0.1', int(sys.argv[2])))")
            run_in(netns, [sys.executable, "-c", code, control, str(port)])
            heard = obs.result()
        finally:
            obs.stop()
        assert heard["until_seen"], heard
        assert heard["tcp_peers"] == [] and heard["datagrams"] == [], \
            f"{attacker.name} reached a service in {netns or 'the host'}: {heard}"


# --- allowed -----------------------------------------------------------------------------------------
def check_gateway_answers_ping(attacker: Guest, cloud: Cloud) -> None:
    got = attacker.probe("ping", "--dst-ip", cloud.gateway)
    assert got.get("reply") is True, f"{attacker.name} got no ICMP echo reply from the gateway: {got}"


def check_outside_reachable(guest: Guest, server_netns: str, server_ip: str, port: int) -> str:
    """TCP from the guest to a server beyond the uplink; returns the source address the server saw."""
    obs = Observer(server_netns, "listen", "--host", server_ip, "--port", str(port), "--until", "never",
                   "--timeout", "300", "--once")
    try:
        got = guest.probe("routed", "--dst-ip", server_ip, "--tcp-port", str(port), "--count", "0",
                          "--marker", "unused", "--tcp-timeout", "10")
        heard = obs.result()
    finally:
        obs.stop()
    assert "tcp_error" not in got, f"{guest.name} could not reach {server_ip}:{port}: {got}"
    assert len(heard["tcp_peers"]) == 1, heard
    return str(heard["tcp_peers"][0])
