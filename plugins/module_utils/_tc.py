# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTB shaping trees: the desired tree and its diff (pure), and a pyroute2 netlink adapter that applies it.

What we manage on a device (everything else on the device is left alone):

* the root qdisc ``htb`` with handle ``7a:`` (MAJOR, "z"). Everything below it is ours: the root class ``7a:1``
  (rate = ceil = ``root_rate_mbps``), the default class ``7a:ffff`` (unclassified traffic) and one leaf class per
  VM ``7a:<minor>`` with minor in 0x10..0xfff, all children of ``7a:1``;
* one u32 filter per VM class on ``7a:`` (preference FILTER_PRIO, protocol all) with handle ``800::<minor>``;
* for the ``ingress`` direction: the device's ``ingress`` qdisc (``ffff:``) holding one u32 filter of preference
  REDIRECT_PRIO that redirects every packet (mirred egress redirect) to an IFB device; the HTB tree lives on the
  IFB. The IFB is created by us and marked with the alias IFB_ALIAS_PREFIX + device; an existing IFB is used
  or deleted only when its alias names the same device (:meth:`NetlinkTc.check_ifb`).

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
import os
import re
import socket
import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

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


class TcError(Exception):
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


# ---- netlink encoding (pure: bytes for our fixed message shapes) -----------------------------------------------
# Layouts: include/uapi/linux/netlink.h (nlmsghdr, nlattr), rtnetlink.h (tcmsg, RTM_*), pkt_sched.h
# (tc_ratespec, tc_htb_opt, tc_htb_glob, TCA_HTB_*), pkt_cls.h (tc_u32_sel, tc_u32_key, TCA_U32_*).

RTM_NEWQDISC, RTM_DELQDISC, RTM_NEWTCLASS, RTM_DELTCLASS, RTM_NEWTFILTER, RTM_DELTFILTER = 36, 37, 40, 41, 44, 45
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x100, 0x200, 0x400
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_HTB_PARMS, TCA_HTB_INIT, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 2, 6, 7
TCA_U32_CLASSID, TCA_U32_SEL = 1, 5
TC_LINKLAYER_ETHERNET = 1


def _nla(kind: int, payload: bytes) -> bytes:
    head = struct.pack("=HH", 4 + len(payload), kind)
    return head + payload + b"\0" * (-len(payload) % 4)


def _ratespec(rate: int) -> bytes:
    return struct.pack("=BBHhHI", 0, TC_LINKLAYER_ETHERNET, 0, -1, 0, min(rate, 0xFFFFFFFF))


def encode_op(op: Op, ifindex: int, seq: int) -> bytes:
    """One netlink request (with NLM_F_ACK) for ``op`` on device ``ifindex``. Raises TcError for unknown ops."""
    o = op.obj
    attrs = b""
    info = 0
    if op.kind in ("qdisc-add", "qdisc-change"):
        mtype = RTM_NEWQDISC
        flags = NLM_F_CREATE | NLM_F_EXCL if op.kind == "qdisc-add" else 0
        handle, parent = ROOT_HANDLE, TC_H_ROOT
        glob = struct.pack("=IIIII", 3, 10, o, 0, 0)  # version 3, r2q 10 (unused: quanta are explicit), defcls
        attrs = _nla(TCA_KIND, b"htb\0") + _nla(TCA_OPTIONS, _nla(TCA_HTB_INIT, glob))
    elif op.kind == "qdisc-del":
        mtype, flags, handle, parent = RTM_DELQDISC, 0, ROOT_HANDLE, TC_H_ROOT
    elif op.kind == "class-put":
        mtype, flags = RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_REPLACE
        handle = ROOT_HANDLE | o.minor
        parent = TC_H_ROOT if o.parent == 0 else ROOT_HANDLE | o.parent
        opt = _ratespec(o.rate) + _ratespec(o.ceil) + struct.pack("=IIIII", o.buffer, o.cbuffer, o.quantum, 0,
                                                                  o.prio)
        inner = _nla(TCA_HTB_PARMS, opt)
        if o.rate >= 0xFFFFFFFF:
            inner += _nla(TCA_HTB_RATE64, struct.pack("=Q", o.rate))
        if o.ceil >= 0xFFFFFFFF:
            inner += _nla(TCA_HTB_CEIL64, struct.pack("=Q", o.ceil))
        attrs = _nla(TCA_KIND, b"htb\0") + _nla(TCA_OPTIONS, inner)
    elif op.kind == "class-del":
        mtype, flags, handle, parent = RTM_DELTCLASS, 0, ROOT_HANDLE | o.minor, ROOT_HANDLE | o.parent
    elif op.kind in ("filter-put", "filter-del"):
        handle, parent = (U32_HTID << 20) | o.node, ROOT_HANDLE
        info = (FILTER_PRIO << 16) | socket.htons(ETH_P_ALL)
        attrs = _nla(TCA_KIND, b"u32\0")
        if op.kind == "filter-put":
            mtype, flags = RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_REPLACE
            sel = struct.pack("=BBBxHHhhI", 1, 0, len(o.keys), 0, 0, 0, 0, 0)  # flags TC_U32_TERMINAL
            for value, mask, koff in o.keys:
                sel += struct.pack(">II", mask, value & mask) + struct.pack("=ii", koff, 0)
            attrs += _nla(TCA_OPTIONS, _nla(TCA_U32_CLASSID, struct.pack("=I", ROOT_HANDLE | o.target))
                          + _nla(TCA_U32_SEL, sel))
        else:
            mtype, flags = RTM_DELTFILTER, 0
    else:
        raise TcError(f"unknown operation {op.kind}")
    body = struct.pack("=BBHiIII", 0, 0, 0, ifindex, handle, parent, info) + attrs
    return struct.pack("=IHHII", 16 + len(body), mtype, NLM_F_REQUEST | NLM_F_ACK | flags, seq, 0) + body


# ---- netlink adapter ----------------------------------------------------------------------------------------

def _import_pyroute2() -> Any:
    try:
        import pyroute2
        from pyroute2.netlink.rtnl.tcmsg import cls_u32  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the managed node
        raise TcError("the Python library pyroute2 (>=0.9,<0.10) is required on the managed node: "
                      "pip install 'pyroute2>=0.9,<0.10'") from e
    return pyroute2


def read_tick_in_usec(path: str = "/proc/net/psched") -> float:
    """psched ticks per microsecond (t2us / us2t x clock_res / 1e6), as tc and pyroute2 compute it."""
    with open(path, encoding="ascii") as f:
        t2us, us2t, clock_res, _unused = (int(x, 16) for x in f.read().split())
    return t2us / us2t * (clock_res / 1_000_000)


_CLASSES: dict[str, Any] = {}


def _msg_classes() -> tuple[Any, Any]:
    """tcmsg subclass whose u32 selector encodes/decodes raw (value, mask, offset) keys, negative offsets included
    (pyroute2's string keys cannot express the negative offsets of Ethernet header matches)."""
    if _CLASSES:
        return _CLASSES["tcmsg"], _CLASSES["u32"]
    _import_pyroute2()
    from pyroute2.netlink import nla
    from pyroute2.netlink.rtnl.tcmsg import cls_u32, tcmsg

    class U32Options(cls_u32.options):
        _nlmsg_base__compiled_nla = False
        _nlmsg_base__t_nla_map = None
        _nlmsg_base__r_nla_map = None

        class u32_sel(cls_u32.options.u32_sel):
            def encode(self) -> None:
                keys = self["keys"]
                self["nkeys"] = len(keys)
                self["flags"] = 1  # TC_U32_TERMINAL
                nla.encode(self)
                off = self.offset + 20  # nla header (4) + struct tc_u32_sel (16)
                need = off + 16 * len(keys)
                if len(self.data) < need:
                    self.data.extend(b"\0" * (need - len(self.data)))
                for value, mask, koff in keys:
                    struct.pack_into(">II", self.data, off, mask, value & mask)
                    struct.pack_into("=ii", self.data, off + 8, koff, 0)
                    off += 16
                self.length = off - self.offset
                struct.pack_into("H", self.data, self.offset, self.length)

    class QosTcMsg(tcmsg):
        # pyroute2 caches the compiled attribute table per class in name-mangled class attributes; a subclass
        # would inherit tcmsg's cache (and its options resolver) unless the cache is reset here.
        _nlmsg_base__compiled_nla = False
        _nlmsg_base__t_nla_map = None
        _nlmsg_base__r_nla_map = None

        @staticmethod
        def get_options(msg: Any, *argv: Any, **kwarg: Any) -> Any:
            if msg.get_attr("TCA_KIND") == "u32":
                return U32Options
            return tcmsg.get_options(msg, *argv, **kwarg)

    _CLASSES["tcmsg"], _CLASSES["u32"] = QosTcMsg, U32Options
    return QosTcMsg, U32Options


def _decode_u32_keys(sel: Any) -> tuple[tuple[int, int, int], ...]:
    """Keys of a dumped TCA_U32_SEL read from its raw bytes (struct tc_u32_key: be32 mask, be32 val, int off)."""
    base = sel.offset + 20
    nkeys = sel.data[sel.offset + 6]
    out = []
    for i in range(nkeys):
        mask, val = struct.unpack_from(">II", sel.data, base + 16 * i)
        off, _unused = struct.unpack_from("=ii", sel.data, base + 16 * i + 8)
        out.append((val, mask, off))
    return tuple(out)


class RtnlWriter:
    """A raw NETLINK_ROUTE socket (inside ``netns`` when given) that sends many requests in one ``send`` and reads
    their acks, with extended acks on: kernel error and warning strings (e.g. HTB's "quantum of class ... is
    big") are returned, not lost."""

    SOL_NETLINK, NETLINK_CAP_ACK, NETLINK_EXT_ACK = 270, 10, 11
    NLMSG_ERROR, NLM_F_ACK_TLVS, NLMSGERR_ATTR_MSG = 2, 0x200, 1
    CHUNK = 256  # requests per send (about 100 bytes each)

    def __init__(self, netns: str | None) -> None:
        if netns:
            from pyroute2 import netns as pnetns

            self.sock = pnetns.create_socket(netns, socket.AF_NETLINK, socket.SOCK_RAW, 0)
        else:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        self.sock.setsockopt(self.SOL_NETLINK, self.NETLINK_CAP_ACK, 1)
        self.sock.setsockopt(self.SOL_NETLINK, self.NETLINK_EXT_ACK, 1)
        self.sock.bind((0, 0))
        self.sock.settimeout(30)
        self.seq = 1

    def close(self) -> None:
        self.sock.close()

    def _acks(self, pending: dict[int, int], results: dict[int, tuple[int, str]]) -> None:
        while pending:
            data = self.sock.recv(1 << 20)
            off = 0
            while off + 16 <= len(data):
                length, mtype, flags, seq, _unused = struct.unpack_from("=IHHII", data, off)
                if length < 16:
                    break
                if mtype == self.NLMSG_ERROR and seq in pending:
                    err = -struct.unpack_from("=i", data, off + 16)[0]
                    text = ""
                    if flags & self.NLM_F_ACK_TLVS:
                        t = off + 16 + 4 + 16
                        while t + 4 <= off + length:
                            alen, atype = struct.unpack_from("=HH", data, t)
                            if alen < 4:
                                break
                            if atype == self.NLMSGERR_ATTR_MSG:
                                text = data[t + 4:t + alen].split(b"\0", 1)[0].decode(errors="replace")
                            t += (alen + 3) & ~3
                    results[pending.pop(seq)] = (err, text)
                off += (length + 3) & ~3

    def send(self, requests: Sequence[Any]) -> list[tuple[int, str]]:
        """Send ``requests`` (callables seq -> bytes) in chunks; return (errno, kernel message) per request."""
        results: dict[int, tuple[int, str]] = {}
        for start in range(0, len(requests), self.CHUNK):
            pending: dict[int, int] = {}
            buf = bytearray()
            for i in range(start, min(start + self.CHUNK, len(requests))):
                self.seq += 1
                pending[self.seq] = i
                buf += requests[i](self.seq)
            self.sock.send(bytes(buf))
            self._acks(pending, results)
        return [results[i] for i in range(len(requests))]


class NetlinkTc:
    """Reads and writes the managed HTB tree of one device, optionally inside a named network namespace.

    Use as a context manager. ``netns`` is a name under /run/netns (``ip netns add``) or None.
    Raises TcError when the device does not exist.
    """

    BATCH = 48  # messages per netlink send (HTB classes carry 2 KiB of rate tables each)

    def __init__(self, device: str, netns: str | None = None) -> None:
        pyroute2 = _import_pyroute2()
        self.device = device
        self.netns = netns
        try:
            self.ipr = pyroute2.IPRoute(netns=netns) if netns else pyroute2.IPRoute()
        except Exception as e:
            raise TcError(f"netns: cannot open network namespace {netns!r}: {e}") from e
        self.tick_in_usec = read_tick_in_usec()
        self._writer: RtnlWriter | None = None

    def __enter__(self) -> NetlinkTc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.ipr.close()

    # -- links --
    def index(self, ifname: str | None = None) -> int:
        name = ifname or self.device
        found = self.ipr.link_lookup(ifname=name)
        if not found:
            where = f" in netns {self.netns}" if self.netns else ""
            raise TcError(f"device: {name!r} does not exist{where}")
        return int(found[0])

    def exists(self, ifname: str) -> bool:
        return bool(self.ipr.link_lookup(ifname=ifname))

    def mtu(self, ifname: str | None = None) -> int:
        link = self.ipr.get_links(self.index(ifname))[0]
        return int(link.get_attr("IFLA_MTU") or 1500)

    def ifb_owner(self, ifb: str) -> str | None:
        """The device an existing link ``ifb`` was created for (from its ifalias IFB_ALIAS_PREFIX + device).

        Returns None when ``ifb`` does not exist, "" when it exists without our alias (not created by us).
        """
        if not self.exists(ifb):
            return None
        link = self.ipr.get_links(self.index(ifb))[0]
        alias = link.get_attr("IFLA_IFALIAS") or ""
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info else None
        if not alias.startswith(IFB_ALIAS_PREFIX) or kind not in (None, "ifb"):
            return ""
        return alias[len(IFB_ALIAS_PREFIX):]

    def ifb_is_ours(self, ifb: str) -> bool:
        """True when ``ifb`` exists and was created for this device (its ifalias names the device)."""
        return self.ifb_owner(ifb) == self.device

    def check_ifb(self, ifb: str) -> None:
        """Refuse an ``ifb`` name that is taken by a link not created for this device (before any change).

        Raises TcError naming the IFB, the device it belongs to (or that it is not ours) and this device. A
        derived IFB name is collision-free by construction (_names.ifb_name); this check covers names given
        explicitly and the residual hash collision, so that an IFB is never silently taken over.
        """
        owner = self.ifb_owner(ifb)
        if owner is None or owner == self.device:
            return
        where = f" in netns {self.netns}" if self.netns else ""
        whose = (f"is the IFB of device {owner!r}" if owner
                 else "exists and was not created by zjusct.cloud (no matching ifalias, or not an ifb)")
        raise TcError(f"ifb: {ifb!r}{where} {whose}; refusing to use it for device {self.device!r} "
                      "(name another ifb)")

    def owned_ifbs(self) -> list[str]:
        """Names of the IFBs created for this device (ifalias IFB_ALIAS_PREFIX + device), sorted."""
        want = IFB_ALIAS_PREFIX + self.device
        return sorted(str(link.get_attr("IFLA_IFNAME")) for link in self.ipr.get_links()
                      if (link.get_attr("IFLA_IFALIAS") or "") == want)

    def ensure_ifb(self, ifb: str) -> bool:
        """Create (alias-marked) and bring up the IFB device ``ifb``; True when something changed.

        Raises TcError (see :meth:`check_ifb`) when ``ifb`` exists but belongs to another device.
        """
        self.check_ifb(ifb)
        changed = False
        if not self.exists(ifb):
            self.ipr.link("add", ifname=ifb, kind="ifb")
            self.ipr.link("set", index=self.index(ifb), ifalias=IFB_ALIAS_PREFIX + self.device)
            changed = True
        link = self.ipr.get_links(self.index(ifb))[0]
        if link.get_attr("IFLA_OPERSTATE") != "UP" and not link["flags"] & 1:
            self.ipr.link("set", index=self.index(ifb), state="up")
            changed = True
        return changed

    def delete_ifb(self, ifb: str) -> bool:
        """Delete ``ifb`` when it was created for this device; True when deleted (another's is left alone)."""
        if self.ifb_is_ours(ifb):
            self.ipr.link("del", index=self.index(ifb))
            return True
        return False

    # -- read --
    def read_tree(self, ifname: str | None = None) -> Tree:
        """The managed tree on ``ifname`` (default: the device) as the kernel reports it."""
        idx = self.index(ifname)
        qdisc = False
        default_minor = DEFAULT_MINOR
        foreign = None
        for q in self.ipr.get_qdiscs(idx):
            if q["parent"] != TC_H_ROOT:
                continue
            kind = q.get_attr("TCA_KIND")
            if kind == "htb" and q["handle"] == ROOT_HANDLE:
                qdisc = True
                init = q.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_INIT")
                default_minor = int(init["defcls"])
            elif q["handle"] != 0:  # handle 0: the kernel's default qdisc (noqueue, pfifo_fast, mq)
                foreign = f"{kind} {q['handle'] >> 16:x}:"
        if not qdisc:
            return Tree(False, foreign_root=foreign)
        classes: dict[int, HtbClass] = {}
        for c in self.ipr.get_classes(idx):
            if c["handle"] >> 16 != MAJOR or c.get_attr("TCA_KIND") != "htb":
                continue
            opts = c.get_attr("TCA_OPTIONS")
            p = opts.get_attr("TCA_HTB_PARMS")
            rate = opts.get_attr("TCA_HTB_RATE64") or p["rate"]
            ceil = opts.get_attr("TCA_HTB_CEIL64") or p["ceil"]
            minor = c["handle"] & 0xFFFF
            parent = 0 if c["parent"] == TC_H_ROOT else c["parent"] & 0xFFFF
            quantum = int(p["quantum"])
            classes[minor] = HtbClass(minor, parent, int(rate), int(ceil), int(p["buffer"]), int(p["cbuffer"]),
                                      quantum, int(p["prio"]))
        filters: dict[int, U32Filter] = {}
        for f in self.ipr.get_filters(idx, parent=ROOT_HANDLE):
            if f.get_attr("TCA_KIND") != "u32" or (f["info"] >> 16) != FILTER_PRIO:
                continue
            handle = f["handle"]
            node = handle & 0xFFF
            opts = f.get_attr("TCA_OPTIONS")
            if not node or opts is None or opts.get_attr("TCA_U32_CLASSID") is None:
                continue
            sel = opts.get_attr("TCA_U32_SEL")
            filters[node] = U32Filter(node, opts.get_attr("TCA_U32_CLASSID") & 0xFFFF, _decode_u32_keys(sel))
        return Tree(True, default_minor, classes, filters)

    def has_redirect(self, ifb: str) -> bool:
        """True when the device's ingress qdisc holds our redirect filter to ``ifb``."""
        idx = self.index()
        if not any(q["handle"] == INGRESS_HANDLE for q in self.ipr.get_qdiscs(idx)):
            return False
        want = self.index(ifb) if self.exists(ifb) else -1
        for f in self.ipr.get_filters(idx, parent=INGRESS_HANDLE):
            if (f["info"] >> 16) != REDIRECT_PRIO or not f["handle"] & 0xFFF:
                continue
            for act in self._actions(f):
                if act.get("ifindex") == want:
                    return True
        return False

    @staticmethod
    def _actions(f: Any) -> Iterable[dict]:
        opts = f.get_attr("TCA_OPTIONS")
        acts = opts.get_attr("TCA_U32_ACT") if opts else None
        if not acts:
            return []
        out = []
        for prio in acts.get("attrs", []):
            a = prio[1]
            if hasattr(a, "get_attr") and a.get_attr("TCA_ACT_KIND") == "mirred":
                parms = a.get_attr("TCA_ACT_OPTIONS").get_attr("TCA_MIRRED_PARMS")
                out.append({"ifindex": parms["ifindex"]})
        return out

    # -- write --
    def _msg(self, idx: int, mtype: int, flags: int, kind: str | None, handle: int, parent: int,
             opts: Any = None, info: int = 0) -> Any:
        from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST

        QosTcMsg, _unused = _msg_classes()
        m = QosTcMsg()
        m["family"] = 0
        m["index"] = idx
        m["handle"] = handle
        m["parent"] = parent
        m["info"] = info
        attrs: list = []
        if kind:
            attrs.append(["TCA_KIND", kind])
        if opts is not None:
            attrs.append(["TCA_OPTIONS", opts])
        m["attrs"] = attrs
        m["header"]["type"] = mtype
        m["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | flags
        return m

    def apply(self, ops: Sequence[Op], ifname: str | None = None, batch: bool = True) -> list[str]:
        """Apply ``ops`` on ``ifname`` (default: the device) in netlink batches (one send per RtnlWriter.CHUNK
        requests); ``batch=False`` waits for each ack before sending the next request (benchmark baseline).

        Returns the kernel's warnings (extended-ack messages of successful requests). Raises TcError naming the
        first failing operation and the kernel's message; a repeated qdisc-add (EEXIST) or the delete of
        something already gone (ENOENT) is not an error, so a re-run converges.
        """
        import errno

        if not ops:
            return []
        idx = self.index(ifname)
        if self._writer is None:
            self._writer = RtnlWriter(self.netns)
        reqs = [(lambda seq, op=op: encode_op(op, idx, seq)) for op in ops]
        if batch:
            results = self._writer.send(reqs)
        else:
            results = [r for req in reqs for r in self._writer.send([req])]
        warnings = []
        for op, (err, text) in zip(ops, results):
            if err == 0:
                if text:
                    warnings.append(f"{ifname or self.device}: {op.describe()}: {text}")
                continue
            if (op.kind == "qdisc-add" and err == errno.EEXIST) or (op.kind.endswith("-del") and err == errno.ENOENT):
                continue
            raise TcError(f"{ifname or self.device}: {op.describe()} failed: {os.strerror(err)}"
                          + (f" ({text})" if text else ""))
        return warnings

    def ensure_redirect(self, ifb: str) -> bool:
        """Ingress qdisc + u32 match-all mirred-redirect filter to ``ifb`` on the device; True when changed."""
        if self.has_redirect(ifb):
            return False
        from socket import htons

        from pyroute2.netlink import NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE
        from pyroute2.netlink.rtnl import RTM_NEWQDISC, RTM_NEWTFILTER
        from pyroute2.netlink.rtnl.tcmsg.common_act import get_tca_action

        idx = self.index()
        msgs = []
        if not any(q["handle"] == INGRESS_HANDLE for q in self.ipr.get_qdiscs(idx)):
            msgs.append(self._msg(idx, RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, "ingress", INGRESS_HANDLE,
                                  TC_H_INGRESS, {"attrs": []}))
        action = get_tca_action({"action": {"kind": "mirred", "direction": "egress", "action": "redirect",
                                            "ifindex": self.index(ifb)}})
        fopts = {"attrs": [["TCA_U32_ACT", action], ["TCA_U32_SEL", {"keys": [(0, 0, 0)]}]]}
        msgs.append(self._msg(idx, RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_REPLACE, "u32",
                              0, INGRESS_HANDLE, fopts, htons(ETH_P_ALL) | (REDIRECT_PRIO << 16)))
        for _unused in self.ipr.nlm_request_batch(msgs):
            pass
        return True

    def remove_redirect(self) -> bool:
        """Delete our redirect filter; delete the ingress qdisc too when nothing else is left on it."""
        from socket import htons

        from pyroute2.netlink.rtnl import RTM_DELQDISC, RTM_DELTFILTER

        idx = self.index()
        if not any(q["handle"] == INGRESS_HANDLE for q in self.ipr.get_qdiscs(idx)):
            return False
        ours = [f for f in self.ipr.get_filters(idx, parent=INGRESS_HANDLE) if (f["info"] >> 16) == REDIRECT_PRIO]
        others = [f for f in self.ipr.get_filters(idx, parent=INGRESS_HANDLE) if (f["info"] >> 16) != REDIRECT_PRIO]
        msgs = []
        if ours:
            msgs.append(self._msg(idx, RTM_DELTFILTER, 0, None, 0, INGRESS_HANDLE, None,
                                  htons(ETH_P_ALL) | (REDIRECT_PRIO << 16)))
        if not others and ours:
            msgs.append(self._msg(idx, RTM_DELQDISC, 0, None, INGRESS_HANDLE, TC_H_INGRESS))
        for _unused in self.ipr.nlm_request_batch(msgs):
            pass
        return bool(msgs)


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
