"""Real shaping: namespaces, a bridge with veth ports standing in for TAPs, HTB through netlink, iperf3.

Expected goodput is computed from the wire rate and the MTU (netlab.expected_goodput_mbps); every assertion on
throughput allows +-5 % of that expectation (issue 9).
"""

from __future__ import annotations

import time

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import bandwidth as bw
from ansible_collections.zjusct.cloud.plugins.module_utils.host.qos_store import QoSStore
from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore
from ansible_collections.zjusct.cloud.plugins.module_utils.host.tc_qos_module import ARGUMENT_SPEC, run
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc as _tc
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc_netlink as _tc_netlink
from qos_netlab import Lab, expected_goodput_mbps, make_lab, sh, steady_mbps

pytestmark = pytest.mark.netns


@pytest.fixture
def lab2():
    lab = make_lab(2)
    yield lab
    lab.close()


@pytest.fixture
def store(tmp_path):
    host = HostStore(str(tmp_path / "host.db"))
    yield QoSStore(host.conn)
    host.close()


def params(**kw):
    p = {k: v.get("default") for k, v in ARGUMENT_SPEC.items()}
    p.update(kw)
    return p


def within(measured: float, wire_mbps: float, tol: float = 0.05, below: float | None = None) -> bool:
    """``measured`` goodput is the shaped rate of ``wire_mbps``: at most ``tol`` above it and at most ``below``
    (default ``tol``) under it."""
    exp = expected_goodput_mbps(wire_mbps)
    print(f"wire {wire_mbps} Mbit/s: goodput {measured:.2f}, expected {exp:.2f} ({(measured / exp - 1) * 100:+.1f} %)")
    return -(tol if below is None else below) * exp <= measured - exp <= tol * exp


def start_vm(store: QoSStore, lab: Lab, i: int, g: int, c: int, prio: int = 0, pool: str = "p"):
    return bw.apply_vm_bandwidth(store, netns=lab.host, device=f"tap{i}", vm_id=f"vm{i}", mac=lab.guest_mac(i),
                                 guaranteed_mbps=g, ceil_mbps=c, pool=pool, priority=prio)


def test_guarantee_only_is_shaped_to_the_guarantee_and_the_first_second_stays_within_burst(lab2, store):
    bw.configure(store, 1000, 1.0, {"p": 100})
    d = start_vm(store, lab2, 0, 20, 20)
    assert (d.outcome, d.granted_mbps) == ("granted", 0)
    ivs = lab2.transfer(0, seconds=4)
    got = steady_mbps(ivs)
    assert within(got, 20), (got, expected_goodput_mbps(20), ivs)
    # first interval: at most the ceiling for its duration plus cburst plus one 64 KiB GSO packet in flight
    _start, secs, nbytes = ivs[0]
    ceil_bytes = 20 * _tc.MBIT_BYTES
    assert nbytes <= ceil_bytes * secs + _tc.burst_bytes(ceil_bytes, 1500) + 65536, ivs[0]


def test_borrow_from_the_pool_reaches_the_ceiling(lab2, store):
    bw.configure(store, 1000, 1.0, {"p": 100})
    d = start_vm(store, lab2, 0, 10, 50)
    assert (d.outcome, d.granted_mbps) == ("granted", 40)
    got = steady_mbps(lab2.transfer(0, seconds=4))
    assert within(got, 50), (got, expected_goodput_mbps(50))


def test_denied_borrow_keeps_the_vm_at_its_guarantee(lab2, store):
    bw.configure(store, 1000, 1.0, {"p": 60})
    assert start_vm(store, lab2, 0, 10, 40, prio=5).outcome == "granted"
    d = start_vm(store, lab2, 1, 10, 50, prio=0)
    assert (d.outcome, d.admitted, d.granted_mbps) == ("denied", True, 0)
    got = steady_mbps(lab2.transfer(1, seconds=4))
    assert within(got, 10), (got, expected_goodput_mbps(10))
    reasons = [e["reason"] for e in store.events("vm1")]
    assert reasons == ["BandwidthDenied"]


def test_preemption_lowers_a_running_lower_priority_borrower_within_a_second(lab2, store):
    bw.configure(store, 1000, 1.0, {"p": 80})
    assert start_vm(store, lab2, 0, 10, 60, prio=0).granted_mbps == 50
    srv0 = lab2.server(lab2.guests[0], lab2.guest_ip(0), interval=0.5)
    t0 = time.monotonic()
    cli0 = lab2.client(lab2.host, lab2.guest_ip(0), 6, interval=0.5)
    time.sleep(3.2)  # 2 s of borrowing after slow start: 1 s dipped 6 % under the suite's load
    t_change = time.monotonic() - t0
    d = start_vm(store, lab2, 1, 10, 50, prio=5)
    # pool 80: vm0 held 60; vm1 needs 10 + 40 with 20 free -> vm0 gives back 30 and keeps 30 (>= its guarantee)
    assert d.outcome == "preempted" and [(p.vm, p.lost_mbps) for p in d.preemptions] == [("vm0", 30)]
    ivs1 = lab2.transfer(1, seconds=3, port=5202)
    cli0.communicate(timeout=30)
    ivs0 = lab2.received(srv0)
    full = [iv for iv in ivs0 if iv[1] > 0.4][:-1]  # the last interval is cut by the end of the transfer
    before = [iv for iv in full if iv[0] >= 1.0 and iv[0] + iv[1] <= t_change - 0.1]
    after = [iv for iv in full if iv[0] >= t_change + 1.0]
    assert before and after, (t_change, ivs0)
    # borrowing up to its ceiling before the change: never above it; a sender short of CPU under the suite's load
    # delivers less, never more, so below it counts only as far as it stays well above the ceiling that follows (30)
    assert within(steady_mbps(before, 1.0), 60, below=0.2), ivs0
    # from 1 s after the change on, the borrower runs at its new ceiling (30 Mbit/s)
    assert within(steady_mbps(after, 0.0), 30), (t_change, ivs0)
    assert within(steady_mbps(ivs1), 50), ivs1
    kinds = [(e["subject"], e["reason"]) for e in store.events()]
    assert ("vm/vm1", "BandwidthPreempted") in kinds and ("vm/vm0", "BandwidthPreempted") in kinds


def test_case_N1_sixty_classes_on_one_device_shape_correctly_without_quantum_warnings():
    lab = make_lab(1)
    try:
        g = lab.guests[0]
        ips = [f"10.231.{lab.k}.{100 + n}" for n in range(60)]
        for ip in ips:
            sh("ip", "-n", g, "addr", "add", f"{ip}/24", "dev", "eth0")
        rates = {n: 5 + n for n in range(60)}
        classes = [{"name": f"c{n}", "classid": "auto", "rate_mbps": rates[n], "ceil_mbps": rates[n],
                    "match": {"ipv4": ips[n]}} for n in range(60)]
        dmesg_before = sh("dmesg", check=False).stdout.count("quantum")
        res = run(params(device="tap0", netns=lab.host, root_rate_mbps=1000, classes=classes), False)
        assert res["changed"] and len(res["classes"]) == 60
        assert res["kernel_warnings"] == []  # extended acks of all 60 classes carried no warning
        tree = _tc_netlink.NetlinkTc("tap0", lab.host)
        with tree:
            t = tree.read_tree()
        assert len([m for m in t.classes if _tc.VM_MINOR_MIN <= m <= _tc.VM_MINOR_MAX]) == 60
        for m, c in t.classes.items():
            if m != _tc.ROOT_MINOR:
                assert c.quantum == _tc.quantum_bytes(c.rate, 1500)
        picked = [0, 30, 59]
        results: dict[int, list] = {}
        servers = {n: lab.server(g, ips[n], 5300 + n) for n in picked}
        clients = {n: lab.client(lab.host, ips[n], 4, 5300 + n) for n in picked}
        for n in picked:
            clients[n].communicate(timeout=30)
            results[n] = lab.received(servers[n])
        for n in picked:
            assert within(steady_mbps(results[n]), rates[n]), (n, rates[n], steady_mbps(results[n]))
        assert sh("dmesg", check=False).stdout.count("quantum") == dmesg_before
        # cross-check with the tc CLI: the same parameters, given explicitly, make tc print no warning
        c = t.classes[0x10]
        out = sh("tc", "-n", lab.host, "class", "change", "dev", "tap0", "parent", "7a:1", "classid", "7a:10", "htb",
                 "rate", f"{c.rate * 8}bit", "ceil", f"{c.ceil * 8}bit", "quantum", str(c.quantum))
        assert "quantum" not in out.stderr, out.stderr
        # negative control: the check above can fail; a derived quantum at 10 Gbit/s makes tc print the warning
        bad = sh("tc", "-n", lab.host, "class", "add", "dev", "tap0", "parent", "7a:1", "classid", "7a:ff0", "htb",
                 "rate", "10gbit")
        assert "quantum of class" in bad.stderr + bad.stdout
    finally:
        lab.close()


def test_reverse_direction_is_shaped_through_an_ifb(lab2):
    res = run(params(device="tap0", netns=lab2.host, direction="ingress", ifb="zqifb0", root_rate_mbps=1000,
                     classes=[{"name": "vm0", "rate_mbps": 15, "match": {"mac": lab2.guest_mac(0)}}]), False)
    assert res["changed"]
    got = steady_mbps(lab2.transfer(None, from_guest=0, seconds=4))
    assert within(got, 15), (got, expected_goodput_mbps(15))
    again = run(params(device="tap0", netns=lab2.host, direction="ingress", ifb="zqifb0", root_rate_mbps=1000,
                       classes=[{"name": "vm0", "rate_mbps": 15, "match": {"mac": lab2.guest_mac(0)}}]), False)
    assert not again["changed"], again["ops"]
    gone = run(params(device="tap0", netns=lab2.host, direction="ingress", ifb="zqifb0", state="absent"), False)
    assert gone["changed"]
    assert "zqifb0" not in sh("ip", "-n", lab2.host, "link", "show").stdout
    assert "ingress" not in sh("tc", "-n", lab2.host, "qdisc", "show", "dev", "tap0").stdout


def _dump(ns: str, dev: str) -> str:
    out = [sh("tc", "-n", ns, kind, "show", "dev", dev).stdout for kind in ("qdisc", "class", "filter")]
    out.append(sh("tc", "-n", ns, "filter", "show", "dev", dev, "ingress").stdout)
    return "\n".join(out)


def test_second_apply_changes_nothing_check_mode_changes_nothing_and_absent_removes_only_ours(lab2):
    ns = lab2.host
    cls = [{"name": "a", "rate_mbps": 10, "ceil_mbps": 50, "match": {"mac": lab2.guest_mac(0)}},
           {"name": "b", "rate_mbps": 20, "match": {"ipv4": lab2.guest_ip(1)}}]
    # a foreign object on the same device that we must not touch
    sh("tc", "-n", ns, "qdisc", "add", "dev", "tap0", "ingress")
    sh("tc", "-n", ns, "filter", "add", "dev", "tap0", "parent", "ffff:", "prio", "3", "protocol", "ip", "u32",
       "match", "ip", "dst", "10.9.9.9/32", "classid", "1:1")
    planned = run(params(device="tap0", netns=ns, root_rate_mbps=1000, classes=cls), True)
    assert planned["changed"] and planned["ops"][0] == "qdisc-add"
    assert "7a:" not in _dump(ns, "tap0")  # check mode left the kernel untouched
    first = run(params(device="tap0", netns=ns, root_rate_mbps=1000, classes=cls), False)
    assert first["changed"] and first["diff"]["before"]["classes"] == []
    dump1 = _dump(ns, "tap0")
    with _tc_netlink.NetlinkTc("tap0", ns) as nl:
        tree1 = nl.read_tree()
    second = run(params(device="tap0", netns=ns, root_rate_mbps=1000, classes=cls), False)
    assert not second["changed"] and second["ops"] == []
    with _tc_netlink.NetlinkTc("tap0", ns) as nl:
        assert nl.read_tree() == tree1
    assert _dump(ns, "tap0") == dump1
    # changing one ceiling touches only that class
    cls[0]["ceil_mbps"] = 40
    third = run(params(device="tap0", netns=ns, root_rate_mbps=1000, classes=cls), False)
    assert third["ops"] == ["class-put 7a:10 rate 10000000bit ceil 40000000bit quantum 125000"]
    gone = run(params(device="tap0", netns=ns, state="absent"), False)
    assert gone["changed"]
    after = _dump(ns, "tap0")
    assert "7a:" not in after
    assert "pref 3" in after  # the foreign ingress filter is still there
    assert not run(params(device="tap0", netns=ns, state="absent"), False)["changed"]


def test_wiring_release_refills_and_reapply_all_restores_kernel_state(lab2, store):
    bw.configure(store, 1000, 1.0, {"p": 100})
    start_vm(store, lab2, 0, 10, 90, prio=0)
    d = start_vm(store, lab2, 1, 10, 90, prio=5)
    assert d.outcome == "preempted"
    ns = lab2.host
    assert "ceil 10Mbit" in sh("tc", "-n", ns, "class", "show", "dev", "tap0").stdout
    ifb1 = bw.ifb_name("tap1")
    assert ifb1 in sh("ip", "-n", ns, "link", "show").stdout
    # "restart": kernel state gone, store intact
    sh("tc", "-n", ns, "qdisc", "del", "dev", "tap0", "root")
    sh("ip", "-n", ns, "link", "del", ifb1)
    results = bw.reapply_all(store)
    assert any(r["device"] == "tap0" and r["ops"] for r in results)
    assert "ceil 10Mbit" in sh("tc", "-n", ns, "class", "show", "dev", "tap0").stdout
    assert ifb1 in sh("ip", "-n", ns, "link", "show").stdout
    assert all(not r["ops"] for r in bw.reapply_all(store))  # converged
    refills = bw.release_vm_bandwidth(store, "vm1")
    assert [(r.vm, r.granted_mbps) for r in refills] == [("vm0", 80)]
    assert "7a:" not in sh("tc", "-n", ns, "qdisc", "show", "dev", "tap1").stdout
    assert ifb1 not in sh("ip", "-n", ns, "link", "show").stdout
    assert "ceil 90Mbit" in sh("tc", "-n", ns, "class", "show", "dev", "tap0").stdout
    got = steady_mbps(lab2.transfer(0, seconds=3))
    assert within(got, 90), got
    assert bw.release_vm_bandwidth(store, "vm1") == []
    reasons = [e["reason"] for e in store.events()]
    assert reasons.count("BandwidthReleased") == 1 and "BandwidthGranted" in reasons
