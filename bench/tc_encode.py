#!/usr/bin/env python3
"""Benchmark: encoding the netlink requests for 1,000 HTB classes (+ their u32 filters) with the hand-written
encoder (network.tc_netlink.encode_op) vs building the same requests with pyroute2's own message classes (tcmsg + the
HTB and u32 option classes, .encode()), in the same run, alternating which side runs first, best of --repeat.

Rule: the hand-written encoder stays only if it is at least 2x faster than pyroute2's message building
for 1,000 classes (same-run ratio); otherwise the adapter uses pyroute2's.

Both sides encode the same ops (the diff from an empty device to the desired tree: the root qdisc, the root and
default classes, one class and one filter per VM). With --verify (root) each side's requests are also sent to a
veth device in a throwaway network namespace and the device's tree read back must equal the desired tree, so the
pyroute2 side is a working alternative, not a strawman.

Run:  /var/cache/zjusct-cloud/venv/bin/python bench/tc_encode.py [--classes 1000] [--repeat 7] [--verify]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc as _tc  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc_netlink as _tc_netlink  # noqa: E402

IFINDEX = 2  # any index: encoding does not look at the device


def ops_for(n: int, tick_in_usec: float) -> tuple[_tc.Tree, list[_tc.Op]]:
    specs = [_tc.ClassSpec(f"vm{i}", 5 + i % 50, 55 + i % 90, mac=f"02:7a:00:00:{i >> 8:02x}:{i & 0xff:02x}",
                           minor=_tc.VM_MINOR_MIN + i) for i in range(n)]
    desired = _tc.desired_tree(specs, mtu=1500, root_rate_mbps=10000, default_rate_mbps=1,
                               default_ceil_mbps=10000, direction="egress", tick_in_usec=tick_in_usec)
    return desired, _tc.diff_trees(_tc.Tree(), desired)


def handwritten(ops: list[_tc.Op], ifindex: int, seq0: int = 1) -> list[bytes]:
    return [_tc_netlink.encode_op(op, ifindex, seq0 + i) for i, op in enumerate(ops)]


def pyroute2_message(op: _tc.Op, ifindex: int, seq: int) -> bytes:
    """The request for ``op`` built with pyroute2's message classes (same kernel semantics as encode_op)."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC, RTM_NEWTCLASS, RTM_NEWTFILTER

    tcmsg, _unused = _tc_netlink._msg_classes()  # tcmsg whose u32 selector takes raw (value, mask, offset) keys
    o = op.obj
    m = tcmsg()
    m["family"] = 0
    m["index"] = ifindex
    m["info"] = 0
    if op.kind == "qdisc-add":
        mtype, flags = RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL
        m["handle"], m["parent"] = _tc.ROOT_HANDLE, _tc.TC_H_ROOT
        glob = {"version": 3, "rate2quantum": 10, "defcls": o, "debug": 0, "direct_pkts": 0}
        m["attrs"] = [["TCA_KIND", "htb"], ["TCA_OPTIONS", {"attrs": [["TCA_HTB_INIT", glob]]}]]
    elif op.kind == "class-put":
        mtype, flags = RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_REPLACE
        m["handle"] = _tc.ROOT_HANDLE | o.minor
        m["parent"] = _tc.TC_H_ROOT if o.parent == 0 else _tc.ROOT_HANDLE | o.parent
        parms = {"rate": o.rate, "ceil": o.ceil, "buffer": o.buffer, "cbuffer": o.cbuffer, "quantum": o.quantum,
                 "prio": o.prio, "level": 0, "rate___reserved": 1, "ceil___reserved": 1}  # linklayer ethernet
        # as pyroute2's own sched_htb.get_class_parameters: PARMS plus the rate tables it computes
        m["attrs"] = [["TCA_KIND", "htb"], ["TCA_OPTIONS", {"attrs": [["TCA_HTB_PARMS", parms],
                                                                      ["TCA_HTB_RTAB", True],
                                                                      ["TCA_HTB_CTAB", True]]}]]
    elif op.kind == "filter-put":
        mtype, flags = RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_REPLACE
        m["handle"], m["parent"] = (_tc.U32_HTID << 20) | o.node, _tc.ROOT_HANDLE
        m["info"] = (_tc.FILTER_PRIO << 16) | socket.htons(_tc.ETH_P_ALL)
        m["attrs"] = [["TCA_KIND", "u32"], ["TCA_OPTIONS", {"attrs": [
            ["TCA_U32_CLASSID", _tc.ROOT_HANDLE | o.target], ["TCA_U32_SEL", {"keys": list(o.keys)}]]}]]
    else:
        raise ValueError(f"no pyroute2 builder for {op.kind} in this benchmark")
    m["header"]["type"] = mtype
    m["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | flags
    m["header"]["sequence_number"] = seq
    m.encode()
    return bytes(m.data)


def with_pyroute2(ops: list[_tc.Op], ifindex: int, seq0: int = 1) -> list[bytes]:
    return [pyroute2_message(op, ifindex, seq0 + i) for i, op in enumerate(ops)]


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


def verify(n: int) -> None:
    """Send each side's requests to a fresh veth device; the tree read back must be the desired tree."""
    if os.geteuid() != 0:
        raise SystemExit("--verify needs root (a network namespace)")
    ns = f"zqe{os.getpid() % 100000}"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        sh("ip", "-n", ns, "link", "set", "d0", "up")
        for name, build in (("hand-written", handwritten), ("pyroute2", with_pyroute2)):
            with _tc_netlink.NetlinkTc("d0", ns) as nl:
                desired, ops = ops_for(n, nl.tick_in_usec)
                idx = nl.index()
                writer = _tc_netlink.RtnlWriter(ns)
                try:
                    results = writer.send([(lambda seq, op=op, build=build, idx=idx: build([op], idx, seq)[0])
                                           for op in ops])
                finally:
                    writer.close()
                failed = [(op.describe(), err, text) for op, (err, text) in zip(ops, results, strict=True) if err]
                assert not failed, f"{name}: kernel refused {failed[:3]}"
                left = _tc.diff_trees(nl.read_tree(), desired)
                assert left == [], f"{name}: the device's tree differs from the desired one: {left[:3]}"
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "d0", "root")
            print(f"verify {name}: {len(ops)} requests accepted, tree read back equals the desired tree")
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7, help="runs per side (best is reported)")
    ap.add_argument("--verify", action="store_true", help="also apply both sides' requests to a device (root)")
    args = ap.parse_args()
    tick = _tc_netlink.read_tick_in_usec()
    _desired, ops = ops_for(args.classes, tick)
    assert len(handwritten(ops, IFINDEX)) == len(with_pyroute2(ops, IFINDEX))  # warm both (imports, caches)
    hand_s, pyr_s = [], []
    for k in range(args.repeat):
        for side in ((0, 1) if k % 2 == 0 else (1, 0)):
            if side == 0:
                hand_s.append(timed(lambda: handwritten(ops, IFINDEX)))
            else:
                pyr_s.append(timed(lambda: with_pyroute2(ops, IFINDEX)))
    hand, pyr = min(hand_s), min(pyr_s)
    ratio = pyr / hand
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"encode {len(ops)} requests ({args.classes} classes + filters): hand-written {hand * 1000:.1f} ms "
          f"(runs {min(hand_s) * 1000:.1f}-{max(hand_s) * 1000:.1f}), pyroute2 message classes {pyr * 1000:.1f} ms "
          f"(runs {min(pyr_s) * 1000:.1f}-{max(pyr_s) * 1000:.1f}); same-run ratio {ratio:.1f}x: "
          f"{'keep the hand-written encoder (>= 2x)' if ratio >= 2 else 'use pyroute2 (< 2x)'}")
    if args.verify:
        verify(args.classes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
