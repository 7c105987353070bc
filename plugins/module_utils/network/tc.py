# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTB shaping trees: what we manage on a device, the desired tree and its diff (pure: no I/O, no pyroute2).

The kernel adapter that reads a device's tree and applies the diff is :mod:`network.tc_netlink`.

What we manage on a device (everything else on the device is left alone):

* the root qdisc ``htb`` with handle ``7a:`` (MAJOR, "z"). Everything below it is ours: the root class ``7a:1``
  (rate = ceil = ``root_rate_mbps``), the default class ``7a:ffff`` (unclassified traffic) and one leaf class per
  VM ``7a:<minor>`` with minor in 0x10..0xfff, all children of ``7a:1``;
* one u32 filter per VM class on ``7a:`` (preference FILTER_PRIO, protocol all) with handle ``800::<minor>``;
* for the ``ingress`` direction: the device's ``ingress`` qdisc (``ffff:``) holding one u32 filter of preference
  REDIRECT_PRIO that redirects every packet (mirred egress redirect) to an IFB device; the HTB tree lives on the
  IFB. The IFB is created by us and marked with the alias IFB_ALIAS_PREFIX + device; an existing IFB is used
  or deleted only when its alias names the same device (:meth:`network.tc_netlink.NetlinkTc.check_ifb`).

Direction semantics for a VM's TAP on a bridge: traffic TO the guest leaves the host through the TAP, so it is
the TAP's **egress** (match the guest's MAC as Ethernet destination, or its IPv4 as IP destination). Traffic FROM
the guest enters the host on the TAP, i.e. the TAP's **ingress**; Linux cannot queue on ingress, so it is
redirected to an IFB device and shaped on the IFB's egress, matching the guest's MAC as Ethernet source (or its
IPv4 as IP source). MAC matching works for any protocol (ARP, IPv6) and survives guest IP changes, so it is the
default choice for TAPs; IPv4 matching is offered for routed setups. u32 offsets are relative to the network
header: Ethernet destination at -14, source at -8, EtherType at -2; IPv4 source at 12, destination at 16.

Quantum (case N1, docs/architecture.md "Failure cases"; docs/qos.md): HTB derives ``quantum = rate / r2q`` when none is
given and warns ("quantum of class ... is big") outside 1000..200000 bytes (net/sched/sch_htb.c). We always pass an
explicit quantum::

    quantum = clamp(rate_bytes_per_s // 10, mtu + 14, 200000)

i.e. the r2q=10 value kept inside the range where it is meaningful, and never below one full Ethernet frame so
a class can always send a packet per round. Burst: ``burst = max(rate_bytes_per_s // 100, 2 * (mtu + 14))``
(10 ms at the rate, at least two frames); cburst likewise from ceil. So a transfer can exceed its ceiling only
by cburst bytes (10 ms) in its first second.

Units: Mbit/s = 10^6 bit/s = 125000 bytes/s at the API; the kernel gets bytes/s and burst in psched ticks.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

MAJOR = 0x7A
ROOT_HANDLE = MAJOR << 16
ROOT_MINOR = 0x1
DEFAULT_MINOR = 0xFFFF
VM_MINOR_MIN = 0x10
VM_MINOR_MAX = 0xFFF  # a u32 node id has 12 bits; the VM class minor doubles as the filter node id
FILTER_PRIO = 10
REDIRECT_PRIO = 0x7A
U32_HTID = 0x800
ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1
INGRESS_HANDLE = 0xFFFF0000
IFB_ALIAS_PREFIX = "zjusct.cloud tc_qos ifb for "
MBIT_BYTES = 125_000
QUANTUM_MAX = 200_000
EGRESS = "egress"
INGRESS = "ingress"

_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


class TcError(CloudError):
    """A tc input or kernel error; the message names the field/device and the value."""


# ---- pure model ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ClassSpec:
    """One VM class as the caller asks for it (Mbit/s). ``minor`` None means "auto"."""

    name: str
    rate_mbps: int
    ceil_mbps: int
    mac: str | None = None
    ipv4: str | None = None
    minor: int | None = None


@dataclass(frozen=True)
class HtbClass:
    """An HTB class as the kernel reports it: bytes/s, burst in psched ticks, quantum in bytes."""

    minor: int
    parent: int
    rate: int
    ceil: int
    buffer: int
    cbuffer: int
    quantum: int
    prio: int = 0


@dataclass(frozen=True)
class U32Filter:
    """A u32 filter node ``800::node`` classifying into ``7a:target`` with keys (value, mask, offset)."""

    node: int
    target: int
    keys: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Tree:
    """The managed part of a device: root qdisc present?, its default class, classes and filters by minor/node.

    ``foreign_root`` names a root qdisc that is not ours (kind and handle), which we refuse to replace.
    """

    qdisc: bool = False
    default_minor: int = DEFAULT_MINOR
    classes: dict[int, HtbClass] = field(default_factory=dict)
    filters: dict[int, U32Filter] = field(default_factory=dict)
    foreign_root: str | None = None


@dataclass(frozen=True)
class Op:
    """One netlink operation: kind in qdisc-add|qdisc-change|class-put|filter-put|filter-del|class-del."""

    kind: str
    obj: Any = None

    def describe(self) -> str:
        if isinstance(self.obj, HtbClass):
            return (f"{self.kind} 7a:{self.obj.minor:x} rate {self.obj.rate * 8}bit ceil {self.obj.ceil * 8}bit "
                    f"quantum {self.obj.quantum}")
        if isinstance(self.obj, U32Filter):
            return f"{self.kind} 800::{self.obj.node:x} -> 7a:{self.obj.target:x}"
        return self.kind


def quantum_bytes(rate_bytes: int, mtu: int) -> int:
    """Explicit HTB quantum: clamp(rate/10, mtu+14, 200000) bytes (see module docstring, case N1)."""
    return max(mtu + 14, min(QUANTUM_MAX, rate_bytes // 10))


def burst_bytes(rate_bytes: int, mtu: int) -> int:
    """Burst: max(10 ms at the rate, two Ethernet frames) in bytes."""
    return max(rate_bytes // 100, 2 * (mtu + 14))


def ticks(rate_bytes: int, size: int, tick_in_usec: float) -> int:
    """Transmit time of ``size`` bytes at ``rate_bytes`` bytes/s in psched ticks (as tc computes it)."""
    return int(int(1_000_000 * (float(size) / rate_bytes)) * tick_in_usec)


def normalize_mac(mac: str, where: str) -> str:
    m = mac.strip().lower().replace("-", ":")
    if not _MAC_RE.match(m):
        raise TcError(f"{where}: {mac!r} is not a MAC address (aa:bb:cc:dd:ee:ff)")
    return m


def match_keys(spec: ClassSpec, direction: str) -> tuple[tuple[int, int, int], ...]:
    """u32 keys (value, mask, offset relative to the network header) matching ``spec``'s traffic.

    egress (to the guest): Ethernet destination / IPv4 destination; ingress (from the guest, on the IFB):
    Ethernet source / IPv4 source. IPv4 keys also require EtherType 0x0800.
    """
    if spec.mac:
        mac = bytes.fromhex(normalize_mac(spec.mac, f"classes[{spec.name}].match.mac").replace(":", ""))
        if direction == EGRESS:  # destination MAC: bytes -14..-9
            return ((int.from_bytes(mac[0:2], "big"), 0x0000FFFF, -16),
                    (int.from_bytes(mac[2:6], "big"), 0xFFFFFFFF, -12))
        # source MAC: bytes -8..-3
        return ((int.from_bytes(mac[0:4], "big"), 0xFFFFFFFF, -8),
                (int.from_bytes(mac[4:6], "big") << 16, 0xFFFF0000, -4))
    if spec.ipv4:
        try:
            ip = int(ipaddress.IPv4Address(spec.ipv4))
        except ValueError as e:
            raise TcError(f"classes[{spec.name}].match.ipv4: {spec.ipv4!r} is not an IPv4 address") from e
        return ((ETH_P_IP, 0x0000FFFF, -4), (ip, 0xFFFFFFFF, 16 if direction == EGRESS else 12))
    raise TcError(f"classes[{spec.name}].match: needs mac or ipv4")


def assign_minors(specs: Sequence[ClassSpec], current: Tree, direction: str) -> list[ClassSpec]:
    """Resolve ``minor=None`` (auto): reuse the class an existing filter with the same match points to, else
    take the lowest free minor in VM_MINOR_MIN..VM_MINOR_MAX. Raises TcError on duplicates or exhaustion."""
    by_keys = {f.keys: f.target for f in current.filters.values()}
    taken: dict[int, str] = {}
    for s in specs:
        if s.minor is not None:
            if not VM_MINOR_MIN <= s.minor <= VM_MINOR_MAX:
                raise TcError(f"classes[{s.name}].classid: 7a:{s.minor:x} is outside 7a:10..7a:fff")
            if s.minor in taken:
                raise TcError(f"classes[{s.name}].classid: 7a:{s.minor:x} is also used by {taken[s.minor]}")
            taken[s.minor] = s.name
    resolved: dict[int, int] = {}  # index in specs -> minor
    for i, s in enumerate(specs):  # first pass: explicit ids, then classes whose match already has a filter
        if s.minor is not None:
            resolved[i] = s.minor
    for i, s in enumerate(specs):
        if s.minor is None:
            reuse = by_keys.get(match_keys(s, direction))
            if reuse is not None and reuse not in taken and VM_MINOR_MIN <= reuse <= VM_MINOR_MAX:
                resolved[i] = reuse
                taken[reuse] = s.name
    free = (m for m in range(VM_MINOR_MIN, VM_MINOR_MAX + 1) if m not in taken)
    out: list[ClassSpec] = []
    for i, s in enumerate(specs):  # second pass: the lowest free minors (a removed VM's id may be reused)
        if i not in resolved:
            minor = next(free, None)
            if minor is None:
                raise TcError(f"classes[{s.name}].classid: no free class id left in 7a:10..7a:fff")
            resolved[i] = minor
        out.append(dataclasses.replace(s, minor=resolved[i]))
    return out


def desired_tree(specs: Sequence[ClassSpec], *, mtu: int, root_rate_mbps: int, default_rate_mbps: int,
                 default_ceil_mbps: int, direction: str, tick_in_usec: float) -> Tree:
    """Build the managed tree for ``specs`` (minors already assigned). Raises TcError on invalid values."""
    if direction not in (EGRESS, INGRESS):
        raise TcError(f"direction: {direction!r} is not one of egress, ingress")
    for name, v in (("root_rate_mbps", root_rate_mbps), ("default_rate_mbps", default_rate_mbps),
                    ("default_ceil_mbps", default_ceil_mbps)):
        if not 1 <= v <= 4_000_000:
            raise TcError(f"{name}: {v} is outside the allowed range 1..4000000")
    if default_ceil_mbps < default_rate_mbps:
        raise TcError(f"default_ceil_mbps: {default_ceil_mbps} is below default_rate_mbps {default_rate_mbps}")

    def cls(minor: int, parent: int, rate_mbps: int, ceil_mbps: int) -> HtbClass:
        rate, ceil = rate_mbps * MBIT_BYTES, ceil_mbps * MBIT_BYTES
        return HtbClass(minor, parent, rate, ceil, ticks(rate, burst_bytes(rate, mtu), tick_in_usec),
                        ticks(ceil, burst_bytes(ceil, mtu), tick_in_usec), quantum_bytes(rate, mtu))

    # The root class gets an explicit quantum too: it is a leaf for an instant when created, and HTB warns
    # "quantum of class 7A0001 is big" for a derived one (seen through extended acks).
    classes = {ROOT_MINOR: cls(ROOT_MINOR, 0, root_rate_mbps, root_rate_mbps),
               DEFAULT_MINOR: cls(DEFAULT_MINOR, ROOT_MINOR, default_rate_mbps, default_ceil_mbps)}
    filters: dict[int, U32Filter] = {}
    seen: dict[tuple, str] = {}
    for s in specs:
        if s.minor is None:
            raise AssertionError("s.minor unexpectedly missing")
        if not 1 <= s.rate_mbps <= s.ceil_mbps <= 4_000_000:
            raise TcError(f"classes[{s.name}]: rate_mbps {s.rate_mbps} / ceil_mbps {s.ceil_mbps} must satisfy "
                          f"1 <= rate <= ceil <= 4000000")
        if s.ceil_mbps > root_rate_mbps:
            raise TcError(f"classes[{s.name}].ceil_mbps: {s.ceil_mbps} is above root_rate_mbps {root_rate_mbps}")
        keys = match_keys(s, direction)
        if keys in seen:
            raise TcError(f"classes[{s.name}].match: same match as {seen[keys]}")
        seen[keys] = s.name
        classes[s.minor] = cls(s.minor, ROOT_MINOR, s.rate_mbps, s.ceil_mbps)
        filters[s.minor] = U32Filter(s.minor, s.minor, keys)
    return Tree(True, DEFAULT_MINOR, classes, filters)


def diff_trees(current: Tree, desired: Tree) -> list[Op]:
    """The operations turning ``current`` into ``desired``, in a safe order (empty when equal).

    Order: qdisc, classes added/changed (root first), stale filters deleted, filters added/replaced, stale
    classes deleted (a class cannot be deleted while a filter points to it). Raises TcError when a foreign root
    qdisc occupies the device.
    """
    if current.foreign_root:
        raise TcError(f"device already has a root qdisc that is not managed here ({current.foreign_root}); "
                      f"remove it first")
    if not desired.qdisc:
        return [Op("qdisc-del")] if current.qdisc else []
    ops: list[Op] = []
    if not current.qdisc:
        ops.append(Op("qdisc-add", desired.default_minor))
        current = Tree()
    elif current.default_minor != desired.default_minor:
        ops.append(Op("qdisc-change", desired.default_minor))
    for minor in sorted(desired.classes, key=lambda m: (m != ROOT_MINOR, m)):
        if current.classes.get(minor) != desired.classes[minor]:
            ops.append(Op("class-put", desired.classes[minor]))
    for node in sorted(current.filters):
        if node not in desired.filters:
            ops.append(Op("filter-del", current.filters[node]))
    for node in sorted(desired.filters):
        if current.filters.get(node) != desired.filters[node]:
            ops.append(Op("filter-put", desired.filters[node]))
    for minor in sorted(current.classes):
        if minor not in desired.classes:
            ops.append(Op("class-del", current.classes[minor]))
    return ops


def tree_summary(tree: Tree) -> list[dict]:
    """Classes of a tree for diff/return values: classid, rate/ceil in Mbit/s, quantum, filter keys."""
    out = []
    for minor in sorted(tree.classes):
        c = tree.classes[minor]
        f = tree.filters.get(minor)
        out.append({
            "classid": f"7a:{minor:x}", "rate_mbps": round(c.rate / MBIT_BYTES, 3),
            "ceil_mbps": round(c.ceil / MBIT_BYTES, 3), "quantum": c.quantum,
            "match": [f"{v:08x}/{m:08x} at {o}" for v, m, o in f.keys] if f else [],
        })
    return out


def parse_classid(value: object, where: str) -> int | None:
    """'auto'/None -> None; 16 or '0x10' or '7a:10' (hex minor, tc notation) -> 16. Raises TcError."""
    if value is None or value == "auto":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    try:
        if ":" in text:
            major, minor = text.split(":", 1)
            if int(major, 16) != MAJOR:
                raise TcError(f"{where}: {value!r} must use the managed major 7a:")
            return int(minor, 16)
        return int(text, 0)
    except ValueError as e:
        raise TcError(f"{where}: {value!r} is not 'auto', an integer minor or '7a:<hex minor>'") from e
