#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, ZJUSCT cloud team
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: audit_info
short_description: List the audit trail of the single-host backend
version_added: 0.1.0
author: ZJUSCT cloud team (@zjusct)
description:
  - Returns the audit records of the host store - one per mutating action of M(zjusct.cloud.cloudvm) (create,
    start, stop, restart, update, delete) that changed something, was refused or failed, and one per change of
    M(zjusct.cloud.owner_quota). Records are kept in the store's C(audit) table and survive restarts.
  - The store is opened read-only; a store that does not exist yet has no records.
options:
  owner:
    description: Only records about this owner's CloudVMs or quota.
    type: str
  actor:
    description: Only records of actions by this actor (the C(owner) option of the acting task, or C(operator)).
    type: str
  subject:
    description: Only records about this subject (C(namespace/name) of a CloudVM, C(quota/<owner>)).
    type: str
  since:
    description: Only records at or after this RFC 3339 UTC time (C(2026-11-30T07:00:00Z)) or date (C(2026-11-30)).
    type: str
  limit:
    description: At most this many records (the newest), returned oldest first.
    type: int
    default: 100
extends_documentation_fragment:
  - zjusct.cloud.host_config
attributes:
  check_mode:
    support: full
    description: Reads only.
  diff_mode:
    support: none
    description: No diff is returned.
seealso:
  - module: zjusct.cloud.owner_quota
  - module: zjusct.cloud.cloudvm
"""

EXAMPLES = r"""
- name: What happened to alice's VMs today
  zjusct.cloud.audit_info:
    owner: alice
    since: "2026-11-30"
  register: alice_audit
"""

RETURN = r"""
records:
  description: Audit records, oldest first (schema in docs/security.md, Audit).
  returned: success
  type: list
  elements: dict
  sample:
    - id: 7
      ts: "2026-11-30T07:00:00.123456Z"
      actor: alice
      operator: false
      action: start
      subject: default/alice
      owner: alice
      result: refused
      reason: QuotaExceeded
      message: "vcpus: owner 'alice' would use 5 of quota 4 vCPUs (in use 4, this request 1, asked by vcpus); ..."
      data: {power_state: running}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module
from ansible_collections.zjusct.cloud.plugins.module_utils.host.audit_info_module import run_audit_info

ARGUMENT_SPEC: dict = {
    "owner": {"type": "str"},
    "actor": {"type": "str"},
    "subject": {"type": "str"},
    "since": {"type": "str"},
    "limit": {"type": "int", "default": 100},
    "host_config": {"type": "path"},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_audit_info)


if __name__ == "__main__":
    main()
