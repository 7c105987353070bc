"""The kernel adapter's netlink encoding (network.tc_netlink.encode_op): the bytes of one HTB class request."""

from __future__ import annotations

import struct

from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc as T
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc_netlink as N

TICK = 15.625


def tree(specs):
    return T.desired_tree(T.assign_minors(specs, T.Tree(), "egress"), mtu=1500, root_rate_mbps=1000,
                          default_rate_mbps=1, default_ceil_mbps=1000, direction="egress", tick_in_usec=TICK)


def test_encoded_class_message_carries_rate_ceil_burst_quantum():
    t = tree([T.ClassSpec("a", 10, 50, mac="02:00:00:00:00:01")])
    c = t.classes[0x10]
    raw = N.encode_op(T.Op("class-put", c), 7, 99)
    length, mtype, flags, seq, _ = struct.unpack_from("=IHHII", raw)
    assert (length, mtype, seq) == (len(raw), N.RTM_NEWTCLASS, 99)
    assert flags & N.NLM_F_ACK and flags & N.NLM_F_CREATE
    _, _, _, ifindex, handle, parent, _ = struct.unpack_from("=BBHiIII", raw, 16)
    assert (ifindex, handle, parent) == (7, 0x7A0010, 0x7A0001)
    # TCA_KIND "htb", then TCA_OPTIONS > TCA_HTB_PARMS (44 bytes: 2 ratespecs, buffer, cbuffer, quantum, level, prio)
    parms = raw.index(struct.pack("=HH", 48, N.TCA_HTB_PARMS)) + 4
    rate = struct.unpack_from("=I", raw, parms + 8)[0]
    ceil = struct.unpack_from("=I", raw, parms + 20)[0]
    buffer, cbuffer, quantum = struct.unpack_from("=III", raw, parms + 24)
    assert (rate, ceil, buffer, cbuffer, quantum) == (c.rate, c.ceil, c.buffer, c.cbuffer, c.quantum)
