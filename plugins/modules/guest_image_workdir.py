#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module zjusct.cloud.guest_image_workdir: create or safely remove a guest image build directory."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: guest_image_workdir
short_description: Create an empty guest image build directory or remove one safely
version_added: "0.1.0"
description:
  - With O(state=absent), unmounts everything mounted at or below O(path) (a killed debootstrap can leave
    C(proc), C(sys) or a bind-mounted C(/dev) behind) and removes the tree without ever crossing into another
    filesystem.
  - With O(state=empty), does the same and then creates O(path) (mode 0700) and the subdirectories in
    O(subdirs), so a build always starts from nothing.
options:
  path:
    description: The build directory (absolute).
    type: path
    required: true
  state:
    description: C(absent) removes, C(empty) removes then recreates.
    type: str
    choices: [absent, empty]
    default: absent
  subdirs:
    description: Subdirectories created below O(path) when O(state=empty).
    type: list
    elements: str
    default: []
author: ZJUSCT cloud team (@zjusct)
"""

EXAMPLES = r"""
- name: Start the build from an empty directory
  zjusct.cloud.guest_image_workdir:
    path: /var/lib/zjusct-cloud/images/.build-debian-bookworm-3f1c0a9b2d4e
    state: empty
    subdirs: [root, out]
"""

RETURN = r"""
removed:
  description: Whether an existing tree was removed.
  type: bool
  returned: always
unmounted:
  description: Mount points that were unmounted below the path.
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.image.guest_image_workdir_module import (
    run_guest_image_workdir,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

ARGUMENT_SPEC: dict = dict(
    path=dict(type="path", required=True),
    state=dict(type="str", default="absent", choices=["absent", "empty"]),
    subdirs=dict(type="list", elements="str", default=[]),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_guest_image_workdir)


if __name__ == "__main__":
    main()
