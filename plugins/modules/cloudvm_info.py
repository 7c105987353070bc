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
    namespace, owner and labels. Never changes anything.
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
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.cloudvm_module import (
    cloudvm_info_argument_spec,
    run_cloudvm_info,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module


def main() -> None:
    module = AnsibleModule(argument_spec=cloudvm_info_argument_spec(), supports_check_mode=True)
    run_module(module, run_cloudvm_info)


if __name__ == "__main__":
    main()
