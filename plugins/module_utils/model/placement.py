# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Four-dimension overcommit placement (pure).

Per node and dimension: ``sum(allocated) + request <= physical * ratio`` (docs/host-backend.md
"How a start works", the KVMCloud model). Default ratios: CPU 4.0, memory 1.5, disk 2.0, bandwidth 1.0. A request over
any dimension is refused with the dimension named; a water level
``allocated / (physical * ratio) >= 0.90`` raises an alert. Units: vCPUs, MiB, MiB, Mbit/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

DIMENSIONS = ("cpu", "memory", "disk", "bandwidth")
UNITS = {"cpu": "vCPUs", "memory": "MiB", "disk": "MiB", "bandwidth": "Mbit/s"}
DEFAULT_RATIOS = {"cpu": 4.0, "memory": 1.5, "disk": 2.0, "bandwidth": 1.0}
DEFAULT_ALERT_LEVEL = 0.90


@dataclass(frozen=True)
class Node:
    """A hypervisor node's physical capacity per dimension and its overcommit ratios."""

    name: str
    physical: dict  # dimension -> capacity (vCPUs, MiB, MiB, Mbit/s)
    ratios: dict = field(default_factory=lambda: dict(DEFAULT_RATIOS))

    def capacity(self, dim: str) -> float:
        """``physical * ratio`` of one dimension."""
        return float(self.physical.get(dim, 0)) * float(self.ratios.get(dim, DEFAULT_RATIOS[dim]))


@dataclass(frozen=True)
class Verdict:
    """Placement outcome: ``fits``; when not, the first dimension over capacity and why."""

    fits: bool
    dimension: Optional[str] = None
    message: str = ""
    levels: dict = field(default_factory=dict)  # dimension -> water level after placement
    alerts: tuple = ()  # dimensions at or above the alert level after placement


def used(allocations: list[dict], node: str) -> dict:
    """Sum the allocations of ``node`` per dimension.

    ``allocations`` rows have keys node, vcpus, memory_mib, disk_mib, bandwidth_mbps.
    """
    total = dict.fromkeys(DIMENSIONS, 0.0)
    for a in allocations:
        if a["node"] != node:
            continue
        total["cpu"] += a["vcpus"]
        total["memory"] += a["memory_mib"]
        total["disk"] += a["disk_mib"]
        total["bandwidth"] += a["bandwidth_mbps"]
    return total


def check(node: Node, allocated: dict, request: dict, alert_level: float = DEFAULT_ALERT_LEVEL) -> Verdict:
    """Does ``request`` fit on ``node`` given what is ``allocated`` there?

    Args:
        node: the node and its ratios.
        allocated: dimension -> amount already allocated (see :func:`used`).
        request: dimension -> amount requested (missing dimensions count as 0).
        alert_level: water level (0-1) at which a dimension is reported in ``alerts``.

    Returns:
        A :class:`Verdict`; dimensions are checked in the order cpu, memory, disk, bandwidth.
    """
    levels = {}
    for dim in DIMENSIONS:
        cap = node.capacity(dim)
        after = allocated.get(dim, 0) + request.get(dim, 0)
        if request.get(dim, 0) > 0 and after > cap:
            free = max(cap - allocated.get(dim, 0), 0)
            return Verdict(False, dim,
                           f"{dim}: requested {request[dim]:g} {UNITS[dim]} but only {free:g}"
                           f" of {cap:g} {UNITS[dim]} (physical {node.physical.get(dim, 0):g} x ratio"
                           f" {node.ratios.get(dim, DEFAULT_RATIOS[dim]):g}) is free on node {node.name}")
        levels[dim] = after / cap if cap else 0.0
    alerts = tuple(d for d in DIMENSIONS if levels[d] >= alert_level)
    return Verdict(True, levels=levels, alerts=alerts)
