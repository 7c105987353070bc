# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The single-host guest network: a bridge in the cloud's network namespace, one TAP per VM.

Layout (docs/network.md): the namespace ``netns`` (default ``zjusct-cloud``) holds the bridge
``bridge`` with the subnet's first host address as the guests' gateway; each running VM has a
TAP ``zjt<10 hex>`` enslaved to it. The host reaches guests through the namespace
(``ip netns exec <netns> ...``; the inventory uses it as an SSH ProxyCommand).

Network isolation (docs/security.md, "Network isolation"), all nftables, all in tables of our own:

* ``bridge zjusct_isolation`` in the namespace (L2): a TAP may send only its own MAC and IPv4
  address (ARP sender fields included) and only IPv4/ARP; frames between TAPs of different owners
  are dropped; a TAP receives only frames for its MAC (or broadcast/multicast); the gateway never
  hands a guest a packet routed from another guest. Per-TAP facts are set elements keyed by the
  TAP name, so starting or deleting a VM changes elements, not rules (:func:`apply_isolation`).
* ``inet zjusct_guard`` in the namespace (L3): routed traffic only guest -> uplink and its
  replies; guests reach nothing on the namespace itself but ICMP echo (:func:`guard_ruleset`).
* ``ip zjusct_nat`` on the uplink's outer side (the host): masquerade, and nothing a guest sends
  reaches that namespace's own services (:func:`uplink_outer_ruleset`).

Sysctls are written only inside the cloud's own namespace (``net.ipv4.ip_forward`` and
``net.bridge.bridge-nf-call-*`` are per namespace); the uplink's outer side (the host) gets
forwarding only when the operator asked for it (``uplink_ip_forward``).

Pure helpers (:func:`tap_name`, :func:`mac_address`, :func:`allocate_ipv4`,
:func:`isolation_elements`, the ``*_ruleset`` functions) decide; the rest run ``ip``/``nft``/``sysctl``
with argument lists.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import subprocess
from typing import Any, Iterable, Optional

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError
from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names

try:
    from netaddr import IPNetwork
except ImportError:  # reported by the functions that need it
    IPNetwork = None

TAP_PREFIX = _names.TAP_PREFIX
NFT_TABLE = "zjusct_isolation"
GUARD_TABLE = "zjusct_guard"
NAT_TABLE = "zjusct_nat"
UPLINK_OUTER, UPLINK_INNER = "zjup0", "zjup1"


class NetworkError(CloudError):
    """A network step failed; the message names the command and its error."""


def tap_name(vm_uid: str) -> str:
    """Stable TAP name for a VM: ``zjt`` + 10 hex digits of sha256(uid) (:func:`model.names.tap_name`)."""
    return _names.tap_name(vm_uid)


def mac_address(vm_uid: str) -> str:
    """Stable, locally administered unicast MAC for a VM (``02:`` + 5 bytes of sha256(uid))."""
    digest = hashlib.sha256(b"mac:" + vm_uid.encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in digest[:5])


def _network(cidr: str) -> Any:
    if IPNetwork is None:
        raise NetworkError("the Python library netaddr is required on the hypervisor (Debian: python3-netaddr)")
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


_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
ISOLATION_SETS = ("guest_mac", "guest_ipv4", "guest_addrs", "same_owner")


def _ifname(name: str) -> str:
    if not _IFNAME_RE.match(name or ""):
        raise NetworkError(f"tap: {name!r} is not a valid interface name (1-15 of A-Z a-z 0-9 _ . -)")
    return name


def isolation_elements(groups: dict) -> dict:
    """The isolation table's set elements for the guests in ``groups``.

    Args:
        groups: owner -> list of that owner's guests, each ``{"tap": str, "mac": str, "ipv4": str}``
            (a lease of the host store; ``ipv4`` without prefix length).

    Returns:
        set name -> set of elements: ``guest_mac`` {(tap, mac)}, ``guest_ipv4`` {(tap, ipv4)},
        ``guest_addrs`` {ipv4}, ``same_owner`` {(tap_a, tap_b)} for every ordered pair of distinct TAPs
        of one owner (the only TAP pairs the bridge forwards between).

    Raises:
        NetworkError: a TAP name, MAC or address is malformed (named in the message).
    """
    elements: dict = {name: set() for name in ISOLATION_SETS}
    for owner in sorted(groups):
        taps = []
        for guest in groups[owner]:
            tap, mac = _ifname(guest["tap"]), str(guest["mac"]).lower()
            if not _MAC_RE.match(mac):
                raise NetworkError(f"mac: {guest['mac']!r} of {tap} is not a MAC address (xx:xx:xx:xx:xx:xx)")
            try:
                ipv4 = str(ipaddress.IPv4Address(str(guest["ipv4"]).split("/", maxsplit=1)[0]))
            except ValueError as exc:
                raise NetworkError(f"ipv4: {guest['ipv4']!r} of {tap} is not an IPv4 address") from exc
            elements["guest_mac"].add((tap, mac))
            elements["guest_ipv4"].add((tap, ipv4))
            elements["guest_addrs"].add(ipv4)
            taps.append(tap)
        elements["same_owner"].update((a, b) for a in taps for b in taps if a != b)
    return elements


def isolation_skeleton() -> list[str]:
    """The rules of ``bridge zjusct_isolation`` (sets empty; :func:`isolation_elements` fills them).

    Frames from a TAP (``zjt*``; a TAP without elements sends nothing) must carry the TAP's MAC as
    Ethernet source, and be ARP with the TAP's MAC and IPv4 as sender, or IPv4 from the TAP's
    address; everything else (IPv6, VLAN tags, other protocols) is dropped. Frames between two TAPs
    pass only between TAPs of one owner. A TAP receives only frames addressed to its MAC or to a
    group address. The gateway's own output to a TAP never carries a guest's source address (that
    would be a packet routed from one guest to another).
    """
    t = f'"{TAP_PREFIX}*"'
    return [
        "set guest_mac { type ifname . ether_addr; }",
        "set guest_ipv4 { type ifname . ipv4_addr; }",
        "set guest_addrs { type ipv4_addr; }",
        "set same_owner { type ifname . ifname; }",
        "chain prerouting {",
        "  type filter hook prerouting priority -200; policy accept;",
        f"  iifname {t} jump from_guest",
        "}",
        "chain from_guest {",
        "  iifname . ether saddr != @guest_mac drop",
        "  ether type arp iifname . arp saddr ether != @guest_mac drop",
        "  ether type arp iifname . arp saddr ip != @guest_ipv4 drop",
        "  ether type arp accept",
        "  ether type ip iifname . ip saddr != @guest_ipv4 drop",
        "  ether type ip accept",
        "  drop",
        "}",
        "chain forward {",
        "  type filter hook forward priority 0; policy accept;",
        f"  iifname {t} oifname {t} iifname . oifname != @same_owner drop",
        "}",
        "chain output {",
        "  type filter hook output priority 0; policy accept;",
        f"  oifname {t} ether type ip ip saddr @guest_addrs drop",
        "}",
        "chain postrouting {",
        "  type filter hook postrouting priority 0; policy accept;",
        f"  oifname {t} jump to_guest",
        "}",
        "chain to_guest {",
        "  ether daddr & 01:00:00:00:00:00 == 01:00:00:00:00:00 accept",
        "  oifname . ether daddr @guest_mac accept",
        "  drop",
        "}",
    ]


def guard_ruleset(bridge: str, uplink: str, forward: bool = True, gateway_source: Optional[str] = None) -> list[str]:
    """The rules of ``inet zjusct_guard`` in the cloud's namespace (routed traffic; L3).

    Input from the bridge: replies to connections the namespace opened (SSH to guests, readiness
    probes) and ICMP echo requests; nothing else, so guests reach no service of the namespace.
    Forward (only when ``forward``; left out when the bridge is in the host's own namespace, whose
    forwarding policy is the operator's): bridge -> ``uplink`` and the replies; any other routed
    packet from or to the bridge, in particular guest -> gateway -> guest, is dropped. With
    ``gateway_source`` (the SSH gateway's address, the uplink's outer address): new TCP connections from
    exactly that address over ``uplink`` to a guest's port 22 too (docs/security.md, the SSH gateway).
    """
    b, u = f'"{_ifname(bridge)}"', f'"{_ifname(uplink)}"'
    gateway_rules = []
    if gateway_source is not None:
        source = ipaddress.IPv4Address(gateway_source)
        gateway_rules = [f"  iifname {u} oifname {b} ip saddr {source} tcp dport 22 ct state new accept"]
    rules = [
        "chain input {",
        "  type filter hook input priority filter; policy accept;",
        f"  iifname {b} ct state established,related accept",
        f"  iifname {b} icmp type echo-request accept",
        f"  iifname {b} drop",
        "}",
    ]
    if forward:
        rules += [
            "chain forward {",
            "  type filter hook forward priority filter; policy accept;",
            f"  iifname {b} oifname {u} accept",
            f"  iifname {u} oifname {b} ct state established,related accept",
            *gateway_rules,
            f"  iifname {b} drop",
            f"  oifname {b} drop",
            "}",
        ]
    return rules


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


def _exec(netns: str) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


def _sysctl_path(key: str) -> str:
    return "/proc/sys/" + key.replace(".", "/")


def read_sysctl(netns: str, key: str) -> Optional[str]:
    """The value of sysctl ``key`` (dotted) in ``netns`` ("" = the host's), or None if it does not exist."""
    proc = _run([*_exec(netns), "cat", _sysctl_path(key)], check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _ensure_sysctl(netns: str, key: str, value: str) -> bool:
    current = read_sysctl(netns, key)
    if current is None or current == value:
        return False
    _run([*_exec(netns), "sysctl", "-q", "-w", f"{key}={value}"])
    return True


# Written only inside the cloud's own namespace: forwarding for the guests, and bridged frames kept
# out of the IP hooks (br_netfilter), so the inet guard table sees routed packets only.
NETNS_SYSCTLS = (("net.ipv4.ip_forward", "1"),
                 ("net.bridge.bridge-nf-call-iptables", "0"),
                 ("net.bridge.bridge-nf-call-ip6tables", "0"),
                 ("net.bridge.bridge-nf-call-arptables", "0"))


def ensure_bridge(netns: str, bridge: str, subnet: str, gateway_source: Optional[str] = None) -> bool:
    """Create the namespace, its bridge with the gateway address, the sysctls and the guard table.

    The sysctls (:data:`NETNS_SYSCTLS`) are written only when ``netns`` is a namespace of its own:
    with ``netns == ""`` (the bridge in the host's namespace) no sysctl is touched, so routing for
    guests is whatever the host's forwarding says. The ``inet`` guard table (:func:`guard_ruleset`)
    is loaded in both cases (without its forward chain in the host's namespace); ``gateway_source``
    lets the SSH gateway's connections to guests' port 22 through (:meth:`HostConfig.gateway_source`).

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
    if netns:
        for key, value in NETNS_SYSCTLS:
            changed |= _ensure_sysctl(netns, key, value)
    guard = guard_ruleset(bridge, UPLINK_INNER, forward=bool(netns), gateway_source=gateway_source)
    changed |= _ensure_table(netns, "inet", GUARD_TABLE, guard)
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


def _nft_elements(netns: str) -> Optional[dict]:
    """The isolation table's current elements (as :func:`isolation_elements` returns them) and its
    comment under the key ``"comment"``; None when the table does not exist."""
    proc = _run([*_exec(netns), "nft", "-j", "list", "table", "bridge", NFT_TABLE], check=False)
    if proc.returncode != 0:
        return None
    current: dict = {name: set() for name in ISOLATION_SETS}
    text = _run([*_exec(netns), "nft", "list", "table", "bridge", NFT_TABLE], check=False).stdout
    comments = [line.strip()[len("comment "):].strip('"') for line in text.splitlines()
                if line.strip().startswith("comment ")]
    current["comment"] = comments[0] if comments else ""  # nft -j (1.0.6) leaves table comments out
    for item in json.loads(proc.stdout).get("nftables", []):
        info = item.get("set")
        if not info or info.get("name") not in current:
            continue
        for elem in info.get("elem", []):
            if isinstance(elem, dict) and "concat" in elem:
                parts = zip(elem["concat"], _SET_IFNAME_PARTS[info["name"]])
                current[info["name"]].add(tuple(str(x) if quoted else str(x).lower() for x, quoted in parts))
            else:
                current[info["name"]].add(str(elem))
    return current


# Which parts of each set's elements are interface names (quoted in nft scripts).
_SET_IFNAME_PARTS = {"guest_mac": (True, False), "guest_ipv4": (True, False), "guest_addrs": (False,),
                     "same_owner": (True, True)}


def _element(name: str, value: Any) -> str:
    parts = value if isinstance(value, tuple) else (value,)
    return " . ".join(f'"{p}"' if quoted else p for p, quoted in zip(parts, _SET_IFNAME_PARTS[name]))


def _element_lines(verb: str, elements: dict) -> list[str]:
    lines = []
    for name in ISOLATION_SETS:
        values = sorted(elements.get(name, ()))
        if values:
            listed = ", ".join(_element(name, v) for v in values)
            lines.append(f"{verb} element bridge {NFT_TABLE} {name} {{ {listed} }}")
    return lines


def isolation_script(groups: dict) -> str:
    """An nft script that replaces ``bridge zjusct_isolation`` by its rules and the elements for ``groups``, in
    one transaction (no moment without the rules). The host backend loads it through :func:`apply_isolation`; a
    launcher Pod on Kubernetes runs it for its one TAP before the launcher starts (docs/security.md).

    Args:
        groups: see :func:`isolation_elements`.

    Returns:
        The script for ``nft -f -``, newline-terminated.

    Raises:
        NetworkError: bad guest data (named in the message).
    """
    body = isolation_skeleton()
    script = _table_script("bridge", NFT_TABLE, body, _digest_comment("bridge", NFT_TABLE, body))
    return script + "".join(line + "\n" for line in _element_lines("add", isolation_elements(groups)))


def apply_isolation(netns: str, groups: dict) -> bool:
    """Make the isolation table in ``netns`` hold exactly the elements for ``groups``.

    Loads the table's rules (:func:`isolation_skeleton`) when the table is missing or its rules
    changed (the table comment carries their digest), together with all elements in one nft
    transaction; otherwise adds the missing and deletes the stale elements only, so starting or
    deleting a VM never reloads rules and never opens a window without them.

    Args:
        groups: see :func:`isolation_elements`.

    Returns:
        Whether anything changed.

    Raises:
        NetworkError: bad guest data, or nft failed (its message included).
    """
    wanted = isolation_elements(groups)
    current = _nft_elements(netns)
    if current is None or current["comment"] != _digest_comment("bridge", NFT_TABLE, isolation_skeleton()):
        _run([*_exec(netns), "nft", "-f", "-"], stdin=isolation_script(groups))
        return True
    add = {name: wanted[name] - current[name] for name in ISOLATION_SETS}
    delete = {name: current[name] - wanted[name] for name in ISOLATION_SETS}
    lines = _element_lines("delete", delete) + _element_lines("add", add)
    if not lines:
        return False
    _run([*_exec(netns), "nft", "-f", "-"], stdin="\n".join(lines) + "\n")
    return True


def uplink_outer_ruleset(subnet: str, uplink_cidr: str, gateway_gid: Optional[int] = None) -> list[str]:
    """The rules of ``ip zjusct_nat`` on the uplink's outer side (the host's namespace by default).

    Guests' traffic (``subnet``, routed there unchanged by the cloud's namespace) and the namespace's
    own (``uplink_cidr``) are masqueraded onto every interface but the uplink veth. Nothing a guest
    sends reaches the outer namespace's own services (its addresses on any interface): from the
    uplink veth, packets from ``subnet`` come in only as replies. The cloud's namespace itself (the
    launchers, QEMU reaching Ceph) keeps reaching the host.

    With ``gateway_gid`` (the SSH gateway is on; the gid of its accounts' group): the outer namespace
    opens new connections to guests only from root's processes and, to port 22, from that group's
    (the gateway's forwarding processes run as the owner's account); nothing it forwards may open one
    (another NAT on the host could otherwise give a packet the uplink's source address).
    """
    guests, uplink = _network(subnet).cidr, _network(uplink_cidr).cidr
    gateway_rules = [] if gateway_gid is None else [
        "chain output {",
        "  type filter hook output priority filter; policy accept;",
        f'  oifname "{UPLINK_OUTER}" ip daddr {guests} ct state new meta skuid 0 accept',
        f'  oifname "{UPLINK_OUTER}" ip daddr {guests} ct state new meta skgid {int(gateway_gid)} tcp dport 22'
        " accept",
        f'  oifname "{UPLINK_OUTER}" ip daddr {guests} ct state new drop',
        "}",
        "chain forward {",
        "  type filter hook forward priority filter; policy accept;",
        f'  oifname "{UPLINK_OUTER}" ip daddr {guests} ct state new drop',
        "}",
    ]
    return [
        *gateway_rules,
        "chain postrouting {",
        "  type nat hook postrouting priority srcnat; policy accept;",
        f'  ip saddr {{ {guests}, {uplink} }} oifname != "{UPLINK_OUTER}" masquerade',
        "}",
        "chain input {",
        "  type filter hook input priority filter; policy accept;",
        f'  iifname "{UPLINK_OUTER}" ip saddr {guests} ct state established,related accept',
        f'  iifname "{UPLINK_OUTER}" ip saddr {guests} drop',
        "}",
    ]


def ensure_uplink(netns: str, subnet: str, uplink_cidr: str, uplink_netns: str = "",
                  ip_forward: bool = False, gateway_gid: Optional[int] = None) -> bool:
    """Give the guests' namespace a way out: a veth to ``uplink_netns`` (the host's by default) and NAT.

    Inside ``netns``: ``zjup1`` with the uplink's second address and a default route via the first;
    guests' packets are routed out unchanged. On the outer side: ``zjup0`` with the first address, a
    route to ``subnet`` via ``zjup1``, and the table :func:`uplink_outer_ruleset` (masquerade, and no
    guest reaches that namespace's services; its other tables are untouched). A single NAT on the
    outer side lets it tell guests' packets (from ``subnet``) from the namespace's own. The outer
    side's ``net.ipv4.ip_forward`` is written only when ``ip_forward`` is true (the operator's opt-in
    ``uplink_ip_forward``); without forwarding there guests are not routed beyond it
    (:func:`uplink_forwarding`). ``gateway_gid``: see :func:`uplink_outer_ruleset`.

    Returns whether anything changed.

    Raises:
        NetworkError: a command failed, or ``subnet`` is already routed elsewhere in the outer namespace.
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
    guests = str(_network(subnet).cidr)
    routed = _ip(uplink_netns, "-o", "route", "show", "exact", guests).stdout.strip()
    if not routed:
        _ip(uplink_netns, "route", "add", guests, "via", str(net[2]), "dev", UPLINK_OUTER)
        changed = True
    elif f"via {net[2]} dev {UPLINK_OUTER}" not in routed:
        where = f"namespace {uplink_netns}" if uplink_netns else "the host's namespace"
        raise NetworkError(f"subnet: {guests} is already routed in {where} ({routed}); choose another"
                           " hypervisor_subnet")
    if _run([*_exec(netns), "nft", "list", "table", "ip", NAT_TABLE], check=False).returncode == 0:
        _run([*_exec(netns), "nft", "delete", "table", "ip", NAT_TABLE])  # the former inner NAT (double NAT)
        changed = True
    changed |= _ensure_table(uplink_netns, "ip", NAT_TABLE, uplink_outer_ruleset(subnet, uplink_cidr, gateway_gid))
    if ip_forward:
        changed |= _ensure_sysctl(uplink_netns, "net.ipv4.ip_forward", "1")
    return changed


def uplink_forwarding(uplink_netns: str = "") -> bool:
    """Whether the uplink's outer namespace forwards IPv4 (needed for guests' traffic beyond it)."""
    return read_sysctl(uplink_netns, "net.ipv4.ip_forward") == "1"


def _digest_comment(family: str, name: str, body: list[str]) -> str:
    digest = hashlib.sha256("\n".join([family, name, *body]).encode()).hexdigest()[:16]
    return f"zjusct-cloud {digest}"


def _table_script(family: str, name: str, body: list[str], comment: str) -> str:
    """nft script replacing table ``family name`` by ``body`` (atomically, in one transaction)."""
    return (f"table {family} {name}\ndelete table {family} {name}\ntable {family} {name} {{\n"
            f'  comment "{comment}"\n' + "".join(f"  {line}\n" for line in body) + "}\n")


def _ensure_table(netns: str, family: str, name: str, body: list[str]) -> bool:
    """Load table ``family name`` with ``body`` unless it already has these rules (digest in its comment)."""
    comment = _digest_comment(family, name, body)
    current = _run([*_exec(netns), "nft", "list", "table", family, name], check=False)
    if current.returncode == 0 and f'comment "{comment}"' in current.stdout:
        return False
    _run([*_exec(netns), "nft", "-f", "-"], stdin=_table_script(family, name, body, comment))
    return True


def host_resolvers(path: str = "/etc/resolv.conf") -> list[str]:
    """The host's IPv4 name servers usable from guests (loopback ones such as 127.0.0.53 left out)."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    servers = [line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1]
    return [s for s in servers if "." in s and not s.startswith("127.")]
