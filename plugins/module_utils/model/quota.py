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

import re
from dataclasses import dataclass, replace
from typing import Optional

LIMITS = ("vms", "vcpus", "memory_mib", "disk_mib", "bandwidth_mbps")
UNITS = {"vms": "VMs", "vcpus": "vCPUs", "memory_mib": "MiB of memory", "disk_mib": "MiB of disk",
         "bandwidth_mbps": "Mbit/s of guaranteed bandwidth"}
# what the user typed (cloudvm option / vm_start variable) that asks for each dimension
OPTIONS = {"vms": "name (a new CloudVM)", "vcpus": "vcpus", "memory_mib": "memory_mib",
           "disk_mib": "volume_size_mib (the root volume's size)", "bandwidth_mbps": "bandwidth.guaranteed_mbps"}


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


# --------------------------------------------------------------------------- Kubernetes
#
# On Kubernetes the API server accepts every CloudVM an owner may create (it cannot sum over other objects), so the
# quota is enforced where a boot consumes resources: the controller admits a boot only when it fits (docs/security.md,
# "Quotas on Kubernetes"). What a CloudVM object counts follows the rules above, restricted to what was admitted:
#
# * a CloudVM counts ``vms`` and its root volume's size (``disk_mib``: the claim's, or ``spec.rootVolumeSizeMiB`` when
#   larger, :func:`root_volume_mib`) from its first admitted boot until it is deleted (a CloudVM that was never
#   admitted is the host's refused create: it holds nothing); a boot that grows the volume asks for the growth;
# * it counts ``vcpus``, ``memory_mib`` and ``bandwidth_mbps`` (:func:`vm_footprint`) while its ``spec.bootID`` is
#   the admitted boot and ``spec.powerState`` is Running (a refused start holds nothing, a stop frees them).
#
# The admitted boot is the status field ``admittedBootID`` (written only by the controller, through the status
# subresource), or for a status written before that field existed the bootID of a status naming its launcher Pod.

CRD_PLURAL = "cloudquotas"
CRD_KIND = "CloudQuota"
ADMITTED_FIELD = "admittedBootID"
# dimension -> the CloudQuota spec field that limits it
API_FIELDS = {"vms": "vms", "vcpus": "vcpus", "memory_mib": "memoryMiB", "disk_mib": "diskMiB",
              "bandwidth_mbps": "bandwidthMbps"}
# dimension -> the CloudVM field that asks for it (the refusal's "asked by")
ASKED_FIELDS = {"vms": "metadata.name", "vcpus": "spec.vcpus", "memory_mib": "spec.memoryMiB",
                "disk_mib": "spec.rootVolumeClaim", "bandwidth_mbps": "spec.network.bandwidth.guaranteedMbps"}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)|[eE]([0-9]+))?$")


def limits_from_spec(spec: Optional[dict]) -> dict:
    """A CloudQuota's ``spec`` (``vms``, ``vcpus``, ``memoryMiB``, ``diskMiB``, ``bandwidthMbps``; absent:
    unlimited) as dimension -> limit (int, or None for unlimited), the shape :func:`check` takes."""
    spec = spec or {}
    return {dim: (None if spec.get(field) is None else int(spec[field])) for dim, field in API_FIELDS.items()}


def spec_from_limits(limits: dict) -> dict:
    """Dimension -> limit (None: unlimited) as a CloudQuota ``spec`` (unlimited dimensions left out)."""
    return {field: int(limits[dim]) for dim, field in API_FIELDS.items() if limits.get(dim) is not None}


def quantity_mib(quantity: object) -> int:
    """A Kubernetes quantity of bytes (``2Gi``, ``2048Mi``, ``1.5G``, ``1e9``, ``1073741824``) in MiB, rounded up.

    Raises:
        ValueError: not a non-negative quantity (the message names the value).
    """
    text = str(quantity).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity of bytes (such as 2Gi or 2048Mi)")
    number, suffix, exponent = match.groups()
    scale = _BINARY.get(suffix or "") or _DECIMAL.get(suffix or "", 1)
    whole, _dot, frac = number.partition(".")
    frac = frac or ""
    numerator = int(whole or "0") * 10 ** len(frac) + int(frac or "0")
    numerator *= scale * (10 ** int(exponent) if exponent else 1)
    denominator = 10 ** len(frac) * 2**20
    return -(-numerator // denominator)


def claim_mib(claim: Optional[dict]) -> int:
    """A PersistentVolumeClaim's size in MiB: ``status.capacity.storage`` once bound, else
    ``spec.resources.requests.storage``; 0 for no claim or no size (a size that is not a quantity counts 0)."""
    if not claim:
        return 0
    size = ((claim.get("status") or {}).get("capacity") or {}).get("storage") or (
        ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
    try:
        return quantity_mib(size) if size is not None else 0
    except ValueError:
        return 0


def root_volume_mib(claim: Optional[dict], spec: Optional[dict]) -> int:
    """The size in MiB a CloudVM's root volume counts on Kubernetes: its claim's size (:func:`claim_mib`), or the
    size its spec grows it to (``spec.rootVolumeSizeMiB``: the launcher grows the RBD image at the next boot while
    the claim keeps its capacity), whichever is larger."""
    return max(claim_mib(claim), int((spec or {}).get("rootVolumeSizeMiB") or 0))


def admitted_boot(status: Optional[dict]) -> Optional[int]:
    """The boot of a CloudVM the controller last admitted, from its status (None: never admitted)."""
    status = status or {}
    if status.get(ADMITTED_FIELD) is not None:
        return int(status[ADMITTED_FIELD])
    if status.get("pod") and status.get("bootID") is not None:  # a status from before admittedBootID existed
        return int(status["bootID"])
    return None


@dataclass(frozen=True)
class Counted:
    """One CloudVM as the Kubernetes quota counts it.

    Attributes:
        spec: the CloudVM's spec (camelCase).
        admitted: the boot the controller admitted last (None: never admitted).
        claim: ``(namespace, name)`` of its root volume claim (one claim is counted once however many VMs name it).
        disk_mib: that claim's size, or the size the spec grows the volume to (:func:`root_volume_mib`).
        held_disk_mib: what the volume holds before the next boot grows it (the claim's size, :func:`claim_mib`);
            None: ``disk_mib``. :func:`check_boot` counts the growth (``disk_mib - held_disk_mib``) as asked by the
            boot, so a boot that would grow the volume past the owner's ``diskMiB`` is refused.
    """

    spec: dict
    admitted: Optional[int]
    claim: tuple
    disk_mib: int
    held_disk_mib: Optional[int] = None


def counted_footprint(item: Counted) -> dict:
    """What one :class:`Counted` CloudVM holds (module comment above), disk included."""
    out = zero()
    if item.admitted is None:
        return out
    out["vms"] = 1
    out["disk_mib"] = int(item.disk_mib)
    if item.admitted == int((item.spec or {}).get("bootID") or 0):
        running = vm_footprint(item.spec)
        for dim in ("vcpus", "memory_mib", "bandwidth_mbps"):
            out[dim] = running[dim]
    return out


def counted_usage(items: list) -> dict:
    """The sum of :func:`counted_footprint` over ``items``; each claim's size counted once."""
    return _counted_sum(items)[0]


def _counted_sum(items: list) -> tuple:
    """``(usage, claims)``: :func:`counted_usage` and the size counted per claim."""
    total = zero()
    claims: dict = {}
    for item in items:
        fp = counted_footprint(item)
        for dim in LIMITS:
            if dim != "disk_mib":
                total[dim] += fp[dim]
        if fp["vms"]:
            claims[item.claim] = max(claims.get(item.claim, 0), fp["disk_mib"])
    total["disk_mib"] = sum(claims.values())
    return total, claims


def _with(base: tuple, item: Counted) -> dict:
    """``base`` (:func:`_counted_sum` of other items) plus ``item``, its claim counted once."""
    total, claims = base
    out = dict(total)
    fp = counted_footprint(item)
    for dim in LIMITS:
        if dim != "disk_mib":
            out[dim] += fp[dim]
    if fp["vms"]:
        out["disk_mib"] += max(0, fp["disk_mib"] - claims.get(item.claim, 0))
    return out


def asked_by(dimension: str, namespace: str, name: str, claim: str = "") -> str:
    """The refusal's "asked by" on Kubernetes: the option and the CloudVM field, e.g. ``vcpus, spec.vcpus of
    CloudVM team-a/web``; for disk also the claim (``... spec.rootVolumeClaim web-root of CloudVM team-a/web``)."""
    option = OPTIONS[dimension].split(" (")[0]
    field = ASKED_FIELDS[dimension] + (f" {claim}" if dimension == "disk_mib" and claim else "")
    return f"{option}, {field} of CloudVM {namespace}/{name}"


def check_boot(owner: str, quota: Optional[dict], others: list, this: Counted, namespace: str, name: str
               ) -> Optional[Refusal]:
    """May the boot ``this.spec.bootID`` of one CloudVM be admitted within its owner's quota?

    Args:
        owner: the owner (``spec.owner``).
        quota: dimension -> limit (:func:`limits_from_spec`), None when the owner has no CloudQuota.
        others: every other CloudVM of the owner (:class:`Counted`), in every namespace the controller sees.
        this: the CloudVM to boot, as counted now (``admitted`` its last admitted boot).
        namespace, name: the CloudVM (named in the refusal).

    Returns:
        None when the boot fits (or the owner is unlimited); else the :class:`Refusal` of the first dimension it
        grows past its limit, with the usage before the boot and what the boot adds (a boot only grows what it does
        not hold yet: a first boot adds ``vms`` and the claim's size, every boot adds ``vcpus``, ``memory_mib``,
        ``bandwidth_mbps`` when ``spec.powerState`` is Running, and the growth of the root volume
        ``spec.rootVolumeSizeMiB`` asks beyond the claim's size, :attr:`Counted.held_disk_mib`).
    """
    if not quota:
        return None
    base = _counted_sum(others)  # one pass over the owner's VMs: the boot's before and after differ only in this
    held = this.disk_mib if this.held_disk_mib is None else min(this.held_disk_mib, this.disk_mib)
    before = _with(base, replace(this, disk_mib=held))
    after = _with(base, Counted(this.spec, int((this.spec or {}).get("bootID") or 0), this.claim, this.disk_mib))
    refusal = check(owner, quota, before, before, after)
    if refusal is None:
        return None
    return replace(refusal, asked_by=asked_by(refusal.dimension, namespace, name, str(this.claim[1])))


_REFUSAL = re.compile(r"^(?P<quota>[a-z_]+): owner '(?P<owner>[^']*)' would use \d+ of quota (?P<limit>\d+) .*?"
                      r"\(in use (?P<in_use>\d+), this request (?P<requested>\d+),")


def parse_message(message: Optional[str]) -> Optional[dict]:
    """The :meth:`Refusal.details` fields back from a :attr:`Refusal.message` (as a CloudVM's status carries it on
    Kubernetes), or None when ``message`` is not one."""
    match = _REFUSAL.match(message or "")
    if not match or match["quota"] not in LIMITS:
        return None
    return {"reason": "QuotaExceeded", "quota": match["quota"], "owner": match["owner"],
            "limit": int(match["limit"]), "in_use": int(match["in_use"]), "requested": int(match["requested"])}
