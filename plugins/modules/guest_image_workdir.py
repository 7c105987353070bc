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

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils._image_fs import FsError, mounts_below, remove_tree


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="absent", choices=["absent", "empty"]),
            subdirs=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    path, state = module.params["path"], module.params["state"]
    if not os.path.isabs(path) or os.path.realpath(path) == "/":
        module.fail_json(msg=f"path: {path!r} must be an absolute path other than /")
    exists = os.path.lexists(path)
    if module.check_mode:
        module.exit_json(changed=exists or state == "empty", removed=exists, unmounted=mounts_below(path))
    try:
        unmounted = mounts_below(path)
        removed = remove_tree(path)
        if state == "empty":
            os.makedirs(path, mode=0o700)
            for sub in module.params["subdirs"]:
                os.makedirs(os.path.join(path, sub), mode=0o755, exist_ok=True)
    except (FsError, OSError) as exc:
        module.fail_json(msg=f"path: {path}: {exc}")
    module.exit_json(changed=removed or state == "empty", removed=removed, unmounted=unmounted)


if __name__ == "__main__":
    main()
