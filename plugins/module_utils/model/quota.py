# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-owner quotas (pure): what an owner uses, what a change adds, and whether a limit allows it.

The rules (docs/security.md, "Quotas"), after OpenStack's compute quotas (instances, cores, ram,
https://docs.openstack.org/nova/latest/user/quotas.html):

* ``vms``: every CloudVM of the owner, whatever its power state (a record holds a name, a lease
  and a root volume).
* ``disk_mib``: the size of every root volume owned by the owner, claimed or not (the bytes exist
  until the volume is deleted).
* ``vcpus``, ``memory_mib``, ``bandwidth_mbps`` (guaranteed): summed over the owner's CloudVMs whose
  ``spec.powerState`` is Running (asked to run, whether booting, running or crashed): stopping a VM
  frees them, like a stopped (shelved) instance. ``bandwidth_mbps`` counts
  ``spec.network.bandwidth.guaranteedMbps``, the part the node reserves; the ceiling is borrowed
  and not counted.

A change is checked only on the dimensions it grows (``after > before``), so a quota lowered below
what an owner already uses never blocks a stop, a delete, a shrink or an unrelated update; it
refuses the next growth. No quota row, or a limit of None, means unlimited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

LIMITS = ("vms", "vcpus", "memory_mib", "disk_mib", "bandwidth_mbps")
UNITS = {"vms": "VMs", "vcpus": "vCPUs", "memory_mib": "MiB of memory", "disk_mib": "MiB of disk",
         "bandwidth_mbps": "Mbit/s of guaranteed bandwidth"}
# what the user typed (cloudvm option / vm_start variable) that asks for each dimension
OPTIONS = {"vms": "name (a new CloudVM)", "vcpus": "vcpus", "memory_mib": "memory_mib",
           "disk_mib": "volume_size_mib (a new root volume)", "bandwidth_mbps": "bandwidth.guaranteed_mbps"}


# how an owner frees each dimension (the refusal's advice)
FREE = {"vms": "delete another VM", "vcpus": "stop another VM", "memory_mib": "stop another VM",
        "disk_mib": "delete another VM with delete_volume=true", "bandwidth_mbps": "stop another VM"}


def zero() -> dict:
    """A footprint of nothing: every dimension 0."""
    return dict.fromkeys(LIMITS, 0)


def vm_footprint(spec: Optional[dict]) -> dict:
    """What one CloudVM spec counts against its owner's quota, except disk (see :func:`usage`).

    Args:
        spec: a CloudVM spec (camelCase API fields: vcpus, memoryMiB, powerState,
            network.bandwidth.guaranteedMbps), or None for no VM.

    Returns:
        dimension -> amount (``vms`` 1; vCPUs, MiB, Mbit/s only when ``powerState`` is Running).
    """
    out = zero()
    if not spec:
        return out
    out["vms"] = 1
    if spec.get("powerState") == "Running":
        out["vcpus"] = int(spec.get("vcpus") or 0)
        out["memory_mib"] = int(spec.get("memoryMiB") or 0)
        band = (spec.get("network") or {}).get("bandwidth") or {}
        out["bandwidth_mbps"] = int(band.get("guaranteedMbps") or 0)
    return out


def usage(specs: list[dict], volume_sizes_mib: list[int]) -> dict:
    """An owner's usage: the sum of :func:`vm_footprint` over ``specs`` plus the volumes' sizes.

    Args:
        specs: the specs of every CloudVM of the owner.
        volume_sizes_mib: the size (MiB) of every root volume the owner owns.
    """
    total = zero()
    for spec in specs:
        for dim, amount in vm_footprint(spec).items():
            total[dim] += amount
    total["disk_mib"] = sum(int(s) for s in volume_sizes_mib)
    return total


@dataclass(frozen=True)
class Refusal:
    """A change over a quota: the dimension, its limit, the usage now and what the change adds."""

    owner: str
    dimension: str
    limit: int
    in_use: int
    requested: int
    asked_by: str = ""  # the option that asks, when not the cloudvm one of OPTIONS (host_volume: rbd_image)

    @property
    def message(self) -> str:
        """``vcpus: owner 'alice' would use 5 of quota 4 vCPUs (in use 4, this request 1, asked by vcpus); ...``."""
        dim = self.dimension
        return (f"{dim}: owner {self.owner!r} would use {self.in_use + self.requested} of quota {self.limit}"
                f" {UNITS[dim]} (in use {self.in_use}, this request {self.requested},"
                f" asked by {self.asked_by or OPTIONS[dim]});"
                f" {FREE[dim]} of {self.owner!r}, or ask the operator to raise owner_quota {dim}")

    def details(self) -> dict:
        """The module result's failure fields (``reason: QuotaExceeded``)."""
        return {"reason": "QuotaExceeded", "quota": self.dimension, "owner": self.owner, "limit": self.limit,
                "in_use": self.in_use, "requested": self.requested}


def check(owner: str, quota: Optional[dict], in_use: dict, before: dict, after: dict) -> Optional[Refusal]:
    """Does changing one owner's footprint from ``before`` to ``after`` stay within ``quota``?

    Args:
        owner: the owner (named in the refusal).
        quota: dimension -> limit (an int >= 0, or None for unlimited); None for no quota at all.
        in_use: the owner's usage now (:func:`usage`), ``before`` included.
        before: what the object being changed counts now (zeros for a new one).
        after: what it would count after the change.

    Returns:
        None when allowed, else the first dimension (in :data:`LIMITS` order) the change grows past
        its limit.
    """
    if not quota:
        return None
    for dim in LIMITS:
        limit = quota.get(dim)
        grow = int(after.get(dim, 0)) - int(before.get(dim, 0))
        if limit is None or grow <= 0:
            continue
        if int(in_use.get(dim, 0)) + grow > int(limit):
            return Refusal(owner, dim, int(limit), int(in_use.get(dim, 0)), grow)
    return None


def validate_limits(limits: dict) -> list[str]:
    """Errors of an owner_quota request: every limit None or an integer >= 0 (option named)."""
    errors = []
    for dim in LIMITS:
        value = limits.get(dim)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            errors.append(f"{dim}: {value!r} is not an integer >= 0 (omit it for no limit on {UNITS[dim]})")
    return errors
