#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cloudvm_info
short_description: List CloudVMs and their status
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Returns CloudVM objects (spec and status) from the host store or the Kubernetes API, filtered by name,
    namespace, owner and labels. Never changes a CloudVM.
  - With O(authorize), it is also the owner check a playbook makes before it acts on a VM it looked up (the
    C(vm_stop), C(vm_restart) and C(vm_backup) playbooks do), and fails with C(reason=Forbidden) when a CloudVM
    found belongs to another owner; and that refusal is recorded like any other (docs/security.md, "Audit").
extends_documentation_fragment:
  - zjusct.cloud.cloudvm_backend
  - kubernetes.core.k8s_auth_options
options:
  name:
    description: Only the CloudVM with this name.
    type: str
  namespace:
    description: Only CloudVMs in this namespace (all namespaces when omitted).
    type: str
  owner:
    description: Only CloudVMs whose C(spec.owner) is this user id.
    type: str
  label_selectors:
    description: Label selectors (C(key=value), C(key!=value)); all must match.
    type: list
    elements: str
    default: []
  authorize:
    description:
      - Refuse (fail with C(reason=Forbidden), naming both owners) unless every CloudVM found may be acted on by
        O(authorize.owner) - its C(spec.owner) is that owner, or O(authorize.operator) is set - for
        O(authorize.action).
      - On the host backend the refusal is written to the host store's audit trail (actor O(authorize.owner),
        action O(authorize.action), result C(refused)), the only write this module ever makes.
      - On Kubernetes the check is first asked of the API server, as a server-side dry run of a label change
        (C(cloud.zjusct.io/authorized-for), nothing is stored) made with the module's credentials, so the owner
        admission policy decides and the API server's audit log records a refusal; the owner comparison is then
        also made here, for a cluster without the policy.
    type: dict
    suboptions:
      owner:
        description: The acting user (the owner a playbook acts for; under AWX the launching user).
        type: str
        required: true
      operator:
        description: The operator switch (docs/security.md); any owner's VM may be acted on.
        type: bool
        default: false
      action:
        description: What the caller is about to do, for the refusal's message and its audit record.
        type: str
        required: true
        choices: [start, stop, restart, update, delete, backup, restore]
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
requirements:
  - With O(backend=kubernetes) on the managed node, the Python library C(kubernetes) (24.2.0 or later) and the
    collection C(kubernetes.core).
notes:
  - On Kubernetes, O(owner) is a field selector (C(spec.owner) is a selectable field of the CRD) and O(name)
    without O(namespace) searches every namespace, which needs cluster-wide list rights.
  - On Kubernetes a status that says C(Running) is also checked against its launcher Pod (RV(running_doubts)); the
    C(status) returned is never changed by that check.
seealso:
  - module: zjusct.cloud.cloudvm
"""

EXAMPLES = r"""
- name: Alice's VMs on this host
  zjusct.cloud.cloudvm_info:
    owner: alice
  register: vms

- name: Running VMs of a course in a tenant namespace on Kubernetes
  zjusct.cloud.cloudvm_info:
    backend: kubernetes
    namespace: tenant-alice
    label_selectors:
      - course=hpc101
  register: course_vms

- name: Look up alice's VM web before stopping it; refused (and audited) if it is not hers
  zjusct.cloud.cloudvm_info:
    name: web
    namespace: default
    authorize:
      owner: alice
      action: stop
  register: found

- name: Show their phases
  ansible.builtin.debug:
    msg: "{{ vms.cloudvms | map(attribute='status.phase') | list }}"
"""

RETURN = r"""
cloudvms:
  description: The matching CloudVMs, ordered by namespace and name.
  returned: always
  type: list
  elements: dict
  sample:
    - metadata: {name: alice, namespace: default}
      spec: {owner: alice, powerState: Running, bootID: 2}
      status: {phase: Running, sshEndpoint: {host: 10.200.0.2, port: 22}}
running_doubts:
  description:
    - The CloudVMs found whose status says C(Running) while their launcher Pod (C(status.pod)) does not back it, keyed
      C(<namespace>/<name>), each with why - the Pod is gone, being deleted, or its C(Ready) condition is not True
      (its node stopped reporting, or the launcher's readiness probe fails). The status is written by the controller
      alone, which may be down; C(cloudvms) still shows the status as written.
    - Kubernetes only, with one Pod list per namespace that has such a VM. Empty on the host backend (its statuses
      are derived from what runs) and when the Pods may not be read (403) or cannot be reached.
  returned: always
  type: dict
  sample:
    default/alice: >-
      status says Running but launcher Pod alice-boot-3 is not Ready (Ready=False, since 2026-12-06T20:35:10Z) on node
      node-2: its node may have stopped reporting (kube-controller-manager then marks every Pod of the node not Ready)
      or the launcher's readiness probe fails; the controller has not recorded that (it may be down or unable to
      update the status)
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm_info_module import (
    cloudvm_info_argument_spec,
    run_cloudvm_info,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module


def main() -> None:
    module = AnsibleModule(argument_spec=cloudvm_info_argument_spec(), supports_check_mode=True)
    run_module(module, run_cloudvm_info)


if __name__ == "__main__":
    main()
