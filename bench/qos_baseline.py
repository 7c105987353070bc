"""The arbitration ledger as it was before its optimisation (commit 66354e2), kept verbatim as the
same-run baseline of bench/qos_apply.py. Not used by the collection."""
# ruff: noqa
from __future__ import annotations

import bisect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / ".collections"))

from ansible_collections.zjusct.cloud.plugins.module_utils.model.qos import (  # noqa: E402
    DENIED, GRANTED, PREEMPTED, Decision, Grant, Preemption, Request, State, validate_request)


def _merge(a: list[Preemption], b: list[Preemption]) -> list[Preemption]:
    total: dict[str, int] = {}
    for p in a + b:
        total[p.vm] = total.get(p.vm, 0) + p.lost_mbps
    return [Preemption(vm, mbps) for vm, mbps in total.items()]


class _Ledger:
    """Mutable working copy of a State with running sums (one pass to build), so that one request costs O(pool)
    and a batch of n requests does not re-sum the whole node for every request. Private: callers use
    :func:`request`, :func:`release` and :func:`arbitrate_all`, which return immutable States."""

    def __init__(self, state: State) -> None:
        self.node = state.node
        self.limit = state.node.guarantee_limit_mbps
        self.pools = state.pools
        self.grants: dict[str, Grant] = dict(state.grants)
        self.next_seq = state.next_seq
        self.node_guaranteed = 0
        self.used = dict.fromkeys(state.pools, 0)
        self.pool_guaranteed = dict.fromkeys(state.pools, 0)
        self.members: dict[str, set[str]] = {p: set() for p in state.pools}
        # Borrowers per (pool, priority): seq-ascending lists of (seq, vm) (the victim order within a priority is
        # the reverse), with the sum of what they borrow, so a denial costs O(priorities) and a preemption
        # O(victims touched). Entries of VMs that no longer borrow are skipped lazily.
        self.borrowers: dict[str, dict[int, list[tuple[int, str]]]] = {p: {} for p in state.pools}
        self.borrowed: dict[str, dict[int, int]] = {p: {} for p in state.pools}
        self.listed: set[str] = set()
        for vm, g in self.grants.items():
            self._add(vm, g)

    def _add(self, vm: str, g: Grant) -> None:
        r = g.request
        self.node_guaranteed += r.guaranteed_mbps
        self.pool_guaranteed[r.pool] += r.guaranteed_mbps
        self.used[r.pool] += r.guaranteed_mbps + g.granted_mbps
        self.members[r.pool].add(vm)
        self._borrow_delta(vm, r, g.seq, g.granted_mbps)

    def _borrow_delta(self, vm: str, r: Request, seq: int, delta: int) -> None:
        if delta == 0:
            return
        by_prio = self.borrowed[r.pool]
        by_prio[r.priority] = by_prio.get(r.priority, 0) + delta
        if delta > 0 and vm not in self.listed:
            bisect.insort(self.borrowers[r.pool].setdefault(r.priority, []), (seq, vm))
            self.listed.add(vm)

    def _remove(self, vm: str) -> Grant:
        g = self.grants.pop(vm)
        r = g.request
        self.node_guaranteed -= r.guaranteed_mbps
        self.pool_guaranteed[r.pool] -= r.guaranteed_mbps
        self.used[r.pool] -= r.guaranteed_mbps + g.granted_mbps
        self.members[r.pool].discard(vm)
        self._borrow_delta(vm, r, g.seq, -g.granted_mbps)
        if vm in self.listed:
            lst = self.borrowers[r.pool][r.priority]
            lst.pop(bisect.bisect_left(lst, (g.seq, vm)))
            self.listed.discard(vm)
        return g

    def _set_granted(self, vm: str, granted: int) -> None:
        g = self.grants[vm]
        self.used[g.request.pool] += granted - g.granted_mbps
        self._borrow_delta(vm, g.request, g.seq, granted - g.granted_mbps)
        self.grants[vm] = Grant(g.request, granted, g.seq)
        if granted == 0 and vm in self.listed:
            lst = self.borrowers[g.request.pool][g.request.priority]
            lst.pop(bisect.bisect_left(lst, (g.seq, vm)))
            self.listed.discard(vm)

    def state(self) -> State:
        return State(self.node, self.pools, dict(self.grants), self.next_seq)

    def _reclaim_plan(self, pool: str, priority: int, need: int, exclude: str) -> tuple[list[Preemption], int]:
        """Plan taking ``need`` Mbit/s from borrowers of ``pool`` with priority < ``priority`` in victim order
        (priority ascending, seq descending); returns (plan, amount found <= need). Nothing is changed."""
        prios = sorted(p for p, total in self.borrowed[pool].items() if p < priority and total > 0)
        excluded = self.grants[exclude].granted_mbps if exclude in self.grants and \
            self.grants[exclude].request.priority < priority and self.grants[exclude].request.pool == pool else 0
        available = sum(self.borrowed[pool][p] for p in prios) - excluded
        if available < need:
            return [], max(available, 0)
        plan: list[Preemption] = []
        left = need
        for p in prios:
            for _seq, vm in reversed(self.borrowers[pool][p]):
                if left <= 0:
                    return plan, need
                g = self.grants.get(vm)
                if vm == exclude or g is None or g.granted_mbps <= 0:
                    continue
                take = min(g.granted_mbps, left)
                plan.append(Preemption(vm, take))
                left -= take
        return plan, need - left

    def request(self, req: Request) -> Decision:
        validate_request(req, self.pools)
        previous = self.grants.get(req.vm)
        prev_g = previous.request.guaranteed_mbps if previous else 0
        prev_same_pool = previous.request.guaranteed_mbps if previous and previous.request.pool == req.pool else 0
        node_sum = self.node_guaranteed - prev_g + req.guaranteed_mbps
        limit = self.limit
        if node_sum > limit:
            return Decision(req.vm, DENIED, False, 0, (), (
                f"node: guarantees would total {node_sum} Mbit/s, above NIC {self.node.nic_mbps} Mbit/s x ratio "
                f"{self.node.ratio} = {limit} Mbit/s"))
        pool_sum = self.pool_guaranteed[req.pool] - prev_same_pool + req.guaranteed_mbps
        cap = self.pools[req.pool].capacity_mbps
        if pool_sum > cap:
            return Decision(req.vm, DENIED, False, 0, (), (
                f"pool {req.pool}: guarantees would total {pool_sum} Mbit/s, above its capacity {cap} Mbit/s"))
        admitted = (f"guarantee {req.guaranteed_mbps} Mbit/s admitted (node {node_sum}/{limit}, "
                    f"pool {req.pool} {pool_sum}/{cap})")
        # Room for the guarantee next to current borrowers: reclaim from strictly lower priority only.
        own = (previous.ceil_mbps if previous and previous.request.pool == req.pool else 0)
        overflow = self.used[req.pool] - own + req.guaranteed_mbps - cap
        plan: list[Preemption] = []
        if overflow > 0:
            plan, got = self._reclaim_plan(req.pool, req.priority, overflow, req.vm)
            if got < overflow:
                return Decision(req.vm, DENIED, False, 0, (), (
                    f"pool {req.pool}: guarantee {req.guaranteed_mbps} Mbit/s needs {overflow} Mbit/s held by "
                    f"borrowers of equal or higher priority (reclaimable: {got} Mbit/s)"))
        # Commit the guarantee (and the reclaim it needed).
        if previous:
            self._remove(req.vm)
            seq = previous.seq
        else:
            seq = self.next_seq
            self.next_seq += 1
        for p in plan:
            self._set_granted(p.vm, self.grants[p.vm].granted_mbps - p.lost_mbps)
        g = Grant(req, 0, seq)
        self.grants[req.vm] = g
        self._add(req.vm, g)
        want = req.wanted_borrow_mbps
        if want == 0:
            return Decision(req.vm, PREEMPTED if plan else GRANTED, True, 0, tuple(plan), admitted)
        free = cap - self.used[req.pool]
        if want <= free:
            self._set_granted(req.vm, want)
            return Decision(req.vm, PREEMPTED if plan else GRANTED, True, want, tuple(plan), (
                f"{admitted}; borrow {want} Mbit/s from pool {req.pool} (free {free} Mbit/s before)"))
        need = want - free
        more, got = self._reclaim_plan(req.pool, req.priority, need, req.vm)
        if got < need:
            return Decision(req.vm, PREEMPTED if plan else DENIED, True, 0, tuple(plan), (
                f"{admitted}; borrow {want} Mbit/s from pool {req.pool} denied: free {free} Mbit/s, reclaimable "
                f"from lower priority than {req.priority}: {got} Mbit/s, short by {need - got} Mbit/s"))
        for p in more:
            self._set_granted(p.vm, self.grants[p.vm].granted_mbps - p.lost_mbps)
        self._set_granted(req.vm, want)
        merged = _merge(plan, more)
        lost = ", ".join(f"{p.vm} -{p.lost_mbps}" for p in more)
        return Decision(req.vm, PREEMPTED, True, want, tuple(merged), (
            f"{admitted}; borrow {want} Mbit/s from pool {req.pool}: free {free} Mbit/s, reclaimed {need} Mbit/s "
            f"from lower priority ({lost})"))



def arbitrate_all(state, requests):
    ledger = _Ledger(state)
    decisions = [ledger.request(r) for r in requests]
    return ledger.state(), decisions
