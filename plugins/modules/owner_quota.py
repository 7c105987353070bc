#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: owner_quota
short_description: Set or remove one owner's quota on the single-host backend
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Sets the limits of one owner (the CloudVM C(spec.owner)) in the host store, or removes them. M(zjusct.cloud.cloudvm)
    checks them in the same store transaction that writes a VM's spec, so concurrent runs cannot together exceed
    them; a refusal fails with C(reason=QuotaExceeded) naming the quota, the owner, the usage, the request and the
    limit.
  - What counts (docs/security.md, Quotas) - O(vms) every CloudVM of the owner; O(disk_mib) every root volume
    the owner owns; O(vcpus), O(memory_mib) and O(bandwidth_mbps) (guaranteed) the CloudVMs whose C(spec.powerState)
    is C(Running).
  - An owner without a quota, or a limit omitted, is unlimited. The row holds exactly the limits the task gives.
  - Lowering a limit below the current usage stops nothing; the task warns, and the next growth is refused.
  - Every change is written to the audit trail (M(zjusct.cloud.audit_info)).
options:
  owner:
    description: The owner (a DNS label, as in C(spec.owner)).
    type: str
    required: true
  state:
    description: C(present) sets the limits given; C(absent) removes the owner's quota (unlimited).
    type: str
    choices: [present, absent]
    default: present
  vms:
    description: Most CloudVMs the owner may have, in any power state. Omit for no limit.
    type: int
  vcpus:
    description: Most vCPUs summed over the owner's CloudVMs asked to run. Omit for no limit.
    type: int
  memory_mib:
    description: Most memory (MiB) summed over the owner's CloudVMs asked to run. Omit for no limit.
    type: int
  disk_mib:
    description: Most root volume size (MiB) summed over every volume the owner owns. Omit for no limit.
    type: int
  bandwidth_mbps:
    description:
      - Most guaranteed bandwidth (Mbit/s, C(spec.network.bandwidth.guaranteedMbps)) summed over the owner's
        CloudVMs asked to run; ceilings are borrowed and not counted. Omit for no limit.
    type: int
  actor:
    description: Who is setting the quota, as recorded in the audit trail.
    type: str
    default: operator
extends_documentation_fragment:
  - zjusct.cloud.host_config
attributes:
  check_mode:
    support: full
    description: Reports whether the quota would change and the owner's usage, without writing.
  diff_mode:
    support: full
    description: Shows the limits before and after.
notes:
  - Host backend only. On Kubernetes, quotas are the cluster's ResourceQuota per namespace (docs/security.md).
seealso:
  - module: zjusct.cloud.audit_info
  - module: zjusct.cloud.cloudvm
"""

EXAMPLES = r"""
- name: Limit alice to two VMs, 4 vCPUs and 4 GiB running, 20 GiB of disk, 100 Mbit/s guaranteed
  zjusct.cloud.owner_quota:
    owner: alice
    vms: 2
    vcpus: 4
    memory_mib: 4096
    disk_mib: 20480
    bandwidth_mbps: 100

- name: Remove bob's quota (unlimited)
  zjusct.cloud.owner_quota:
    owner: bob
    state: absent
"""

RETURN = r"""
owner:
  description: The owner.
  returned: success
  type: str
  sample: alice
quota:
  description: The limits after the task (null per limit for unlimited); null when the owner has no quota.
  returned: success
  type: dict
  sample: {vms: 2, vcpus: 4, memory_mib: 4096, disk_mib: 20480, bandwidth_mbps: null}
usage:
  description: What the owner uses now, counted as the quota counts it.
  returned: success
  type: dict
  sample: {vms: 1, vcpus: 1, memory_mib: 512, disk_mib: 2048, bandwidth_mbps: 0}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module
from ansible_collections.zjusct.cloud.plugins.module_utils.model.quota import LIMITS
from ansible_collections.zjusct.cloud.plugins.module_utils.host.tenancy_module import run_owner_quota

ARGUMENT_SPEC: dict = {
    "owner": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "actor": {"type": "str", "default": "operator"},
    "host_config": {"type": "path"},
    **{dim: {"type": "int"} for dim in LIMITS},  # the quota dimensions (docs/security.md, "Quotas")
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_owner_quota, diff=True)


if __name__ == "__main__":
    main()
