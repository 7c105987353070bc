# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bandwidth arbitration: guarantee, borrow and preemption over shared pools (pure, no I/O).

The model (docs/qos.md "The model", absorbed from KVMCloud's guarantee/borrow/preempt semantics):

* Every VM has a **guaranteed** rate (Mbit/s). A guarantee is admitted only if both hold after adding it:
  ``sum(guaranteed on the node) <= floor(NIC Mbit/s x bandwidth ratio)`` and
  ``sum(guaranteed in the VM's pool) <= pool capacity``.
* A VM may **borrow** up to ``ceil - guaranteed`` from its pool's free capacity, where
  ``free = capacity - sum(guaranteed + granted)`` over the pool's VMs. So the sum of the ceilings of one pool never
  exceeds the pool capacity.
* A borrow that does not fit in the free capacity **preempts** borrowed (never guaranteed) bandwidth from VMs of
  strictly lower priority. A borrow is all or nothing: either it is served completely (``granted`` from free
  capacity, or ``preempted`` when others had to give some back) or nothing changes (``denied``, the VM keeps
  its guarantee and its previous grant).
* When a VM is released, the freed capacity **refills** VMs of the same pool whose grant is below what they
  asked for (partial refills are allowed).

Deterministic tie-breaks (documented promise, tested):

* Preemption victims are taken in the order (priority ascending, admission sequence descending, vm id
  ascending): the lowest priority first, among equals the most recently admitted first (last in, first out);
  each victim loses only what is still needed.
* Refills are served in the order (priority descending, admission sequence ascending, vm id ascending).

Units: every rate is an integer in Mbit/s (10^6 bit/s). Priority: a larger integer is a higher priority.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable, Mapping

from ansible_collections.zjusct.cloud.plugins.module_utils.common.errors import CloudError

GRANTED = "granted"
PREEMPTED = "preempted"
DENIED = "denied"
OUTCOMES = (GRANTED, PREEMPTED, DENIED)

#: Largest rate accepted anywhere (Mbit/s): 4 Tbit/s, far above any NIC, keeps integer maths small.
MAX_MBPS = 4_000_000


@dataclass(frozen=True)
class Pool:
    """A shared bandwidth pool: ``capacity_mbps`` bounds the sum of ceilings of its VMs."""

    name: str
    capacity_mbps: int


@dataclass(frozen=True)
class NodeCapacity:
    """The node's NIC rate (Mbit/s) and the bandwidth overcommit ratio for guarantees."""

    nic_mbps: int
    ratio: float = 1.0

    @property
    def guarantee_limit_mbps(self) -> int:
        """floor(nic_mbps x ratio), computed exactly (ratio taken as its decimal text, 1.1 is 11/10)."""
        return math.floor(Fraction(str(self.ratio)) * self.nic_mbps)


@dataclass(frozen=True)
class Request:
    """A VM's bandwidth request: guaranteed rate, requested ceiling, priority and pool."""

    vm: str
    guaranteed_mbps: int
    ceil_mbps: int
    priority: int = 0
    pool: str = "default"

    @property
    def wanted_borrow_mbps(self) -> int:
        return self.ceil_mbps - self.guaranteed_mbps


@dataclass(frozen=True)
class Grant:
    """An admitted VM: its request, what it currently borrows, and its admission sequence number."""

    request: Request
    granted_mbps: int = 0
    seq: int = 0

    @property
    def rate_mbps(self) -> int:
        return self.request.guaranteed_mbps

    @property
    def ceil_mbps(self) -> int:
        return self.request.guaranteed_mbps + self.granted_mbps


@dataclass(frozen=True)
class Preemption:
    """A VM that gave back ``lost_mbps`` of borrowed bandwidth to a higher-priority request."""

    vm: str
    lost_mbps: int


@dataclass(frozen=True)
class Decision:
    """The outcome of one arbitration.

    Attributes:
        vm: the VM the decision is about.
        outcome: ``granted``, ``preempted`` or ``denied``.
        admitted: whether the VM's guarantee is held after the decision (a denied borrow keeps it).
        granted_mbps: the VM's borrowed bandwidth after the decision (Mbit/s, on top of the guarantee).
        preemptions: who lost how much (only for ``preempted``).
        reason: a human sentence naming the rule that decided.
    """

    vm: str
    outcome: str
    admitted: bool
    granted_mbps: int
    preemptions: tuple[Preemption, ...] = ()
    reason: str = ""

    def as_dict(self) -> dict:
        return {
            "vm": self.vm,
            "outcome": self.outcome,
            "admitted": self.admitted,
            "granted_mbps": self.granted_mbps,
            "preemptions": [{"vm": p.vm, "lost_mbps": p.lost_mbps} for p in self.preemptions],
            "reason": self.reason,
        }


@dataclass(frozen=True)
class State:
    """Everything arbitration needs: the node, its pools and the admitted VMs (by vm id)."""

    node: NodeCapacity
    pools: Mapping[str, Pool]
    grants: Mapping[str, Grant] = field(default_factory=dict)
    next_seq: int = 1

    def pool_used_mbps(self, pool: str) -> int:
        """Sum of ceilings (guaranteed + granted) of the pool's VMs."""
        return sum(g.ceil_mbps for g in self.grants.values() if g.request.pool == pool)

    def node_guaranteed_mbps(self) -> int:
        return sum(g.rate_mbps for g in self.grants.values())

    def pool_free_mbps(self, pool: str) -> int:
        return self.pools[pool].capacity_mbps - self.pool_used_mbps(pool)


class QoSInputError(CloudError, ValueError):
    """Invalid input: the message names the field, the value and the allowed range."""


def _check_int(name: str, value: object, low: int, high: int = MAX_MBPS) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise QoSInputError(f"{name}: {value!r} is not an integer")
    if value < low or value > high:
        raise QoSInputError(f"{name}: {value} is outside the allowed range {low}..{high}")


def validate_node(node: NodeCapacity) -> None:
    """Raise QoSInputError unless nic_mbps is 1..MAX_MBPS and ratio is in (0, 100]."""
    _check_int("node.nic_mbps", node.nic_mbps, 1)
    if not isinstance(node.ratio, (int, float)) or not 0 < node.ratio <= 100:
        raise QoSInputError(f"node.ratio: {node.ratio!r} is outside the allowed range (0, 100]")


def validate_pool(pool: Pool) -> None:
    """Raise QoSInputError unless the pool has a name and a capacity of 1..MAX_MBPS Mbit/s."""
    if not pool.name:
        raise QoSInputError("pool.name: empty name")
    _check_int(f"pools[{pool.name}].capacity_mbps", pool.capacity_mbps, 1)


def validate_request(req: Request, pools: Mapping[str, Pool]) -> None:
    """Raise QoSInputError unless 1 <= guaranteed <= ceil <= pool capacity and the pool exists."""
    if not req.vm:
        raise QoSInputError("vm: empty vm id")
    _check_int(f"{req.vm}.guaranteed_mbps", req.guaranteed_mbps, 1)
    _check_int(f"{req.vm}.ceil_mbps", req.ceil_mbps, req.guaranteed_mbps)
    _check_int(f"{req.vm}.priority", req.priority, -1_000_000, 1_000_000)
    if req.pool not in pools:
        known = ", ".join(sorted(pools)) or "none"
        raise QoSInputError(f"{req.vm}.pool: {req.pool!r} is not a configured pool (known: {known})")
    cap = pools[req.pool].capacity_mbps
    if req.ceil_mbps > cap:
        raise QoSInputError(f"{req.vm}.ceil_mbps: {req.ceil_mbps} is above the capacity {cap} of pool {req.pool}")


def _refill_order(g: Grant) -> tuple[int, int, str]:
    return (-g.request.priority, g.seq, g.request.vm)


_new = object.__new__


def _frozen(cls: Any, **fields: Any) -> Any:
    """An instance of the frozen dataclass ``cls`` with ``fields`` (all of them), without the per-field
    ``object.__setattr__`` calls of its ``__init__``: same fields, same equality and hash. The batch paths build one
    Request, Grant, Decision and ClassRate per VM (docs/benchmarks.md); values are not validated here."""
    obj = _new(cls)
    obj.__dict__.update(fields)
    return obj


def _grant(request: Request, granted_mbps: int, seq: int) -> Grant:
    """Grant(request, granted_mbps, seq) built by :func:`_frozen`."""
    return _frozen(Grant, request=request, granted_mbps=granted_mbps, seq=seq)


def _request(vm: str, guaranteed_mbps: int, ceil_mbps: int, priority: int, pool: str) -> Request:
    """Request(...) built by :func:`_frozen`."""
    return _frozen(Request, vm=vm, guaranteed_mbps=guaranteed_mbps, ceil_mbps=ceil_mbps, priority=priority,
                   pool=pool)


def grants_from_rows(rows: Iterable[tuple[str, str, int, int, int, int, int]]) -> dict[str, Grant]:
    """The admitted VMs from stored rows ``(vm, pool, guaranteed_mbps, ceil_mbps, priority, granted_mbps, seq)``
    (all Mbit/s integers; the host store's ``qos_grants`` columns): vm id -> Grant, in row order.

    Same Requests and Grants as their constructors give (equal, same hash), built without the frozen dataclass'
    per-field ``object.__setattr__``: loading a node's 10,000 grants is part of every VM start on it
    (docs/benchmarks.md). Values are not validated here (the store wrote them from validated requests;
    :func:`check_invariants` checks a loaded State). Raises ValueError/TypeError when a number is not an int."""
    out: dict[str, Grant] = {}
    for vm, pool, guaranteed, ceil, priority, granted, seq in rows:
        out[vm] = _grant(_request(vm, int(guaranteed), int(ceil), int(priority), pool), int(granted), int(seq))
    return out


def _preemptions(losses: list[tuple[str, int]]) -> tuple[Preemption, ...]:
    """Preemption(vm, lost_mbps) per ``(vm, lost Mbit/s)`` pair, in order, built like :func:`_frozen` does."""
    if not losses:
        return ()
    out = []
    for vm, lost_mbps in losses:
        p = _new(Preemption)
        p.__dict__.update(vm=vm, lost_mbps=lost_mbps)
        out.append(p)
    return tuple(out)


def _decision(vm: str, outcome: str, admitted: bool, granted_mbps: int, preemptions: tuple[Preemption, ...],
              reason: str) -> Decision:
    """Decision(...) built like :func:`_frozen` does (one per request: without the keyword-argument round trip)."""
    d = _new(Decision)
    d.__dict__.update(vm=vm, outcome=outcome, admitted=admitted, granted_mbps=granted_mbps, preemptions=preemptions,
                      reason=reason)
    return d


def _merge(a: list[tuple[str, int]], b: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Losses ``(vm, Mbit/s)``: a then b, with the losses of a VM in both summed (at its place in a)."""
    total: dict[str, int] = {}
    for vm, mbps in a + b:
        total[vm] = total.get(vm, 0) + mbps
    return list(total.items())


class _Ledger:
    """Mutable working copy of a State with running sums (one pass to build), so that one request costs O(pool)
    and a batch of n requests does not re-sum the whole node for every request. Private: callers use
    :func:`request`, :func:`release` and :func:`arbitrate_all`, which return immutable States.

    Per VM it keeps three plain dicts (request, granted Mbit/s, admission seq) in the State's grant order instead
    of one frozen Grant per change; Grants are built once, in :meth:`state` (unchanged ones are reused).

    Borrowers are indexed per pool and priority, so that a denial costs O(priorities) and a reclaim O(victims
    touched): ``borrowed[pool][prio]`` is the sum of what they borrow (Mbit/s), ``prio_keys[pool]`` the sorted
    priorities seen in the pool (kept when their sum drops to 0), ``borrowers[pool][prio]`` the ``(seq, vm)`` of the
    VMs whose granted > 0, seq ascending (the victim order within a priority is the reverse). A VM is listed
    exactly when its granted is > 0."""

    def __init__(self, state: State) -> None:
        self.node = state.node
        self.limit = state.node.guarantee_limit_mbps
        self.pools = state.pools
        self.caps = {name: p.capacity_mbps for name, p in state.pools.items()}
        self.orig = state.grants
        self.reqs: dict[str, Request] = {}
        self.granted: dict[str, int] = {}
        self.seqs: dict[str, int] = {}
        self.next_seq = state.next_seq
        self.used = dict.fromkeys(state.pools, 0)
        self.pool_guaranteed = dict.fromkeys(state.pools, 0)
        self.borrowers: dict[str, dict[int, list[tuple[int, str]]]] = {p: {} for p in state.pools}
        self.borrowed: dict[str, dict[int, int]] = {p: {} for p in state.pools}
        self.prio_keys: dict[str, list[int]] = {p: [] for p in state.pools}
        # One inlined loop: request() on a node of n VMs builds this working copy, so it is the O(n) part of every
        # VM start.
        reqs, granted_of, seqs, used, pool_guaranteed = self.reqs, self.granted, self.seqs, self.used, \
            self.pool_guaranteed
        node_guaranteed = 0
        borrowing = []
        for vm, g in state.grants.items():
            r = g.request
            granted = g.granted_mbps
            reqs[vm] = r
            granted_of[vm] = granted
            seqs[vm] = g.seq
            gm = r.guaranteed_mbps
            node_guaranteed += gm
            pool_guaranteed[r.pool] += gm
            used[r.pool] += gm + granted
            if granted:
                borrowing.append((vm, r, g.seq, granted))
        self.node_guaranteed = node_guaranteed
        for vm, r, seq, granted in borrowing:
            self._borrow(r.pool, r.priority, granted)
            if granted > 0:
                self._list(r.pool, r.priority, (seq, vm))

    def _borrow(self, pool: str, prio: int, delta: int) -> None:
        """Add ``delta`` Mbit/s to what ``pool``'s VMs of priority ``prio`` borrow."""
        by_prio = self.borrowed[pool]
        total = by_prio.get(prio)
        if total is None:
            bisect.insort(self.prio_keys[pool], prio)
            total = 0
        by_prio[prio] = total + delta

    def _lend(self, vm: str, pool: str, prio: int, seq: int, mbps: int) -> None:
        """``vm`` (admitted, granted 0) now borrows ``mbps`` > 0 from ``pool``."""
        self.granted[vm] = mbps
        self.used[pool] += mbps
        self._borrow(pool, prio, mbps)
        self._list(pool, prio, (seq, vm))

    def _list(self, pool: str, prio: int, entry: tuple[int, str]) -> None:
        """Add ``(seq, vm)`` to the borrowers of ``pool`` and ``prio``, keeping them sorted. A new VM's seq is the
        largest so far, so the entry usually goes last (one comparison instead of a bisection)."""
        lst = self.borrowers[pool].get(prio)
        if lst is None:
            self.borrowers[pool][prio] = [entry]
        elif not lst or lst[-1] < entry:
            lst.append(entry)
        else:
            bisect.insort(lst, entry)

    def _remove(self, vm: str) -> None:
        r = self.reqs.pop(vm)
        granted = self.granted.pop(vm)
        seq = self.seqs.pop(vm)
        self.node_guaranteed -= r.guaranteed_mbps
        self.pool_guaranteed[r.pool] -= r.guaranteed_mbps
        self.used[r.pool] -= r.guaranteed_mbps + granted
        if granted:
            self._borrow(r.pool, r.priority, -granted)
        if granted > 0:
            lst = self.borrowers[r.pool][r.priority]
            del lst[bisect.bisect_left(lst, (seq, vm))]

    def state(self) -> State:
        """The immutable State of the ledger: unchanged Grants of the original State reused, the others built like
        :func:`_grant` does (inlined: one per admitted VM of a batch)."""
        grants: dict[str, Grant] = {}
        orig = self.orig
        granted = self.granted
        seqs = self.seqs
        for vm, r in self.reqs.items():
            o = orig.get(vm)
            g = granted[vm]
            seq = seqs[vm]
            if o is not None and o.request is r and o.granted_mbps == g and o.seq == seq:
                grants[vm] = o
            else:
                grants[vm] = o = _new(Grant)
                o.__dict__.update(request=r, granted_mbps=g, seq=seq)
        return State(self.node, self.pools, grants, self.next_seq)

    def _reclaim(self, pool: str, priority: int, need: int, exclude: str) -> tuple[list[tuple[str, int]], int]:
        """Take ``need`` Mbit/s from what borrowers of ``pool`` with priority < ``priority`` borrow (never from
        ``exclude``), in victim order: priority ascending, admission seq descending, each victim losing only what is
        still needed. All or nothing: returns ``([(vm, lost Mbit/s), ...] in victim order, need)`` when taken, else
        ``([], found)`` with found < need and nothing changed."""
        borrowed = self.borrowed[pool]
        prios = []
        available = 0
        for p in self.prio_keys[pool]:
            if p >= priority:
                break
            total = borrowed[p]
            if total > 0:
                prios.append(p)
                available += total
        ex = self.reqs.get(exclude)
        if ex is not None and ex.priority < priority and ex.pool == pool:
            available -= self.granted[exclude]
        if available < need:
            return [], max(available, 0)
        # Plan first (victims and where they are listed), change only if the plan covers ``need``.
        granted = self.granted
        borrowers = self.borrowers[pool]
        plan: list[tuple[str, int]] = []
        where: list[tuple[int, int]] = []
        left = need
        for p in prios:
            lst = borrowers[p]
            i = len(lst)
            while i:
                i -= 1
                vm = lst[i][1]
                if vm == exclude:
                    continue
                g = granted[vm]  # > 0: listed
                take = g if g < left else left
                plan.append((vm, take))
                where.append((p, i))
                left -= take
                if not left:
                    break
            if not left:
                break
        if left:
            return [], need - left
        # Apply: indices were collected in descending order per priority, so a deletion never moves one still to
        # be visited.
        for (vm, take), (p, i) in zip(plan, where):
            g = granted[vm] - take
            granted[vm] = g
            borrowed[p] -= take
            if not g:
                del borrowers[p][i]
        self.used[pool] -= need
        return plan, need

    def request(self, req: Request) -> Decision:
        """Decide ``req`` against the ledger and apply it (see :func:`request` for the outcomes; the rules and
        tie-breaks are the module docstring's). Rates in Mbit/s. Raises QoSInputError for an invalid request."""
        vm = req.vm
        pool = req.pool
        g_req = req.guaranteed_mbps
        ceil = req.ceil_mbps
        prio = req.priority
        cap = self.caps.get(pool, 0)
        # The common valid case in one expression (exact int: bool and subclasses take the slow path); anything
        # else gets validate_request's precise error.
        if not (g_req.__class__ is int and ceil.__class__ is int and prio.__class__ is int and vm
                and 1 <= g_req <= ceil <= cap and ceil <= MAX_MBPS and -1_000_000 <= prio <= 1_000_000):
            validate_request(req, self.pools)
            cap = self.caps[pool]
        granted = self.granted
        prev_r = self.reqs.get(vm)
        if prev_r is None:
            prev_g = prev_same_pool = own = 0
        else:
            prev_g = prev_r.guaranteed_mbps
            if prev_r.pool == pool:
                prev_same_pool = prev_g
                own = prev_g + granted[vm]
            else:
                prev_same_pool = own = 0
        node_sum = self.node_guaranteed - prev_g + g_req
        limit = self.limit
        if node_sum > limit:
            return _decision(vm, DENIED, False, 0, (), (
                f"node: guarantees would total {node_sum} Mbit/s, above NIC {self.node.nic_mbps} Mbit/s x ratio "
                f"{self.node.ratio} = {limit} Mbit/s"))
        pool_sum = self.pool_guaranteed[pool] - prev_same_pool + g_req
        if pool_sum > cap:
            return _decision(vm, DENIED, False, 0, (), (
                f"pool {pool}: guarantees would total {pool_sum} Mbit/s, above its capacity {cap} Mbit/s"))
        # Room for the guarantee next to current borrowers: reclaim from strictly lower priority only.
        used = self.used
        overflow = used[pool] - own + g_req - cap
        first: list[tuple[str, int]] = []
        if overflow > 0:
            first, got = self._reclaim(pool, prio, overflow, vm)
            if got < overflow:
                return _decision(vm, DENIED, False, 0, (), (
                    f"pool {pool}: guarantee {g_req} Mbit/s needs {overflow} Mbit/s held by "
                    f"borrowers of equal or higher priority (reclaimable: {got} Mbit/s)"))
        admitted = (f"guarantee {g_req} Mbit/s admitted (node {node_sum}/{limit}, "
                    f"pool {pool} {pool_sum}/{cap})")
        # Commit the guarantee (the reclaim it needed is done): vm holds g_req and borrows 0.
        if prev_r is None:
            seq = self.next_seq
            self.next_seq = seq + 1
        else:
            seq = self.seqs[vm]
            self._remove(vm)
        self.reqs[vm] = req
        granted[vm] = 0
        self.seqs[vm] = seq
        self.node_guaranteed = node_sum
        self.pool_guaranteed[pool] = pool_sum
        in_use = used[pool] + g_req
        used[pool] = in_use
        want = ceil - g_req
        if want == 0:
            return _decision(vm, PREEMPTED if first else GRANTED, True, 0, _preemptions(first), admitted)
        free = cap - in_use
        if want <= free:
            self._lend(vm, pool, prio, seq, want)
            return _decision(vm, PREEMPTED if first else GRANTED, True, want, _preemptions(first), (
                f"{admitted}; borrow {want} Mbit/s from pool {pool} (free {free} Mbit/s before)"))
        need = want - free
        more, got = self._reclaim(pool, prio, need, vm)
        if got < need:
            return _decision(vm, PREEMPTED if first else DENIED, True, 0, _preemptions(first), (
                f"{admitted}; borrow {want} Mbit/s from pool {pool} denied: free {free} Mbit/s, reclaimable "
                f"from lower priority than {prio}: {got} Mbit/s, short by {need - got} Mbit/s"))
        self._lend(vm, pool, prio, seq, want)
        lost = ", ".join(f"{v} -{mbps}" for v, mbps in more)
        return _decision(vm, PREEMPTED, True, want, _preemptions(_merge(first, more) if first else more), (
            f"{admitted}; borrow {want} Mbit/s from pool {pool}: free {free} Mbit/s, reclaimed {need} Mbit/s "
            f"from lower priority ({lost})"))


def request(state: State, req: Request) -> tuple[State, Decision]:
    """Admit ``req``'s guarantee, then borrow up to its ceiling; return the new state and one Decision.

    A VM that is already admitted is re-arbitrated with its new request (its admission sequence is kept).
    Outcomes: ``denied`` with admitted False (guarantee does not fit: the state is unchanged); ``granted``
    (guarantee held, borrow fully served or nothing to borrow); ``preempted`` (bandwidth reclaimed from lower
    priority, listed in ``preemptions``); ``denied`` with admitted True (guarantee held, borrow refused,
    granted_mbps 0).

    The guarantee must also fit next to what other VMs of the pool currently borrow: borrowed bandwidth of
    strictly lower priority is reclaimed for it; if that is not enough the request is denied (so a higher
    priority is never preempted by a lower one, not even for a guarantee).

    Cost: O(VMs on the node) to build the working copy, plus O(pool) when reclaiming.
    """
    ledger = _Ledger(state)
    decision = ledger.request(req)
    if not decision.admitted:
        return state, decision
    return ledger.state(), decision


def arbitrate_all(state: State, requests: Iterable[Request]) -> tuple[State, list[Decision]]:
    """Arbitrate ``requests`` one after another (same result as calling :func:`request` in a loop), in
    O(n) plus the reclaims: used to rebuild a whole node's state and by the ``tc_qos`` requests form."""
    ledger = _Ledger(state)
    decisions = [ledger.request(r) for r in requests]
    return ledger.state(), decisions


def release(state: State, vm: str) -> tuple[State, list[Decision]]:
    """Remove ``vm`` (no-op if unknown) and refill the pool's VMs that hold less than they asked for.

    Returns the new state and one ``granted`` Decision per refilled VM (reason names the released VM).
    """
    if vm not in state.grants:
        return state, []
    pool = state.grants[vm].request.pool
    grants = dict(state.grants)
    del grants[vm]
    return refill(dataclasses.replace(state, grants=grants), pool, reason=f"refilled after {vm} released")


def refill(state: State, pool: str, reason: str = "refilled") -> tuple[State, list[Decision]]:
    """Hand free capacity of ``pool`` to its VMs below their requested ceiling, in refill order (priority
    descending, admission ascending, vm id); partial refills allowed. One ``granted`` Decision per refilled VM."""
    free = state.pool_free_mbps(pool)
    decisions: list[Decision] = []
    grants = dict(state.grants)
    for g in sorted((g for g in grants.values() if g.request.pool == pool), key=_refill_order):
        if free <= 0:
            break
        deficit = g.request.wanted_borrow_mbps - g.granted_mbps
        if deficit <= 0:
            continue
        give = min(deficit, free)
        free -= give
        grants[g.request.vm] = dataclasses.replace(g, granted_mbps=g.granted_mbps + give)
        decisions.append(Decision(g.request.vm, GRANTED, True, g.granted_mbps + give, (),
                                  f"{reason}: +{give} Mbit/s from pool {pool}"))
    return dataclasses.replace(state, grants=grants), decisions


@dataclass(frozen=True)
class ClassRate:
    """The HTB rates of one VM: rate = guaranteed, ceil = guaranteed + granted (Mbit/s)."""

    vm: str
    rate_mbps: int
    ceil_mbps: int


def desired_rates(state: State, vms: Iterable[str] | None = None) -> list[ClassRate]:
    """The class rates of the given admitted VMs (all when ``vms`` is None), sorted by vm id."""
    grants = state.grants
    wanted = sorted(grants) if vms is None else sorted(set(vms) & set(grants))
    out = []
    for vm in wanted:
        r = grants[vm].request
        out.append(_frozen(ClassRate, vm=vm, rate_mbps=r.guaranteed_mbps,
                           ceil_mbps=r.guaranteed_mbps + grants[vm].granted_mbps))
    return out


def check_invariants(state: State) -> list[str]:
    """Return the violated invariants (empty when healthy); used by tests and by the store after loading."""
    problems = []
    if state.node_guaranteed_mbps() > state.node.guarantee_limit_mbps:
        problems.append("node guarantees exceed NIC x ratio")
    for name, pool in state.pools.items():
        if state.pool_used_mbps(name) > pool.capacity_mbps:
            problems.append(f"pool {name}: sum of ceilings exceeds capacity")
    for vm, g in state.grants.items():
        if g.granted_mbps < 0 or g.granted_mbps > g.request.wanted_borrow_mbps:
            problems.append(f"{vm}: granted {g.granted_mbps} outside 0..{g.request.wanted_borrow_mbps}")
    return problems
