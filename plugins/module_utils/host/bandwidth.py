# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A VM's bandwidth on a host: arbitration (model.qos) + persistence (host.qos_store) + kernel state (network.tc).

This is the API the host backend calls on VM start/stop (docs/qos.md, "Wiring"):

* :func:`configure` — node NIC rate, bandwidth ratio and pools (once, or when the operator changes them);
* :func:`apply_vm_bandwidth` — on VM start (after its TAP exists): arbitrate, persist, shape the TAP (egress = to
  the guest) and, through an IFB, the TAP's ingress (= from the guest); also re-shapes VMs that were preempted;
* :func:`release_vm_bandwidth` — on VM stop/delete: forget the VM, refill preempted VMs, remove its tc objects;
* :func:`reapply_all` — after a host restart (or as a periodic sweep): re-create every stored VM's tc state from
  the stored pool state; devices that do not exist (VM not running) are reported and skipped.

Each VM's TAP carries its own managed HTB tree (root 7a:, one VM class 7a:<minor>, default 7a:ffff); its IFB is
named :func:`ifb_name` (TAP), the one rule shared with tc_qos (model.names), marked with the TAP's name and never
reused for another TAP (network.tc_netlink.NetlinkTc.check_ifb); it carries the mirror tree for the other direction.
Both
directions get the same rate (guaranteed) and ceil (guaranteed + granted).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ansible_collections.zjusct.cloud.plugins.module_utils.host.qos_store import Attachment, QoSStore
from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.model import qos as q
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc as _tc
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc_netlink as _tc_netlink


def ifb_name(device: str) -> str:
    """The IFB name for a device: the same rule as tc_qos's default ``ifb`` (:func:`model.names.ifb_name`)."""
    return _names.ifb_name(device)


def _store(store: Any) -> QoSStore:
    if isinstance(store, QoSStore):
        return store
    return QoSStore(getattr(store, "conn", store))


def configure(store: Any, nic_mbps: int, ratio: float, pools: dict[str, int]) -> list[str]:
    """Set node capacity (NIC Mbit/s, ratio) and pools (name -> capacity Mbit/s). Returns the changes made."""
    return _store(store).configure(nic_mbps, ratio, pools)


def _specs(state: q.State, atts: Iterable[Attachment]) -> list[_tc.ClassSpec]:
    out = []
    for a in atts:
        g = state.grants.get(a.vm)
        if g is None:
            continue
        out.append(_tc.ClassSpec(a.vm, g.rate_mbps, g.ceil_mbps, mac=a.mac, ipv4=a.ipv4, minor=a.minor))
    return out


def apply_device(qs: QoSStore, state: q.State, netns: str, device: str) -> dict:
    """Make the kernel state of ``device`` (and its IFB) match the store. Returns {device, ops, missing}."""
    atts = qs.attachments(netns, device)
    result: dict[str, Any] = {"netns": netns, "device": device, "ops": [], "missing": False}
    try:
        nl = _tc_netlink.NetlinkTc(device, netns or None)
    except _tc.TcError:
        result["missing"] = True
        return result
    with nl:
        if not nl.exists(device):
            result["missing"] = True
            if not atts:
                result["ops"].extend(f"ifb {x} deleted" for x in nl.owned_ifbs() if nl.delete_ifb(x))
            return result
        specs = _specs(state, atts)
        ifb = atts[0].ifb if atts else ifb_name(device)
        root = max([state.node.nic_mbps, 1] + [s.ceil_mbps for s in specs])
        for direction, ifname in ((_tc.EGRESS, device), (_tc.INGRESS, ifb)):
            if direction == _tc.INGRESS and not (atts and atts[0].ifb):
                continue
            if direction == _tc.INGRESS and specs:
                if nl.ensure_ifb(ifb):
                    result["ops"].append(f"ifb {ifb} created")
            if not nl.exists(ifname):
                continue
            current = nl.read_tree(ifname)
            if specs:
                desired = _tc.desired_tree(specs, mtu=nl.mtu(device), root_rate_mbps=root, default_rate_mbps=1,
                                           default_ceil_mbps=root, direction=direction,
                                           tick_in_usec=nl.tick_in_usec)
            else:
                desired = _tc.Tree()
            ops = _tc.diff_trees(current, desired)
            nl.apply(ops, ifname)
            result["ops"].extend(f"{ifname}: {op.describe()}" for op in ops)
        if specs and atts[0].ifb:
            if nl.ensure_redirect(ifb):
                result["ops"].append(f"{device}: ingress redirect to {ifb}")
        elif not specs:
            if nl.remove_redirect():
                result["ops"].append(f"{device}: ingress redirect removed")
            # every IFB created for this device, also one recorded under an earlier naming rule
            result["ops"].extend(f"ifb {x} deleted" for x in nl.owned_ifbs() if nl.delete_ifb(x))
    return result


def apply_vm_bandwidth(store: Any, *, netns: str | None, device: str, vm_id: str, mac: str | None = None,
                       ipv4: str | None = None, guaranteed_mbps: int, ceil_mbps: int, pool: str = "default",
                       priority: int = 0, ingress: bool = True) -> q.Decision:
    """Arbitrate and apply a VM's bandwidth on VM start (idempotent: calling it again re-applies).

    Args:
        store: a HostStore (its ``conn`` is used), a sqlite3 connection or a QoSStore.
        netns: network namespace name of the TAP (None or '' = root namespace).
        device: the VM's TAP device.
        vm_id: the VM's id (uid); subject of the events ``vm/<vm_id>``.
        mac / ipv4: how the VM's traffic is matched (MAC preferred for a TAP on a bridge).
        guaranteed_mbps, ceil_mbps: Mbit/s, 1 <= guaranteed <= ceil <= pool capacity.
        pool, priority: the pool borrowed from; larger priority preempts smaller.
        ingress: also shape traffic from the guest (TAP ingress via IFB).

    Returns:
        the Decision. ``admitted`` False means the guarantee did not fit: nothing was shaped or stored and the
        caller should not start the VM (reason in ``decision.reason``). Otherwise the VM's class has
        rate = guaranteed and ceil = guaranteed + decision.granted_mbps, and preempted VMs were re-shaped.

    Raises:
        QoSInputError: invalid values (field, value and range named); TcError: netlink failure (the store
        transaction is rolled back, so a retry is safe).
    """
    qs = _store(store)
    req = q.Request(vm_id, guaranteed_mbps, ceil_mbps, priority, pool)
    if not (mac or ipv4):
        raise q.QoSInputError(f"{vm_id}: mac or ipv4 is required to match the VM's traffic")
    with qs.transaction():
        before = qs.load()
        if before.node.nic_mbps <= 0:
            raise q.QoSInputError("node.nic_mbps: bandwidth is not configured on this host (call configure first)")
        after, decision = q.request(before, req)
        qs.record(decision, req)
        if not decision.admitted:
            return decision
        qs.save_grants(before, after)
        ns = netns or ""
        qs.attach(vm_id, ns, device, ifb_name(device) if ingress else "", mac, ipv4)
        touched = {(ns, device)}
        for p in decision.preemptions:
            a = qs.attachment(p.vm)
            if a:
                touched.add((a.netns, a.device))
        for ns_, dev in sorted(touched):
            apply_device(qs, after, ns_, dev)
    return decision


def release_vm_bandwidth(store: Any, vm_id: str) -> list[q.Decision]:
    """Release a VM's bandwidth on stop/delete: remove its classes, forget it, refill its pool's VMs.

    Idempotent (an unknown VM returns []). Returns the refill decisions (recorded as events too).
    """
    qs = _store(store)
    with qs.transaction():
        before = qs.load()
        att = qs.attachment(vm_id)
        after, refills = q.release(before, vm_id)
        if vm_id in before.grants:
            qs.event("Normal", vm_id, "BandwidthReleased",
                     f"released {before.grants[vm_id].ceil_mbps} Mbit/s of pool {before.grants[vm_id].request.pool}",
                     {"vm": vm_id})
        for d in refills:
            qs.record(d)
        qs.save_grants(before, after)
        qs.detach(vm_id)
        touched = set()
        if att:
            touched.add((att.netns, att.device))
        for d in refills:
            a = qs.attachment(d.vm)
            if a:
                touched.add((a.netns, a.device))
        for ns_, dev in sorted(touched):
            apply_device(qs, after, ns_, dev)
    return refills


def reapply_all(store: Any) -> list[dict]:
    """Re-create the kernel state of every stored attachment from the stored state (after a restart).

    Returns one result per device: {netns, device, ops (what was changed), missing (device absent: skipped)}.
    """
    qs = _store(store)
    with qs.transaction():
        state = qs.load()
        devices = sorted({(a.netns, a.device) for a in qs.attachments()})
        return [apply_device(qs, state, ns_, dev) for ns_, dev in devices]
