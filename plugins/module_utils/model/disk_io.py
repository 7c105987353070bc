# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Disk I/O limits of a VM's root disk: the rule that combines the tenant's limits with the operator's (pure;
docs/api/cloudvm.md "DiskIO"; the fields and their ranges are :data:`model.spec.DISK_IO`).

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

from ansible_collections.zjusct.cloud.plugins.module_utils.model.spec import DISK_IO


def effective(vm_limits: Optional[Mapping], operator_limits: Optional[Mapping]) -> dict:
    """The limits a boot's VMM enforces: for each key the smaller of the VM's and the operator's, or the one of them
    that is set; keys neither sets are absent (no limit).

    Args:
        vm_limits: ``spec.diskIO`` (None or empty: the VM asks for nothing).
        operator_limits: the backend's configured limits (None or empty: none).

    Returns:
        ``{key: int}`` in :data:`model.spec.DISK_IO` order, only the keys limited.
    """
    out = {}
    for key in DISK_IO:
        values = [int(m[key]) for m in (vm_limits or {}, operator_limits or {}) if m.get(key) is not None]
        if values:
            out[key] = min(values)
    return out
