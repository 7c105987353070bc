"""The pure HTB tree (network/tc.py): quantum/burst rules, u32 keys, minor assignment, diff order."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc as T

TICK = 15.625


def tree(specs, **kw):
    args = {"mtu": 1500, "root_rate_mbps": 1000, "default_rate_mbps": 1, "default_ceil_mbps": 1000,
            "direction": "egress", "tick_in_usec": TICK}
    args.update(kw)
    return T.desired_tree(T.assign_minors(specs, T.Tree(), args["direction"]), **args)


@pytest.mark.parametrize(("mbps", "quantum"), [(1, 12500), (10, 125000), (16, 200000), (10000, 200000)])
def test_case_N1_quantum_is_explicit_and_inside_the_range_htb_accepts_silently(mbps, quantum):
    assert T.quantum_bytes(mbps * T.MBIT_BYTES, 1500) == quantum
    assert 1000 <= T.quantum_bytes(mbps * T.MBIT_BYTES, 1500) <= 200000


def test_quantum_never_below_one_frame_even_for_tiny_rates():
    assert T.quantum_bytes(1000, 9000) == 9014


def test_every_class_of_a_tree_has_an_explicit_quantum_and_ten_ms_burst():
    t = tree([T.ClassSpec("a", 10, 50, mac="02:00:00:00:00:01")])
    for c in t.classes.values():
        assert c.quantum > 0
    a = t.classes[0x10]
    assert a.buffer == T.ticks(a.rate, a.rate // 100, TICK) and a.cbuffer == T.ticks(a.ceil, a.ceil // 100, TICK)


def test_mac_keys_match_destination_on_egress_and_source_on_ingress():
    s = T.ClassSpec("a", 1, 1, mac="02:7A:00:00:00:05")
    assert T.match_keys(s, "egress") == ((0x027A, 0xFFFF, -16), (0x00000005, 0xFFFFFFFF, -12))
    assert T.match_keys(s, "ingress") == ((0x027A0000, 0xFFFFFFFF, -8), (0x00050000, 0xFFFF0000, -4))


def test_ipv4_keys_require_ethertype_ip_and_use_dst_or_src_offset():
    s = T.ClassSpec("a", 1, 1, ipv4="10.0.0.2")
    assert T.match_keys(s, "egress") == ((0x0800, 0xFFFF, -4), (0x0A000002, 0xFFFFFFFF, 16))
    assert T.match_keys(s, "ingress")[1][2] == 12


def test_auto_minor_reuses_the_class_of_an_existing_filter_with_the_same_match():
    current = tree([T.ClassSpec("x", 1, 1, mac="02:00:00:00:00:01"), T.ClassSpec("y", 1, 1, mac="02:00:00:00:00:02")])
    # "x" removed, "y" kept: y must keep minor 0x11, the new VM takes the freed 0x10
    specs = T.assign_minors([T.ClassSpec("z", 1, 1, mac="02:00:00:00:00:03"),
                             T.ClassSpec("y", 1, 1, mac="02:00:00:00:00:02")], current, "egress")
    assert {s.name: s.minor for s in specs} == {"y": 0x11, "z": 0x10}


def test_diff_is_empty_for_equal_trees_and_orders_filters_before_class_deletion():
    a = tree([T.ClassSpec("x", 1, 5, mac="02:00:00:00:00:01"), T.ClassSpec("y", 2, 5, mac="02:00:00:00:00:02")])
    assert T.diff_trees(a, a) == []
    b = tree([T.ClassSpec("y", 2, 5, mac="02:00:00:00:00:02", minor=0x11)])
    kinds = [op.kind for op in T.diff_trees(a, b)]
    assert kinds == ["filter-del", "class-del"]
    assert [op.kind for op in T.diff_trees(a, T.Tree())] == ["qdisc-del"]


def test_foreign_root_qdisc_is_refused_not_replaced():
    with pytest.raises(T.TcError, match="not managed here"):
        T.diff_trees(T.Tree(foreign_root="fq_codel 1:"), tree([]))


def test_invalid_input_names_field_and_value():
    with pytest.raises(T.TcError, match=r"classes\[a\].match.mac: 'zz' is not a MAC"):
        tree([T.ClassSpec("a", 1, 1, mac="zz")])
    with pytest.raises(T.TcError, match=r"classes\[a\].ceil_mbps: 2000 is above root_rate_mbps 1000"):
        tree([T.ClassSpec("a", 1, 2000, ipv4="10.0.0.1")])
    with pytest.raises(T.TcError, match="same match as a"):
        tree([T.ClassSpec("a", 1, 1, ipv4="10.0.0.1"), T.ClassSpec("b", 1, 1, ipv4="10.0.0.1")])
    with pytest.raises(T.TcError, match=r"outside 7a:10\.\.7a:fff"):
        tree([T.ClassSpec("a", 1, 1, ipv4="10.0.0.1", minor=5)])


def test_classid_parsing():
    assert T.parse_classid("auto", "x") is None
    assert T.parse_classid("7a:1f", "x") == 0x1F
    assert T.parse_classid(17, "x") == 17
    with pytest.raises(T.TcError, match="managed major 7a"):
        T.parse_classid("1:10", "classes[0].classid")
