#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: host_volume_info
short_description: List the single-host backend's root volumes
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Returns volume records from the host store (name, driver, location, size, owner, claim), and the host's
    volume driver and RBD connection settings. For rbd volumes each record has C(rbd) with the pool, image and
    connection settings, ready to pass to M(zjusct.cloud.rbd_backup); a qcow2 volume's record has C(base), the
    read-only base image its overlay reads through. Never changes anything.
options:
  name:
    description: Only the volume with this name.
    type: str
  owner:
    description: Only volumes of this owner.
    type: str
extends_documentation_fragment:
  - zjusct.cloud.host_config
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
seealso:
  - module: zjusct.cloud.host_volume
"""

EXAMPLES = r"""
- name: Where is alice's root volume?
  zjusct.cloud.host_volume_info:
    name: alice-root
  register: vol
"""

RETURN = r"""
volumes:
  description: Matching volume records, ordered by name.
  returned: always
  type: list
  elements: dict
  sample:
    - {name: alice-root, driver: rbd, location: rbd/alice-root, size_mib: 2048, owner: alice,
       claimed_by: 6c1f..., rbd: {pool: rbd, image: alice-root, conf: /etc/ceph/ceph.conf, user: cloud,
       keyring_path: /etc/ceph/ceph.client.cloud.keyring, cluster: ""}}
    - {name: bob-root, driver: qcow2, location: /var/lib/zjusct-cloud/volumes/bob-root.qcow2, size_mib: 2048,
       owner: bob, claimed_by: 9a2e..., base: /var/lib/zjusct-cloud/volumes/bases/debian-bookworm-1.qcow2}
volume_driver:
  description: The host configuration's C(volume_driver) (C(file), C(rbd) or C(qcow2)) used for new root volumes.
  returned: always
  type: str
rbd:
  description: The host configuration's RBD settings (pool, conf, user, keyring_path, cluster), or null.
  returned: always
  type: dict
host_config:
  description:
    - Absolute path of the host configuration file read (O(host_config), else E(ZJUSCT_CLOUD_CONFIG), else
      C(/etc/zjusct-cloud/host.json)), or null when there is none (defaults). The backup playbooks pass it to
      M(zjusct.cloud.rbd_backup) so that backups and restores are audited in this host's store.
  returned: always
  type: str
  sample: /etc/zjusct-cloud/host.json
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.host.host_volume_info_module import run_host_volume_info
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

ARGUMENT_SPEC: dict = {
    "name": {"type": "str"},
    "owner": {"type": "str"},
    "host_config": {"type": "path"},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_host_volume_info)


if __name__ == "__main__":
    main()
