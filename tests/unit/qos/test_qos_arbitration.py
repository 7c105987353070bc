"""Arbitration of guarantees, borrows and preemptions (pure; plugins/module_utils/model/qos.py)."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model import qos as q
from hypothesis import given, settings
from hypothesis import strategies as st


def state(capacity=100, nic=1000, ratio=1.0, pools=None):
    pools = pools or {"p": capacity}
    return q.State(q.NodeCapacity(nic, ratio), {n: q.Pool(n, c) for n, c in pools.items()})


def run(st_, *reqs):
    out = []
    for r in reqs:
        st_, d = q.request(st_, r)
        out.append(d)
    return st_, out


def test_guarantee_only_is_granted_with_no_borrow():
    s, [d] = run(state(), q.Request("a", 10, 10, 0, "p"))
    assert (d.outcome, d.admitted, d.granted_mbps) == ("granted", True, 0)
    assert q.desired_rates(s) == [q.ClassRate("a", 10, 10)]


def test_borrow_from_free_pool_capacity_is_granted():
    s, [d] = run(state(), q.Request("a", 10, 50, 0, "p"))
    assert (d.outcome, d.granted_mbps) == ("granted", 40)
    assert q.desired_rates(s) == [q.ClassRate("a", 10, 50)]


def test_higher_priority_borrow_preempts_lower_priority_borrower_but_not_its_guarantee():
    s, [a, b] = run(state(), q.Request("low", 20, 80, 0, "p"), q.Request("high", 10, 60, 5, "p"))
    assert a.granted_mbps == 60
    assert b.outcome == "preempted"
    # free 20: 10 for the guarantee, then 50 borrowed needs 40 back from "low"
    assert b.preemptions == (q.Preemption("low", 40),)
    rates = {c.vm: c for c in q.desired_rates(s)}
    assert rates["low"] == q.ClassRate("low", 20, 40)
    assert rates["high"] == q.ClassRate("high", 10, 60)


def test_equal_priority_cannot_preempt_so_the_borrow_is_denied_but_the_guarantee_held():
    s, [_, d] = run(state(), q.Request("x", 20, 90, 1, "p"), q.Request("y", 10, 50, 1, "p"))
    assert (d.outcome, d.admitted, d.granted_mbps) == ("denied", True, 0)
    assert "short by" in d.reason
    assert {c.vm: c.ceil_mbps for c in q.desired_rates(s)} == {"x": 90, "y": 10}


def test_guarantee_above_pool_capacity_is_denied_and_state_unchanged():
    s0, _ = run(state(), q.Request("a", 60, 60, 0, "p"))
    s1, d = q.request(s0, q.Request("b", 50, 50, 0, "p"))
    assert (d.outcome, d.admitted) == ("denied", False)
    assert "pool p" in d.reason and "capacity 100" in d.reason
    assert s1 == s0


def test_guarantee_above_nic_times_ratio_is_denied_naming_the_node_check():
    s0 = state(pools={"p": 500, "r": 500}, nic=100, ratio=1.5)
    _s1, [a, b] = run(s0, q.Request("a", 100, 100, 0, "p"), q.Request("b", 60, 60, 0, "r"))
    assert a.admitted and not b.admitted
    assert "NIC 100 Mbit/s x ratio 1.5 = 150" in b.reason


def test_preemption_order_is_lowest_priority_then_last_admitted_first():
    s, ds = run(state(capacity=100),
                q.Request("p1-old", 5, 30, 1, "p"), q.Request("p1-new", 5, 30, 1, "p"),
                q.Request("p0", 5, 30, 0, "p"), q.Request("hi", 5, 25, 9, "p"))
    # 90 used before "hi"; hi needs 5 guaranteed + 20 borrow = 25, free 10 -> reclaim 15:
    # p0 first (25 borrowed), nothing from priority 1.
    assert ds[-1].preemptions == (q.Preemption("p0", 15),)
    _s2, d = q.request(s, q.Request("top", 5, 40, 10, "p"))
    # free 0; needs 40: p0 has 10 left, then p1-new (LIFO) 25, then p1-old 5.
    assert d.preemptions == (q.Preemption("p0", 10), q.Preemption("p1-new", 25), q.Preemption("p1-old", 5))


def test_release_refills_preempted_borrowers_in_priority_order():
    s, _ = run(state(), q.Request("low", 10, 90, 0, "p"), q.Request("high", 10, 90, 5, "p"))
    assert {c.vm: c.ceil_mbps for c in q.desired_rates(s)} == {"low": 10, "high": 90}
    s, decisions = q.release(s, "high")
    assert [(d.vm, d.granted_mbps) for d in decisions] == [("low", 80)]
    assert "refilled after high released" in decisions[0].reason


def test_invalid_request_names_field_value_and_range():
    with pytest.raises(q.QoSInputError, match=r"a.ceil_mbps: 5 is outside the allowed range 10\.\."):
        q.request(state(), q.Request("a", 10, 5, 0, "p"))
    with pytest.raises(q.QoSInputError, match="'nope' is not a configured pool"):
        q.request(state(), q.Request("a", 10, 10, 0, "nope"))
    with pytest.raises(q.QoSInputError, match="above the capacity 100 of pool p"):
        q.request(state(), q.Request("a", 10, 101, 0, "p"))


# ---- properties -------------------------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("req"), st.sampled_from("abcdefgh"), st.integers(1, 60), st.integers(0, 80),
                  st.integers(0, 3), st.sampled_from(["p", "r"])),
        st.tuples(st.just("rel"), st.sampled_from("abcdefgh")),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(ops=ops, nic=st.integers(50, 300), ratio=st.sampled_from([0.5, 1.0, 1.5, 2.0]))
def test_property_capacity_guarantees_and_priority(ops, nic, ratio):
    s = state(pools={"p": 120, "r": 90}, nic=nic, ratio=ratio)
    for op in ops:
        before = s
        if op[0] == "rel":
            s, decisions = q.release(s, op[1])
            assert all(d.outcome == "granted" for d in decisions)
        else:
            _, vm, g, extra, prio, pool = op
            cap = s.pools[pool].capacity_mbps
            g = min(g, cap)
            s, d = q.request(s, q.Request(vm, g, min(cap, g + extra), prio, pool))
            for p in d.preemptions:
                # higher priority is never preempted by lower (nor by equal)
                assert before.grants[p.vm].request.priority < prio
                assert p.lost_mbps > 0
            if not d.admitted:
                assert s == before or vm not in s.grants
        # sum of rates never exceeds capacity (node: guarantees; pools: ceilings)
        assert q.check_invariants(s) == []
        assert s.node_guaranteed_mbps() <= s.node.guarantee_limit_mbps
        for name, pool in s.pools.items():
            assert s.pool_used_mbps(name) <= pool.capacity_mbps
        # nobody below its guarantee: rate = guaranteed and ceil >= rate for every admitted VM
        for c in q.desired_rates(s):
            assert c.ceil_mbps >= c.rate_mbps == s.grants[c.vm].request.guaranteed_mbps


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_property_arbitration_is_deterministic(ops):
    def play():
        s = state(pools={"p": 120, "r": 90}, nic=200)
        out = []
        for op in ops:
            if op[0] == "rel":
                s, ds = q.release(s, op[1])
                out.extend(ds)
            else:
                _, vm, g, extra, prio, pool = op
                g = min(g, s.pools[pool].capacity_mbps)
                s, d = q.request(s, q.Request(vm, g, min(s.pools[pool].capacity_mbps, g + extra), prio, pool))
                out.append(d)
        return s, out
    assert play() == play()


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_property_batch_arbitration_equals_one_request_at_a_time(ops):
    reqs = []
    for op in ops:
        if op[0] == "req":
            _, vm, g, extra, prio, pool = op
            cap = {"p": 120, "r": 90}[pool]
            reqs.append(q.Request(vm, min(g, cap), min(cap, min(g, cap) + extra), prio, pool))
    s = state(pools={"p": 120, "r": 90}, nic=200)
    one = s
    singles = []
    for r in reqs:
        one, d = q.request(one, r)
        singles.append(d)
    batch, decisions = q.arbitrate_all(s, reqs)
    assert decisions == singles
    assert batch == one
