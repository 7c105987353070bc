#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: zjusct.cloud contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module zjusct.cloud.guest_image_publish: write the manifest last and move the set into place."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: guest_image_publish
short_description: Seal a built guest image set (manifest, read-only files) and rename it into place atomically
version_added: "0.1.0"
description:
  - Hashes every artefact in O(staging) (C(rootfs.raw), C(vmlinuz), C(vmlinux), C(initrd.img)), writes
    C(manifest.json) last (temp file, fsync, rename), makes the files read-only (0444, directory 0555) and
    renames O(staging) to O(path). An existing O(path) (a forced rebuild) is renamed aside first and removed
    afterwards, so O(path) is at every instant either absent or a complete set.
  - When O(path) already holds a complete set for the same O(inputs_sha256) and O(force) is false, nothing
    is changed.
options:
  staging:
    description: Directory holding the finished artefacts, on the same filesystem as O(path).
    type: path
    required: true
  path:
    description: Final image set directory C(<images_dir>/<name>-<version>).
    type: path
    required: true
  inputs:
    description: The canonical inputs returned by M(zjusct.cloud.guest_image_plan) (its C(inputs) result).
    type: dict
    required: true
  inputs_sha256:
    description: sha256 of the inputs, checked against O(inputs).
    type: str
    required: true
  kernel_version:
    description: Kernel release of the artefacts (from M(zjusct.cloud.guest_image_kernel)).
    type: str
    required: true
  default_cmdline:
    description: Kernel command line recorded as C(defaultCmdline).
    type: str
    default: console=ttyS0 root=/dev/vda rw net.ifnames=0 panic=-1 quiet zjusct.identity=/dev/vdb
  force:
    description: Replace a complete existing set.
    type: bool
    default: false
author: ZJUSCT cloud team (@zjusct)
"""

EXAMPLES = r"""
- name: Publish
  zjusct.cloud.guest_image_publish:
    staging: "{{ plan.build_path }}/out"
    path: "{{ plan.path }}"
    inputs: "{{ plan.inputs }}"
    inputs_sha256: "{{ plan.inputs_sha256 }}"
    kernel_version: "{{ kernel.kernel_version }}"
"""

RETURN = r"""
manifest:
  description: The manifest of the set at O(path).
  type: dict
  returned: success
path:
  description: The image set directory.
  type: str
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.zjusct.cloud.plugins.module_utils.image.guest_image_publish_module import (
    run_guest_image_publish,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.common.module import run_module

ARGUMENT_SPEC: dict = dict(
    staging=dict(type="path", required=True),
    path=dict(type="path", required=True),
    inputs=dict(type="dict", required=True),
    inputs_sha256=dict(type="str", required=True),
    kernel_version=dict(type="str", required=True),
    default_cmdline=dict(
        type="str", default="console=ttyS0 root=/dev/vda rw net.ifnames=0 panic=-1 quiet zjusct.identity=/dev/vdb"),
    force=dict(type="bool", default=False),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=False)
    run_module(module, run_guest_image_publish)


if __name__ == "__main__":
    main()
