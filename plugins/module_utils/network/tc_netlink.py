# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel adapter of the HTB shaping trees: reads a device's managed tree and applies :mod:`network.tc`'s ops.

:mod:`network.tc` is the pure part (what we manage, the desired tree, the diff; no I/O); this module does the I/O:
rtnetlink requests encoded by hand (:func:`encode_op`, our few fixed message shapes; ``bench/tc_encode.py``
measures it against building the same messages with pyroute2's message classes, docs/benchmarks.md) and sent in
batches with extended acks (:class:`RtnlWriter`), dumps read through pyroute2 (:class:`NetlinkTc`), the IFB and
the ingress redirect of the ``ingress`` direction. Requires pyroute2 (>=0.9,<0.10) on the managed node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import threading
import types
from typing import Any, Callable, Iterable, Iterator, Sequence

from ansible_collections.zjusct.cloud.plugins.module_utils.network.tc import (
    DEFAULT_MINOR,
    ETH_P_ALL,
    FILTER_PRIO,
    IFB_ALIAS_PREFIX,
    INGRESS_HANDLE,
    MAJOR,
    REDIRECT_PRIO,
    ROOT_HANDLE,
    TC_H_INGRESS,
    TC_H_ROOT,
    U32_HTID,
    HtbClass,
    Op,
    TcError,
    Tree,
    U32Filter,
)

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


CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0  # linux/netlink.h
REQUEST_TIMEOUT = 5.0  # seconds a netlink request of an IPRoute may wait for its answer (BoundedIPRoute); the
# kernel answers in milliseconds, and a read retried once must stay well inside the host store's busy timeout


def netns_socket(netns: str, family: int, kind: int, proto: int) -> socket.socket:
    """A socket created inside the network namespace ``netns`` (a name under /run/netns, as ``ip netns add``
    makes), by a short-lived thread that enters it with setns(2): a socket stays in the namespace it was made in,
    and only that thread ever changes namespace (setns with CLONE_NEWNET acts on the calling thread alone).

    pyroute2's ``netns.create_socket`` forks a child process for this, next to the open IPRoute and its asyncio
    event loop; this needs no process.

    Raises:
        OSError: the namespace does not exist, setns or socket failed (errno kept).
    """
    import ctypes

    out: dict[str, Any] = {}

    def make() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(os.path.join("/run/netns", netns), "rb") as ns:
                if libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into network namespace {netns!r}: {os.strerror(err)}")
            out["sock"] = socket.socket(family, kind, proto)
        except BaseException as exc:  # handed to the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=make, name=f"netns-socket-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["sock"]


def open_iproute(pyroute2: Any, netns: str | None) -> Any:
    """A pyroute2 ``IPRoute`` on a NETLINK_ROUTE socket of ``netns`` (None: the host's namespace).

    The socket is made by :func:`netns_socket` and handed over with ``IPRoute(fileno=...)``, never through
    ``IPRoute(netns=...)``: pyroute2 (0.9) makes that socket in a forked child, which it gives 2 s to answer and
    SIGTERMs when the caller is interrupted; under load a child got SIGTERM while it ran, the module's own SIGTERM
    handler (inherited across fork) raised in it, and the child went on running the module's code beside its
    parent, on the same store connection (two runs of one cloudvm stop, the host store locked for minutes).

    Raises:
        OSError: the namespace does not exist, setns or socket failed.
    """
    if not netns:
        return pyroute2.IPRoute()
    fd = netns_socket(netns, socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE).detach()
    try:
        return pyroute2.IPRoute(fileno=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


class NoAnswer(TcError):
    """A netlink request's deadline passed (raised by the SIGALRM handler of :func:`_deadline`; BoundedIPRoute
    turns it into a TcError naming the request)."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`NoAnswer` in the block once ``seconds`` have passed (SIGALRM; in the main thread only: in any
    other thread, or with an alarm already set, the block runs unbounded)."""
    if threading.current_thread() is not threading.main_thread() or signal.getitimer(signal.ITIMER_REAL)[0]:
        yield
        return

    def expired(_signum: int, _frame: Any) -> None:
        raise NoAnswer()

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class BoundedIPRoute:
    """A pyroute2 IPRoute whose every request has a deadline (:data:`REQUEST_TIMEOUT`).

    pyroute2's synchronous API waits for a netlink answer without a timeout, and one request of a cloudvm stop (a
    ``link_lookup`` right after its tc tree was removed) was seen waiting for ever, inside the host store's write
    transaction. A read (``link_lookup``, ``get_links``, ``get_qdiscs``, ``get_classes``, ``get_filters``) that
    gets no answer in time is retried once on a newly opened IPRoute; a write (``link``, ``nlm_request_batch``) is
    not retried (it may have been carried out). ``open`` makes the IPRoute; ``where`` names its namespace in the
    errors.

    Raises:
        TcError: the namespace cannot be opened, or a request got no answer in time (naming it and the namespace).
    """

    READS = frozenset({"link_lookup", "get_links", "get_qdiscs", "get_classes", "get_filters"})
    WRITES = frozenset({"link", "nlm_request_batch"})

    def __init__(self, open_: Callable[[], Any], where: str) -> None:
        self._open, self.where = open_, where
        self._ipr = self._connect()

    def _connect(self) -> Any:
        try:
            return self._open()
        except Exception as e:
            raise TcError(f"netns: cannot open network namespace ({self.where}): {e}") from e

    def close(self) -> None:
        self._ipr.close()

    def __getattr__(self, name: str) -> Any:
        if name not in self.READS | self.WRITES:
            return getattr(self._ipr, name)

        def call(*argv: Any, **kwarg: Any) -> Any:
            for attempt in (1, 2):
                try:
                    with _deadline(REQUEST_TIMEOUT):
                        out = getattr(self._ipr, name)(*argv, **kwarg)
                        return list(out) if isinstance(out, types.GeneratorType) else out
                except NoAnswer:
                    with contextlib.suppress(Exception):
                        self._ipr.close()
                    self._ipr = self._connect()
                    if name in self.WRITES or attempt == 2:
                        raise TcError(f"netlink: {name} in {self.where} got no answer within {REQUEST_TIMEOUT:g} s"
                                      + (" (twice)" if attempt == 2 else "")) from None
            raise AssertionError("unreachable")

        return call


class RtnlWriter:
    """A raw NETLINK_ROUTE socket (inside ``netns`` when given) that sends many requests in one ``send`` and reads
    their acks, with extended acks on: kernel error and warning strings (e.g. HTB's "quantum of class ... is
    big") are returned, not lost."""

    SOL_NETLINK, NETLINK_CAP_ACK, NETLINK_EXT_ACK = 270, 10, 11
    NLMSG_ERROR, NLM_F_ACK_TLVS, NLMSGERR_ATTR_MSG = 2, 0x200, 1
    CHUNK = 256  # requests per send (about 100 bytes each)

    def __init__(self, netns: str | None) -> None:
        if netns:
            self.sock = netns_socket(netns, socket.AF_NETLINK, socket.SOCK_RAW, 0)
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
        self.ipr: Any = BoundedIPRoute(lambda: open_iproute(pyroute2, netns),
                                       f"netns {netns}" if netns else "the host's network namespace")
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
        derived IFB name is collision-free by construction (model.names.ifb_name); this check covers names given
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
