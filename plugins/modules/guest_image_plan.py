#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module zjusct.cloud.guest_image_plan: version and completeness of a guest image set."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: guest_image_plan
short_description: Compute a guest image set's version from its build inputs and check whether it exists
version_added: "0.1.0"
description:
  - Computes the canonical build inputs of a guest image set, their sha256 (C(inputs_sha256)) and the version
    (first 12 hex digits), and reports whether C(<dir>/<name>-<version>/manifest.json) describes a complete set
    for exactly these inputs (manifest parses, same inputsSha256, every artefact present with the recorded size).
  - Never changes anything; C(changed) is always false. Used by the C(zjusct.cloud.guest_image) role to decide
    whether to build.
options:
  dir:
    description: Directory holding image sets (the role's C(guest_image_dir)). Absolute path.
    type: path
    required: true
  name:
    description: Image name without version; lowercase letters, digits, C(.) and C(-), at most 63 characters.
    type: str
    default: debian-bookworm
  distro:
    description: Distribution family; selects debootstrap's script and the defaults documented in the role.
    type: str
    choices: [debian, ubuntu]
    default: debian
  suite:
    description: Release code name given to debootstrap.
    type: str
    default: bookworm
  mirror:
    description: Archive URL (http, https or file) given to debootstrap.
    type: str
    required: true
  components:
    description: Archive components.
    type: list
    elements: str
    default: [main]
  packages:
    description: Packages added to the minbase variant (order and duplicates do not change the version).
    type: list
    elements: str
    default: []
  kernel_package:
    description: Package that provides the guest kernel inside the image.
    type: str
    default: linux-image-amd64
  size_mib:
    description: Size of C(rootfs.raw) in MiB (512-65536).
    type: int
    default: 2048
  prune_module_dirs:
    description: Directories below C(/lib/modules/<version>/kernel) removed from the image.
    type: list
    elements: str
    default: []
  extra_inputs:
    description: Further inputs (for example sha256 of the in-guest scripts), a flat mapping of strings.
    type: dict
    default: {}
  verify_sha256:
    description: Also re-hash every artefact of an existing set (reads the whole rootfs).
    type: bool
    default: false
author: ZJUSCT cloud team (@zjusct)
"""

EXAMPLES = r"""
- name: Decide whether the default image set must be built
  zjusct.cloud.guest_image_plan:
    dir: /var/lib/zjusct-cloud/images
    mirror: http://deb.debian.org/debian
    packages: [systemd, systemd-sysv, dbus, openssh-server, iproute2]
  register: plan
"""

RETURN = r"""
version:
  description: First 12 hex digits of inputs_sha256.
  type: str
  returned: always
  sample: 3f1c0a9b2d4e
inputs_sha256:
  description: sha256 of the canonical JSON of the inputs.
  type: str
  returned: always
set_name:
  description: C(<name>-<version>), the image set's directory name.
  type: str
  returned: always
  sample: debian-bookworm-3f1c0a9b2d4e
path:
  description: Absolute path of the image set directory.
  type: str
  returned: always
build_path:
  description: Scratch directory a build of this version uses (hidden, removed when the set is published).
  type: str
  returned: always
complete:
  description: Whether a complete set for these inputs exists at C(path).
  type: bool
  returned: always
reason:
  description: Why the set is or is not complete.
  type: str
  returned: always
inputs:
  description: The canonical inputs.
  type: dict
  returned: always
manifest:
  description: The existing manifest when complete, else null.
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.image.guest_image_plan_module import run_guest_image_plan
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

ARGUMENT_SPEC: dict = dict(
    dir=dict(type="path", required=True),
    name=dict(type="str", default="debian-bookworm"),
    distro=dict(type="str", default="debian", choices=["debian", "ubuntu"]),
    suite=dict(type="str", default="bookworm"),
    mirror=dict(type="str", required=True),
    components=dict(type="list", elements="str", default=["main"]),
    packages=dict(type="list", elements="str", default=[]),
    kernel_package=dict(type="str", default="linux-image-amd64"),
    size_mib=dict(type="int", default=2048),
    prune_module_dirs=dict(type="list", elements="str", default=[]),
    extra_inputs=dict(type="dict", default={}),
    verify_sha256=dict(type="bool", default=False),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, run_guest_image_plan)


if __name__ == "__main__":
    main()
