#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_node_resources
short_description: Advertise extended resources in a Kubernetes Node's status capacity
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Sets (or removes) extended resources such as C(cloud.zjusct.io/bandwidth-mbps) in C(status.capacity) and
    C(status.allocatable) of one Node, with a JSON Patch of the C(nodes/<name>/status) subresource, as
    U(https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/) shows. The scheduler then
    places Pods so that the sum of their requests of a resource never exceeds what the Node advertises.
  - kubernetes.core.k8s cannot write a subresource, hence this module.
  - Changes nothing (and reports C(changed=false)) when capacity and allocatable already hold the values,
    compared as quantities.
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
options:
  name:
    description: The Node's name.
    type: str
    required: true
  resources:
    description:
      - Extended resource name (C(<domain>/<name>), the domain outside C(kubernetes.io)) -> integer quantity >= 0.
      - With O(state=absent) only the names count.
    type: dict
    required: true
  state:
    description: C(present) sets each resource to its value; C(absent) removes each from capacity and allocatable.
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    support: full
    description: Reads the Node and reports what would change; sends no patch.
  diff_mode:
    support: full
    description: C(before)/C(after) hold the named resources' capacity.
requirements:
  - The Python library C(kubernetes) and the collection C(kubernetes.core).
  - The C(patch) right on C(nodes/status) (cluster administrators have it).
notes:
  - A kubelet keeps an extended resource it does not manage across its restarts (measured with kubelet 1.35), but
    a Node object deleted and registered again comes back without it, and a kubelet that finds no device-plugin
    checkpoint when it registers (a reinstalled node) sets it to 0. Run this module (the C(cluster) role) again
    after either.
seealso:
  - name: Advertise Extended Resources for a Node
    description: The Kubernetes task this module carries out.
    link: https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/
"""

EXAMPLES = r"""
- name: Node hv1 offers 10 Gbit/s of guaranteed bandwidth to launcher Pods
  zjusct.cloud.k8s_node_resources:
    kubeconfig: ~/.kube/config
    name: hv1
    resources:
      cloud.zjusct.io/bandwidth-mbps: 10000

- name: Stop advertising it
  zjusct.cloud.k8s_node_resources:
    name: hv1
    resources:
      cloud.zjusct.io/bandwidth-mbps: 0
    state: absent
"""

RETURN = r"""
node:
  description: The Node's name.
  returned: always
  type: str
  sample: hv1
capacity:
  description: The named resources' capacity after the task (null when removed), as quantity strings.
  returned: always
  type: dict
  sample: {"cloud.zjusct.io/bandwidth-mbps": "10000"}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.client import auth_argument_spec
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module
from ansible_collections.zjusct.cloud.plugins.module_utils.k8s.k8s_node_resources_module import run_k8s_node_resources

ARGUMENT_SPEC: dict = {
    "name": {"type": "str", "required": True},
    "resources": {"type": "dict", "required": True},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    **auth_argument_spec(),  # kubernetes.core's connection options
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_k8s_node_resources, diff=True)


if __name__ == "__main__":
    main()
