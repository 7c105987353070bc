# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The single-host guest network: a bridge in the cloud's network namespace, one TAP per VM.

Layout (docs/network.md): the namespace ``netns`` (default ``zjusct-cloud``) holds the bridge
``bridge`` with the subnet's first host address as the guests' gateway; each running VM has a
TAP ``zjt<10 hex>`` enslaved to it. Guests of different owners cannot reach each other: an
nftables ``bridge`` table drops frames forwarded between TAPs of different owners. The host
reaches guests through the namespace (``ip netns exec <netns> ...``; the inventory uses it as an
SSH ProxyCommand).

Pure helpers (:func:`tap_name`, :func:`mac_address`, :func:`allocate_ipv4`,
:func:`isolation_ruleset`) decide; the rest run ``ip``/``nft`` with argument lists.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from typing import Any, Iterable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils import _names

try:
    from netaddr import IPNetwork
except ImportError:  # reported by the functions that need it
    IPNetwork = None

TAP_PREFIX = _names.TAP_PREFIX
NFT_TABLE = "zjusct_isolation"
NAT_TABLE = "zjusct_nat"
UPLINK_OUTER, UPLINK_INNER = "zjup0", "zjup1"


class NetworkError(Exception):
    """A network step failed; the message names the command and its error."""


def tap_name(vm_uid: str) -> str:
    """Stable TAP name for a VM: ``zjt`` + 10 hex digits of sha256(uid) (:func:`_names.tap_name`)."""
    return _names.tap_name(vm_uid)


def mac_address(vm_uid: str) -> str:
    """Stable, locally administered unicast MAC for a VM (``02:`` + 5 bytes of sha256(uid))."""
    digest = hashlib.sha256(b"mac:" + vm_uid.encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in digest[:5])


def _network(cidr: str) -> Any:
    if IPNetwork is None:
        raise NetworkError("the Python library netaddr is required on the hypervisor (pip install netaddr)")
    return IPNetwork(cidr)


def gateway(subnet: str) -> str:
    """The subnet's first host address, used by the bridge (``10.200.0.1`` for 10.200.0.0/24)."""
    return str(_network(subnet)[1])


def prefix_length(subnet: str) -> int:
    """The subnet's prefix length (24 for 10.200.0.0/24)."""
    return int(_network(subnet).prefixlen)


def allocate_ipv4(subnet: str, used: Iterable[str]) -> str:
    """The lowest free host address of ``subnet`` after the gateway.

    Raises:
        NetworkError: the subnet has no free address left.
    """
    net = _network(subnet)
    taken = set(used) | {gateway(subnet)}
    for ip in net.iter_hosts():
        if str(ip) not in taken:
            return str(ip)
    raise NetworkError(f"subnet: {subnet} has no free address left ({len(taken)} in use)")


def isolation_ruleset(groups: dict) -> str:
    """nft script replacing the isolation table: frames between TAPs of different owners are dropped.

    Args:
        groups: owner -> list of that owner's TAP names.
    """
    lines = [f"table bridge {NFT_TABLE} {{", "  chain forward {",
             "    type filter hook forward priority 0; policy accept;"]
    all_taps = sorted(t for taps in groups.values() for t in taps)
    for owner in sorted(groups):
        mine = sorted(groups[owner])
        others = [t for t in all_taps if t not in mine]
        if not others:
            continue
        for tap in mine:
            lines.append(f'    iifname "{tap}" oifname {{ {", ".join(others)} }} drop')
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def _run(argv: list[str], stdin: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkError(f"{' '.join(argv)}: {exc}") from exc
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc


def _ip(netns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *(["-n", netns] if netns else []), *args], check=check)


def link_exists(netns: str, dev: str) -> bool:
    """Whether device ``dev`` exists in ``netns``."""
    return _ip(netns, "link", "show", "dev", dev, check=False).returncode == 0


def _is_up(netns: str, dev: str) -> bool:
    """Whether ``dev`` is administratively up (the UP flag in ``ip link show``: ``<...,UP,...>``)."""
    flags = _ip(netns, "link", "show", "dev", dev).stdout.split("<", 1)[-1].split(">", 1)[0]
    return "UP" in flags.split(",")


def netns_exists(netns: str) -> bool:
    """Whether the named network namespace exists (the host's own namespace always does)."""
    if not netns:
        return True
    return netns in _run(["ip", "netns", "list"]).stdout.split()


def ensure_bridge(netns: str, bridge: str, subnet: str) -> bool:
    """Create the namespace, its bridge with the gateway address, and enable forwarding.

    Returns whether anything changed.
    """
    changed = False
    if netns and not netns_exists(netns):
        _run(["ip", "netns", "add", netns])
        _ip(netns, "link", "set", "lo", "up")
        changed = True
    if not link_exists(netns, bridge):
        _ip(netns, "link", "add", bridge, "type", "bridge")
        changed = True
    address = f"{gateway(subnet)}/{prefix_length(subnet)}"
    if address not in _ip(netns, "-o", "addr", "show", "dev", bridge).stdout:
        _ip(netns, "addr", "add", address, "dev", bridge)
        changed = True
    if not _is_up(netns, bridge):
        _ip(netns, "link", "set", bridge, "up")
        changed = True
    exec_prefix = ["ip", "netns", "exec", netns] if netns else []
    forwarding = _run([*exec_prefix, "cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip()
    if forwarding != "1":
        _run([*exec_prefix, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        changed = True
    return changed


def tap_owner(netns: str, tap: str) -> Optional[tuple]:
    """``(user, group)`` recorded on TAP ``tap`` (``ip -d -j link show``: linkinfo.info_data), None if unset."""
    info = json.loads(_ip(netns, "-d", "-j", "link", "show", "dev", tap).stdout or "[]")
    data = ((info[0] if info else {}).get("linkinfo") or {}).get("info_data") or {}
    if "user" not in data and "group" not in data:
        return None
    return (data.get("user"), data.get("group"))


def ensure_tap(netns: str, bridge: str, tap: str, owner: Optional[dict] = None) -> bool:
    """Create TAP ``tap`` (if missing), enslave it to ``bridge`` and bring it up.

    ``owner``: ``{"uid": U, "gid": G}`` that may attach to the TAP without CAP_NET_ADMIN (the VMM's runAs);
    an existing TAP recorded for another owner is created anew. Returns whether the TAP was created.
    """
    want = (owner["uid"], owner["gid"]) if owner else None
    if link_exists(netns, tap):
        if tap_owner(netns, tap) == want:
            _ip(netns, "link", "set", tap, "master", bridge, "up")
            return False
        _ip(netns, "link", "del", tap)
    owner_args = ["user", str(want[0]), "group", str(want[1])] if want else []
    _ip(netns, "tuntap", "add", "dev", tap, "mode", "tap", *owner_args)
    try:
        _ip(netns, "link", "set", tap, "master", bridge, "up")
    except NetworkError:
        _ip(netns, "link", "del", tap, check=False)
        raise
    return True


def remove_tap(netns: str, tap: str) -> bool:
    """Delete TAP ``tap`` if it exists; returns whether it existed."""
    if not link_exists(netns, tap):
        return False
    _ip(netns, "link", "del", tap)
    return True


def list_taps(netns: str) -> list[str]:
    """Our TAP devices (``zjt*``) in ``netns``."""
    out = _ip(netns, "-o", "link", "show", check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return sorted(n for n in names if n.startswith(TAP_PREFIX))


def apply_isolation(netns: str, groups: dict) -> None:
    """Replace the isolation table in ``netns`` with :func:`isolation_ruleset` of ``groups``."""
    exec_prefix = ["ip", "netns", "exec", netns] if netns else []
    script = f"table bridge {NFT_TABLE}\ndelete table bridge {NFT_TABLE}\n" + isolation_ruleset(groups)
    _run([*exec_prefix, "nft", "-f", "-"], stdin=script)


def nat_ruleset(table_family: str, source: str, oif_match: str) -> str:
    """nft script replacing the NAT table: masquerade ``source`` leaving through ``oif_match``.

    Args:
        table_family: ``ip``.
        source: source prefix to masquerade (CIDR).
        oif_match: an nft ``oifname`` expression such as ``"zjup1"`` or ``!= "zjup0"``.
    """
    return (f"table {table_family} {NAT_TABLE}\ndelete table {table_family} {NAT_TABLE}\n"
            f"table {table_family} {NAT_TABLE} {{\n"
            "  chain postrouting {\n"
            "    type nat hook postrouting priority srcnat; policy accept;\n"
            f"    ip saddr {source} oifname {oif_match} masquerade\n"
            "  }\n}\n")


def ensure_uplink(netns: str, subnet: str, uplink_cidr: str, uplink_netns: str = "") -> bool:
    """Give the guests' namespace a way out: a veth to ``uplink_netns`` (the host's by default) and NAT.

    Inside ``netns``: ``zjup1`` with the uplink's second address, a default route via the first,
    and guests' traffic (``subnet``) masqueraded onto ``zjup1``. On the outer side: ``zjup0`` with
    the first address, forwarding on, and — in the host's namespace only — the uplink prefix
    masqueraded onto every other interface, in its own nft table (the host's tables are untouched).

    Returns whether anything changed.
    """
    if not netns:
        return False
    net = _network(uplink_cidr)
    outer, inner = f"{net[1]}/{net.prefixlen}", f"{net[2]}/{net.prefixlen}"
    changed = False
    if not link_exists(uplink_netns, UPLINK_OUTER):
        _ip(uplink_netns, "link", "add", UPLINK_OUTER, "type", "veth", "peer", "name", UPLINK_INNER,
            "netns", netns)
        changed = True
    for ns, dev, address in ((uplink_netns, UPLINK_OUTER, outer), (netns, UPLINK_INNER, inner)):
        if address not in _ip(ns, "-o", "addr", "show", "dev", dev).stdout:
            _ip(ns, "addr", "add", address, "dev", dev)
            changed = True
        if not _is_up(ns, dev):
            _ip(ns, "link", "set", dev, "up")
            changed = True
    if f"default via {net[1]}" not in _ip(netns, "route", "show", "default").stdout:
        _ip(netns, "route", "replace", "default", "via", str(net[1]), "dev", UPLINK_INNER)
        changed = True
    changed |= _ensure_nft(netns, nat_ruleset("ip", subnet, f'"{UPLINK_INNER}"'))
    outer_prefix = ["ip", "netns", "exec", uplink_netns] if uplink_netns else []
    if _run([*outer_prefix, "cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip() != "1":
        _run([*outer_prefix, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        changed = True
    if not uplink_netns:
        changed |= _ensure_nft("", nat_ruleset("ip", str(net.cidr), f'!= "{UPLINK_OUTER}"'))
    return changed


def _ensure_nft(netns: str, script: str) -> bool:
    """Load ``script`` (which replaces one table) unless the table already has the same rules."""
    exec_prefix = ["ip", "netns", "exec", netns] if netns else []
    table = script.split("\n")[0].split(" ", 1)[1]  # "<family> <name>"
    current = _run([*exec_prefix, "nft", "list", "table", *table.split()], check=False)
    wanted_rule = [line.strip() for line in script.splitlines() if "masquerade" in line or " drop" in line]
    if current.returncode == 0 and all(rule in current.stdout for rule in wanted_rule):
        return False
    _run([*exec_prefix, "nft", "-f", "-"], stdin=script)
    return True


def remove_uplink(netns: str, uplink_netns: str = "") -> None:
    """Delete the uplink veth pair and, in the host's namespace, its NAT table."""
    if link_exists(uplink_netns, UPLINK_OUTER):
        _ip(uplink_netns, "link", "del", UPLINK_OUTER)
    if not uplink_netns:
        _run(["nft", "delete", "table", "ip", NAT_TABLE], check=False)


def host_resolvers(path: str = "/etc/resolv.conf") -> list[str]:
    """The host's IPv4 name servers usable from guests (loopback ones such as 127.0.0.53 left out)."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    servers = [line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1]
    return [s for s in servers if "." in s and not s.startswith("127.")]


def remove_netns(netns: str) -> None:
    """Delete the namespace (and with it the bridge, TAPs and tables). Used by teardown."""
    if netns and netns_exists(netns):
        _run(["ip", "netns", "del", netns])
