#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: host_store
short_description: Create or migrate the single-host backend's store
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Creates the host store (the SQLite database named by the host configuration's C(store_path)) when it does
    not exist, and migrates an older schema to this collection's. The hypervisor role runs it with C(site.yml).
  - Reads (M(zjusct.cloud.cloudvm_info), the inventory) open the store read-only and never migrate it; a store
    with an older schema is refused there until this module (or C(site.yml)) has run.
extends_documentation_fragment:
  - zjusct.cloud.host_config
attributes:
  check_mode:
    support: full
    description: Reports whether the store would be created or migrated, without writing.
  diff_mode:
    support: none
    description: No diff is shown.
seealso:
  - module: zjusct.cloud.cloudvm_info
"""

EXAMPLES = r"""
- name: Create or migrate the host store
  zjusct.cloud.host_store:
    host_config: /etc/zjusct-cloud/host.json
"""

RETURN = r"""
path:
  description: The store's path.
  returned: always
  type: str
  sample: /var/lib/zjusct-cloud/cloud.db
schema_version:
  description: The store's schema version after the task (this collection's).
  returned: always
  type: int
  sample: 2
previous_schema_version:
  description: The schema version before the task; null when the store did not exist.
  returned: always
  type: int
  sample: 1
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module
from ansible_collections.zjusct.cloud.plugins.module_utils.host.host_store_module import run_host_store

ARGUMENT_SPEC: dict = {"host_config": {"type": "path"}}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_host_store)


if __name__ == "__main__":
    main()
