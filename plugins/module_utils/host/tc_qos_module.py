# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of ``zjusct.cloud.tc_qos``: turn its parameters into a desired tree, diff, apply."""

from __future__ import annotations

from typing import Any

from ansible_collections.zjusct.cloud.plugins.module_utils.model import names as _names
from ansible_collections.zjusct.cloud.plugins.module_utils.model import qos as q
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc as _tc
from ansible_collections.zjusct.cloud.plugins.module_utils.network import tc_netlink as _tc_netlink

ARGUMENT_SPEC: dict[str, Any] = {
    "device": {"type": "str", "required": True},
    "netns": {"type": "str"},
    "direction": {"type": "str", "default": "egress", "choices": ["egress", "ingress"]},
    "ifb": {"type": "str"},
    "root_rate_mbps": {"type": "int", "default": 10000},
    "default_rate_mbps": {"type": "int", "default": 1},
    "default_ceil_mbps": {"type": "int"},
    "classes": {"type": "list", "elements": "dict", "options": {
        "name": {"type": "str", "required": True},
        "classid": {"type": "raw", "default": "auto"},
        "rate_mbps": {"type": "int", "required": True},
        "ceil_mbps": {"type": "int"},
        "match": {"type": "dict", "required": True, "options": {
            "mac": {"type": "str"}, "ipv4": {"type": "str"}}},
    }},
    "node": {"type": "dict", "options": {
        "nic_mbps": {"type": "int", "required": True}, "ratio": {"type": "float", "default": 1.0}}},
    "pools": {"type": "list", "elements": "dict", "options": {
        "name": {"type": "str", "required": True}, "capacity_mbps": {"type": "int", "required": True}}},
    "requests": {"type": "list", "elements": "dict", "options": {
        "vm": {"type": "str", "required": True},
        "guaranteed_mbps": {"type": "int", "required": True},
        "ceil_mbps": {"type": "int"},
        "priority": {"type": "int", "default": 0},
        "pool": {"type": "str", "default": "default"},
        "classid": {"type": "raw", "default": "auto"},
        "match": {"type": "dict", "required": True, "options": {
            "mac": {"type": "str"}, "ipv4": {"type": "str"}}},
    }},
    "store_path": {"type": "path"},
    "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
}
MUTUALLY_EXCLUSIVE = [["classes", "requests"]]
REQUIRED_TOGETHER = [["requests", "pools", "node"]]


def _match(item: dict, where: str) -> tuple[str | None, str | None]:
    m = item.get("match") or {}
    if bool(m.get("mac")) == bool(m.get("ipv4")):
        raise _tc.TcError(f"{where}.match: give exactly one of mac, ipv4")
    return m.get("mac"), m.get("ipv4")


def specs_from_classes(classes: list[dict]) -> list[_tc.ClassSpec]:
    out = []
    for i, c in enumerate(classes):
        where = f"classes[{i}]"
        mac, ipv4 = _match(c, where)
        out.append(_tc.ClassSpec(c["name"], c["rate_mbps"], c.get("ceil_mbps") or c["rate_mbps"], mac, ipv4,
                                 _tc.parse_classid(c.get("classid"), f"{where}.classid")))
    return out


def arbitrate(params: dict) -> tuple[list[_tc.ClassSpec], list[q.Decision], list[q.Request]]:
    """Arbitrate ``requests`` in the given order from an empty state; admitted ones become class specs.

    One :func:`model.qos.arbitrate_all` over all requests (the same decisions as :func:`model.qos.request` in a loop,
    but
    one working copy instead of one per request: O(n) plus the reclaims, not O(n^2); 10,000 requests took
    minutes the quadratic way, see docs/benchmarks.md). Duplicate vm ids are refused before anything is decided.
    """
    node = q.NodeCapacity(params["node"]["nic_mbps"], params["node"].get("ratio") or 1.0)
    q.validate_node(node)
    pools = {}
    for p in params["pools"]:
        pool = q.Pool(p["name"], p["capacity_mbps"])
        q.validate_pool(pool)
        pools[pool.name] = pool
    state = q.State(node, pools)
    reqs: list[q.Request] = []
    by_vm: dict[str, tuple[dict, int]] = {}
    for i, r in enumerate(params["requests"]):
        req = q.Request(r["vm"], r["guaranteed_mbps"], r.get("ceil_mbps") or r["guaranteed_mbps"],
                        r.get("priority") or 0, r.get("pool") or "default")
        if req.vm in by_vm:
            raise q.QoSInputError(f"requests[{i}].vm: {req.vm!r} appears twice")
        by_vm[req.vm] = (r, i)
        reqs.append(req)
    state, decisions = q.arbitrate_all(state, reqs)
    specs = []
    for rate in q.desired_rates(state):
        r, i = by_vm[rate.vm]
        mac, ipv4 = _match(r, f"requests[{i}]")
        specs.append(_tc.ClassSpec(rate.vm, rate.rate_mbps, rate.ceil_mbps, mac, ipv4,
                                   _tc.parse_classid(r.get("classid"), f"requests[{i}].classid")))
    return specs, decisions, reqs


def run(params: dict, check_mode: bool) -> dict:
    """Plan and (unless check_mode) apply; returns the module result. Raises TcError/QoSInputError."""
    device, netns, direction = params["device"], params.get("netns"), params["direction"]
    ifb = (params.get("ifb") or _names.ifb_name(device)) if direction == "ingress" else None
    if ifb is not None and not 1 <= len(ifb) <= _names.IFNAME_MAX:
        raise _tc.TcError(f"ifb: {ifb!r} has {len(ifb)} characters; an interface name has 1-{_names.IFNAME_MAX} "
                          "(IFNAMSIZ 16 including the NUL, linux/if.h)")
    decisions: list[q.Decision] = []
    reqs: list[q.Request] = []
    specs: list[_tc.ClassSpec] = []
    if params["state"] == "present":
        if params.get("requests") is not None:
            specs, decisions, reqs = arbitrate(params)
        else:
            specs = specs_from_classes(params.get("classes") or [])
    result: dict[str, Any] = {"changed": False, "ops": [], "decisions": [d.as_dict() for d in decisions],
                              "kernel_warnings": []}
    with _tc_netlink.NetlinkTc(device, netns) as nl:
        nl.index()  # the device must exist
        target = device if direction == "egress" else ifb
        if target is None:
            raise AssertionError("target unexpectedly missing")
        stale: list[str] = []
        if ifb is not None:
            nl.check_ifb(ifb)  # refuse another device's IFB before anything is planned or changed
            stale = [x for x in nl.owned_ifbs() if x != ifb or params["state"] == "absent"]
        ifb_missing = direction == "ingress" and not nl.exists(target)
        current = _tc.Tree() if ifb_missing else nl.read_tree(target)
        if params["state"] == "present":
            specs = _tc.assign_minors(specs, current, direction)
            root = params["root_rate_mbps"]
            desired = _tc.desired_tree(specs, mtu=nl.mtu(device), root_rate_mbps=root,
                                       default_rate_mbps=params["default_rate_mbps"],
                                       default_ceil_mbps=params.get("default_ceil_mbps") or root,
                                       direction=direction, tick_in_usec=nl.tick_in_usec)
        else:
            desired = _tc.Tree()
        ops = _tc.diff_trees(current, desired)
        extra: list[str] = []
        if direction == "ingress":
            if params["state"] == "present":
                if ifb_missing:
                    extra.append(f"create ifb {ifb}")
                if ifb_missing or not nl.has_redirect(ifb):
                    extra.append(f"redirect {device} ingress to {ifb}")
            else:
                if nl.has_redirect(ifb) or nl.ifb_is_ours(ifb):
                    extra.append(f"remove redirect and ifb {ifb}")
            extra += [f"remove stale ifb {x} (an earlier ifb of {device})" for x in stale if x != ifb]
        result["ops"] = extra + [op.describe() for op in ops]
        result["changed"] = bool(result["ops"])
        after = desired if params["state"] == "present" else _tc.Tree()
        result["diff"] = {"before": {"classes": _tc.tree_summary(current)},
                          "after": {"classes": _tc.tree_summary(after)}}
        result["classes"] = [{"name": s.name, "classid": f"7a:{s.minor:x}", "rate_mbps": s.rate_mbps,
                              "ceil_mbps": s.ceil_mbps} for s in specs]
        if check_mode or not result["changed"]:
            return result
        warnings: list[str] = []
        if direction == "ingress" and params["state"] == "present":
            nl.ensure_ifb(ifb)
            warnings = nl.apply(ops, ifb)
            nl.ensure_redirect(ifb)
            for x in stale:
                nl.delete_ifb(x)
        elif direction == "ingress":
            nl.remove_redirect()
            if nl.ifb_is_ours(ifb):
                warnings = nl.apply(ops, ifb)
            for x in stale:
                nl.delete_ifb(x)
        else:
            warnings = nl.apply(ops)
        result["kernel_warnings"] = warnings
        verify = _tc.diff_trees(nl.read_tree(target) if nl.exists(target) else _tc.Tree(), desired)
        if verify:
            raise _tc.TcError(f"{target}: kernel state differs after apply: {[o.describe() for o in verify]}")
    if params.get("store_path") and decisions:
        from ansible_collections.zjusct.cloud.plugins.module_utils.host.qos_store import QoSStore
        from ansible_collections.zjusct.cloud.plugins.module_utils.host.store import HostStore

        with HostStore(params["store_path"]) as hs:
            qs = QoSStore(hs.conn)
            for d, r in zip(decisions, reqs):
                qs.record(d, r)
    return result


def run_tc_qos(params: dict, check_mode: bool) -> dict:
    """The ``zjusct.cloud.tc_qos`` module: :func:`run`; its ``kernel_warnings`` are also the task's warnings.

    Raises:
        TcError, QoSInputError: as :func:`run`.
    """
    result = run(params, check_mode)
    result["warnings"] = list(result["kernel_warnings"])
    return result
