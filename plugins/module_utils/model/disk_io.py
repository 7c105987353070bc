# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Disk I/O limits of a VM's root disk: the fields, their ranges and the rule that combines the tenant's limits
with the operator's (pure; docs/api/cloudvm.md "DiskIO").

Four limits, each optional: ``readBytesPerSecond``, ``writeBytesPerSecond`` (bytes/s), ``readIOPS``,
``writeIOPS`` (requests/s), the terms of libvirt's ``<iotune>`` and OpenStack's ``disk_*_sec`` flavor keys. They
are the same in three places: the CloudVM's ``spec.diskIO`` (what the tenant asks), the operator's limits (host
configuration ``disk_io_limits``, the controller's ``diskIOLimits``) and the launcher's ``rootDisk.ioLimits``
(what the VMM enforces: QEMU's block I/O throttling of the root device, Firecracker's drive rate limiter).

The rule (:func:`effective`): the operator's limit is the default **and** the most any VM gets; a VM's own limit can
only lower it. A tenant cannot lift a limit an operator set, so one VM saturating the host's disk is bounded by the
operator however its spec reads.
"""

from __future__ import annotations

from typing import Mapping, Optional

KEYS = ("readBytesPerSecond", "writeBytesPerSecond", "readIOPS", "writeIOPS")
"""The limit names, in the order messages list them."""

# Below these a root disk cannot boot a guest within a readiness timeout (a Debian boot reads ~60 MiB in a few
# thousand requests); above them a limit limits nothing a virtio disk does. Units: bytes/s and requests/s.
BYTES_PER_SECOND_MIN, BYTES_PER_SECOND_MAX = 1048576, 1099511627776  # 1 MiB/s .. 1 TiB/s
IOPS_MIN, IOPS_MAX = 20, 10000000
RANGES = {"readBytesPerSecond": (BYTES_PER_SECOND_MIN, BYTES_PER_SECOND_MAX),
          "writeBytesPerSecond": (BYTES_PER_SECOND_MIN, BYTES_PER_SECOND_MAX),
          "readIOPS": (IOPS_MIN, IOPS_MAX), "writeIOPS": (IOPS_MIN, IOPS_MAX)}
UNITS = {"readBytesPerSecond": "bytes/s", "writeBytesPerSecond": "bytes/s",
         "readIOPS": "requests/s", "writeIOPS": "requests/s"}
OPTIONS = {"readBytesPerSecond": "read_bytes_per_second", "writeBytesPerSecond": "write_bytes_per_second",
           "readIOPS": "read_iops", "writeIOPS": "write_iops"}
"""API key -> the cloudvm module's ``disk_io`` suboption (the playbook variable is ``disk_<suboption>``)."""


def rule(key: str) -> str:
    """The allowed range of limit ``key`` in words, e.g. ``allowed 1048576 to 1099511627776 bytes/s``."""
    low, high = RANGES[key]
    return f"allowed {low} to {high} {UNITS[key]}"


def validate(limits: object, path: str) -> list[str]:
    """Check a mapping of limits (``spec.diskIO``, the operator's limits, ``rootDisk.ioLimits``).

    Args:
        limits: the mapping (any value: a non-mapping is a problem).
        path: the field path messages start with, e.g. ``spec.diskIO``.

    Returns:
        One message per problem, each ``<path>.<key>: <value> is above the maximum <n>`` and the like (empty when
        valid). Unknown keys are problems too.
    """
    if not isinstance(limits, Mapping):
        return [f"{path}: must be a mapping of {', '.join(KEYS)}"]
    errors = [f"{path}.{key}: unknown field (allowed: {', '.join(KEYS)})" for key in limits if key not in KEYS]
    for key in KEYS:
        value = limits.get(key)
        if value is None:
            continue
        low, high = RANGES[key]
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{path}.{key}: {value!r} is not an integer")
        elif value < low:
            errors.append(f"{path}.{key}: {value} is below the minimum {low}")
        elif value > high:
            errors.append(f"{path}.{key}: {value} is above the maximum {high}")
    return errors


def effective(vm_limits: Optional[Mapping], operator_limits: Optional[Mapping]) -> dict:
    """The limits a boot's VMM enforces: for each key the smaller of the VM's and the operator's, or the one of them
    that is set; keys neither sets are absent (no limit).

    Args:
        vm_limits: ``spec.diskIO`` (None or empty: the VM asks for nothing).
        operator_limits: the backend's configured limits (None or empty: none).

    Returns:
        ``{key: int}`` in :data:`KEYS` order, only the keys limited.
    """
    out = {}
    for key in KEYS:
        values = [int(m[key]) for m in (vm_limits or {}, operator_limits or {}) if m.get(key) is not None]
        if values:
            out[key] = min(values)
    return out
