#!/usr/bin/env python3
"""Benchmark: applying 1,000 HTB classes (+ their u32 filters) through netlink batches vs one `tc` process per
object, in the same run on the same kind of device; and arbitrating 10,000 VM requests.

Goals: netlink batch >= 10x faster than one tc process per class (same-run ratio); arbitration of
10,000 VM requests < 100 ms measured (absolute), printed next to the same-run ratio against the previous algorithm
(bench/qos_baseline.py) on the same requests.

Run as root:  /var/cache/zjusct-cloud/venv/bin/python bench/qos_apply.py [--classes 1000] [--vms 10000]
[--repeat 7] [--arbitration-only] [--against REV]
``--against REV`` also times ``arbitrate_all`` of ``git show REV:plugins/module_utils/model/qos.py`` (loaded as a
separate
module) in the same alternation and asserts its decisions and final state equal this tree's.
Creates two network namespaces with a veth device each and deletes them at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.zjusct.cloud.plugins.module_utils.host import tc_qos_module as _tc_qos_module  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.module_utils.host.qos_store import QoSStore  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.module_utils.model import qos as q  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc as _tc  # noqa: E402
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc_netlink as _tc_netlink  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
import qos_baseline  # noqa: E402


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


def specs(n: int) -> list[_tc.ClassSpec]:
    return [_tc.ClassSpec(f"vm{i}", 5 + i % 50, 55 + i % 90, mac=f"02:7a:00:00:{i >> 8:02x}:{i & 0xff:02x}",
                          minor=_tc.VM_MINOR_MIN + i) for i in range(n)]


def netlink_apply(ns: str, n: int, batch: bool = True) -> float:
    with _tc_netlink.NetlinkTc("d0", ns) as nl:
        desired = _tc.desired_tree(specs(n), mtu=1500, root_rate_mbps=10000, default_rate_mbps=1,
                                   default_ceil_mbps=10000, direction="egress", tick_in_usec=nl.tick_in_usec)
        ops = _tc.diff_trees(nl.read_tree(), desired)
        t = time.perf_counter()
        warnings = nl.apply(ops, batch=batch)
        elapsed = time.perf_counter() - t
        assert _tc.diff_trees(nl.read_tree(), desired) == [], "netlink apply did not converge"
        assert not warnings, warnings
    return elapsed


def tc_per_object(ns: str, n: int) -> float:
    """The same tree built with one `tc` process per qdisc/class/filter (the classic shell approach)."""
    cmds = [["tc", "-n", ns, "qdisc", "add", "dev", "d0", "root", "handle", "7a:", "htb", "default", "ffff"],
            ["tc", "-n", ns, "class", "add", "dev", "d0", "parent", "7a:", "classid", "7a:1", "htb",
             "rate", "10000mbit", "ceil", "10000mbit"],
            ["tc", "-n", ns, "class", "add", "dev", "d0", "parent", "7a:1", "classid", "7a:ffff", "htb",
             "rate", "1mbit", "ceil", "10000mbit", "quantum", "1514"]]
    for s in specs(n):
        rate = s.rate_mbps * _tc.MBIT_BYTES
        cmds.append(["tc", "-n", ns, "class", "add", "dev", "d0", "parent", "7a:1", "classid", f"7a:{s.minor:x}",
                     "htb", "rate", f"{s.rate_mbps}mbit", "ceil", f"{s.ceil_mbps}mbit",
                     "quantum", str(_tc.quantum_bytes(rate, 1500))])
        cmds.append(["tc", "-n", ns, "filter", "add", "dev", "d0", "parent", "7a:", "protocol", "all", "prio", "10",
                     "u32", "match", "ether", "dst", s.mac or "", "flowid", f"7a:{s.minor:x}"])
    t = time.perf_counter()
    for c in cmds:
        subprocess.run(c, check=True, capture_output=True, timeout=30)
    return time.perf_counter() - t


def requests_of(n: int, pools: int, seed: int) -> list[q.Request]:
    """n VM requests: guarantee 1-50 Mbit/s, ceil up to 200 above it, priority 0-5, round robin over the pools."""
    rnd = random.Random(seed)
    reqs = []
    for i in range(n):
        g = rnd.randint(1, 50)
        reqs.append(q.Request(f"vm{i}", g, g + rnd.randint(0, 200), rnd.randint(0, 5), f"p{i % pools}"))
    return reqs


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this thread) of one call of fn: the wall time is what a caller waits, the
    thread CPU time what the arbitration itself consumed (the rest is waiting for a core on a loaded machine)."""
    t, c = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - t, time.thread_time() - c


def figures(samples: list[tuple[float, float]]) -> str:
    wall = [w for w, _ in samples]
    cpu = [c for _, c in samples]
    return (f"median {statistics.median(wall) * 1000:.1f} ms wall (runs {min(wall) * 1000:.1f}-"
            f"{max(wall) * 1000:.1f}), {statistics.median(cpu) * 1000:.1f} ms thread CPU")


def verdict(samples: list[tuple[float, float]], goal_s: float = 0.1) -> str:
    wall = statistics.median(w for w, _ in samples)
    cpu = statistics.median(c for _, c in samples)
    return (f"goal < {goal_s * 1000:.0f} ms: {'met' if wall < goal_s else 'NOT met'} (wall median)"
            f"{'' if wall < goal_s else ', met in CPU time' if cpu < goal_s else ', not met in CPU time either'}")


class Undo(Exception):
    """Raised inside a store transaction to roll it back."""


def store_with(n: int, directory: str) -> tuple[QoSStore, list[q.Request]]:
    """A host store (SQLite file in ``directory``) holding n admitted VMs in 20 pools, as on a full node."""
    hs = HostStore(os.path.join(directory, "store.db"))
    qs = QoSStore(hs.conn)
    qs.configure(1_000_000, 1.0, {f"p{i}": 100_000 for i in range(20)})
    reqs = requests_of(n + 1, 20, 9)
    before = qs.load()
    full, decisions = q.arbitrate_all(before, reqs[:n])
    assert all(d.admitted for d in decisions) and len(full.grants) == n
    qs.save_grants(before, full)
    return qs, reqs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--vms", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=7, help="arbitration runs per side (the median is reported)")
    ap.add_argument("--loop-baseline", type=int, default=0, metavar="N",
                    help="also time the previous tc_qos form (one request() per VM, quadratic) on N requests")
    ap.add_argument("--arbitration-only", action="store_true", help="skip the tc/netlink part (no root needed)")
    ap.add_argument("--against", metavar="REV", help="also time arbitrate_all of qos.py at git revision REV "
                    "(same run, alternating; decisions and state asserted equal)")
    args = ap.parse_args()
    if not args.arbitration_only:
        apply_classes(args)
    arbitrate(args)
    return 0


def apply_classes(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces); --arbitration-only skips that part")
    tag = f"zqb{os.getpid() % 100000}"
    nss = [tag + "a", tag + "b", tag + "c"]
    try:
        for ns in nss:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
            sh("ip", "-n", ns, "link", "set", "d0", "up")
        batch = netlink_apply(nss[0], args.classes)
        per_tc = tc_per_object(nss[1], args.classes)
        unbatched = netlink_apply(nss[2], args.classes, batch=False)
    finally:
        for ns in nss:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    print(f"apply {args.classes} classes + filters: netlink batch {batch * 1000:.1f} ms, "
          f"one tc process per object {per_tc * 1000:.0f} ms, ratio {per_tc / batch:.1f}x (goal >= 10x); "
          f"netlink one request per ack {unbatched * 1000:.1f} ms; "
          f"{'goal met' if per_tc / batch >= 10 else 'not met'} (same-run ratio)")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} CPUs"


def module_at(rev: str) -> types.ModuleType:
    """plugins/module_utils/model/qos.py as it is at git revision ``rev`` (``_qos.py`` before module_utils had
    rooms), loaded as a separate module (it imports the standard library and the error root only)."""
    for path in ("plugins/module_utils/model/qos.py", "plugins/module_utils/_qos.py"):
        shown = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{path}"], check=False,
                               capture_output=True, text=True, timeout=30)
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"--against {rev}: no qos.py at that revision ({shown.stderr.strip()})")
    mod = types.ModuleType(f"_qos_at_{abs(hash(rev))}")
    sys.modules[mod.__name__] = mod  # dataclasses looks its module up
    # before the rooms, the error root was module_utils._errors: point that import at this tree's
    src = shown.stdout.replace("module_utils._errors import", "module_utils.common.errors import")
    exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)  # our own file at REV
    return mod


def grant_rows(state: object) -> tuple:
    """A State's grants as plain tuples, in order, and its next seq: comparable across module copies."""
    return ([(vm, g.request.vm, g.request.guaranteed_mbps, g.request.ceil_mbps, g.request.priority, g.request.pool,
              g.granted_mbps, g.seq) for vm, g in state.grants.items()], state.next_seq)  # type: ignore[attr-defined]


def arbitrate(args: argparse.Namespace) -> None:
    t = time.perf_counter()
    x = 0
    for i in range(1_000_000):
        x += i
    calib = time.perf_counter() - t
    print(f"CPU calibration: 1e6 Python loop iterations {calib * 1000:.0f} ms (about 30 ms on an idle core); "
          f"{load()}")
    n, runs = args.vms, args.repeat
    # 1. The batch: n VM requests (10 pools, priorities 0-5, many preemptions) from an empty node, as the
    # tc_qos requests form and a rebuild of a node's state do. Same-run baseline: the ledger before its optimisation
    # (bench/qos_baseline.py) on the same requests, alternating which side runs first.
    reqs = requests_of(n, 10, 3)
    state = q.State(q.NodeCapacity(400_000, 1.0), {f"p{i}": q.Pool(f"p{i}", 60_000) for i in range(10)})
    sides: dict[str, Callable[[], tuple]] = {
        "new": lambda: q.arbitrate_all(state, reqs),
        "base": lambda: qos_baseline.arbitrate_all(state, reqs),
    }
    if args.against:
        prev = module_at(args.against)
        p_reqs = [prev.Request(r.vm, r.guaranteed_mbps, r.ceil_mbps, r.priority, r.pool) for r in reqs]
        p_state = prev.State(prev.NodeCapacity(400_000, 1.0),
                             {f"p{i}": prev.Pool(f"p{i}", 60_000) for i in range(10)})
        sides["prev"] = lambda: prev.arbitrate_all(p_state, p_reqs)
    samples: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    out: dict = {}
    order = list(sides)
    for k in range(runs):
        for side in order[k % len(order):] + order[:k % len(order)]:  # each side first in turn
            out.pop(side, None)  # free the previous run's result outside the timed call
            run = sides[side]
            samples[side].append(timed(lambda: out.__setitem__(side, run())))  # noqa: B023 - called right here
    new_s, base_s = samples["new"], samples["base"]
    final, decisions = out["new"]
    assert out["new"] == out["base"], "optimised arbitration differs from the baseline"
    outcomes = {o: sum(d.outcome == o for d in decisions) for o in q.OUTCOMES}
    preempt = sum(len(d.preemptions) for d in decisions)
    ratio = statistics.median(w for w, _ in base_s) / statistics.median(w for w, _ in new_s)
    print(f"arbitrate_all of {n} VM requests ({runs} runs, absolute): {figures(new_s)}; {verdict(new_s)}; "
          f"previous ledger {figures(base_s)}: same-run ratio {ratio:.2f}x faster (wall medians); identical "
          f"decisions and state; outcomes {outcomes}, {preempt} preemptions; invariants ok: "
          f"{not q.check_invariants(final)}")
    if args.against:
        p_final, p_decisions = out["prev"]
        assert [d.as_dict() for d in p_decisions] == [d.as_dict() for d in decisions], \
            f"{args.against} decides otherwise"
        assert grant_rows(p_final) == grant_rows(final), f"{args.against} leaves another state"
        prev_s = samples["prev"]
        print(f"  qos.py at {args.against}: {figures(prev_s)}; same-run ratio {args.against} / this tree: "
              f"{statistics.median(w for w, _ in prev_s) / statistics.median(w for w, _ in new_s):.2f}x (wall "
              f"medians), {statistics.median(c for _, c in prev_s) / statistics.median(c for _, c in new_s):.2f}x "
              f"(CPU medians); identical decisions and state")
    # 2. The same batch through the tc_qos module's requests form (arbitration + class specs).
    params = {"node": {"nic_mbps": 400_000, "ratio": 1.0},
              "pools": [{"name": f"p{i}", "capacity_mbps": 60_000} for i in range(10)],
              "requests": [{"vm": r.vm, "guaranteed_mbps": r.guaranteed_mbps, "ceil_mbps": r.ceil_mbps,
                            "priority": r.priority, "pool": r.pool,
                            "match": {"mac": f"02:7a:00:{i >> 16 & 0xff:02x}:{i >> 8 & 0xff:02x}:{i & 0xff:02x}"}}
                           for i, r in enumerate(reqs)]}
    tcq = [timed(lambda: _tc_qos_module.arbitrate(params)) for _ in range(runs)]
    print(f"tc_qos requests form, {n} requests -> class specs ({runs} runs, absolute): {figures(tcq)}; "
          f"{verdict(tcq)}")
    if args.loop_baseline:
        m = args.loop_baseline

        def loop() -> None:  # the tc_qos requests form before this change: one request() (one ledger) per VM
            st = state
            for r in reqs[:m]:
                st, _ = q.request(st, r)
        w, c = timed(loop)
        print(f"  previous tc_qos form (request() per VM, O(n^2)) for the first {m} requests, one run: "
              f"{w:.1f} s wall, {c:.1f} s thread CPU ({load()})")
    # 3. One VM start on a node that already holds n VMs: request() against n admitted VMs, and the same
    # through the host store as host.bandwidth.apply_vm_bandwidth does it (load n rows, arbitrate, save the change).
    with tempfile.TemporaryDirectory(prefix="zqa") as d:
        qs, sreqs = store_with(n, d)
        full = qs.load()
        new = sreqs[n]
        one = [timed(lambda: q.request(full, new)) for _ in range(runs)]
        rates = [timed(lambda: q.desired_rates(full)) for _ in range(runs)]

        def vm_start() -> None:
            try:
                with qs.transaction():
                    before = qs.load()
                    after, decision = q.request(before, new)
                    assert decision.admitted
                    qs.save_grants(before, after)
                    raise Undo  # rolled back: the next run starts from the same n VMs
            except Undo:
                pass
        start = [timed(vm_start) for _ in range(runs)]
        print(f"one VM start against {n} admitted VMs ({runs} runs each, absolute): request() {figures(one)}; "
              f"store load + request + save {figures(start)}, {verdict(start)}; desired rates of all {n}: "
              f"{figures(rates)}")
    print(f"after the runs: {load()}")


if __name__ == "__main__":
    sys.exit(main())
