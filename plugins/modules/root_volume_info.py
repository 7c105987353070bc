#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: root_volume_info
short_description: Describe a CloudVM's root volume in one shape on either backend
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Looks up a root volume by its name (a CloudVM's C(spec.rootVolumeClaim)) or by the name of the CloudVM that would
    get it by default (C(<vm>-root)) and returns it in the same shape on both backends, with what a backup or a
    restore needs to know. Never changes anything.
  - On the host backend the volume is the host store's record (as M(zjusct.cloud.host_volume_info) returns it); the
    store's volume names are host-wide, so O(namespace) is not used.
  - On Kubernetes the volume is the PersistentVolumeClaim O(namespace)/O(name), when it is Bound, and the
    PersistentVolume it names (C(spec.volumeName)) when that PV's C(spec.claimRef) is this claim; an RBD volume
    is a PV of the CSI driver C(rbd.csi.ceph.com) naming C(volumeAttributes) C(pool) and C(imageName)
    (docs/controller.md, Root disk). Reading them needs C(get) on both kinds.
  - The backup and restore playbooks use it for both backends (docs/playbooks.md).
extends_documentation_fragment:
  - zjusct.cloud.cloudvm_backend
  - kubernetes.core.k8s_auth_options
options:
  name:
    description:
      - Name of the root volume (host store) or of the PersistentVolumeClaim (Kubernetes), a DNS subdomain.
      - Exactly one of O(name) and O(vm).
    type: str
  vm:
    description:
      - Name of a CloudVM (a DNS label); the volume looked up is the root volume a new CloudVM of that name gets,
        C(<vm>-root) (docs/playbooks.md). Returned as RV(name).
      - Exactly one of O(name) and O(vm).
    type: str
  namespace:
    description: Namespace of the claim (Kubernetes); not used on the host backend.
    type: str
    default: default
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
requirements:
  - With O(backend=kubernetes) on the managed node, the Python library C(kubernetes) (24.2.0 or later) and the
    collection C(kubernetes.core).
seealso:
  - module: zjusct.cloud.host_volume_info
  - module: zjusct.cloud.root_volume_claim
"""

EXAMPLES = r"""
- name: The root volume of alice's VM web, whichever backend runs it
  zjusct.cloud.root_volume_info:
    name: "{{ web.cloudvms[0].spec.rootVolumeClaim }}"
    namespace: default
  register: root

- name: Is the name a restore into VM web-restored would use free?
  zjusct.cloud.root_volume_info:
    vm: web-restored
  register: target

- name: Say what it is
  ansible.builtin.debug:
    msg: "{{ ('driver ' ~ root.volume.driver) if root.volume else root.missing }}"
"""

RETURN = r"""
name:
  description: The volume or claim name looked up (O(name), or C(<vm>-root) for O(vm)).
  returned: always
  type: str
  sample: web-root
volume:
  description:
    - The root volume, or null when there is none (RV(missing) says what is absent).
    - On both backends C(name), C(owner) (the owner mark; C((none)) on a claim without one), C(driver) (C(file),
      C(qcow2) or C(rbd); on Kubernetes C(rbd) for an RBD PersistentVolume, else the PV's C(spec.csi.driver) or
      C((none))), C(claimed_by) (uid of the CloudVM whose claim mark it carries, or null) and C(rbd) (C(pool) and
      C(image) of an RBD volume, else null).
    - On the host backend also the store's C(location), C(size_mib), the RBD connection settings in C(rbd) and a
      qcow2 overlay's C(base); on Kubernetes also C(namespace) and C(persistent_volume).
  returned: always
  type: dict
  sample: {name: web-root, namespace: default, owner: alice, driver: rbd, claimed_by: 6c1f...,
           persistent_volume: default.web-root, rbd: {pool: rbd, image: default.web-root}}
missing:
  description: Why RV(volume) is null (no such volume; on Kubernetes also a claim not Bound, its PV gone, or a PV
    whose C(spec.claimRef) names another claim); empty when it is not.
  returned: always
  type: str
  sample: no PersistentVolumeClaim default/web-root
volume_driver:
  description: The driver a new root volume gets on this backend (the host configuration's C(volume_driver);
    C(rbd) on Kubernetes).
  returned: always
  type: str
  sample: file
rbd_image:
  description: On Kubernetes the RBD image (and PersistentVolume) name a new claim of RV(name) gets,
    C(<namespace>.<name>) fitted to 128 characters (docs/naming.md), as M(zjusct.cloud.root_volume_claim) names
    it; null on the host backend.
  returned: always
  type: str
  sample: default.web-root
host_config:
  description: The host configuration file read (host backend), or null (no file, or Kubernetes). The backup
    playbooks pass it on so that backups and restores are audited in this host's store.
  returned: always
  type: str
  sample: /etc/zjusct-cloud/host.json
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.root_volume_info_module import (
    ROOT_VOLUME_INFO_ONE_OF,
    root_volume_info_argument_spec,
    run_root_volume_info,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module


def main() -> None:
    module = AnsibleModule(argument_spec=root_volume_info_argument_spec(), supports_check_mode=True,
                           mutually_exclusive=ROOT_VOLUME_INFO_ONE_OF, required_one_of=ROOT_VOLUME_INFO_ONE_OF)
    run_module(module, run_root_volume_info)


if __name__ == "__main__":
    main()
