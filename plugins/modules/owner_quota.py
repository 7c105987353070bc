#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: owner_quota
short_description: Set or remove one owner's quota (host store or Kubernetes CloudQuota)
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Sets the limits of one owner (the CloudVM C(spec.owner)), or removes them, on either backend. The rules of what
    counts are the same on both (docs/security.md, Quotas) - O(vms) the owner's CloudVMs; O(disk_mib) their root
    volumes; O(vcpus), O(memory_mib) and O(bandwidth_mbps) (guaranteed) the CloudVMs whose C(spec.powerState) is
    C(Running). A refusal names the quota, the owner, the usage, the request and the limit, with
    C(reason=QuotaExceeded).
  - O(backend=host) writes the host store's quota row. M(zjusct.cloud.cloudvm) checks it in the same store
    transaction that writes a VM's spec, so concurrent runs cannot together exceed it; O(disk_mib) counts every root
    volume the owner owns. Every change is written to the audit trail (M(zjusct.cloud.audit_info)).
  - O(backend=kubernetes) writes the cluster-scoped C(CloudQuota) named after the owner
    (C(cloudquotas.cloud.zjusct.io), applied by C(site.yml)'s cluster role). The controller admits each boot of the
    owner's CloudVMs, in every namespace it watches, only within it; a boot that does not fit stays
    C(Blocked/QuotaExceeded) with the refusal as its status message and a Warning Event, and starts by itself once it
    fits (another VM stopped or deleted, the quota raised). There a CloudVM counts toward O(vms) and its root volume
    claim toward O(disk_mib) from its first admitted boot until it is deleted (the API server accepts the object
    itself; a CloudVM beyond O(vms) never boots). The usage returned is counted over the CloudVMs the connection may
    list, cluster-wide.
  - An owner without a quota, or a limit omitted, is unlimited. The quota holds exactly the limits the task gives.
  - Lowering a limit below the current usage stops nothing; the task warns, and the next growth is refused.
extends_documentation_fragment:
  - zjusct.cloud.cloudvm_backend
  - kubernetes.core.k8s_auth_options
options:
  owner:
    description: The owner (a DNS label, as in C(spec.owner)); on Kubernetes also the CloudQuota's name.
    type: str
    required: true
  state:
    description: C(present) sets the limits given; C(absent) removes the owner's quota (unlimited).
    type: str
    choices: [present, absent]
    default: present
  vms:
    description: Most CloudVMs the owner may have, in any power state (CloudQuota C(spec.vms)). Omit for no limit.
    type: int
  vcpus:
    description: Most vCPUs summed over the owner's CloudVMs asked to run (C(spec.vcpus)). Omit for no limit.
    type: int
  memory_mib:
    description: Most memory (MiB) summed over the owner's CloudVMs asked to run (C(spec.memoryMiB)). Omit for no limit.
    type: int
  disk_mib:
    description:
      - Most root volume size (MiB) summed over the owner's volumes (C(spec.diskMiB)). Omit for no limit.
      - On Kubernetes the root volume claims of the owner's admitted CloudVMs, each at C(status.capacity.storage)
        (else its requested size).
    type: int
  bandwidth_mbps:
    description:
      - Most guaranteed bandwidth (Mbit/s, C(spec.network.bandwidth.guaranteedMbps)) summed over the owner's
        CloudVMs asked to run; ceilings are borrowed and not counted (C(spec.bandwidthMbps)). Omit for no limit.
    type: int
  actor:
    description:
      - Who is setting the quota, as recorded in the host store's audit trail.
      - Not used on Kubernetes, where the API server's audit log records the authenticated user.
    type: str
    default: operator
attributes:
  check_mode:
    support: full
    description:
      - Reports whether the quota would change and the owner's usage, without writing.
      - On Kubernetes the write is sent as a server-side dry run, so the API server's validation and authorization
        answer too.
  diff_mode:
    support: full
    description: Shows the limits before and after.
requirements:
  - With O(backend=kubernetes), the Python library C(kubernetes) and the collection C(kubernetes.core); the rights
    to write C(cloudquotas) (cluster administrators, or the operators the cluster grants them; no role of
    C(config/rbac) grants it to tenants) and to list C(cloudvms) and read C(persistentvolumeclaims) for the usage.
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

- name: The same limits for alice on Kubernetes (her CloudQuota, over every namespace)
  zjusct.cloud.owner_quota:
    backend: kubernetes
    kubeconfig: ~/.kube/config
    owner: alice
    vcpus: 4
    memory_mib: 4096
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
  description: What the owner uses now, counted as the quota counts it (on Kubernetes as the controller counts it).
  returned: success
  type: dict
  sample: {vms: 1, vcpus: 1, memory_mib: 512, disk_mib: 2048, bandwidth_mbps: 0}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.owner_quota_module import (
    owner_quota_argument_spec,
    run_owner_quota,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module


def main() -> None:
    module = AnsibleModule(argument_spec=owner_quota_argument_spec(), supports_check_mode=True)
    run_module(module, run_owner_quota, diff=True)


if __name__ == "__main__":
    main()
