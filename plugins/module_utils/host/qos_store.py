# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Persistence of bandwidth arbitration in the host store (SQLite): node capacity, pools, grants, attachments.

Tables (created by the host store's migration 2, host.store.MIGRATIONS; this module runs no DDL):

* ``qos_node`` (one row): ``nic_mbps``, ``ratio``, ``next_seq``;
* ``qos_pools``: ``name``, ``capacity_mbps``;
* ``qos_grants``: one row per admitted VM: request (guaranteed, ceil, priority, pool), ``granted_mbps``, ``seq``;
* ``qos_attachments``: where a VM's classes live: ``vm``, ``netns`` ('' = the root namespace), ``device``,
  ``ifb`` ('' = no ingress shaping), ``mac``, ``ipv4``, ``minor`` (class id 7a:<minor> on the device and IFB).

Every decision is an event row in the host store's ``events`` table (same columns as ``HostStore.record_event``:
kind Normal|Warning, reason ``BandwidthGranted|BandwidthPreempted|BandwidthDenied|BandwidthReleased``, message,
data JSON). Its subject is the host store's for the VM (host.store.SUBJECTS): ``<namespace>/<name>`` when the VM id
is a CloudVM's uid in the store, so a VM's bandwidth events sit with its other events; ``vm/<id>`` for a VM the
store does not know (tc_qos ``requests`` recorded with ``store_path``).

Concurrency: use :meth:`QoSStore.transaction` (``BEGIN IMMEDIATE``) around load -> decide -> save so two
processes arbitrating the same pools are serialized (the SQLite write lock plays the role of KVMCloud's advisory
lock per pool).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any, ContextManager

from ansible_collections.zjusct.cloud.plugins.module_utils.common.sqlite import insert_event, write_transaction
from ansible_collections.zjusct.cloud.plugins.module_utils.model import qos as q

REASONS = {q.GRANTED: "BandwidthGranted", q.PREEMPTED: "BandwidthPreempted", q.DENIED: "BandwidthDenied"}


@dataclass(frozen=True)
class Attachment:
    """Where a VM's class lives: device (its TAP) in netns ('' = root namespace), optional IFB for ingress."""

    vm: str
    netns: str
    device: str
    ifb: str
    mac: str | None
    ipv4: str | None
    minor: int


class QoSStore:
    """Arbitration state in SQLite. ``conn`` is the connection of an opened (so migrated) host store,
    ``HostStore(path).conn`` (autocommit; we issue BEGIN IMMEDIATE ourselves).

    Raises:
        sqlite3.OperationalError: ``conn`` is not a migrated host store (no ``qos_node`` table).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        if self.conn.isolation_level is not None:
            self.conn.isolation_level = None
        self.conn.execute("SELECT 1 FROM qos_node LIMIT 1")  # fails early on a database the host store never opened

    def transaction(self) -> ContextManager[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE), committed on success; nested use joins the outer one."""
        return write_transaction(self.conn)

    # -- configuration --
    def configure(self, nic_mbps: int, ratio: float, pools: dict[str, int]) -> list[str]:
        """Set the node capacity and the pools (name -> capacity Mbit/s); returns what changed.

        Pools not listed are removed when no VM uses them. Raises QoSInputError when a value is out of range or
        a new capacity is below what is already guaranteed/used in a pool (field, value and usage named).
        """
        node = q.NodeCapacity(nic_mbps, ratio)
        q.validate_node(node)
        for name, cap in pools.items():
            q.validate_pool(q.Pool(name, cap))
        changes: list[str] = []
        with self.transaction() as conn:
            state = self.load()
            if state.node_guaranteed_mbps() > node.guarantee_limit_mbps:
                raise q.QoSInputError(
                    f"node.nic_mbps/ratio: {nic_mbps} x {ratio} = {node.guarantee_limit_mbps} Mbit/s is below the "
                    f"{state.node_guaranteed_mbps()} Mbit/s already guaranteed")
            for name in state.pools:
                used = state.pool_used_mbps(name)
                if name not in pools and any(g.request.pool == name for g in state.grants.values()):
                    raise q.QoSInputError(f"pools[{name}]: still used by admitted VMs, cannot be removed")
                if name in pools and pools[name] < used:
                    raise q.QoSInputError(f"pools[{name}].capacity_mbps: {pools[name]} is below the {used} Mbit/s "
                                          f"in use (guaranteed + granted)")
            if (state.node.nic_mbps, state.node.ratio) != (nic_mbps, ratio):
                conn.execute("INSERT INTO qos_node (id, nic_mbps, ratio) VALUES (1, ?, ?) ON CONFLICT (id) DO "
                             "UPDATE SET nic_mbps = excluded.nic_mbps, ratio = excluded.ratio", (nic_mbps, ratio))
                changes.append(f"node {nic_mbps} Mbit/s x {ratio}")
            for name, cap in sorted(pools.items()):
                if name not in state.pools or state.pools[name].capacity_mbps != cap:
                    conn.execute("INSERT INTO qos_pools (name, capacity_mbps) VALUES (?, ?) ON CONFLICT (name) "
                                 "DO UPDATE SET capacity_mbps = excluded.capacity_mbps", (name, cap))
                    changes.append(f"pool {name} {cap} Mbit/s")
            for name in sorted(set(state.pools) - set(pools)):
                conn.execute("DELETE FROM qos_pools WHERE name = ?", (name,))
                changes.append(f"pool {name} removed")
        return changes

    # -- state --
    def load(self) -> q.State:
        """The arbitration state (node 0 Mbit/s when never configured)."""
        row = self.conn.execute("SELECT nic_mbps, ratio, next_seq FROM qos_node WHERE id = 1").fetchone()
        node = q.NodeCapacity(int(row[0]), float(row[1])) if row else q.NodeCapacity(0, 1.0)
        next_seq = int(row[2]) if row else 1
        pools = {r[0]: q.Pool(r[0], int(r[1])) for r in
                 self.conn.execute("SELECT name, capacity_mbps FROM qos_pools")}
        cur = self.conn.cursor()
        cur.row_factory = None  # plain tuples: a node's 10,000 rows are read on every VM start
        grants = q.grants_from_rows(cur.execute(
            "SELECT vm, pool, guaranteed_mbps, ceil_mbps, priority, granted_mbps, seq FROM qos_grants"))
        return q.State(node, pools, grants, next_seq)

    def save_grants(self, before: q.State, after: q.State) -> None:
        """Write the grant rows that differ between ``before`` and ``after`` (and next_seq)."""
        with self.transaction() as conn:
            for vm in set(before.grants) - set(after.grants):
                conn.execute("DELETE FROM qos_grants WHERE vm = ?", (vm,))
            old = before.grants
            for vm, g in after.grants.items():
                o = old.get(vm)
                if o is not g and o != g:  # arbitration reuses unchanged Grant objects: identity first
                    r = g.request
                    conn.execute("INSERT OR REPLACE INTO qos_grants (vm, pool, guaranteed_mbps, ceil_mbps, priority,"
                                 " granted_mbps, seq) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (vm, r.pool, r.guaranteed_mbps, r.ceil_mbps, r.priority, g.granted_mbps, g.seq))
            if after.next_seq != before.next_seq:
                conn.execute("UPDATE qos_node SET next_seq = ? WHERE id = 1", (after.next_seq,))

    # -- attachments --
    def attachments(self, netns: str | None = None, device: str | None = None) -> list[Attachment]:
        query, args = "SELECT vm, netns, device, ifb, mac, ipv4, minor FROM qos_attachments WHERE 1=1", []
        if netns is not None:
            query += " AND netns = ?"
            args.append(netns)
        if device is not None:
            query += " AND device = ?"
            args.append(device)
        return [Attachment(*r) for r in self.conn.execute(query + " ORDER BY netns, device, minor", args)]

    def attachment(self, vm: str) -> Attachment | None:
        r = self.conn.execute("SELECT vm, netns, device, ifb, mac, ipv4, minor FROM qos_attachments WHERE vm = ?",
                              (vm,)).fetchone()
        return Attachment(*r) if r else None

    def attach(self, vm: str, netns: str, device: str, ifb: str, mac: str | None, ipv4: str | None) -> Attachment:
        """Record (or keep) where ``vm``'s class lives; allocates the lowest free class minor on the device."""
        with self.transaction() as conn:
            old = self.attachment(vm)
            if old and (old.netns, old.device) == (netns, device):
                minor = old.minor
            else:
                used = {a.minor for a in self.attachments(netns, device) if a.vm != vm}
                minor = next(m for m in range(0x10, 0x1000) if m not in used)
            conn.execute("INSERT OR REPLACE INTO qos_attachments (vm, netns, device, ifb, mac, ipv4, minor) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)", (vm, netns, device, ifb, mac, ipv4, minor))
        return Attachment(vm, netns, device, ifb, mac, ipv4, minor)

    def detach(self, vm: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM qos_attachments WHERE vm = ?", (vm,))

    # -- events --
    def record(self, decision: q.Decision, request: q.Request | None = None) -> None:
        """One event for the decision and one per preempted VM (subject ``vm/<vm>``)."""
        data: dict[str, Any] = decision.as_dict()
        if request is not None:
            data["request"] = {"guaranteed_mbps": request.guaranteed_mbps, "ceil_mbps": request.ceil_mbps,
                               "priority": request.priority, "pool": request.pool}
        kind = "Warning" if decision.outcome == q.DENIED else "Normal"
        self.event(kind, decision.vm, REASONS[decision.outcome], decision.reason, data)
        for p in decision.preemptions:
            self.event("Warning", p.vm, "BandwidthPreempted",
                       f"gave back {p.lost_mbps} Mbit/s of borrowed bandwidth to {decision.vm}",
                       {"vm": p.vm, "lost_mbps": p.lost_mbps, "by": decision.vm})

    def subject(self, vm: str) -> str:
        """The event subject of VM id ``vm``: its CloudVM's ``<namespace>/<name>``, else ``vm/<vm>``."""
        row = self.conn.execute("SELECT namespace, name FROM cloudvms WHERE uid = ?", (vm,)).fetchone()
        return f"{row[0]}/{row[1]}" if row else f"vm/{vm}"

    def event(self, kind: str, vm: str, reason: str, message: str, data: dict) -> None:
        insert_event(self.conn, kind, self.subject(vm), reason, message, data)

    def events(self, vm: str | None = None) -> list[dict]:
        """Bandwidth events, oldest first (all VMs when ``vm`` is None)."""
        query = "SELECT ts, kind, subject, reason, message, data FROM events WHERE reason LIKE 'Bandwidth%'"
        args: list = []
        if vm is not None:
            query += " AND subject = ?"
            args.append(self.subject(vm))
        rows = self.conn.execute(query + " ORDER BY id", args).fetchall()
        return [{"ts": r[0], "kind": r[1], "subject": r[2], "reason": r[3], "message": r[4],
                 "data": json.loads(r[5])} for r in rows]
