#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: host_volume
short_description: Register an existing Ceph RBD image as a tenant's root volume on the single-host backend
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Adds a volume record (driver C(rbd), location C(pool/image)) to the host store for an RBD image that already
    exists, typically one restored from a backup by M(zjusct.cloud.rbd_backup). A following
    M(zjusct.cloud.cloudvm) with O(zjusct.cloud.cloudvm#module:root_volume_claim=<name>) creates the VM on it and
    claims it when it first starts.
  - The image must be in the host configuration's C(rbd.pool) (or name its pool), have no watcher, no
    C(cloud.zjusct.io/claimed-by) mark, and an owner mark that is absent (then set to O(owner)) or equal to O(owner).
  - Idempotent; a name already registered for another image or owner is refused.
  - The image's size counts against the owner's C(disk_mib) quota (M(zjusct.cloud.owner_quota)). A registration
    over it is refused with RV(reason=QuotaExceeded) before the image is marked, and checked again in the store
    transaction that records the volume; nothing is recorded and the image keeps its marks.
  - A registration that changed something, was refused or failed is an audit record (action C(volume-register),
    subject C(volume/<name>)), listed by M(zjusct.cloud.audit_info); a run that changed nothing and check mode
    record nothing. See docs/security.md, "Quotas" and "Audit".
options:
  name:
    description: Volume name in the host store (a DNS label); by convention C(<vm name>-root).
    type: str
    required: true
  owner:
    description: User id owning the volume (a DNS label); must match the image's owner mark if it has one.
    type: str
    required: true
  rbd_image:
    description: The RBD image, C(pool/image) or C(image) (in the host configuration's C(rbd.pool)).
    type: str
    required: true
  image:
    description:
      - Image set whose kernel and initrd boot the volume (name, full versioned name, or path); the guest's root
        file system comes from the RBD image.
      - Defaults to the host configuration's C(default_image).
    type: str
  actor:
    description: Who acts, for the audit record (the launching user under AWX). Defaults to O(owner).
    type: str
extends_documentation_fragment:
  - zjusct.cloud.host_config
attributes:
  check_mode:
    support: full
    description: Reports whether the volume would be registered, without checking the image or writing anything
      (so a quota refusal is not predicted).
  diff_mode:
    support: none
    description: No diff is returned.
notes:
  - Connection settings come from the host configuration's C(rbd) key (docs/host-backend.md).
seealso:
  - module: zjusct.cloud.host_volume_info
  - module: zjusct.cloud.rbd_backup
  - module: zjusct.cloud.cloudvm
"""

EXAMPLES = r"""
- name: Register a restored image as bob's root volume
  zjusct.cloud.host_volume:
    name: bob-restored-root
    owner: bob
    rbd_image: rbd/bob-restored-root

- name: Create and start a VM on it
  zjusct.cloud.cloudvm:
    name: bob-restored
    owner: bob
    root_volume_claim: bob-restored-root
    power_state: running
"""

RETURN = r"""
volume:
  description: The volume record; C(rbd) holds the image and the host's connection settings (paths, no secrets).
  returned: success
  type: dict
  sample:
    name: bob-restored-root
    driver: rbd
    location: rbd/bob-restored-root
    size_mib: 2048
    owner: bob
    claimed_by: null
    rbd: {pool: rbd, image: bob-restored-root, conf: /etc/ceph/ceph.conf, user: cloud, keyring_path: /etc/ceph/k}
reason:
  description: V(QuotaExceeded) when the registration would take the owner over its C(disk_mib) quota.
  returned: failure over a quota
  type: str
  sample: QuotaExceeded
quota:
  description: The quota exceeded (V(disk_mib)).
  returned: failure over a quota
  type: str
  sample: disk_mib
limit:
  description: The owner's limit (MiB).
  returned: failure over a quota
  type: int
  sample: 2048
in_use:
  description: What the owner uses now (MiB).
  returned: failure over a quota
  type: int
  sample: 1024
requested:
  description: The image's size (MiB).
  returned: failure over a quota
  type: int
  sample: 2048
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.host.host_volume_module import run_host_volume
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

ARGUMENT_SPEC: dict = {
    "name": {"type": "str", "required": True},
    "owner": {"type": "str", "required": True},
    "rbd_image": {"type": "str", "required": True},
    "image": {"type": "str"},
    "actor": {"type": "str"},
    "host_config": {"type": "path"},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_host_volume)


if __name__ == "__main__":
    main()
