"""The optimised batch arbitration (model.qos._Ledger behind request/arbitrate_all) makes exactly the decisions and
leaves exactly the final state of a straightforward reference written from the module docstring's rules: every
sum is recomputed from the grants, victims are found by sorting all grants. Pure; no timing here (bench/)."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.model import qos as q
from hypothesis import given, settings
from hypothesis import strategies as st


def _reclaim(grants: dict, pool: str, priority: int, need: int, exclude: str) -> tuple[list, int]:
    """Victims: strictly lower priority borrowers of the pool, priority ascending then last admitted first."""
    victims = sorted((g for vm, g in grants.items()
                      if vm != exclude and g.request.pool == pool and g.request.priority < priority
                      and g.granted_mbps > 0),
                     key=lambda g: (g.request.priority, -g.seq, g.request.vm))
    available = sum(g.granted_mbps for g in victims)
    if available < need:
        return [], available
    plan, left = [], need
    for g in victims:
        if left <= 0:
            break
        take = min(g.granted_mbps, left)
        plan.append(q.Preemption(g.request.vm, take))
        left -= take
    return plan, need


def _take(grants: dict, plan: list) -> None:
    for p in plan:
        g = grants[p.vm]
        grants[p.vm] = q.Grant(g.request, g.granted_mbps - p.lost_mbps, g.seq)


def reference_request(state: q.State, req: q.Request) -> tuple[q.State, q.Decision]:
    q.validate_request(req, state.pools)
    grants = dict(state.grants)
    prev = grants.get(req.vm)
    others = {vm: g for vm, g in grants.items() if vm != req.vm}
    node_sum = sum(g.request.guaranteed_mbps for g in others.values()) + req.guaranteed_mbps
    limit = state.node.guarantee_limit_mbps
    if node_sum > limit:
        return state, q.Decision(req.vm, q.DENIED, False, 0, (), (
            f"node: guarantees would total {node_sum} Mbit/s, above NIC {state.node.nic_mbps} Mbit/s x ratio "
            f"{state.node.ratio} = {limit} Mbit/s"))
    in_pool = [g for g in others.values() if g.request.pool == req.pool]
    pool_sum = sum(g.request.guaranteed_mbps for g in in_pool) + req.guaranteed_mbps
    cap = state.pools[req.pool].capacity_mbps
    if pool_sum > cap:
        return state, q.Decision(req.vm, q.DENIED, False, 0, (), (
            f"pool {req.pool}: guarantees would total {pool_sum} Mbit/s, above its capacity {cap} Mbit/s"))
    admitted = (f"guarantee {req.guaranteed_mbps} Mbit/s admitted (node {node_sum}/{limit}, "
                f"pool {req.pool} {pool_sum}/{cap})")
    overflow = sum(g.ceil_mbps for g in in_pool) + req.guaranteed_mbps - cap
    plan: list = []
    if overflow > 0:
        plan, got = _reclaim(grants, req.pool, req.priority, overflow, req.vm)
        if got < overflow:
            return state, q.Decision(req.vm, q.DENIED, False, 0, (), (
                f"pool {req.pool}: guarantee {req.guaranteed_mbps} Mbit/s needs {overflow} Mbit/s held by "
                f"borrowers of equal or higher priority (reclaimable: {got} Mbit/s)"))
    seq, next_seq = (prev.seq, state.next_seq) if prev else (state.next_seq, state.next_seq + 1)
    grants.pop(req.vm, None)
    _take(grants, plan)
    grants[req.vm] = q.Grant(req, 0, seq)
    want = req.ceil_mbps - req.guaranteed_mbps
    outcome = q.PREEMPTED if plan else q.GRANTED

    def done(decision: q.Decision) -> tuple[q.State, q.Decision]:
        return q.State(state.node, state.pools, grants, next_seq), decision

    if want == 0:
        return done(q.Decision(req.vm, outcome, True, 0, tuple(plan), admitted))
    free = cap - sum(g.ceil_mbps for g in grants.values() if g.request.pool == req.pool)
    if want <= free:
        grants[req.vm] = q.Grant(req, want, seq)
        return done(q.Decision(req.vm, outcome, True, want, tuple(plan), (
            f"{admitted}; borrow {want} Mbit/s from pool {req.pool} (free {free} Mbit/s before)")))
    need = want - free
    more, got = _reclaim(grants, req.pool, req.priority, need, req.vm)
    if got < need:
        return done(q.Decision(req.vm, q.PREEMPTED if plan else q.DENIED, True, 0, tuple(plan), (
            f"{admitted}; borrow {want} Mbit/s from pool {req.pool} denied: free {free} Mbit/s, reclaimable "
            f"from lower priority than {req.priority}: {got} Mbit/s, short by {need - got} Mbit/s")))
    _take(grants, more)
    grants[req.vm] = q.Grant(req, want, seq)
    total: dict[str, int] = {}
    for p in plan + more:
        total[p.vm] = total.get(p.vm, 0) + p.lost_mbps
    lost = ", ".join(f"{p.vm} -{p.lost_mbps}" for p in more)
    return done(q.Decision(req.vm, q.PREEMPTED, True, want, tuple(q.Preemption(v, m) for v, m in total.items()), (
        f"{admitted}; borrow {want} Mbit/s from pool {req.pool}: free {free} Mbit/s, reclaimed {need} Mbit/s "
        f"from lower priority ({lost})")))


POOLS = {"p": 120, "r": 90, "s": 40}

batch = st.lists(
    st.tuples(st.sampled_from([f"vm{i}" for i in range(12)]), st.integers(1, 60), st.integers(0, 90),
              st.integers(-2, 4), st.sampled_from(sorted(POOLS))),
    max_size=60,
)


def requests(ops: list) -> list[q.Request]:
    out = []
    for vm, g, extra, prio, pool in ops:
        g = min(g, POOLS[pool])
        out.append(q.Request(vm, g, min(POOLS[pool], g + extra), prio, pool))
    return out


@settings(max_examples=500, deadline=None)
@given(first=batch, second=batch, nic=st.integers(40, 400), ratio=st.sampled_from([0.5, 1.0, 1.5]))
def test_optimised_arbitration_equals_the_straightforward_reference(first, second, nic, ratio):
    start = q.State(q.NodeCapacity(nic, ratio), {n: q.Pool(n, c) for n, c in POOLS.items()})
    # Two batches: the second starts from a state with borrowers, so the ledger is built from existing grants.
    state = start
    for ops in (first, second):
        ref, ref_decisions = state, []
        for r in requests(ops):
            ref, d = reference_request(ref, r)
            ref_decisions.append(d)
        got, decisions = q.arbitrate_all(state, requests(ops))
        assert decisions == ref_decisions
        assert got == ref
        assert list(got.grants) == list(ref.grants)  # same order too
        assert q.check_invariants(got) == []
        state = got


def test_reference_is_not_trivially_equal_preemptions_happen():
    """Guard against a vacuous property: the strategy's kind of input does preempt and deny."""
    s = q.State(q.NodeCapacity(400), {n: q.Pool(n, c) for n, c in POOLS.items()})
    reqs = [q.Request("low", 10, 90, 0, "r"), q.Request("mid", 10, 60, 1, "r"), q.Request("hi", 30, 90, 4, "r")]
    _, decisions = q.arbitrate_all(s, reqs)
    _, ref2 = reference_request(reference_request(s, reqs[0])[0], reqs[1])
    assert [d.outcome for d in decisions] == ["granted", "preempted", "preempted"]
    assert decisions[1] == ref2


@pytest.mark.parametrize("bad", [q.Request("a", 0, 5, 0, "p"), q.Request("a", 5, 4, 0, "p"),
                                 q.Request("a", 5, 5, 0, "nope"), q.Request("a", 5, 500, 0, "p"),
                                 q.Request("a", 5, 5, 2_000_000, "p"), q.Request("a", True, 5, 0, "p")])
def test_optimised_path_raises_the_same_input_errors(bad):
    s = q.State(q.NodeCapacity(400), {n: q.Pool(n, c) for n, c in POOLS.items()})
    with pytest.raises(q.QoSInputError) as want:
        q.validate_request(bad, s.pools)
    with pytest.raises(q.QoSInputError, match=str(want.value).replace(".", r"\.").replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[")):
        q.arbitrate_all(s, [bad])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_batches_equal_the_reference(seed):
    """Hundreds of VMs per pool: long borrower lists per priority, so reclaims walk and shorten them (victims taken
    from the end, a re-requesting VM skipped in the middle), re-requests with a new priority or pool, a second batch
    from a state with borrowers. Same decisions, state and grant order as the reference."""
    import random

    rnd = random.Random(seed)
    pools = {"a": 3_000, "b": 2_000}
    start = q.State(q.NodeCapacity(4_500, 1.0), {n: q.Pool(n, c) for n, c in pools.items()})
    state = start
    for _batch in range(2):
        reqs = []
        for _ in range(300):
            vm = f"vm{rnd.randrange(400)}"
            pool = rnd.choice(sorted(pools))
            g = rnd.randint(1, 12)
            reqs.append(q.Request(vm, g, min(pools[pool], g + rnd.randint(0, 60)), rnd.randint(0, 4), pool))
        ref, ref_decisions = state, []
        for r in reqs:
            ref, d = reference_request(ref, r)
            ref_decisions.append(d)
        got, decisions = q.arbitrate_all(state, reqs)
        assert decisions == ref_decisions
        assert got == ref and list(got.grants) == list(ref.grants)
        assert q.check_invariants(got) == []
        state = got
    outcomes = {d.outcome for d in decisions}
    assert outcomes == {q.GRANTED, q.PREEMPTED, q.DENIED}  # not vacuous


def test_a_vm_raising_its_priority_never_preempts_itself():
    """x borrows at priority 0 and is the most recently admitted (first in victim order); re-requested at priority 1
    with a larger guarantee, the room for it is taken from a, not from x's own (released) borrow."""
    s = q.State(q.NodeCapacity(1000), {"p": q.Pool("p", 100)})
    s, _ = q.arbitrate_all(s, [q.Request("a", 10, 50, 0, "p"), q.Request("x", 10, 50, 0, "p")])
    assert s.grants["x"].granted_mbps == 40 and s.grants["a"].granted_mbps == 40
    again = q.Request("x", 60, 60, 1, "p")
    got, [decision] = q.arbitrate_all(s, [again])
    ref, ref_decision = reference_request(s, again)
    assert decision == ref_decision
    assert got == ref
    assert decision.outcome == q.PREEMPTED and decision.preemptions == (q.Preemption("a", 10),)
