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
    connection settings, ready to pass to M(zjusct.cloud.rbd_backup). Never changes anything.
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
volume_driver:
  description: The host configuration's C(volume_driver) (C(file) or C(rbd)) used for new root volumes.
  returned: always
  type: str
rbd:
  description: The host configuration's RBD settings (pool, conf, user, keyring_path, cluster), or null.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils._host_volume_module import (
    host_volume_info_argument_spec,
    list_volumes,
    run,
)


def main() -> None:
    module = AnsibleModule(argument_spec=host_volume_info_argument_spec(), supports_check_mode=True)
    run(module, lambda: list_volumes(module.params))


if __name__ == "__main__":
    main()
